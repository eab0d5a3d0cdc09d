"""`minips run`, `minips server`, `minips worker` and `minips evaluate`.

Thin: `run` and `server` take their options from the run's configuration (minips.run.config)
and call minips.run.launch / minips.run.build (`server --config FILE`: a run's config.json);
`worker` and `evaluate` make a client and call minips.worker.worker / minips.worker.evaluator.
Every option can also be given as an environment variable MINIPS_<COMMAND>_<OPTION>, e.g.
MINIPS_WORKER_CONNECT (but `server --config FILE` takes the file and the command line only).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from minips.cli.numbers import BoundedIntRange, FiniteFloatRange
from minips.cli.options import config_options
from minips.cli.progress import ProgressBar
from minips.run.config import RunConfig
from minips.run.report_text import plural

DEFAULT_OUT = "runs/latest"  # replaced by every run that does not choose another --out
COLLAPSED = 3  # `minips run`'s exit status when the model collapsed (minips.server.collapse)


if TYPE_CHECKING:
    from minips.protocol.auth import ClientKeys


def run_command(config_class: type[RunConfig] = RunConfig) -> click.Command:
    """`minips run`, its options those of `config_class` that `run` takes."""

    @click.command("run")
    @config_options(config_class, "run")
    @click.option(
        "--out",
        type=click.Path(file_okay=False),
        default=DEFAULT_OUT,
        show_default=True,
        help="Run directory.",
    )
    @click.option(
        "--eval-interval",
        type=FiniteFloatRange(min=0.1),
        default=2.0,
        show_default=True,
        help="Seconds between evaluations of the model.",
    )
    @click.option(
        "--force",
        is_flag=True,
        help="Reuse --out even if it holds a previous run (its files are removed).",
    )
    @click.option(
        "--dashboard",
        is_flag=True,
        help="Serve a live page of the run (its URL is printed) while it trains.",
    )
    @click.option(
        "--dashboard-listen",
        default="127.0.0.1:8050",
        show_default=True,
        help="HOST:PORT of the --dashboard page (port 0: any free port).",
    )
    @click.option("--quiet", is_flag=True, help="No progress bar.")  # fmt: skip
    def run(
        out: str,
        eval_interval: float,
        force: bool,
        dashboard: bool,
        dashboard_listen: str,
        quiet: bool,
        **options: Any,
    ) -> None:
        """Run a server, N workers and an evaluator on this machine, as processes.

        With no options: lenet5 on the bundled sample with 2 workers, rule dana-gap.
        Writes OUT/config.json, metrics.jsonl, summary.json and checkpoint.npz. OUT must be
        new or empty (the default, runs/latest, is replaced by each run; --force replaces
        another). A model that collapsed (diverged, or at chance after a warm-up) stops the
        run early, says so in one line, and the exit status is 3.
        """
        from minips.run.launch import run_local
        from minips.run.rundir import claim_run_dir

        config = config_class.from_options(options)
        config.validate()  # before anything is removed
        resume = Path(config.resume) if config.resume else None
        claim_run_dir(Path(out), force or out == DEFAULT_OUT, keep=resume)
        from minips.dashboard import RunDashboard

        keys = config.keys or (Path(out) / "keys" if config.auth else None)  # the run's keys
        with RunDashboard(dashboard_listen if dashboard else None, Path(out), keys) as page:

            def on_start(endpoint: str) -> None:
                if url := page.start(endpoint):
                    click.echo(f"dashboard: {url}")

            hooks = {"on_start": on_start, "announce": click.echo}
            if quiet:
                summary = run_local(config, out, eval_interval, **hooks)
            else:
                with ProgressBar() as bar:
                    summary = run_local(config, out, eval_interval, progress=bar.update, **hooks)
            page.finish(summary)  # the page shows "finished" and the summary, and keeps them
        click.echo(
            f"{summary['samples']} samples, {summary['updates']} updates in "
            f"{summary['wall_s']:.1f} s; staleness mean {summary['staleness_mean'] or 0:.2f} "
            f"max {summary['staleness_max']}"
        )
        click.echo(f"run directory: {out}")
        click.echo(f"test accuracy: {summary['accuracy']:.4f}")
        if summary.get("collapse"):
            click.echo(f"stopped early, exit status {COLLAPSED}: {summary['collapse']['line']}")
            raise SystemExit(COLLAPSED)

    return run


def server_command(config_class: type[RunConfig] = RunConfig) -> click.Command:
    """`minips server`, its options those of `config_class` that `server` takes."""

    @click.command("server")
    @click.option(
        "--config", "config_file", type=click.Path(dir_okay=False, exists=True),
        help="Serve the configuration in this file (a run's config.json); options given "
        "beside it change it.",
    )  # fmt: skip
    @config_options(config_class, "server")
    @click.option("--endpoint-file", type=click.Path(dir_okay=False), hidden=True)
    @click.option(
        "--updates-log", type=click.Path(dir_okay=False), help="JSONL of applied updates."
    )
    @click.option("--t0", type=float, default=None, hidden=True)
    @click.option("--verbose", "-v", is_flag=True)  # fmt: skip
    def server(
        config_file: str | None,
        endpoint_file: str | None,
        updates_log: str | None,
        t0: float | None,
        verbose: bool,
        **options: Any,
    ) -> None:
        """Serve the model to workers until stopped (Ctrl-C, SIGTERM, or a `stop` request)."""
        from minips.run.build import join_root, make_server, server_summary
        from minips.run.metrics import MetricsLog

        logging.basicConfig(
            level=logging.INFO if verbose or endpoint_file else logging.WARNING,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
        config = server_config(config_class, config_file, options)
        if config.servers > 1 and config.shard < 0 and not config.root:  # all on this machine
            from minips.run.servergroup import serve_group_here

            serve_group_here(config, endpoint_file, updates_log, t0, verbose)
            return
        config, joiner = join_root(config, on_wait=lambda line: click.echo(line, err=True))
        if config.servers > 1:  # a launched shard names its files by the index it got
            updates_log = updates_log and updates_log.replace("{shard}", str(config.shard))
            endpoint_file = endpoint_file and endpoint_file.replace("{shard}", str(config.shard))
        with MetricsLog(updates_log, start_time=t0) as updates:

            def on_update(record: dict[str, Any]) -> None:
                record = {key: value for key, value in record.items() if key != "time"}
                updates.write("update", **record)

            ps = make_server(config, on_update=on_update, joiner=joiner)
            click.echo(
                f"minips server on {ps.endpoint}, rule {config.rule}, "
                f"{plural(config.workers, 'worker')}"
            )
            if endpoint_file:
                tmp = Path(endpoint_file + ".tmp")
                tmp.write_text(ps.endpoint + "\n")
                tmp.replace(endpoint_file)  # atomic: the launcher never reads half an address
            ps.serve_forever()
            updates.write("server", stats=ps.stats())
        click.echo(server_summary(ps))

    return server


def server_config(
    config_class: type[RunConfig], config_file: str | None, options: dict[str, Any]
) -> RunConfig:
    """The config `minips server` serves: the options', or --config's file changed by the
    options given on the command line (not by their defaults, nor by MINIPS_SERVER_*
    variables, which would silently change a run's recorded configuration)."""
    if config_file is None:
        return config_class.from_options(options)
    context = click.get_current_context()
    given = {
        name: value
        for name, value in options.items()
        if context.get_parameter_source(name) is ParameterSource.COMMANDLINE
    }
    return config_class.from_options(given, base=config_class.from_json(config_file))


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
    from minips.protocol.auth import load_client_keys

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
    report: str | None,
    bandwidth: str | None,
    trace: str | None,
    quiet: bool,
    keys: str | None,
    key_name: str,
) -> None:
    """Train here for the server at --connect (everything else comes from it)."""
    from minips.worker.client import PSClient

    # Retries and lost-server warnings go to stderr (the run's log for launched processes).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from minips.worker.netlimit import parse_rate
    from minips.worker.trace import open_trace
    from minips.worker.worker import summary_line, write_report

    if bandwidth:
        parse_rate(bandwidth)  # a bad rate: one line, before connecting
    with PSClient(
        connect, timeout=timeout, worker_id=worker_id, keys=client_keys(keys, key_name)
    ) as client:
        click.echo(f"worker on {socket.gethostname()}: joining {connect} ...")

        def joined(report: Any, world_size: int) -> None:
            click.echo(f"joined as rank {report.rank} of {world_size} (host {report.host})")

        extras = {"bandwidth": bandwidth, "trace": open_trace(trace), "on_join": joined}
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
    from minips.worker.client import ServerError
    from minips.worker.worker import Worker

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
            if client.rank is not None:
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
    tests them on the dataset's test set and appends an `eval` record to --metrics, the
    last one (`final: true`) on the final parameters when the server stops.
    """
    from minips.worker.client import PSClient

    # Retries and lost-server warnings go to stderr (the run's log for launched processes).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from minips.run.metrics import MetricsLog
    from minips.worker.evaluator import run_evaluator

    with (
        PSClient(connect, timeout=10.0, retries=5, keys=client_keys(keys, key_name)) as client,
        MetricsLog(metrics_path, start_time=t0) as metrics,
    ):
        click.echo(f"testing the model of {connect} every {interval:g} s; records: {metrics_path}")
        last = run_evaluator(client, metrics, interval, data_dir)
    if last:
        final = "final model" if last.get("final") else "last model seen"
        click.echo(
            f"test accuracy of the {final}: {last['accuracy']:.4f} (loss {last['loss']:.4f})"
        )
