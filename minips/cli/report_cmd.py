"""`minips report` and `minips plot`: look at finished run directories.

Thin: each command loads the run directories with minips.results.rundir and hands them to
minips.results.report (JSON; its text: minips.results.report_text) or minips.results.plot (PNG
files)."""

from __future__ import annotations

import json

import click

from minips.cli.numbers import FiniteFloatRange

_RUN_DIRS = click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_DIR...")
_TARGET = click.option(
    "--target", type=FiniteFloatRange(0, 1), default=None,
    help="Also show when test accuracy first reached this value.",
)  # fmt: skip


@click.command()
@_RUN_DIRS
@_TARGET
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a JSON list).")
def report(run_dirs: tuple[str, ...], target: float | None, as_json: bool) -> None:
    """Summarise run directories: accuracy, time, traffic, staleness per worker."""
    from minips.results.loading import load_run
    from minips.results.report import summarize
    from minips.results.report_text import format_report

    reports = [summarize(load_run(path), target) for path in run_dirs]
    if as_json:
        click.echo(json.dumps(reports, indent=2))
    else:
        click.echo("\n\n".join(format_report(r) for r in reports))


@click.command()
@_RUN_DIRS
@_TARGET
@click.option(
    "--out", type=click.Path(dir_okay=False), default="plot.png", show_default=True,
    help="Accuracy figure; the staleness one goes beside it: *-staleness.png.",
)  # fmt: skip
@click.option("--title", default=None, help="Figure title.")
def plot(run_dirs: tuple[str, ...], target: float | None, out: str, title: str | None) -> None:
    """Plot accuracy vs time and vs samples, and staleness histograms (needs matplotlib)."""
    from minips.results.loading import load_run
    from minips.results.plot import plot_accuracy, plot_staleness, staleness_path

    runs = [load_run(path) for path in run_dirs]
    click.echo(f"accuracy:  {plot_accuracy(runs, out, target, title)}")
    click.echo(f"staleness: {plot_staleness(runs, staleness_path(out), title)}")
