"""`minips run` and `minips server` (their clients, `worker` and `evaluate`: client_cmd.py).

Thin: both take their options from the run's configuration (minips.run.config) and call
minips.run.launch / minips.run.build (`server --config FILE`: a run's config.json). Every
option can also be given as an environment variable MINIPS_<COMMAND>_<OPTION>, e.g.
MINIPS_RUN_WORKERS (but `server --config FILE` takes the file and the command line only).
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from minips.cli.click_options import config_options
from minips.cli.numbers import FiniteFloatRange
from minips.cli.progress import ProgressBar
from minips.errors import ConfigError
from minips.results.report_text import plural
from minips.results.versions import (
    accuracy_line,
    interrupted_line,
    kept_after_interrupt,
    stopped_line,
    untested_line,
)
from minips.run.config import RunConfig

DEFAULT_OUT = "runs/latest"  # replaced by every run that does not choose another --out
COLLAPSED = 3  # `minips run`'s exit status when the model collapsed (minips.ops.collapse)
# Its exit status when a stop signal cut its wrap-up short (minips.run.wrapup): a Ctrl-C's.
INTERRUPTED = 130


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
        help="Reuse --out even if it holds a previous run (its files are removed; "
        "the files this run reads, and a folder that holds no run, are left alone).",
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
        from minips.run.prepare import check_run_can_start, claim_run_dir, run_inputs

        config = config_class.from_options(options)
        config.validate()  # before anything is removed
        check_run_can_start(config, dashboard_listen if dashboard else None)
        inputs = run_inputs(config)  # kept: --resume, --plan, ...
        run_lock = claim_run_dir(Path(out), force or out == DEFAULT_OUT, keep=inputs)
        from minips.classroom.dashboard import RunDashboard

        keys = config.keys or (Path(out) / "keys" if config.auth else None)  # the run's keys
        listen = dashboard_listen if dashboard else None
        # OUT is this run's while it lives (minips.run.runlock)
        with run_lock, RunDashboard(listen, Path(out), keys) as page:

            def on_start(endpoint: str) -> None:
                if url := page.start(endpoint):
                    click.echo(f"dashboard: {url}")
                    click.echo(f"projector view: {url}?projector")

            hooks = {"on_start": on_start, "announce": click.echo}
            try:
                if quiet:
                    summary = run_local(config, out, eval_interval, **hooks)
                else:
                    with ProgressBar() as bar:
                        summary = run_local(
                            config, out, eval_interval, progress=bar.update, **hooks
                        )
            except KeyboardInterrupt:  # before training was over: every child is stopped
                kept = kept_after_interrupt(config.checkpoint or Path(out) / "checkpoint.npz")
                click.echo(f"interrupted: {kept}", err=True)
                raise SystemExit(INTERRUPTED) from None
            page.finish(summary)  # the page shows "finished" and the summary, and keeps them
        click.echo(
            f"{summary['samples']} samples, {summary['updates']} updates in "
            f"{summary['wall_s']:.1f} s; staleness mean {summary['staleness_mean'] or 0:.2f} "
            f"max {summary['staleness_max']}"
        )
        click.echo(f"run directory: {out}")
        click.echo(accuracy_line(summary))
        if untested := untested_line(summary):  # the accuracy is of an earlier model: say so
            click.echo(f"warning: {untested}", err=True)
        if stopped := stopped_line(summary):  # cut short: fewer samples than planned
            click.echo(f"warning: {stopped}", err=True)
        if interrupted := interrupted_line(summary):  # Ctrl-C once training was over
            click.echo(f"warning: {interrupted}", err=True)
            raise SystemExit(INTERRUPTED)
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
        from minips.run.runlock import server_locks

        logging.basicConfig(
            level=logging.INFO if verbose or endpoint_file else logging.WARNING,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
        config = server_config(config_class, config_file, options)
        # A run directory it writes is its own while it serves; a launcher's server (an
        # endpoint file to write) or a joining shard holds it beside its launcher.
        launched = endpoint_file is not None or bool(config.root or config.backup_of)
        with server_locks([config_file, config.checkpoint], launched):
            serve(config, endpoint_file, updates_log, t0, verbose)

    return server


def serve(
    config: RunConfig,
    endpoint_file: str | None,
    updates_log: str | None,
    t0: float | None,
    verbose: bool,
) -> None:
    """`minips server`'s work once its run directories are held: serve `config` (a whole
    group here, or one server or shard) until stopped, then print its summary line."""
    from minips.ops.mixed_resume import mixed_checkpoint_line
    from minips.ops.signals import serve_forever
    from minips.results.metrics import MetricsLog
    from minips.results.whole_file import write_whole
    from minips.run.build import join_root, make_server, server_summary

    if config.servers > 1 and config.shard < 0 and not config.root:  # all on this machine
        from minips.run.servergroup import serve_group_here

        if config.replicas > 1 or config.backup_of:
            raise ConfigError(
                "--replicas 2 with --servers K: serve each shard's pair with --shard J "
                "(`minips run --servers K --replicas 2` starts them all)"
            )

        serve_group_here(config, endpoint_file, updates_log, t0, verbose)
        return
    from minips.run.replicas import serve_replica

    if config.backup_of:  # a backup replica (docs/protocol.md 17): its primary joined the root
        click.echo(server_summary(serve_replica(config, endpoint_file, updates_log, t0)))
        return
    config, joiner = join_root(config, on_wait=lambda line: click.echo(line, err=True))
    if config.servers > 1:  # a launched shard names its files by the index it got
        updates_log = updates_log and updates_log.replace("{shard}", str(config.shard))
        endpoint_file = endpoint_file and endpoint_file.replace("{shard}", str(config.shard))
    if config.replicas > 1:  # a primary replica (a shard's: --replicas from its root's run)
        ps = serve_replica(config, endpoint_file, updates_log, t0, joiner)
        click.echo(server_summary(ps))
        return
    with MetricsLog(updates_log, start_time=t0) as updates:

        def on_update(record: dict[str, Any]) -> None:
            record = {key: value for key, value in record.items() if key != "time"}
            updates.write("update", **record)

        ps = make_server(config, on_update=on_update, joiner=joiner)
        # Said before the start line, which is what a launcher (or a user) waits for.
        if config.resume and not config.root:  # a group's shards: their root says it
            if mixed := mixed_checkpoint_line(config.resume):
                click.echo(f"warning: {mixed}", err=True)
        click.echo(
            f"minips server on {ps.endpoint}, rule {config.rule}, "
            f"{plural(config.workers, 'worker')}"
        )
        if ps.ops.checkpoints.said:  # the model at its checkpoint path: resumed or kept
            click.echo(ps.ops.checkpoints.said)
        if endpoint_file:  # whole or not at all: the launcher never reads half an address
            write_whole(endpoint_file, ps.endpoint + "\n")
        # A shard that stopped ends as stopped: its root's SIGTERM on the shard's way out
        # (it stops a shard that already stopped on its word) would end it as one killed.
        # A lone server keeps Ctrl-C to the end: its user may need it if the exit hangs.
        serve_forever(ps, after=signal.SIG_IGN if config.root else None)
        updates.write("server", stats=ps.stats())
    click.echo(server_summary(ps))


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
