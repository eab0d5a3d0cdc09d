"""`minips run`, `minips server`, `minips worker` and `minips evaluate`.

Thin: each command turns its options into a `ServerSpec` (or a client) and calls
minips.launch / minips.worker / minips.evaluator. Every option can also be given as an
environment variable MINIPS_<COMMAND>_<OPTION>, e.g. MINIPS_WORKER_CONNECT.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from minips.errors import ConfigError
from minips.launch import ServerSpec
from minips.rules import DASGD, RULES, make_rule

# Named rule options: CLI parameter -> (the rule it belongs to, the rule's option name).
RULE_FLAGS = {
    "staleness": ("ssp", "staleness"),
    "dasgd_schedule": ("dasgd", "schedule"),
    "beta": ("dasgd", "beta"),
    "power": ("dasgd", "power"),
    "tau_max": ("dasgd", "tau_max"),
    "vsgd_rho": ("vsgd", "rho"),
    "vsgd_min_samples": ("vsgd", "min_samples"),
    "dc_lambda": ("dcasgd", "lam"),
}


def _parse_hetero(_ctx: Any, _param: Any, value: str | None) -> list[float]:
    if not value:
        return []
    try:
        return [float(part) for part in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}") from None


def _parse_rule_options(_ctx: Any, _param: Any, values: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        try:
            options[key.replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = raw  # a bare word, e.g. schedule=inverse
    return options


def spec_options(command: Callable) -> Callable:
    """The options shared by `run` and `server`: model, data, optimizer, rule, cluster."""
    defaults = ServerSpec()
    options = [
        click.option("--model", default=defaults.model, show_default=True),
        click.option("--dataset", default=defaults.dataset, show_default=True),
        click.option("--data-dir", type=click.Path(file_okay=False)),
        click.option("--epochs", type=click.IntRange(min=1), default=defaults.epochs,
                     show_default=True, help="Epochs over each worker's shard."),
        click.option("--batch-size", type=click.IntRange(min=1), default=defaults.batch_size,
                     show_default=True),
        click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=defaults.lr,
                     show_default=True),
        click.option("--momentum", type=click.FloatRange(0, 1, max_open=True),
                     default=defaults.momentum, show_default=True),
        click.option("--weight-decay", type=click.FloatRange(min=0), default=0.0,
                     show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--rule", default=defaults.rule, show_default=True,
                     help=f"Update rule: {', '.join(RULES)} (docs/algorithms.md)."),
        click.option("--staleness", type=click.IntRange(min=0), default=None,
                     help="ssp: how many clocks a worker may run ahead of the slowest."),
        click.option("--dasgd-schedule", type=click.Choice(list(DASGD.SCHEDULES)), default=None,
                     help="dasgd: f(tau) = 1/max(1,tau) | exp(-beta tau) | (1+tau)^-power "
                          "| drop past tau-max (default inverse)."),
        click.option("--beta", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="dasgd exp: decay per clock of staleness (default 0.2)."),
        click.option("--power", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="dasgd poly: exponent p (default 0.5)."),
        click.option("--tau-max", type=click.IntRange(min=0), default=None,
                     help="dasgd cutoff: drop pushes staler than this (default 8)."),
        click.option("--vsgd-rho", type=click.FloatRange(0, 1, min_open=True), default=None,
                     help="vsgd: fraction of each parameter sampled (default 0.01)."),
        click.option("--vsgd-min-samples", type=click.IntRange(min=1), default=None,
                     help="vsgd: at least this many samples per parameter (default 32)."),
        click.option("--dc-lambda", type=click.FloatRange(min=0), default=None,
                     help="dcasgd: lambda of the delay compensation (default 0.04)."),
        click.option("--rule-option", "rule_options", multiple=True,
                     callback=_parse_rule_options, help="Extra rule option KEY=VALUE."),
        click.option("--workers", type=click.IntRange(min=1), default=defaults.workers,
                     show_default=True),
        click.option("--hetero", callback=_parse_hetero,
                     help="Slowdown factor per worker, e.g. 1,1,2,4."),
        click.option("--heartbeat-timeout", type=click.FloatRange(min=0, min_open=True),
                     default=defaults.heartbeat_timeout, show_default=True,
                     help="Seconds of silence before a worker is declared dead."),
        click.option("--checkpoint-every", type=click.IntRange(min=0), default=0,
                     show_default=True, help="Checkpoint every N updates (0: at the end)."),
        click.option("--resume", type=click.Path(dir_okay=False, exists=True),
                     help="Start from this checkpoint."),
        click.option("--max-samples", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Stop once all workers together processed this many (0: no limit)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def _spec(options: dict[str, Any], **extra: Any) -> ServerSpec:
    rule_options = dict(options.pop("rule_options") or {})
    for param, (rule, key) in RULE_FLAGS.items():
        value = options.pop(param)
        if value is None:
            continue
        if options["rule"] != rule:
            flag = "--" + param.replace("_", "-")
            raise ConfigError(f"{flag} only applies to --rule {rule}")
        rule_options[key] = value
    # Build the rule once here so a bad option is a one-line error before any process starts.
    make_rule(options["rule"], **rule_options)
    return ServerSpec(rule_options=rule_options, **options, **extra)


@click.command()
@spec_options
@click.option("--out", type=click.Path(file_okay=False), default="runs/latest", show_default=True,
              help="Run directory.")  # fmt: skip
@click.option("--eval-interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def run(out: str, eval_interval: float, quiet: bool, **options: Any) -> None:
    """Run a server, N workers and an evaluator on this machine, as processes.

    With no options: lenet5 on the bundled sample with 2 asgd workers.
    Writes OUT/config.json, metrics.jsonl, summary.json and checkpoint.npz.
    """
    from minips.launch import run_local

    spec = _spec(options)
    bar = None if quiet else _Progress()
    try:
        summary = run_local(spec, out, eval_interval, progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    click.echo(
        f"{summary['samples']} samples, {summary['updates']} updates in {summary['wall_s']:.1f} s;"
        f" staleness mean {summary['staleness_mean'] or 0:.2f} max {summary['staleness_max']}"
    )
    click.echo(f"run directory: {out}")
    click.echo(f"test accuracy: {summary['accuracy']:.4f}")


@click.command()
@spec_options
@click.option("--bind", default="tcp://127.0.0.1:5555", show_default=True,
              help="Listen address (tcp://0.0.0.0:5555 accepts other machines).")  # fmt: skip
@click.option("--checkpoint", type=click.Path(dir_okay=False), help="Checkpoint file (.npz).")
@click.option("--endpoint-file", type=click.Path(dir_okay=False), hidden=True)
@click.option("--updates-log", type=click.Path(dir_okay=False), help="JSONL of applied updates.")
@click.option("--t0", type=float, default=None, hidden=True)
@click.option("--verbose", "-v", is_flag=True)
def server(
    bind: str,
    checkpoint: str | None,
    endpoint_file: str | None,
    updates_log: str | None,
    t0: float | None,
    verbose: bool,
    **options: Any,
) -> None:
    """Serve the model to workers until stopped (Ctrl-C, SIGTERM, or a `stop` request)."""
    from minips.launch import make_server
    from minips.metrics import MetricsLog

    logging.basicConfig(
        level=logging.INFO if verbose or endpoint_file else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    spec = _spec(options, bind=bind, checkpoint=checkpoint)
    with MetricsLog(updates_log, start_time=t0) as updates:

        def on_update(record: dict[str, Any]) -> None:
            record = {key: value for key, value in record.items() if key != "time"}
            updates.write("update", **record)

        ps = make_server(spec, on_update=on_update)
        click.echo(f"minips server on {ps.endpoint}, rule {spec.rule}, {spec.workers} workers")
        if endpoint_file:
            tmp = Path(endpoint_file + ".tmp")
            tmp.write_text(ps.endpoint + "\n")
            tmp.replace(endpoint_file)  # atomic: the launcher never reads half an address
        ps.serve_forever()
        updates.write("server", stats=ps.stats())


@click.command()
@click.option("--connect", required=True, help="Server address, e.g. tcp://192.0.2.1:5555.")
@click.option("--slowdown", type=click.FloatRange(min=1), default=None,
              help="Make each step take F times its compute time.")  # fmt: skip
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--max-steps", type=click.IntRange(min=1), default=None)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="Seconds to wait for each reply.")  # fmt: skip
@click.option("--report", type=click.Path(dir_okay=False),
              help="Write the worker's report here ({rank} is replaced by its rank).")  # fmt: skip
@click.option("--quiet", is_flag=True)
def worker(
    connect: str,
    slowdown: float | None,
    data_dir: str | None,
    max_steps: int | None,
    timeout: float,
    report: str | None,
    quiet: bool,
) -> None:
    """Train on this machine for the server at --connect (everything else comes from it)."""
    from minips.client import PSClient

    # Retries and lost-server warnings go to stderr (the run's log for launched processes).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from minips.worker import Worker, write_report

    with PSClient(connect, timeout=timeout) as client:
        result = Worker(client, data_dir, slowdown, max_steps).run()
        client.bye()
    if report:
        # A worker that arrived after the run ended has no rank: "worker-late.json".
        rank = str(result.rank) if result.rank >= 0 else "late"
        write_report(result, report.replace("{rank}", rank))
    if not quiet:
        click.echo(json.dumps(result.summary()))


@click.command(hidden=True)
@click.option("--connect", required=True)
@click.option("--metrics", "metrics_path", type=click.Path(dir_okay=False), required=True)
@click.option("--interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True)
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--t0", type=float, default=None, hidden=True)
def evaluate(
    connect: str, metrics_path: str, interval: float, data_dir: str | None, t0: float | None
) -> None:
    """Pull the model now and then and test it, until the server stops."""
    from minips.client import PSClient

    # Retries and lost-server warnings go to stderr (the run's log for launched processes).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from minips.evaluator import run_evaluator
    from minips.metrics import MetricsLog

    with (
        PSClient(connect, timeout=30.0, retries=2) as client,
        MetricsLog(metrics_path, start_time=t0) as metrics,
    ):
        run_evaluator(client, metrics, interval, data_dir)


class _Progress:
    """Progress bar for `minips run`: samples done, latest accuracy."""

    def __init__(self) -> None:
        self._bar = None
        self._done = 0

    def update(self, done: int, total: int, latest: dict[str, Any]) -> None:
        if self._bar is None:
            stream = click.get_text_stream("stderr")
            self._bar = click.progressbar(length=total, label="training", file=stream)
            self._bar.__enter__()
        if "accuracy" in latest:
            self._bar.label = f"acc {latest['accuracy']:.3f} upd {latest.get('updates', 0)}"
        self._bar.update(max(0, done - self._done))
        self._done = max(done, self._done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
