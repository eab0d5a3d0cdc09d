"""`minips plan`: measure each layer and codec here, choose a plan for a link, print why."""

from __future__ import annotations

import json
from pathlib import Path

import click

from minips.cli.numbers import BoundedIntRange, FiniteFloatRange
from minips.run.plan_measure import MAX_PLAN_BATCH
from minips.state.registry import MAX_REGISTERED


@click.command("plan")
@click.option("--model", default="lenet5", show_default=True, help="Model from the zoo.")
@click.option(
    "--batch-size",
    type=BoundedIntRange(1, MAX_PLAN_BATCH),
    default=64,
    show_default=True,
    help="Samples per gradient (timed here in real batches).",
)
@click.option("--workers", type=BoundedIntRange(1, MAX_REGISTERED), default=4, show_default=True)
@click.option(
    "--bandwidth",
    default=None,
    help="Each worker's own link, e.g. 100mbit, as `minips run --bandwidth` means it "
    "(unset, and no --netem: unlimited, so all dense).",
)
@click.option(
    "--netem",
    default=None,
    help="One link at the server shared by every worker, e.g. 100mbit, as `minips run "
    "--netem` means it (each worker gets RATE / --workers).",
)
@click.option("--rule", default=None, help="The run's update rule (as `minips run --rule`; "
              "default: its default): ssgd's barrier waits for the slowest worker, and the "
              "rule sets the default --momentum.")  # fmt: skip
@click.option("--momentum", type=FiniteFloatRange(0, 1, max_open=True), default=None,
              help="The server's SGD momentum (as `minips run --momentum`; default: the "
              "rule's, 0 under dana-gap): top-k then corrects for it (docs/protocol.md "
              "13.9).")  # fmt: skip
@click.option("--browser", type=BoundedIntRange(min=0), default=0, show_default=True,
              help="How many of the workers are browser slots (as `minips run --browser`): "
              "their steps are slower.")  # fmt: skip
@click.option("--servers", type=BoundedIntRange(min=1), default=1, show_default=True,
              help="A server group of K shards (as `minips run --servers`): the server's "
              "work splits K ways, and under --netem each shard has its own link.")  # fmt: skip
@click.option("--cores", type=BoundedIntRange(min=1), default=None,
              help="Cores the workers and the server share (default: this machine's).")  # fmt: skip
@click.option("--compute-ms", type=FiniteFloatRange(min=0, min_open=True), default=None,
              help="One step's compute as a worker really gets it, if known (default: "
              "the layers' CPU time scaled by how many processes share the cores).")  # fmt: skip
@click.option("--repeats", type=BoundedIntRange(min=1), default=7, show_default=True,
              help="Batches timed per layer (the fastest counts).")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the chosen plan here (for --plan FILE of run/server).")  # fmt: skip
def plan(
    model: str,
    batch_size: int,
    workers: int,
    bandwidth: str | None,
    netem: str | None,
    rule: str | None,
    momentum: float | None,
    browser: int,
    servers: int,
    cores: int | None,
    compute_ms: float | None,
    repeats: int,
    json_path: str | None,
) -> None:
    """Choose per-layer codecs for a link: the least predicted time to accuracy."""
    from minips.cli.plan_table import format_table
    from minips.nn import build_model
    from minips.rules import server_momentum
    from minips.run.build import plan_cluster
    from minips.run.config import DEFAULT_RULE
    from minips.run.plan_measure import choose_plan, parse_network
    from minips.run.rule_plugins import rule_class

    rule = rule or DEFAULT_RULE
    chosen = rule_class(rule)  # an unknown rule: its one-line error, as `minips run` says it
    if momentum is not None:
        chosen.check_server_momentum(momentum)
    momentum = server_momentum(chosen) if momentum is None else momentum
    network = parse_network(bandwidth=bandwidth, netem=netem)
    if browser > workers:
        raise click.BadParameter(
            f"{browser} browser slots among {workers} workers", param_hint="--browser"
        )
    cluster = plan_cluster(model, workers, browser=browser, servers=servers, rule=rule,
                           shared_link=bool(netem), cores=cores, compute_ms=compute_ms)  # fmt: skip
    report = choose_plan(
        build_model(model), batch_size, cluster, network, repeats=repeats, momentum=momentum
    )
    click.echo(format_table(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report.plan.to_dict(), indent=2) + "\n")
        click.echo(f"plan written to {json_path} (use: --plan {json_path})")
