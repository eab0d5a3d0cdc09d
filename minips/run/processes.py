"""The child processes of a local run: each started, watched, restarted and stopped here.

A `Child` is one supervised process: its name, the command of each of its starts
(`generation` 0, then one per restart, so a restart may be started differently: a server
resumes from its checkpoint), its log file and its `RestartPolicy` (None: a crash is the
run's error). A `ProcessGroup` holds every child of a run, so stopping the run stops them
all, in whatever phase it is. `MINIPS` is a child's command line, `SINGLE_THREADED_BLAS`
the environment a worker runs in.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from minips.errors import MinipsError
from minips.held_signals import end_with_the_launcher, held_during_start, released_in_child

Command = Callable[[int], list[str]]  # generation -> argv

# Environment for worker processes: one BLAS thread each, so N workers on 2 cores do not
# oversubscribe (user settings win).
SINGLE_THREADED_BLAS = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
MINIPS = (sys.executable, "-m", "minips")  # the command line of a child process


class RestartPolicy(Protocol):
    """Whether a crashed child is started again, and what is done first."""

    def allows(self, child: Child) -> bool:
        """Whether `child`, which crashed, may be started again."""
        ...

    def prepare(self, child: Child) -> None:
        """Make ready for the next generation (and record the restart)."""
        ...

    def records(self) -> list[dict[str, Any]]:
        """One JSON-ready record per restart done (the run's summary lists them)."""
        ...


class Child:
    """One child process of a run, logging to logs/<name>.log (a restart: <name>-<N>.log)."""

    def __init__(self, name: str, command: Command, policy: RestartPolicy | None = None) -> None:
        self.name = name
        self.command = command
        self.policy = policy
        self.generation = -1  # not started yet
        self.proc: subprocess.Popen | None = None
        self.log_as: str | None = None  # its log's name when another child started it
        self.stopped = False  # this generation was stopped by the launcher (stop_all)

    @property
    def log_name(self) -> str:
        if self.log_as is not None:
            return self.log_as
        return self.name if self.generation <= 0 else f"{self.name}-{self.generation}"

    def start(self, logs: Path, env: dict[str, str]) -> None:
        """Start the next generation (the first, or a restart after the last one exited)."""
        self.generation += 1
        self.log_as, self.stopped = None, False
        # Held: a stop signal meanwhile is handled once self.proc names the child to stop.
        with open(logs / f"{self.log_name}.log", "w") as log, held_during_start():
            self.proc = subprocess.Popen(
                self.command(self.generation),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=released_in_child(end_with_the_launcher()),
            )

    def code(self) -> int | None:
        """Its exit code (None: still running)."""
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.poll()

    def exited(self) -> bool:
        return self.code() is not None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL it (stopped by SIGSTOP too) and reap it."""
        assert self.proc is not None, f"{self.name} was never started"
        self.proc.kill()
        reap(self.proc)

    def wait_exit(self, timeout: float) -> bool:
        """Whether it exits within `timeout` seconds (it keeps running otherwise)."""
        deadline = time.monotonic() + timeout
        while not self.exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.exited()

    def crashed(self) -> bool:
        """Exited with an error or a signal (exit 0 is a clean stop)."""
        return self.code() not in (None, 0)

    def last_line(self, logs: Path) -> str:
        lines = (logs / f"{self.log_name}.log").read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(no output)"


class ProcessGroup:
    """Every child process of a local run, by name, and how each one ended."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs = logs
        self.env = env
        self.children: dict[str, Child] = {}
        self.exit_codes: dict[str, int | None] = {}  # filled by stop_all
        self._rank_names: dict[int, str] = {}  # pid -> "worker-<rank>"

    def start(
        self, name: str, command: Command | list[str], policy: RestartPolicy | None = None
    ) -> Child:
        """Start a child; a plain argv is the same command for every start."""
        run = command if callable(command) else (lambda _generation, argv=command: argv)
        child = self.children[name] = Child(name, run, policy)
        child.start(self.logs, self.env)
        return child

    def restart(self, name: str) -> bool:
        """Start the next generation of a child that crashed, if its policy allows it."""
        child = self.children[name]
        assert child.crashed(), f"{name} did not crash"
        if child.policy is None or not child.policy.allows(child):
            return False
        child.policy.prepare(child)
        child.start(self.logs, self.env)
        return True

    def restart_records(self) -> list[dict[str, Any]]:
        """Every restart of every child, in the order of the children's starts."""
        return [
            r for child in self.children.values() if child.policy for r in child.policy.records()
        ]

    def __getitem__(self, name: str) -> Child:
        return self.children[name]

    def running(self, prefix: str) -> bool:
        """Whether a child whose name starts with `prefix` still runs."""
        return any(
            not child.exited() for name, child in self.children.items() if name.startswith(prefix)
        )

    def check_alive(self, name: str) -> None:
        """MinipsError naming the child, its exit code and its last words, once it exited."""
        child = self.children[name]
        code = child.code()
        if code is not None:
            # Its last line is usually its own "error: ..." line: not "error: ... error:".
            last = child.last_line(self.logs).removeprefix("error: ")
            raise MinipsError(f"{name} exited with code {code}: {last}")

    def wait_for_file(
        self,
        path: Path,
        name: str,
        timeout: float,
        needed: Iterable[str] = (),
        meanwhile: Callable[[], None] | None = None,
    ) -> str:
        """The text of `path` once child `name` wrote it; MinipsError if it exits first, if a
        child it `needed` (the server its clients start against) exits meanwhile, or if the
        timeout passes. `meanwhile` is called at each look (a server's replicas looked
        after: one lost while the others start is replaced)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and path.read_text().strip():
                return path.read_text().strip()
            if meanwhile is not None:
                meanwhile()
            for child in (name, *needed):
                self.check_alive(child)
            time.sleep(0.05)
        raise MinipsError(f"{name} did not start within {timeout:g} s; see {self.logs}")

    def wait(self, name: str, timeout: float) -> None:
        """Wait for a child to leave by itself; SIGKILL it after `timeout` seconds."""
        proc = self.children[name].proc
        assert proc is not None
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()

    def wait_or_stop(self, name: str, patience: float, timeout: float) -> None:
        """Wait `patience` s for a child to leave by itself, then SIGTERM it (a server takes
        that as `stop`); SIGKILL it after `timeout` s more."""
        proc = self.children[name].proc
        assert proc is not None
        try:
            proc.wait(patience)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            self.wait(name, timeout)

    def stop_all(self, grace: float = 5.0) -> None:
        """SIGTERM every child still running, then SIGKILL what ignores it for `grace`
        seconds: none left behind, also when Ctrl-C comes meanwhile (the stop finishes,
        then KeyboardInterrupt goes on). Records every child's exit code."""
        try:
            self._stop_all(grace)
        except KeyboardInterrupt:  # the signal came during this very cleanup: finish it
            self._stop_all(grace)
            raise

    def _stop_all(self, grace: float) -> None:
        procs = {name: child.proc for name, child in self.children.items() if child.proc}
        for name, proc in procs.items():
            if proc.poll() is None:
                self.children[name].stopped = True  # its exit code is the launcher's doing
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                reap(proc)
        self.exit_codes = {
            self.name_of(self.children[name]): proc.returncode for name, proc in procs.items()
        }

    def name_of(self, child: Child) -> str:
        """A child's name in the summary: a worker's by its rank once known (worker-R)."""
        return self._rank_names.get(child.pid, child.name) if child.proc else child.name

    def learn_ranks(self, stats: dict[str, Any]) -> None:
        """Name worker processes by the ranks the server gave them (from its `stats`)."""
        for entry in stats.get("workers", []):
            pid = (entry.get("info") or {}).get("pid")
            if not entry.get("observer") and pid is not None:
                self._rank_names[pid] = f"worker-{entry['rank']}"

    def learn_ranks_from_reports(self, reports: Iterable[Path]) -> None:
        """Workers that finished before the launcher saw them in `stats` name their rank in
        their reports (worker-R.json); a killed one was seen in `stats` (it registered
        before it trained)."""
        for path in reports:
            try:
                report = json.loads(path.read_text())
                self.learn_ranks({"workers": [{"rank": report["rank"], "info": report}]})
            except (OSError, ValueError, KeyError, TypeError):  # damaged: it names no rank
                continue


def reap(proc: subprocess.Popen, patience: float = 5.0) -> None:
    """Wait for a killed child's exit without `Popen.wait()`'s blocking lock: a Ctrl-C that
    lands in an earlier `wait()` just after it took that lock leaves the lock held for good,
    and the next `wait()` blocks forever (a launcher stopping its run hung there). So wait
    with a timeout (it never blocks on the lock), then reap the process directly."""
    try:
        proc.wait(patience)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ChildProcessError):  # reaped meanwhile
            _, status = os.waitpid(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)


@contextlib.contextmanager
def signals_stop_the_run() -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`, a scheduler) and SIGINT sent to the launcher alone stop
    the run as Ctrl-C in its terminal does: KeyboardInterrupt in the launcher, whose cleanup
    stops every child it started. Signals after the first are ignored, so that cleanup
    (a few seconds at most: ProcessGroup.stop_all) always finishes. Only in the main
    thread (the only one Python delivers signals to)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: object) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {
        signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
