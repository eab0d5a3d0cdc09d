"""Crash recovery when things are worse: a damaged checkpoint, no checkpoint yet, and a
server that keeps dying (minips/run/recovery.py).

Each test runs a real `minips run` (mlp on the synthetic dataset) and SIGKILLs its server
process. A checkpoint is damaged while the server is stopped (SIGSTOP), so the launcher
finds it so when it notices the death; the run then restarts from the checkpoint before
it, or ends with one error line and a summary that says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_recovery import _server, _version

from minips.ops.checkpoint_file import load_checkpoint, previous_path

RUN = ("--model", "mlp", "--dataset", "synthetic", "--rule", "asgd", "--lr", "0.05",
       "--momentum", "0.5", "--workers", "2", "--epochs", "100", "--seed", "0",
       "--eval-interval", "0.5")  # fmt: skip

# Workers re-send a request lost with a killed server after 5 s, not their default 10
# (MINIPS_WORKER_TIMEOUT is their --timeout): the restart is awaited, not its timeout.
WORKER_ENV = {"MINIPS_WORKER_TIMEOUT": "5"}


def _start(out: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet", *RUN, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **WORKER_ENV},
    )


def _wait(condition, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _training_server(out: Path, past: int = 0) -> int:
    """The pid of the run's server once it applied updates past version `past`."""
    _wait(lambda: (_version(out) or 0) > past, f"the server to train past {past}")
    server = _server(out)
    assert server is not None, "no server process"
    return server[0]


def _server_pid(out: Path) -> int | None:
    server = _server(out)
    return server[0] if server is not None else None


def _finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, stdout, stderr


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_a_server_killed_before_its_first_checkpoint_is_restarted_from_the_start(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, "--max-samples", "30000", "--checkpoint-interval", "1000")
    try:
        os.kill(_training_server(out), signal.SIGKILL)
        assert not (out / "checkpoint.npz").exists()  # none was written yet
        code, stdout, stderr = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0, stderr
    summary = _summary(out)
    assert summary["ended"] == "finished" and summary["restarts"] == 1
    (restart,) = summary["restart_log"]
    assert restart["resumed_from"] is None and restart["checkpoint_version"] == 0
    assert restart["checkpoint_age_s"] is None
    assert restart["updates_lost"] == restart["last_version"] > 0  # all of them, from the start
    first = json.loads((out / "updates-1.jsonl").read_text().splitlines()[0])
    assert first["version"] == 1  # the new server began at the initial parameters
    assert summary["samples"] >= 30000 and summary["accuracy"] > 0.5


def test_a_final_model_short_of_what_was_trained_after_a_restart_is_said(tmp_path):
    """Restarted from the start, the server's final model lacks what the workers trained
    before the crash: the run says how many samples its model has of those it was to."""
    out = tmp_path / "run"
    proc = _start(out, "--epochs", "30", "--checkpoint-interval", "1000")
    try:
        os.kill(_training_server(out, past=50), signal.SIGKILL)
        code, stdout, stderr = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0, stderr
    samples = _summary(out)["samples"]
    assert 0 < samples < 60000
    assert (
        f"warning: the final model trained {samples} of the 60000 samples the run was to: "
        "the server's restart lost the updates after its last checkpoint"
    ) in stdout.splitlines()


def _stop_damage_kill(out: Path, damage) -> None:
    """Stop the server, damage its checkpoint files, then kill it: what the launcher finds."""
    pid = _training_server(out)
    _wait(lambda: previous_path(out / "checkpoint.npz").exists(), "two checkpoints")
    os.kill(pid, signal.SIGSTOP)
    damage(out / "checkpoint.npz")
    os.kill(pid, signal.SIGKILL)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:1000])


def test_a_damaged_checkpoint_at_a_crash_is_passed_over_for_the_one_before(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, "--max-samples", "40000", "--checkpoint-interval", "0.3")
    try:
        _stop_damage_kill(out, _truncate)
        code, stdout, stderr = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0, stderr
    summary = _summary(out)
    assert summary["ended"] == "finished" and summary["restarts"] == 1
    (restart,) = summary["restart_log"]
    assert restart["resumed_from"] == str(out / "checkpoint.prev.npz")
    (damaged,) = restart["damaged"]
    assert damaged.startswith(f"checkpoint {out / 'checkpoint.npz'} is damaged")
    first = json.loads((out / "updates-1.jsonl").read_text().splitlines()[0])
    assert first["version"] == restart["checkpoint_version"] + 1  # resumed from it
    assert (out / "checkpoint.damaged-1.npz").exists()  # set aside, for a look
    assert load_checkpoint(out / "checkpoint.npz").version == summary["updates"]
    assert summary["samples"] >= 40000 and summary["accuracy"] > 0.5


def test_a_crash_with_every_checkpoint_damaged_ends_the_run_with_one_line_and_a_summary(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, "--max-samples", "400000", "--checkpoint-interval", "0.3")
    try:
        _stop_damage_kill(out, lambda path: (_truncate(path), _truncate(previous_path(path))))
        code, stdout, stderr = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    assert lines[0].startswith("error: the server crashed (exit code -9) and no checkpoint")
    assert f"checkpoint {out / 'checkpoint.npz'} is damaged" in lines[0]
    summary = _summary(out)
    assert summary["ended"] == lines[0] and summary["restarts"] == 0
    crash = summary["final_crash"]
    assert crash["exit_code"] == -signal.SIGKILL and crash["resumed_from"] is None
    assert len(crash["damaged"]) == 2 and crash["last_version"] > 0
    assert summary["exit_codes"]["server"] == -signal.SIGKILL


def test_past_the_restart_budget_the_summary_records_every_crash(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, "--max-samples", "400000", "--checkpoint-interval", "0.3")
    try:
        killed = []
        for _crash in range(4):  # three restarts allowed: the fourth crash ends the run
            pid = _training_server(out)
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)
            _wait(lambda dead=pid: _server_pid(out) != dead, "the death noticed")
        code, stdout, stderr = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    last_log = out / "logs" / "server-3.log"
    assert lines[0].startswith("error: the server crashed 4 times (exit codes -9, -9, -9, -9)")
    last_words = last_log.read_text().strip().splitlines()[-1]
    assert lines[0].endswith(f"its last log, {last_log}, ends: {last_words}")
    summary = _summary(out)
    assert summary["ended"] == lines[0]
    assert summary["restarts"] == 3 and len(summary["restart_log"]) == 3
    for restart in summary["restart_log"]:
        assert restart["exit_code"] == -signal.SIGKILL
        assert restart["updates_lost"] == restart["last_version"] - restart["checkpoint_version"]
    crash = summary["final_crash"]
    assert crash["exit_code"] == -signal.SIGKILL and crash["last_version"] > 0
    assert summary["updates_lost"] == sum(r["updates_lost"] for r in summary["restart_log"])
    assert len(set(killed)) == 4
