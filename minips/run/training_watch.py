"""Following a run until training is over: the launcher's watch over its server.

A mixin of LocalRun (and so of `minips launch`'s coordinator, which narrows what training
is and which shards are its own). The launcher asks the server for `stats` every 0.2 s:
the workers' ranks, the progress, the seats, and whether the server is stopping; a server
that crashed mid-training is restarted (minips.run.recovery) or ends the run, and a
collapsed model stops it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from minips.errors import MinipsError
from minips.results.rundir import final_stats, latest_collapse, latest_eval
from minips.worker.client import PSClient, ServerUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable

    from minips.classroom.web.slots import SeatWatch
    from minips.results.metrics import ProgressFn
    from minips.results.rundir import RunDir
    from minips.run.config import RunConfig
    from minips.run.group_recovery import GroupRollback
    from minips.run.processes import Child, ProcessGroup
    from minips.run.recovery import ServerRestarts
    from minips.run.refusals import Refusals
    from minips.run.replicas import ReplicaSet

# What the server's log says once it stops training (minips.server.server): the stop begun,
# the loop ended.
SERVER_STOPPING = (" stopping (", " stopped at version ")


class TrainingWatch:
    """Watches the run's server until training is over (`watch`), from the run's state,
    which the class that mixes it in holds (LocalRun: its attributes are described there),
    as it holds the names of the servers' children (`_server_names`) and the run's clock
    (`_elapsed`)."""

    config: RunConfig
    dir: RunDir
    processes: ProcessGroup
    restarts: list[ServerRestarts]
    server_restarts: ServerRestarts
    replicas: ReplicaSet | None
    rollback: GroupRollback | None
    seats: SeatWatch
    refusals: Refusals
    progress: ProgressFn | None
    announce: Callable[[str], None]
    training_ended: float | None
    stats: dict[str, Any] | None
    stopped_why: str | None
    _shards: tuple[int, int, int | None]
    _silent_since: float | None
    _shown_total: int

    def watch(self, operator: PSClient) -> float:
        """Follow the run until training is over, stop the server; return the training time.

        Training is over when the server starts stopping (its sample budget is spent), when
        the model collapsed (the server's `stats` or the evaluator says so: the line is
        announced and the server stopped, rather than train on at chance), or when the last
        worker is done; shutdown is not training.
        """
        total = self._progress_total()
        while self._training():
            if self.replicas is not None:  # the backup took over: it is the server now
                self.replicas.check()
            server = self.processes["server"]
            if self.training_ended is None:
                self._restart_crashed_shards()
            if server.exited():
                if not self._server_exited():
                    break
            elif self.training_ended is None:
                self._follow_counters(operator, total)
            time.sleep(0.2 if self.training_ended is None else 0.1)
        server = self.processes["server"]
        if self.training_ended is None:
            # The last figures, by the seats the run ended with. A server that does not
            # answer may be exiting by itself: why, then, from its last stats.
            if server.exited() or not self._follow_counters(operator, total):
                if server.wait_exit(2.0):
                    self._note_stop(final_stats(self.dir)[0])
            self.training_ended = self.training_ended or self._elapsed()
            if not server.exited():
                _stop_server(operator, server)  # the evaluator then tests the final model
        return self.training_ended

    def training_over(self) -> bool:
        """Whether training is over, judged from what has happened rather than from the
        watch's last look (it looks every 0.2 s; a stop signal in between must find the run
        as it is): the watch saw it end, or since its last look the server said it is
        stopping or stopped (its log), or exited by itself, or the evaluator wrote its final
        record. training_ended is then set, at the moment this was found."""
        if self.training_ended is None and (self._server_done() or self._final_tested()):
            self.training_ended = self._elapsed()
        return self.training_ended is not None

    def _final_tested(self) -> bool:
        """The evaluator's last record is its final one. Asked as a signal lands, which
        may find a record half written: not final yet, rather than an error in its stead."""
        try:
            return bool(latest_eval(self.dir.eval_log).get("final"))
        except (OSError, ValueError):
            return False

    def _server_done(self) -> bool:
        """The server's log says it is stopping or stopped, or it exited cleanly."""
        server = self.processes.children.get("server")
        if server is None or server.proc is None:
            return False  # not started yet: training is not over
        if server.exited() and not server.crashed():
            return True
        try:
            text = (self.processes.logs / f"{server.log_name}.log").read_text(errors="replace")
        except OSError:
            return False
        return any(marker in text for marker in SERVER_STOPPING)

    def _training(self) -> bool:
        """A NumPy worker runs, or the run waits for a browser seat (minips.classroom.web.slots)."""
        if self.seats.end_run:
            return False  # a seat stayed empty and the teacher chose --empty-seats end
        if self.processes.running("worker"):
            return True
        return not self.processes["server"].exited() and self.seats.pending(self.stats)

    def _server_exited(self) -> bool:
        """The server is gone: a crash mid-training restarts it (minips.run.recovery) or is
        the run's error; any other exit ends training. False: stop watching (workers still
        knock at a server that has been gone for 10 s)."""
        server = self.processes["server"]
        if server.crashed() and self._backup_takes_over(0):
            return True  # the next look at the replicas makes the backup the server
        if server.crashed():
            if self.training_ended is None and self.processes.restart("server"):
                self.announce(self.server_restarts.restarts[-1].line())
                self.processes.wait_for_file(self.dir.endpoint, "server", timeout=60)
                return True
            if self.training_ended is not None:  # it crashed while it stopped: no restart;
                return False  # the run's end says what it lost (_crash_at_the_end)
            self.server_restarts.check_budget(server, self.dir.logs)
            self.processes.check_alive("server")  # raises: the crash is the run's error
        if self.training_ended is None:
            self.training_ended = self._elapsed()
            self._note_stop(final_stats(self.dir)[0])
        if self._elapsed() - self.training_ended > 10:
            self.processes.stop_all()
            return False
        return True

    def _restart_crashed_shards(self) -> None:
        """A shard 1..K-1 of a group that crashed is started again from its own checkpoint
        (minips.run.recovery) while the others keep serving; one that cannot be is the
        run's error. Under ssgd the whole group goes back to one version instead
        (minips.run.group_recovery), the root too when it is the one that crashed."""
        if self.rollback is not None and self.rollback.recover():
            return
        for shard, name in enumerate(self._server_names()[1:], start=1):
            child = self.processes[name]
            if not child.crashed() or self._backup_takes_over(shard):
                continue
            if not self.processes.restart(name):
                self.restarts[shard].check_budget(child, self.dir.logs)
                self.processes.check_alive(name)  # raises: the crash is the run's error
            self.announce(self.restarts[shard].restarts[-1].line())

    def _backup_takes_over(self, shard: int) -> bool:
        """Whether shard `shard`'s crashed primary has a backup running, which the next look
        at the replicas (`ReplicaSet.check`) makes the primary: it must not be restarted
        from its checkpoint meanwhile (it died after that look, before this one)."""
        return self.replicas is not None and self.replicas.backs_up(shard)

    def _follow_counters(self, operator: PSClient, total: int) -> bool:
        """Ask the server for `stats`: learn the workers' ranks, notice the server stopping,
        show progress; False when it did not answer. MinipsError when it has not answered
        for 30 s."""
        try:
            stats = operator.stats()
        except ServerUnavailable:
            self._silent_since = self._silent_since or time.monotonic()
            if time.monotonic() - self._silent_since > 30:
                raise MinipsError("the server stopped answering; see its log") from None
            return False  # busy, or exiting (seen on the next turn): ask again
        self._silent_since, self.stats = None, stats
        self.processes.learn_ranks(stats)
        for notice in self.seats.update(stats):
            self.announce(notice)
        for line in self.refusals.update(stats):
            self.announce(line)
        if stats.get("stopping"):
            self.training_ended = self._elapsed()
            self._note_stop(stats)
        elif (collapse := stats.get("collapse") or latest_collapse(self.dir.eval_log)) is not None:
            self.training_ended = self._elapsed()
            self.announce(collapse["line"])
            _stop_server(operator, self.processes["server"])
            return True
        if self.progress is not None:  # a stopping server's counts too: the bar's last figures
            latest = latest_eval(self.dir.eval_log)
            latest.update(updates=stats.get("updates", 0), waiting=self.seats.waiting(stats))
            taken = self.seats.progress_total(stats, *self._shards)  # by the seats taken
            self._shown_total = total if taken is None else taken
            self.progress(int(stats.get("samples", 0)), self._shown_total, latest)
        return True

    def _note_stop(self, stats: dict[str, Any]) -> None:
        """A server found stopping before the launcher asked: by its own end (its budget
        spent, every worker finished), or cut short by a signal or another's operator key,
        which the summary then says (`stopped_why`) instead of "finished"."""
        if stats.get("stopping") and stats.get("stop_planned") is False:
            self.stopped_why = stats.get("stop_why") or "an unknown reason"

    def _progress_total(self) -> int:
        """The progress bar's length in samples (0 without a bar: the data is not loaded)."""
        if self.progress is None:
            return 0
        from minips.data import load_dataset
        from minips.provision.locations import find_data

        train_labels = load_dataset(
            self.config.dataset, self.config.data_dir, find=find_data
        ).y_train
        self._shards = (len(train_labels), self.config.epochs, self.config.max_samples)
        total = self.config.epochs * len(train_labels)
        return min(total, self.config.max_samples) if self.config.max_samples else total


def _stop_server(operator: PSClient, server: Child, attempts: int = 10) -> None:
    """Send `stop` (the evaluator then tests the final model and leaves)."""
    for _ in range(attempts):
        try:
            operator.stop()
            return
        except ServerUnavailable:
            if server.exited():
                return  # it stopped by itself meanwhile: fine
    raise MinipsError("the server does not answer `stop`")
