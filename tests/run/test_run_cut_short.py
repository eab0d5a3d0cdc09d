"""A run whose server is stopped from outside before the run's end (a SIGTERM to the server
alone, a `stop` from a client other than the launcher) says so: its summary's `ended` is
"stopped" with what stopped it, `minips run` prints one warning line, and the model it
ended with is still the one tested. Real processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minips.worker.client import PSClient

pytestmark = pytest.mark.slow
EPOCHS = 200  # far more than the test lets it train: the stop comes first
FAST = ["--model", "mlp", "--dataset", "synthetic", "--eval-interval", "0.5", "--quiet",
        "--workers", "2", "--epochs", str(EPOCHS)]  # fmt: skip


def _server_pid(out: Path) -> int:
    """The pid of the server of the run writing to `out` (from /proc)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"server" in argv and str(out / "config.json").encode() in argv:
                return int(entry.name)
    raise AssertionError("no server process found")


def _wait_for_updates(out: Path, updates: int) -> str:
    """The run's address once its server applied `updates` updates."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        endpoint_file = out / "endpoint"
        if endpoint_file.exists() and endpoint_file.read_text().strip():
            endpoint = endpoint_file.read_text().strip()
            with PSClient(endpoint, timeout=10, retries=0) as client:
                if client.stats()["updates"] >= updates:
                    return endpoint
        time.sleep(0.2)
    raise AssertionError(f"the run never reached {updates} updates")


def _run_and_stop(tmp_path: Path, stop) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), *FAST]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        endpoint = _wait_for_updates(out, 20)
        stop(out, endpoint)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    return done, json.loads((out / "summary.json").read_text())


def _sigterm_the_server(out: Path, _endpoint: str) -> None:
    os.kill(_server_pid(out), signal.SIGTERM)


def _stop_as_another_client(_out: Path, endpoint: str) -> None:
    with PSClient(endpoint, timeout=10) as client:
        client.stop()


@pytest.mark.parametrize(
    ("stop", "why"),
    [(_sigterm_the_server, "signal 15"), (_stop_as_another_client, "an operator asked")],
    ids=["sigterm", "operator"],
)
def test_a_server_stopped_from_outside_is_a_run_stopped_early_not_finished(tmp_path, stop, why):
    done, summary = _run_and_stop(tmp_path, stop)
    assert done.returncode == 0, done.stderr[-2000:]
    assert summary["ended"] == "stopped" and summary["stopped_why"] == why, summary
    assert 0 < summary["samples"] < EPOCHS * 2000  # cut short, far before the run's end
    warning = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert warning == [
        f"warning: the run was stopped before its end ({why} to the server): "
        f"{summary['samples']} samples trained"
    ], done.stderr[-2000:]
    # The model it ended with is the one tested, as in a run that finished.
    assert summary["final_tested"] and summary["accuracy_version"] == summary["final_version"]
    assert done.stdout.strip().splitlines()[-1].startswith("test accuracy: ")
