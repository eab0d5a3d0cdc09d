"""`minips worker` and `minips evaluate`: the clients of a running server.

Thin: each makes a client (minips.worker.client) and calls minips.worker.worker or
minips.results.evaluator; everything about the run comes from the server. Every option can
also be given as an environment variable, e.g. MINIPS_WORKER_CONNECT.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from minips.cli.numbers import BoundedIntRange, FiniteFloatRange
from minips.cli.progress import ProgressBar
from minips.cli.terminate import sigterm_as_interrupt

if TYPE_CHECKING:
    from minips.guard.curve import ClientKeys


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
    from minips.provision.keyfiles import load_client_keys

    return load_client_keys(directory, name) if directory else None


@click.command()
@click.option("--connect", required=True, help="Server address, e.g. tcp://192.0.2.1:5555.")
@click.option("--slowdown", type=FiniteFloatRange(min=1), default=None,
              help="Make each step take F times its compute time.")  # fmt: skip
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="This machine's copy of the dataset (default: the server's --data-dir).",
)
@click.option("--max-steps", type=BoundedIntRange(min=1), default=None)
@click.option(
    "--rank",
    type=BoundedIntRange(min=0),
    default=None,
    help="Take over this rank's shard (a worker that died or left unfinished).",
)
@click.option("--worker-id", default=None,
              help="This worker's name for the server; a restart with the same id gets its "
              "rank back at once.")  # fmt: skip
@click.option("--timeout", type=FiniteFloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds to wait for each reply (keep it under the "
              "server's heartbeat timeout, 30 s by default).")  # fmt: skip
@click.option("--wait", type=FiniteFloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds to wait for the server's first reply (one "
              "started later is waited for) before saying nothing answers.")  # fmt: skip
@click.option("--report", type=click.Path(dir_okay=False),
              help="Write the worker's report here ({rank} is replaced by its rank).")  # fmt: skip
@click.option(
    "--bandwidth",
    default=None,
    help="This worker's link, e.g. 100mbit (default: the run's --bandwidth).",
)
@click.option(
    "--trace",
    type=click.Path(dir_okay=False),
    help="Write a Chrome trace (Perfetto) of compute and send/receive spans here.",
)
@click.option("--quiet", is_flag=True, help="No progress bar and no final summary line.")
@client_key_options
def worker(
    connect: str,
    slowdown: float | None,
    data_dir: str | None,
    max_steps: int | None,
    rank: int | None,
    worker_id: str | None,
    timeout: float,
    wait: float,
    report: str | None,
    bandwidth: str | None,
    trace: str | None,
    quiet: bool,
    keys: str | None,
    key_name: str,
) -> None:
    """Train here for the server at --connect (everything else comes from it)."""
    from minips.group.root import GROUPS
    from minips.run.assembly import PSClient

    # Retries and lost-server warnings go to stderr (the run's log for launched processes).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from minips.provision.locations import find_data
    from minips.results.trace import open_trace
    from minips.results.worker_summary import summary_line, write_report
    from minips.run.conditions import Emulated
    from minips.run.plan_measure import parse_rate

    if bandwidth:
        parse_rate(bandwidth)  # a bad rate: one line, before connecting
    with PSClient(
        connect,
        timeout=timeout,
        worker_id=worker_id,
        keys=client_keys(keys, key_name),
        first_wait=wait,
        groups=GROUPS,
    ) as client:
        click.echo(f"worker on {socket.gethostname()}: joining {connect} ...")

        def joined(report: Any, world_size: int) -> None:
            click.echo(f"joined as rank {report.rank} of {world_size} (host {report.host})")

        extras = {"bandwidth": bandwidth, "trace": open_trace(trace), "on_join": joined,
                  "conditions": Emulated(), "find_data": find_data}  # fmt: skip
        with sigterm_as_interrupt():  # SIGTERM says bye too, as Ctrl-C
            result = _train_worker(client, data_dir, slowdown, max_steps, rank, quiet, extras)
    if report:
        # A worker that arrived after the run ended has no rank: "worker-late.json".
        where = str(result.rank) if result.rank >= 0 else "late"
        write_report(result, report.replace("{rank}", where))
    if not quiet:
        click.echo(summary_line(result.summary()))


def _train_worker(
    client: Any,
    data_dir: str | None,
    slowdown: float | None,
    max_steps: int | None,
    rank: int | None,
    quiet: bool,
    extras: dict[str, Any] | None = None,
) -> Any:
    """Run a Worker on `client`, then say bye: `finished: false` when its epochs are not
    done (--max-steps, Ctrl-C), so a restarted worker may take over its rank. extras:
    more Worker keyword arguments (bandwidth, trace)."""
    from minips.errors import MinipsError
    from minips.results.evaluator import BYE_TIMEOUT
    from minips.run.assembly import Worker
    from minips.worker.client import ServerError, ServerUnavailable

    with ProgressBar(label="worker") as bar:
        progress = None if quiet else bar.update
        trainer = Worker(
            client, data_dir, slowdown, max_steps, rank=rank, progress=progress, **(extras or {})
        )
        try:
            result = trainer.run()
        except ServerError as exc:
            if exc.code != "full" or rank is not None:
                raise  # with --rank, the server's reason already says why that rank is held
            raise MinipsError(
                f"{exc}; to take over the shard of a worker that crashed, start this one with "
                "--rank R: it gets rank R once the server has declared the old worker dead "
                "(--heartbeat-timeout seconds of silence)"
            ) from None
        except KeyboardInterrupt:
            if client.hello_sent:  # one short try: the server may be gone too
                client.timeout, client.retries = min(client.timeout, BYE_TIMEOUT), 0
                with contextlib.suppress(ServerUnavailable):
                    client.bye(finished=False)
            raise
    if client.rank is not None:
        client.bye(finished=result.finished)
    return result


@click.command()
@click.option("--connect", required=True, help="Server address, e.g. tcp://192.0.2.1:5555.")
@click.option(
    "--metrics",
    "metrics_path",
    type=click.Path(dir_okay=False),
    required=True,
    help="JSONL of `eval` records (time, samples, accuracy, loss, updates).",
)
@click.option(
    "--interval",
    type=FiniteFloatRange(min=0.05),
    default=2.0,
    show_default=True,
    help="Seconds between two tests.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="This machine's copy of the dataset (default: the server's --data-dir).",
)
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
    """Test the model of the server at --connect every few seconds, until it stops.

    A read-only observer (it never pushes and holds no rank): it pulls the parameters,
    tests them on the dataset's test set and appends an `eval` record (with the version
    tested) to --metrics, the last one (`final: true`) on the final parameters when the
    server stops.
    """
    from minips.group.root import GROUPS
    from minips.run.assembly import PSClient

    # Retries and lost-server warnings go to stderr (the run's log for launched processes).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from minips.results.evaluator import run_evaluator
    from minips.results.metrics import MetricsLog

    with (
        PSClient(
            connect, timeout=10.0, retries=5, keys=client_keys(keys, key_name), groups=GROUPS
        ) as client,
        MetricsLog(metrics_path, start_time=t0, append=True) as metrics,
    ):
        click.echo(f"testing the model of {connect} every {interval:g} s; records: {metrics_path}")
        with sigterm_as_interrupt():  # SIGTERM says bye too, as Ctrl-C
            last = run_evaluator(client, metrics, interval, data_dir)
    if last:
        final = "final model" if last.get("final") else "last model seen"
        click.echo(
            f"test accuracy of the {final}: {last['accuracy']:.4f} (loss {last['loss']:.4f})"
        )
