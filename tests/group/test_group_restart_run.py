"""`minips run --servers 2` with shard 1 SIGKILLed once, after its first checkpoint: the
run goes on (workers and evaluator ride through the restart) and its group checkpoint is
the model it ended with (each shard's last file, at the shards' final versions). Under
ssgd the whole group goes back to the version the crashed shard restarts from, so its
shards end at one version; under another rule the restarted shard stays behind, and the
run says so in one line, which the summary keeps; the run's samples and updates are then
that shard's, the fewest, which every slice of the kept model trained."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from run_support import assert_clean_exits
from test_group_runs import _shard_pid, _wait

from minips.results.metrics import read_metrics


def _logged_version(log: Path) -> int:
    if not log.exists():
        return 0
    try:
        records = read_metrics(log)
    except json.JSONDecodeError:  # a line being written
        return 0
    return max((r.get("version", 0) for r in records if r.get("event") == "update"), default=0)


def _server_pid(out: Path, shard: int) -> int | None:
    """The pid of the live process of shard `shard` (0: the root) of the run in `out`."""
    if shard:
        return _shard_pid(out, shard)
    marker = str(out / "endpoint").encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    return None


def _saved(checkpoint: Path) -> int:
    """The updates in a shard's newest checkpoint (a large number while it is replaced)."""
    try:
        with np.load(checkpoint) as data:
            return json.loads(str(data["meta"]))["updates"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return 1 << 30


def _run_killing(out: Path, shard: int, *options: str) -> tuple[dict, str, list[int]]:
    """The run's summary, its output, and the versions in its group checkpoint, shard
    `shard` (0: the root) having been SIGKILLed once it wrote a checkpoint and went on
    past it."""
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--servers", "2",
            "--workers", "2", "--model", "mlp", "--dataset", "synthetic", "--epochs", "8",
            "--eval-interval", "1", *options]  # fmt: skip
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        first = out / f"checkpoint-shard{shard}.npz"
        _wait("a first checkpoint", lambda: first.exists())
        log = out / ("updates-shard1.jsonl" if shard else "updates.jsonl")
        # Past the shard's newest checkpoint, read afresh at each look: killed just after a
        # new one, a shard would lose only the update in flight, which its worker sends again.
        _wait("training past the checkpoint", lambda: _logged_version(log) > _saved(first) + 5)
        os.kill(_wait("the shard's process", lambda: _server_pid(out, shard)), signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert_clean_exits(summary, out)
    finals = [row["version"] for row in summary["shards"]]
    with np.load(out / "checkpoint.npz") as data:
        meta = json.loads(str(data["meta"]))
        assert int(data["version"]) == finals[0]
    assert meta["group"]["versions"] == finals == summary["group"]["versions"]
    return summary, stdout + stderr, finals


@pytest.mark.parametrize(("shard", "who"), [(1, "shard 1"), (0, "the root")])
def test_under_ssgd_the_group_goes_back_with_a_crashed_shard_and_ends_at_one_version(
    tmp_path, shard, who
):
    summary, output, finals = _run_killing(tmp_path / "run", shard, "--rule", "ssgd")
    assert finals[0] == finals[1] and summary["group"]["consistent"], finals
    assert summary["group"]["torn"] is None and summary["samples"] > 0
    restarts = {r["shard"]: r for r in summary["restart_log"]}
    crashed, rolled = restarts[shard], restarts[1 - shard]
    assert not crashed["rolled_back"] and rolled["rolled_back"] and len(restarts) == 2
    version = crashed["checkpoint_version"]
    assert version == rolled["checkpoint_version"] > 0 and crashed["updates_lost"] > 0
    line = f"{who} crashed: the server group went back to version {version} on every shard"
    assert output.count(line) == 1, output


def test_under_asgd_a_restarted_shard_left_behind_is_said_in_one_line(tmp_path):
    summary, output, finals = _run_killing(
        tmp_path / "run", 1, "--rule", "asgd", "--checkpoint-every", "30",
        "--checkpoint-interval", "0",
    )  # fmt: skip
    assert summary["shards"][1]["updates_lost"] > 0 and finals[0] > finals[1], finals
    line = summary["group"]["torn"]
    assert not summary["group"]["consistent"] and line is not None
    assert f"shard 0 at {finals[0]}, shard 1 at {finals[1]}" in line
    assert f"{finals[0] - finals[1]} apart" in line
    assert output.count(line) == 1
    # The push the restarted shard refused (`bad_base`) was applied by the root: it is not
    # sent again, so the root applied each of the workers' steps once.
    reports = [json.loads(p.read_text()) for p in (tmp_path / "run").glob("worker-[0-9]*.json")]
    assert finals[0] == sum(report["steps"] for report in reports), (finals, reports)
    trained = sum(report["samples"] for report in reports)
    root, behind = summary["shards"]
    assert (root["samples"], root["updates"]) == (trained, finals[0])
    # The run's counts are what every slice of the kept model trained: shard 1's, behind
    assert (summary["samples"], summary["updates"]) == (behind["samples"], finals[1])
    assert behind["samples"] < trained
    lacks = {"shard": 1, "of": 0, "samples": trained - behind["samples"],
             "updates": finals[0] - finals[1]}  # fmt: skip
    assert summary["behind"] == lacks
    said = (f"warning: the final model trained {behind['samples']} of the {trained} samples "
            f"the run was to: shard 1 is {lacks['samples']} samples and {lacks['updates']} "
            "updates behind shard 0 (a restart lost them)")  # fmt: skip
    assert output.count(said) == 1, output
    assert f"{behind['samples']} samples, {finals[1]} updates in " in output, output
    restart = summary["restart_log"][0]
    assert (f"warning: shard 1 crashed (exit code -9) and was restarted from its checkpoint at "
            f"version {restart['checkpoint_version']}: {restart['updates_lost']} update(s) lost"
            ) in output  # fmt: skip
