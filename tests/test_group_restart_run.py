"""`minips run --servers 2` with shard 1 SIGKILLed once, after its first checkpoint: the
run goes on (workers and evaluator ride through the restart) and its group checkpoint is
the model it ended with (each shard's last file, at the shards' final versions). Under
ssgd the whole group goes back to the version the crashed shard restarts from, so its
shards end at one version; under another rule the restarted shard stays behind, and the
run says so in one line, which the summary keeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from test_group_runs import _shard_pid, _wait

from minips.run.metrics import read_metrics


def _logged_version(log: Path) -> int:
    if not log.exists():
        return 0
    try:
        records = read_metrics(log)
    except json.JSONDecodeError:  # a line being written
        return 0
    return max((r.get("version", 0) for r in records if r.get("event") == "update"), default=0)


def _run_killing_shard1(out: Path, *options: str) -> tuple[dict, str, list[int]]:
    """The run's summary, its output, and the versions in its group checkpoint, shard 1
    having been SIGKILLed once it wrote a checkpoint and went on past it."""
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--servers", "2",
            "--workers", "2", "--model", "mlp", "--dataset", "synthetic", "--epochs", "8",
            "--eval-interval", "1", *options]  # fmt: skip
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        first = out / "checkpoint-shard1.npz"
        _wait("shard 1's first checkpoint", lambda: first.exists())
        saved = json.loads(str(np.load(first)["meta"]))["updates"]
        log = out / "updates-shard1.jsonl"
        _wait("shard 1 past its checkpoint", lambda: _logged_version(log) > saved + 5)
        os.kill(_wait("shard 1", lambda: _shard_pid(out, 1)), signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    codes = summary["exit_codes"]
    assert codes["evaluator"] == codes["worker-0"] == codes["worker-1"] == 0, codes
    finals = [row["version"] for row in summary["shards"]]
    with np.load(out / "checkpoint.npz") as data:
        meta = json.loads(str(data["meta"]))
        assert int(data["version"]) == finals[0]
    assert meta["group"]["versions"] == finals == summary["group"]["versions"]
    return summary, stdout + stderr, finals


def test_under_ssgd_the_group_goes_back_with_a_crashed_shard_and_ends_at_one_version(tmp_path):
    summary, output, finals = _run_killing_shard1(tmp_path / "run", "--rule", "ssgd")
    assert finals[0] == finals[1] and summary["group"]["consistent"], finals
    assert summary["group"]["torn"] is None
    crashed, rolled = sorted(summary["restart_log"], key=lambda r: r["shard"], reverse=True)
    assert (crashed["shard"], crashed["rolled_back"]) == (1, False)
    assert (rolled["shard"], rolled["rolled_back"]) == (0, True)
    version = crashed["checkpoint_version"]
    assert version == rolled["checkpoint_version"] > 0 and crashed["updates_lost"] > 0
    line = f"shard 1 crashed: the server group went back to version {version} on every shard"
    assert output.count(line) == 1, output


def test_under_asgd_a_restarted_shard_left_behind_is_said_in_one_line(tmp_path):
    summary, output, finals = _run_killing_shard1(
        tmp_path / "run", "--rule", "asgd", "--checkpoint-interval", "0.5"
    )
    assert summary["shards"][1]["updates_lost"] > 0 and finals[0] > finals[1], finals
    line = summary["group"]["torn"]
    assert not summary["group"]["consistent"] and line is not None
    assert f"shard 0 at {finals[0]}, shard 1 at {finals[1]}" in line
    assert f"{finals[0] - finals[1]} apart" in line
    assert output.count(line) == 1
