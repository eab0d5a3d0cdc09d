"""`minips plan`: measure each layer here, count each codec's bytes, choose a plan for a link."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("plan")
@click.option("--model", default="lenet5", show_default=True, help="Model from the zoo.")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--bandwidth",
    default=None,
    help="The link, e.g. 100mbit (unset: unlimited, so all dense).",
)
@click.option(
    "--per-worker",
    is_flag=True,
    help="The rate is each worker's own link (--bandwidth of run), not the server's shared "
    "link (--netem of run, split among --workers).",
)
@click.option("--servers", type=click.IntRange(min=1), default=1, show_default=True,
              help="A server group of K shards, each behind a link of --bandwidth (shared "
              "by the workers): the bytes split over K links.")  # fmt: skip
@click.option("--repeats", type=click.IntRange(min=1), default=7, show_default=True,
              help="Batches timed per layer (the fastest counts).")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the chosen plan here (for --plan FILE of run/server).")  # fmt: skip
def plan(
    model: str,
    batch_size: int,
    workers: int,
    bandwidth: str | None,
    per_worker: bool,
    servers: int,
    repeats: int,
    json_path: str | None,
) -> None:
    """Choose per-layer codecs for a link: measured compute, exact bytes, predicted step."""
    from minips.nn import build_model
    from minips.run.planner import format_table, make_plan
    from minips.worker.netlimit import parse_rate

    rate = parse_rate(bandwidth) if bandwidth else None
    report = make_plan(build_model(model), batch_size, workers, rate, shared=not per_worker,
                       repeats=repeats, servers=servers)  # fmt: skip
    click.echo(format_table(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report.plan.to_dict(), indent=2) + "\n")
        click.echo(f"plan written to {json_path} (use: --plan {json_path})")
