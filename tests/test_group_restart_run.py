"""`minips run --servers 2 --rule ssgd` with shard 1 SIGKILLed once, after its first
checkpoint: the run goes on (workers and evaluator ride through the restart), its group
checkpoint is the model it ended with (each shard's last file, at the shards' final
versions), and shards left at different versions (the restarted one resumed from an older
checkpoint) are said in one line, which the summary keeps."""

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


def test_a_shard_killed_once_leaves_a_group_checkpoint_at_the_final_versions(tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--servers", "2",
            "--workers", "2", "--rule", "ssgd", "--model", "mlp", "--dataset", "synthetic",
            "--epochs", "8", "--eval-interval", "1"]  # fmt: skip
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        # once shard 1 wrote its first checkpoint (an ssgd group's: every 50 rounds) and
        # went on past it: the restart resumes from there and loses the rounds since
        first = out / "checkpoint-shard1.npz"
        _wait("shard 1's first checkpoint", lambda: first.exists())
        log = out / "updates-shard1.jsonl"
        _wait("shard 1 past its checkpoint", lambda: _logged_version(log) > 55)
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
    lost = summary["shards"][1]["updates_lost"]
    assert lost > 0 and finals[0] > finals[1], summary["shards"]
    line = summary["group"]["torn"]
    assert not summary["group"]["consistent"] and line is not None
    assert f"shard 0 at {finals[0]}, shard 1 at {finals[1]}" in line
    assert f"{finals[0] - finals[1]} apart" in line
    assert (stdout + stderr).count(line) == 1
