"""`minips train`: the single-process trainer (its options derived from minips.run.config)."""

from __future__ import annotations

from typing import Any

import click

from minips.cli.click_options import config_options
from minips.cli.progress import ProgressBar
from minips.run.config import TrainConfig


@click.command()
@config_options(TrainConfig, "train")
@click.option(
    "--metrics", "metrics_path", type=click.Path(dir_okay=False), help="Write JSONL here."
)
@click.option(
    "--save",
    "save_path",
    type=click.Path(dir_okay=False),
    help="Save the model as a checkpoint (.npz; `minips run --resume` takes it).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(metrics_path: str | None, save_path: str | None, quiet: bool, **options: Any) -> None:
    """Train a model in one process (the baseline for distributed runs).

    Prints `test accuracy: 0.XXXX` at the end.
    """
    from minips.results.metrics import MetricsLog
    from minips.results.rundir import check_writable
    from minips.trainer import train as run_training

    config = TrainConfig.from_options(options)
    if save_path:
        check_writable(save_path, "--save")
    with MetricsLog(metrics_path) as metrics:
        if quiet:
            _, result = run_training(config, metrics, save=save_path)
        else:
            with ProgressBar() as bar:
                _, result = run_training(config, metrics, progress=bar.update, save=save_path)
    click.echo(
        f"trained {result.samples} samples in {result.wall_s:.1f} s "
        f"({result.samples / max(result.wall_s, 1e-9):.0f} samples/s)"
    )
    click.echo(f"test accuracy: {result.accuracy:.4f}")
