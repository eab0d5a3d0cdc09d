"""Run a whole cluster on this machine with one call: `minips run`.

`run_local(config, out_dir)` prepares the run directory (minips.run.prepare) and hands it
to a `LocalRun`, which starts the server (from the run's config.json), N workers
(single-threaded BLAS) and an evaluator as separate processes on loopback, watches them,
stops the server when the workers are done, and writes the results.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from minips.classroom.web.slots import SeatWatch
from minips.errors import MinipsError
from minips.group.root import GROUPS
from minips.ops.client_retries import RetryingClient
from minips.provision import keyfiles
from minips.results.metrics import ProgressFn
from minips.results.rundir import (
    RunDir,
    final_stats,
    latest_eval,
    run_collapse,
    write_results,
)
from minips.run.commands import ProcessCommands
from minips.run.config import RunConfig
from minips.run.final_test import ensure_final_tested, let_evaluator_leave
from minips.run.group_recovery import GroupRollback, final_group_checkpoint
from minips.run.outcome import (
    crashed_workers,
    failed_workers,
    lost_workers_line,
    short_of_samples_line,
    workers_failed,
)
from minips.run.prepare import prepare_run_dir, server_links
from minips.run.processes import (
    SINGLE_THREADED_BLAS,
    Child,
    ProcessGroup,
    signals_stop_the_run,
)
from minips.run.recovery import ServerRestarts
from minips.run.refusals import Refusals
from minips.run.replicas import ReplicaSet
from minips.run.training_watch import TrainingWatch
from minips.run.wrapup import WrapUp, untested_after_interrupt
from minips.worker.client import PSClient


def run_local(
    config: RunConfig,
    out_dir: str | Path,
    eval_interval: float = 2.0,
    progress: ProgressFn | None = None,
    startup_timeout: float = 60.0,
    on_start: Callable[[str], None] | None = None,
    announce: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run a server, `config.workers` workers and an evaluator as processes; return the summary.

    The run directory's files are described in minips.results.rundir. progress: told the
    samples done as training goes (minips.results.metrics.ProgressFn). on_start(endpoint):
    called once every process is started (`minips run --dashboard` starts its page there).
    With `config.browser` = B, B of the workers are browser slots (minips.classroom.web.slots): the
    gateway is started too and `announce(line)` is told the URL to open.
    """
    run_dir = RunDir(Path(out_dir))
    config = prepare_run_dir(config, run_dir)
    with server_links(config) as links:
        server_prefix, server_host = links[0]
        if server_host is not None:  # tcp on the shaped link (ipc would go around it)
            config = replace(config, bind=f"tcp://{server_host}:*")
        run_dir.config.write_text(config.to_json())  # the server process starts from it
        run = LocalRun(
            config, run_dir, server_prefix, eval_interval, startup_timeout,
            progress=progress, on_start=on_start, announce=announce, shard_links=links[1:],
        )  # fmt: skip
        try:
            with signals_stop_the_run():
                return run.run()
        finally:
            for shard in range(config.servers):
                run_dir.shard_socket(shard).unlink(missing_ok=True)


