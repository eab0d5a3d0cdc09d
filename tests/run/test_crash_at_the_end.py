"""A server killed while it stops, once training is over (no restart then): the run ends
with an error that says which model it keeps and how many updates were lost, recorded as
its final crash; it never reads as a finished run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

RUN = ["--model", "mlp", "--dataset", "synthetic", "--epochs", "3", "--workers", "2",
       "--checkpoint-interval", "0.5"]  # fmt: skip


def test_a_server_killed_while_it_stops_is_the_runs_error(tmp_path: Path) -> None:
    for attempt in range(4):  # the kill must land before the final checkpoint: mostly does
        out = tmp_path / f"run{attempt}"
        stderr, code = _killed_while_stopping(out)
        summary = json.loads((out / "summary.json").read_text())
        if summary["final_crash"] is not None or code != 0:
            break
    crash = summary["final_crash"]
    assert code == 2, stderr
    assert summary["ended"].startswith("error: the server crashed while it stopped (exit code -9)")
    assert crash["exit_code"] == -9 and crash["updates_lost"] == (
        crash["last_version"] - crash["checkpoint_version"]
    )
    assert crash["updates_lost"] > 0
    assert f"{crash['updates_lost']} update(s) after it were lost" in stderr, stderr


def _killed_while_stopping(out: Path) -> tuple[str, int]:
    """A run whose server is SIGKILLed once it logged its stop; (stderr, exit status)."""
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet", *RUN]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log, deadline = out / "logs" / "server.log", time.monotonic() + 120
        while not (log.exists() and "stopping (" in log.read_text()):  # training is over
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        pid = _server_pid(out)
        if pid is not None:  # else it stopped already: this attempt does not count
            os.kill(pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return stderr, proc.returncode


def _server_pid(out: Path) -> int | None:
    """The pid of the run's server process (its command line names the run's config)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if "server" in text and str(out / "config.json") in text:
            return int(entry.name)
    return None
