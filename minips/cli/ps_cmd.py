"""`minips run`, `minips server`, `minips worker` and `minips evaluate`.

Thin: `run` and `server` take their options from the run's configuration (minips.config)
and call minips.launch; `worker` and `evaluate` make a client and call minips.worker /
minips.evaluator. Every option can also be given as an environment variable
MINIPS_<COMMAND>_<OPTION>, e.g. MINIPS_WORKER_CONNECT.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from minips.cli.progress import ProgressBar
from minips.config import RunConfig, config_options

if TYPE_CHECKING:
    from minips.auth import ClientKeys


def run_command(config_class: type[RunConfig] = RunConfig) -> click.Command:
    """`minips run`, its options those of `config_class` that `run` takes."""

    @click.command("run")
    @config_options(config_class, "run")
    @click.option(
        "--out",
        type=click.Path(file_okay=False),
        default="runs/latest",
        show_default=True,
        help="Run directory.",
    )
    @click.option(
        "--eval-interval",
        type=click.FloatRange(min=0.1),
        default=2.0,
        show_default=True,
        help="Seconds between evaluations of the model.",
    )
    @click.option("--quiet", is_flag=True, help="No progress bar.")  # fmt: skip
    def run(out: str, eval_interval: float, quiet: bool, **options: Any) -> None:
        """Run a server, N workers and an evaluator on this machine, as processes.

        With no options: lenet5 on the bundled sample with 2 asgd workers.
        Writes OUT/config.json, metrics.jsonl, summary.json and checkpoint.npz.
        """
        from minips.launch import run_local

        config = config_class.from_options(options)
        if quiet:
            summary = run_local(config, out, eval_interval)
        else:
            with ProgressBar() as bar:
                summary = run_local(config, out, eval_interval, progress=bar.update)
        click.echo(
            f"{summary['samples']} samples, {summary['updates']} updates in "
            f"{summary['wall_s']:.1f} s; staleness mean {summary['staleness_mean'] or 0:.2f} "
            f"max {summary['staleness_max']}"
        )
        click.echo(f"run directory: {out}")
        click.echo(f"test accuracy: {summary['accuracy']:.4f}")

    return run


def server_command(config_class: type[RunConfig] = RunConfig) -> click.Command:
    """`minips server`, its options those of `config_class` that `server` takes."""

    @click.command("server")
    @config_options(config_class, "server")
    @click.option("--endpoint-file", type=click.Path(dir_okay=False), hidden=True)
    @click.option(
        "--updates-log", type=click.Path(dir_okay=False), help="JSONL of applied updates."
    )
    @click.option("--t0", type=float, default=None, hidden=True)
    @click.option("--verbose", "-v", is_flag=True)  # fmt: skip
    def server(
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
        config = config_class.from_options(options)
        with MetricsLog(updates_log, start_time=t0) as updates:

            def on_update(record: dict[str, Any]) -> None:
                record = {key: value for key, value in record.items() if key != "time"}
                updates.write("update", **record)

            ps = make_server(config, on_update=on_update)
            click.echo(
                f"minips server on {ps.endpoint}, rule {config.rule}, {config.workers} workers"
            )
            if endpoint_file:
                tmp = Path(endpoint_file + ".tmp")
                tmp.write_text(ps.endpoint + "\n")
                tmp.replace(endpoint_file)  # atomic: the launcher never reads half an address
            ps.serve_forever()
            updates.write("server", stats=ps.stats())

    return server


run = run_command()
server = server_command()


def client_key_options(command: Callable) -> Callable:
    """`--keys DIR` and `--key-name NAME`: a client's CURVE keys (docs/protocol.md 15)."""
    command = click.option(
        "--key-name", default="worker", show_default=True,
        help="This client's key pair in --keys: NAME.key_secret.",
    )(command)  # fmt: skip
    return click.option(
        "--keys", type=click.Path(file_okay=False),
        help="Key directory (minips keys) with server.key and this client's key pair.",
    )(command)  # fmt: skip


def client_keys(directory: str | None, name: str) -> ClientKeys | None:
    """A client's CURVE keys from a key directory (None: no directory, no CURVE)."""
    from minips.auth import load_client_keys

    return load_client_keys(directory, name) if directory else None


@click.command()
@click.option("--connect", required=True, help="Server address, e.g. tcp://192.0.2.1:5555.")
@click.option("--slowdown", type=click.FloatRange(min=1), default=None,
              help="Make each step take F times its compute time.")  # fmt: skip
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--max-steps", type=click.IntRange(min=1), default=None)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds to wait for each reply (keep it under the "
              "server's heartbeat timeout, 30 s by default).")  # fmt: skip
@click.option("--report", type=click.Path(dir_okay=False),
              help="Write the worker's report here ({rank} is replaced by its rank).")  # fmt: skip
@click.option("--quiet", is_flag=True)
@client_key_options
def worker(
    connect: str,
    slowdown: float | None,
    data_dir: str | None,
    max_steps: int | None,
    timeout: float,
    report: str | None,
    quiet: bool,
    keys: str | None,
    key_name: str,
) -> None:
    """Train here for the server at --connect (everything else comes from it)."""
    from minips.client import PSClient

    # Retries and lost-server warnings go to stderr (the run's log for launched processes).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from minips.worker import Worker, write_report

    with PSClient(connect, timeout=timeout, keys=client_keys(keys, key_name)) as client:
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
@client_key_options
def evaluate(
    connect: str,
    metrics_path: str,
    interval: float,
    data_dir: str | None,
    t0: float | None,
    keys: str | None,
    key_name: str,
) -> None:
    """Pull the model now and then and test it, until the server stops."""
    from minips.client import PSClient

    # Retries and lost-server warnings go to stderr (the run's log for launched processes).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from minips.evaluator import run_evaluator
    from minips.metrics import MetricsLog

    with (
        PSClient(connect, timeout=10.0, retries=5, keys=client_keys(keys, key_name)) as client,
        MetricsLog(metrics_path, start_time=t0) as metrics,
    ):
        run_evaluator(client, metrics, interval, data_dir)