class LocalRun(ProcessCommands, TrainingWatch):
    """One `minips run` on this machine: its config, run directory, clock and processes.

    `run()` is start() (the server, the evaluator, any browser slots, the workers, in that
    order), watch() (until training is over: minips.run.training_watch) and the shutdown
    (the server checkpoints, the evaluator, else the launcher, tests the final model:
    minips.run.final_test; every child is stopped, the results are written).
    server_prefix (--netem: `ip netns exec NS`) runs the server, and the evaluator beside
    it, behind the shaped link's far end: the evaluator's pulls then do not cross the link,
    whose rate is the workers'.
    """

    def __init__(
        self,
        config: RunConfig,
        run_dir: RunDir,
        server_prefix: list[str] | None = None,
        eval_interval: float = 2.0,
        startup_timeout: float = 60.0,
        *,
        progress: ProgressFn | None = None,
        on_start: Callable[[str], None] | None = None,
        announce: Callable[[str], None] | None = None,
        shard_links: list[tuple[list[str], str | None]] | None = None,
    ) -> None:
        self.config = config
        self.dir = run_dir
        self.server_prefix = server_prefix or []
        # A server group's shards 1..K-1: (command prefix, host) of each one's link.
        self.shard_links = shard_links or [([], None)] * (config.servers - 1)
        self.eval_interval = eval_interval
        self.startup_timeout = startup_timeout
        self.progress = progress
        self.on_start = on_start
        self.announce = announce or _to_stderr  # one line for the teacher
        self.t0 = time.monotonic()  # every process's clock origin: one time axis for all
        env = {**SINGLE_THREADED_BLAS, **os.environ, "PYTHONUNBUFFERED": "1"}
        self.processes = ProcessGroup(run_dir.logs, env)
        checkpoint = Path(config.checkpoint or "")
        self.restarts = [  # one policy per server: the root (or the one server), each shard
            ServerRestarts(run_dir, checkpoint, shard, config.servers, config.resume)
            for shard in range(config.servers)
        ]
        self.server_restarts = self.restarts[0]
        self.replicas = (  # the backup of each server it starts (minips.run.replicas)
            ReplicaSet(self.processes, run_dir.config, run_dir, self.t0, config.servers,
                       shards=len(self._server_names()))
            if config.replicas > 1 else None
        )  # fmt: skip
        self.rollback = GroupRollback.of(config.rule, self.processes, self._server_names(),
                                         self.restarts, self.announce, self.replicas)  # fmt: skip
        self.training_ended: float | None = None  # seconds after t0, once training is over
        self.stats: dict[str, Any] | None = None  # the server's latest `stats`
        # How long the run waits for its browser seats, and what it says about empty ones.
        self.seats = SeatWatch(config.browser, config.join_wait, config.empty_seats == "end")
        self._shards: tuple[int, int, int | None] = (0, config.epochs, config.max_samples)
        self._silent_since: float | None = None  # since when `stats` has had no answer
        self._shown_total = 0  # the progress's length at its last update (0: none yet)
        self.stopped_why: str | None = None  # what stopped the server before the run's end
        self.refusals = Refusals()  # workers that could not follow the run, said once each

    def run(self) -> dict[str, Any]:
        """Start, watch, shut down; write the results and return the summary. A run that
        cannot go on once started (its server crashed past recovery) still writes its
        summary, which says why it ended, then raises the MinipsError. A stop signal once
        training is over cuts the wrap-up short and keeps the results (minips.run.wrapup)."""
        failure: MinipsError | None = None
        group = None  # a server group's checkpoint, made of its shards' last files
        failed: list[Child] = []
        crashed: list[Child] = []
        wrap_up = WrapUp(self.training_over)
        try:
            with wrap_up.cut_short():
                endpoint = self.start()
                if self.on_start is not None:
                    self.on_start(endpoint)
                try:
                    with self._operator(endpoint) as operator:
                        wall = self.watch(operator)
                except MinipsError as exc:
                    failure, wall = exc, self._elapsed()
                failed = failed_workers(self.processes)  # before any is stopped
                crashed = crashed_workers(self.processes)
                if failure is None:
                    self.processes.wait("server", timeout=60)
                    for name in self._server_names()[1:]:
                        # A shard hears the root's stop at its next join (within 1 s); one
                        # that restarted and lost its join can wait out its root timeout.
                        self.processes.wait_or_stop(name, patience=3, timeout=60)
                    let_evaluator_leave(self.processes, self.dir.eval_log)
                    failure = self._crash_at_the_end()
        finally:
            self.processes.learn_ranks_from_reports(self.dir.path.glob("worker-[0-9]*.json"))
            wrap_up.finish(self.processes.stop_all)
            if self.config.servers > 1:  # every shard wrote its last file: the group's
                wrap_up.finish(self.wait_for_shards)
                group = wrap_up.finish(
                    lambda: final_group_checkpoint(
                        self.config.checkpoint, self.processes.restart_records(), self.announce
                    )
                )
        if wrap_up.interrupted:
            wall = self.training_ended or self._elapsed()
        untested = None  # the accuracy is the final model's, or why not; did workers train?
        lost = None
        if failure is None:
            with wrap_up.cut_short():
                if not wrap_up.interrupted:
                    untested = ensure_final_tested(self.config, self.dir, self.t0)
            if wrap_up.interrupted:
                untested = untested_after_interrupt(self.dir, self.config.servers)
            # After a collapse the workers' failures (their pushes refused as non-finite)
            # are its consequence: the collapse is the run's ending (exit status 3).
            collapsed = self._collapsed()
            failure = None if collapsed else workers_failed(failed, self.dir, self.config)
            lost = (
                None
                if failure or failed or collapsed
                else lost_workers_line(crashed, self.dir, self.processes.name_of)
            )
            if lost:
                self.announce(lost)
        restarts = self.processes.restart_records()
        if failure is None and not lost and not wrap_up.interrupted:
            short = short_of_samples_line(self.dir, self.config, restarts)
            if short:
                self.announce(short)
        codes, ended = self.processes.exit_codes, None if failure is None else f"error: {failure}"
        summary = wrap_up.finish(
            lambda: write_results(self.dir, self.config.rule, self.config.workers, wall, codes,
                                  restarts, ended, self._final_crash(),
                                  servers=self.config.servers, group=group,
                                  untested_why=untested, stopped_why=self.stopped_why,
                                  replication=self.replicas and self.replicas.records(),
                                  interrupted=wrap_up.note)
        )  # fmt: skip
        with wrap_up.cut_short():
            self._show_final_counts(summary)
        if failure is not None:
            raise failure
        return summary

    def _show_final_counts(self, summary: dict[str, Any]) -> None:
        """The progress's last figures are the run's: the server may exit between two
        `stats`, and its last answer then lags the summary by a step or more."""
        if self.progress is None or not self._shown_total:
            return
        latest = latest_eval(self.dir.eval_log)
        latest.update(updates=summary.get("updates", 0))
        self.progress(int(summary.get("samples", 0)), self._shown_total, latest)

    def _collapsed(self) -> bool:
        """Whether the model collapsed, as the summary will say (results.rundir.run_collapse)."""
        return bool(run_collapse(self.dir, final_stats(self.dir)[0]))

    def _crash_at_the_end(self) -> MinipsError | None:
        """The run's error when a server crashed once training was over: the model it kept
        is not the one trained (with replicas a primary's crash is a failover)."""
        if self.replicas is not None:
            return None
        for shard, name in enumerate(self._server_names()):
            line = self.restarts[shard].crashed_at_the_end(self.processes[name])
            if line is not None:
                return MinipsError(line)
        return None

    def _final_crash(self) -> dict[str, Any] | None:
        """The server's (or a shard's) crash that no restart followed, if any."""
        return next((c for c in (r.final_crash() for r in self.restarts) if c), None)

    def wait_for_shards(self) -> None:
        """Every shard of a local group is a child: stopped by now (minips launch waits
        for the job's other processes here)."""

    def _server_names(self) -> list[str]:
        """The server's child, or a group's: the root ("server") and "shard-1".."shard-K-1"."""
        return ["server", *(f"shard-{j}" for j in range(1, self.config.servers))]

    # --- starting ---------------------------------------------------------------------

    def start(self) -> str:
        """Start the server, the evaluator, any browser slots, the NumPy workers; return the
        server's address."""
        self.processes.start("server", self._server_command, self.server_restarts)
        for shard in range(1, self.config.servers):  # a group's other shards join the root
            command = functools.partial(self._shard_command, shard)
            self.processes.start(f"shard-{shard}", command, self.restarts[shard])
        endpoint = self._wait_for(self.dir.endpoint, "server")
        if self.replicas is not None:  # each primary serves once its backup joined
            self.replicas.start_backups(self.startup_timeout)
        # The evaluator first: registered before any worker trains, it sees the first and
        # (the server waits for observers when stopping) the final parameters.
        self.processes.start("evaluator", self._evaluator_command(endpoint))
        self._wait_for(self.dir.eval_log, "evaluator")
        if self.config.browser:  # before the NumPy workers: the tabs take longest to say hello
            self._start_browser_slots(endpoint)
        for index in range(self.config.workers - self.config.browser):
            # The server gives ranks in the order hellos arrive, so a process is named by its
            # start order until its rank is known.
            self.processes.start(f"worker.{index}", self._worker_command(endpoint, index))
        return endpoint

    def _start_browser_slots(self, endpoint: str) -> None:
        """Start the gateway (`minips web`), announce its URL, open headless tabs if asked."""
        from minips.classroom.web.slots import gateway_argv, headless_argv, student_url

        config = self.config
        gateway = gateway_argv(endpoint, config.listen, self.dir.web_url, config.data_dir)
        self.processes.start("gateway", gateway)
        url = self._wait_for(self.dir.web_url, "gateway")
        self.announce(f"{config.browser} browser slot(s): open {student_url(url)} in a browser")
        if config.browser_headless:
            profile = self.dir.logs / "chromium-profile"
            self.processes.start("chromium", headless_argv(url, config.browser, profile))

    def _wait_for(self, path: Path, name: str) -> str:
        """The file `name` writes once it started; an error if it or a server exits first.
        Once the backups started, a replica lost meanwhile is replaced (a primary serves
        only once a backup joined it)."""
        servers = [s for s in self._server_names() if s != name]
        replicas = self.replicas.check if self.replicas and self.replicas.started() else None
        return self.processes.wait_for_file(
            path, name, self.startup_timeout, needed=servers, meanwhile=replicas
        )

    # --- the launcher's client and clock ---------------------------------------------

    def _operator(self, endpoint: str) -> PSClient:
        """The launcher's client (`stats`, `stop`; an operator key in an authenticated run).

        Short timeouts: the server may exit (sample budget spent) while a stats request is
        in flight, and the launcher must notice that at once rather than after retries.
        """
        keys = (
            keyfiles.load_client_keys(self.config.keys, keyfiles.OPERATOR)
            if self.config.keys
            else None
        )
        return RetryingClient(endpoint, timeout=1.0, retries=0, keys=keys, groups=GROUPS)

    def _elapsed(self) -> float:
        return time.monotonic() - self.t0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
