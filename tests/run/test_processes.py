"""A run's child processes (minips.run.processes), with real processes: stopping every
child whatever it does with SIGTERM, the log of each start, the restart budget, the names
of the exit codes, and the launcher's signal handling in a process of its own."""

import signal
import subprocess
import sys
import textwrap
import threading
import time

from minips.errors import MinipsError
from minips.run.processes import Child, ProcessGroup

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"  # noqa: E501
SLEEPS = "import time; print('up', flush=True); time.sleep(60)"


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _wait_for_line(group: ProcessGroup, name: str, text: str) -> None:
    deadline = time.monotonic() + 30
    log = group.logs / f"{group[name].log_name}.log"
    while text not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"{name} never printed {text!r}"
        time.sleep(0.02)


def test_stop_all_stops_a_child_that_ignores_sigterm_and_one_that_does_not(tmp_path):
    group = ProcessGroup(tmp_path, env={})
    group.start("stubborn", _python(IGNORES_TERM))
    group.start("polite", _python(SLEEPS))
    _wait_for_line(group, "stubborn", "up")  # its handler is in place
    _wait_for_line(group, "polite", "up")
    started = time.monotonic()
    group.stop_all(grace=0.5)
    assert group.exit_codes == {"stubborn": -signal.SIGKILL, "polite": -signal.SIGTERM}
    assert not group.running("")
    assert time.monotonic() - started < 10


def test_a_wait_lock_a_ctrl_c_left_held_does_not_hang_the_stop(tmp_path):
    """A Ctrl-C that lands in `Popen.wait()` just after it took its lock (a `with` whose
    `__exit__` never runs) leaves that lock held, and a later blocking `wait()` never
    returns: killing and stopping children must not wait on it."""
    group = ProcessGroup(tmp_path, env={})
    group.start("stubborn", _python(IGNORES_TERM))
    group.start("killed", _python(SLEEPS))
    _wait_for_line(group, "stubborn", "up")
    _wait_for_line(group, "killed", "up")
    for name in ("stubborn", "killed"):
        group[name].proc._waitpid_lock.acquire()  # as such a Ctrl-C leaves it

    def kill_then_stop_all() -> None:
        group["killed"].kill()
        group.stop_all(grace=0.2)

    stopping = threading.Thread(target=kill_then_stop_all, daemon=True)
    stopping.start()
    stopping.join(30)
    assert not stopping.is_alive(), "the stop waits on a lock no one will release"
    assert group["killed"].proc.returncode == -signal.SIGKILL
    assert group.exit_codes["stubborn"] == -signal.SIGKILL


