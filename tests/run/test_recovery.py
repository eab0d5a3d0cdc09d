"""Crash recovery: SIGKILL the server of a running `minips run` twice, at random
moments; the launcher restarts it from its last checkpoint, the workers ride through, and
the run finishes with both restarts and the updates they lost in its summary.

The accuracy comparison: the same run undisturbed (same seed, same sample budget of 120,000
samples, mlp on the synthetic dataset, which both runs learn completely). Its tolerance is
1 point; on this dataset an undisturbed run ends at 100% on every seed we tried,
so a loss of a point would mean the recovery broke the model, not noise. That the model
really resumed (not restarted from scratch) is checked on its own: the first update of each
new server is the one right after its checkpoint. The budget is large enough that the
resumed server still trains well past the second kill's delay: a faster machine would
finish a small remaining budget before the second kill lands.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from run_support import assert_clean_exits

from minips.ops.checkpoint_file import load_checkpoint
from minips.results.metrics import read_metrics
from minips.worker.client import PSClient, ServerUnavailable

RUN = ("--rule", "asgd", "--model", "mlp", "--dataset", "synthetic", "--lr", "0.05",
       "--momentum", "0.5",
       "--epochs", "100", "--max-samples", "120000", "--seed", "0", "--eval-interval", "0.5",
       "--checkpoint-interval", "1")  # fmt: skip
CHECKPOINT_INTERVAL = 1.0
# Workers re-send a request lost with a killed server after 5 s, not their default 10
# (MINIPS_WORKER_TIMEOUT is their --timeout): the restart is awaited, not its timeout.
WORKER_ENV = {"MINIPS_WORKER_TIMEOUT": "5"}


def _start(out: Path) -> subprocess.Popen:
    code = "from minips.cli import main; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, "run", "--out", str(out), "--quiet", *RUN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **WORKER_ENV},
    )


def _server(out: Path) -> tuple[int, list[str]] | None:
    """The pid and command line of the run's live server process (found by the latter)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "server" in argv and str(out / "endpoint") in argv:
            return int(entry.name), argv
    return None


def _address(endpoint: Path) -> str | None:
    """The address in a server's endpoint file (None while there is none: the launcher
    removes the file when it restarts the server, at any moment between two reads)."""
    try:
        return endpoint.read_text().strip() or None
    except FileNotFoundError:
        return None


def _version(out: Path) -> int | None:
    """The running server's version (None while it is down or starting)."""
    address = _address(out / "endpoint")
    if address is None:
        return None
    try:
        with PSClient(address, timeout=0.5, retries=0) as client:
            return client.stats()["version"]
    except ServerUnavailable:
        return None


def _kill_when_training(
    out: Path, rng: random.Random, after_version: int
) -> tuple[list[str], float]:
    """SIGKILL the server a random 0.3-1.5 s after it applied updates past `after_version`
    and wrote a checkpoint since this call (a slow machine may take longer than one
    interval to write its first; the one on disk may be the previous server's); return its
    command line and the time the checkpoint on disk at the kill was written (its mtime)."""
    since = time.time()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        version = _version(out)
        if version is not None and version > after_version and _checkpointed_since(out, since):
            time.sleep(rng.uniform(0.3, 1.5))
            server = _server(out)
            assert server is not None, "no server process"
            saved = (out / "checkpoint.npz").stat().st_mtime
            os.kill(server[0], signal.SIGKILL)
            return server[1], saved
        time.sleep(0.1)
    raise AssertionError("the server did not train")


def _started_at(log: Path) -> float:
    """When the server whose log is `log` started: its first logged line's time (logging's
    "2026-12-04 15:21:02,174", local time), as time.time() gives it."""
    for line in log.read_text().splitlines():
        try:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:  # a line printed, not logged
            continue
    raise AssertionError(f"nothing logged in {log}")


def _checkpointed_since(out: Path, since: float) -> bool:
    """Whether the run's checkpoint was written at or after `since` (time.time())."""
    try:
        return (out / "checkpoint.npz").stat().st_mtime >= since
    except FileNotFoundError:
        return False


def _first_update(log: Path, timeout: float = 90) -> dict:
    """The first update record of a server's log, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_metrics(log) if log.exists() else []
        if records:
            return records[0]
        time.sleep(0.1)
    raise AssertionError(f"no update in {log}")


def _finish(proc: subprocess.Popen, out: Path) -> dict:
    """The run's summary, once it ended well; what it printed under "said"."""
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert stdout.strip().splitlines()[-1].startswith("test accuracy: ")
    return {**json.loads((out / "summary.json").read_text()), "said": stdout + stderr}


def test_a_run_survives_two_server_kills_and_records_what_they_cost(tmp_path):
    rng = random.Random(10)
    undisturbed = _start(tmp_path / "calm")
    disturbed = _start(tmp_path / "killed")
    out = tmp_path / "killed"
    try:
        first, first_saved = _kill_when_training(out, rng, after_version=0)
        # The second kill: once the restarted server trained past what it resumed from.
        resumed_at = _first_update(out / "updates-1.jsonl")["version"]
        second, second_saved = _kill_when_training(out, rng, after_version=resumed_at)
        calm, summary = _finish(undisturbed, tmp_path / "calm"), _finish(disturbed, out)
    finally:
        for proc in (undisturbed, disturbed):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    # Every server starts from the run's config.json; a restarted one resumes beside it.
    for argv in (first, second):
        assert argv[argv.index("--config") + 1] == str(out / "config.json")
        assert "--model" not in argv and "--rule" not in argv
    assert "--resume" not in first
    assert second[second.index("--resume") + 1] == str(out / "checkpoint.npz")
    assert summary["restarts"] == 2 and calm["restarts"] == 0
    restarts = summary["restart_log"]
    assert [r["exit_code"] for r in restarts] == [-signal.SIGKILL] * 2
    for generation, (restart, saved) in enumerate(
        zip(restarts, (first_saved, second_saved), strict=True), start=1
    ):
        # The checkpoint's age when the death was noticed, which was before the next server
        # started: at most the time from the checkpoint on disk at the kill to that start
        # (0.1 s: a checkpoint's time is taken just before its file is written).
        started = _started_at(out / "logs" / f"server-{generation}.log")
        assert 0 <= restart["checkpoint_age_s"] <= started - saved + 0.1, (restart, started - saved)
        assert restart["updates_lost"] == restart["last_version"] - restart["checkpoint_version"]
        start = (f"its checkpoint at version {restart['checkpoint_version']}"
                 if restart["resumed_from"] else "the run's start")  # fmt: skip
        said = (f"warning: the server crashed (exit code -9) and was restarted from {start}: "
                f"{restart['updates_lost']} update(s) lost")  # fmt: skip
        assert said in summary["said"], summary["said"]
        first = read_metrics(out / f"updates-{generation}.jsonl")[0]
        assert first["version"] == restart["checkpoint_version"] + 1  # resumed, not restarted
    assert summary["updates_lost"] == sum(r["updates_lost"] for r in restarts)
    assert summary["samples"] >= 120000 and calm["samples"] >= 120000  # the same budget
    assert_clean_exits(summary, out)
    assert abs(summary["accuracy"] - calm["accuracy"]) <= 0.01
    assert load_checkpoint(out / "checkpoint.npz").version == summary["updates"]
