"""SIGTERM and SIGINT sent to the `minips run` process alone (as `kill`, `timeout`, a
scheduler or a supervisor sends them), in each phase of a run: waiting for its browser
seats, training, stopping. Every process the run started is gone (bounded: grace, then a kill). Real
processes; the signal goes to the launcher's pid only, never to its process group."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minips.ops.checkpoint_file import load_checkpoint
from minips.worker.client import PSClient

pytestmark = pytest.mark.slow
FAST = ["--model", "mlp", "--dataset", "synthetic", "--eval-interval", "0.5", "--quiet"]


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children, theirs, ...)."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(FileNotFoundError):
                for child in (task / "children").read_text().split():
                    if int(child) not in found:
                        found.add(int(child))
                        todo.append(int(child))
    return found


def _argv(pid: int) -> list[bytes]:
    with contextlib.suppress(FileNotFoundError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--out", str(tmp_path / "run"), *FAST, *args],
        stdout=open(tmp_path / "stdout", "w"), stderr=open(tmp_path / "stderr", "w"),
        start_new_session=True,  # its own group: a stray group signal could not hide a bug
    )  # fmt: skip


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _stats(tmp_path: Path) -> dict:
    endpoint = (tmp_path / "run" / "endpoint").read_text().strip()
    with PSClient(endpoint, timeout=30, retries=0) as client:  # 30: only a hang
        return client.stats()


def _stop_alone(run: subprocess.Popen, signum: int, tmp_path: Path) -> None:
    """Send `signum` to the launcher alone; its processes are all gone: within its 5 s grace
    and a kill, given 60 s (a bound that catches a launcher that waits forever, not a slow
    machine)."""
    started = _descendants(run.pid)
    assert len(started) >= 3, started  # server, evaluator, and a worker or the gateway
    os.kill(run.pid, signum)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and (run.poll() is None or any(map(_alive, started))):
            time.sleep(0.1)
        left = sorted(pid for pid in started if _alive(pid))
        assert run.poll() is not None and not left, (
            f"{signal.Signals(signum).name}: after 60 s the launcher "
            f"{'exited' if run.poll() is not None else 'still runs'}, left behind {left}; "
            + (tmp_path / "stderr").read_text()[-500:]
        )
    finally:
        for pid in [run.pid, *started]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        run.wait(10)
    assert "Traceback" not in (tmp_path / "stderr").read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_waiting_for_seats_stops_the_whole_run(tmp_path, signum):
    pytest.importorskip("websockets", reason="browser seats need pip install '.[web]'")
    run = _start(tmp_path, "--workers", "2", "--browser", "1", "--listen", "127.0.0.1:0",
                 "--epochs", "50")  # fmt: skip
    _wait(lambda: (tmp_path / "run" / "web-url").exists(), 60, "the gateway")
    time.sleep(1.0)  # the NumPy worker is up too; the browser seat stays empty
    _stop_alone(run, signum, tmp_path)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_training_stops_the_whole_run(tmp_path, signum):
    run = _start(tmp_path, "--workers", "2", "--epochs", "50")
    _wait(lambda: (tmp_path / "run" / "endpoint").exists(), 60, "the server")
    _wait(lambda: _stats(tmp_path)["updates"] >= 20, 60, "training")
    _stop_alone(run, signum, tmp_path)
    # It says what it keeps: the checkpoint the server wrote as it stopped.
    checkpoint = load_checkpoint(tmp_path / "run" / "checkpoint.npz")
    assert run.returncode == 130
    assert (tmp_path / "stderr").read_text().splitlines()[-1] == (
        f"interrupted: training was cut short; the model at version {checkpoint.version} "
        f"({checkpoint.meta['samples']} samples) is kept in {tmp_path / 'run' / 'checkpoint.npz'}"
    )
    assert checkpoint.version >= 20


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_stopping_stops_the_whole_run(tmp_path, signum):
    # The server is stopping and waits (its grace) for a worker that does not answer
    # (paused): the launcher is in its stopping phase when the signal comes.
    run = _start(tmp_path, "--workers", "2", "--epochs", "50")
    _wait(lambda: (tmp_path / "run" / "endpoint").exists(), 60, "the server")
    _wait(lambda: _stats(tmp_path)["updates"] >= 20, 60, "training")
    workers = [pid for pid in _descendants(run.pid) if b"worker" in _argv(pid)]
    os.kill(workers[0], signal.SIGSTOP)
    endpoint = (tmp_path / "run" / "endpoint").read_text().strip()
    with PSClient(endpoint, timeout=5.0) as operator:
        operator.stop()
    _wait(lambda: _stats(tmp_path)["stopping"], 10, "the server to be stopping")
    _stop_alone(run, signum, tmp_path)