class Budget:
    """A restart policy allowing `n` restarts, recording each."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, []

    def allows(self, child: Child) -> bool:
        return len(self.done) < self.n

    def prepare(self, child: Child) -> None:
        self.done.append({"generation": child.generation, "code": child.code()})

    def records(self) -> list[dict]:
        return list(self.done)


def test_a_needed_child_that_exits_while_another_starts_is_the_error_at_once(tmp_path):
    """A server stopped (exit 0: a SIGTERM it handled) while the evaluator starts: the wait
    ends with the server's exit and last words, not the evaluator's start timeout."""
    group = ProcessGroup(tmp_path, env={})
    group.start("server", _python("print('server stopped: 0 updates')"))
    group.start("evaluator", _python(SLEEPS))
    started = time.monotonic()
    try:
        group.wait_for_file(tmp_path / "never", "evaluator", timeout=30, needed=["server"])
    except MinipsError as exc:
        assert str(exc) == "server exited with code 0: server stopped: 0 updates", exc
    else:
        raise AssertionError("the wait outlived the server")
    finally:
        group.stop_all(grace=0.5)
    assert time.monotonic() - started < 10  # at once, not after the 30 s timeout


def test_restarts_within_the_budget_each_with_its_own_log(tmp_path):
    group = ProcessGroup(tmp_path, env={})
    crash = lambda generation: _python(f"print('start {generation}'); raise SystemExit(3)")  # noqa: E731
    child = group.start("server", crash, Budget(2))
    for generation in range(3):
        child.proc.wait(30)
        assert child.crashed() and child.generation == generation
        assert group.restart("server") is (generation < 2)
    assert child.generation == 2
    logs = {path.name: path.read_text() for path in tmp_path.glob("server*.log")}
    assert logs == {
        "server.log": "start 0\n",
        "server-1.log": "start 1\n",
        "server-2.log": "start 2\n",
    }
    assert group.restart_records() == [{"generation": 0, "code": 3}, {"generation": 1, "code": 3}]
    assert "exited with code 3: start 2" in _check_alive_error(group, "server")


def _check_alive_error(group: ProcessGroup, name: str) -> str:
    try:
        group.check_alive(name)
    except Exception as exc:  # MinipsError naming the child and its last words
        return str(exc)
    raise AssertionError("check_alive said nothing of a dead child")


def test_a_child_without_policy_is_never_restarted(tmp_path):
    group = ProcessGroup(tmp_path, env={})
    child = group.start("worker-x", _python("raise SystemExit(1)"))
    child.proc.wait(30)
    assert group.restart("worker-x") is False and child.generation == 0


def test_exit_codes_are_named_by_the_ranks_the_server_gave_not_the_observers(tmp_path):
    group = ProcessGroup(tmp_path, env={})
    first = group.start("worker-a", _python(SLEEPS))
    second = group.start("worker-b", _python(SLEEPS))
    evaluator = group.start("evaluator", _python(SLEEPS))
    group.learn_ranks({"workers": [
        {"rank": 1, "observer": False, "info": {"pid": first.proc.pid}},
        {"rank": 0, "observer": False, "info": {"pid": second.proc.pid}},
        {"rank": 2, "observer": True, "info": {"pid": evaluator.proc.pid}},
    ]})  # fmt: skip
    group.stop_all(grace=5)
    assert set(group.exit_codes) == {"worker-1", "worker-0", "evaluator"}


LAUNCHER = textwrap.dedent(
    """
    import os, signal, time
    from minips.run.processes import signals_stop_the_run
    with signals_stop_the_run():
        try:
            os.kill(os.getpid(), signal.{first})
            time.sleep(10)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # signals during the cleanup are ignored
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            print("cleaned up", flush=True)
    print("handlers", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    """
)


def test_sigterm_and_sigint_interrupt_the_launcher_once_and_spare_its_cleanup():
    for first in ("SIGTERM", "SIGINT"):
        done = subprocess.run(_python(LAUNCHER.format(first=first)), capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[:3] == ["interrupted", "cleaned up", "handlers True"]


def test_a_report_being_written_as_the_run_stops_names_no_rank_and_stops_nothing(tmp_path):
    """The launcher reads the workers' reports as the run stops; one found empty (its
    worker still writing it) or damaged is passed over, not a traceback that leaves the
    run's processes running."""
    (tmp_path / "worker-0.json").write_text("")
    (tmp_path / "worker-1.json").write_text('{"rank": 1, "pid": 4242}\n')
    (tmp_path / "worker-2.json").write_text('["not a report"]\n')
    processes = ProcessGroup(tmp_path, {})
    processes.learn_ranks_from_reports(sorted(tmp_path.glob("worker-*.json")))
    assert processes._rank_names == {4242: "worker-1"}


# Stops on SIGTERM after a second's work, as a server writing its final checkpoint does.
SLOW_STOP = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0))); print('up', flush=True); time.sleep(60)"  # noqa: E501


def test_stop_all_gives_a_child_its_grace_to_finish_its_stop(tmp_path):
    group = ProcessGroup(tmp_path, env={})
    group.start("server", _python(SLOW_STOP))
    _wait_for_line(group, "server", "up")
    group.stop_all(grace=10)
    assert group.exit_codes == {"server": 0}  # its own stop, not the SIGKILL after the grace


def test_wait_or_stop_sends_sigterm_before_it_kills(tmp_path):
    group = ProcessGroup(tmp_path, env={})
    group.start("server", _python(SLOW_STOP))
    _wait_for_line(group, "server", "up")
    group.wait_or_stop("server", patience=0.2, timeout=10)
    assert group["server"].code() == 0  # stopped as on `stop`: its model kept


def test_a_file_created_empty_is_waited_for_until_it_is_written(tmp_path):
    """A child that creates its address file, then writes it: the wait returns what it
    wrote, never the empty file in between."""
    path = tmp_path / "endpoint"
    write = f"import time; open({str(path)!r}, 'w').close(); time.sleep(0.5); open({str(path)!r}, 'w').write('tcp://127.0.0.1:5555\\n'); time.sleep(60)"  # noqa: E501
    group = ProcessGroup(tmp_path, env={})
    group.start("server", _python(write))
    try:
        assert group.wait_for_file(path, "server", timeout=30) == "tcp://127.0.0.1:5555"
    finally:
        group.stop_all(grace=0.5)


INTERRUPTED_STOP = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from pathlib import Path
    from minips.run.processes import ProcessGroup
    group = ProcessGroup(Path(sys.argv[1]), env={{}})
    child = group.start("stubborn", [sys.executable, "-c", {stubborn!r}])
    time.sleep(0.5)  # its SIGTERM handler is in place
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C mid-stop
    try:
        group.stop_all(grace=2)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    alive = child.proc.poll() is None
    print("alive" if alive else "stopped", flush=True)
    if alive:
        child.proc.kill()
        child.proc.wait()
    """
)


def test_a_ctrl_c_during_the_stop_of_the_children_still_stops_them(tmp_path):
    script = INTERRUPTED_STOP.format(stubborn=IGNORES_TERM)
    done = subprocess.run(_python(script) + [str(tmp_path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.stdout.split() == ["interrupted", "stopped"], done.stdout + done.stderr
