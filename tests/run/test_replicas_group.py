"""A replicated server group (`--servers 2 --replicas 2`): every shard, the root too, has a
backup that takes its address over when its primary dies. SIGKILL primaries and backups of
both shards of a running `minips run`: under ssgd the run ends with exactly the final model
of the same run never killed (loss, accuracy, every shard's checkpoint arrays), and under
asgd and dana-gap every acknowledged push is applied once on every shard.

Why exactly: each shard is an ordinary replicated server over its slices (its backup holds
every input its primary answered, minips/ops/replication.py), and its joins to the root
are inputs of the root's pair like any request (minips/run/replicas.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_replicas import _kill_when_held, _new_backup, _serving_primary

from minips.ops.checkpoint_file import load_checkpoint

# lr 0.02: asgd's momentum 0.9 at 0.05 diverged (the run stopped as collapsed) under load.
# Each worker's step is stretched 3x by sleeping (--hetero): the run lasts long enough for
# three kills on a loaded machine, at no more CPU, and ssgd's sums do not depend on time.
# Four replicas and two workers on a loaded machine: a replica can go unscheduled for a
# second, so the failover bound is 3 s (a backup let go then is replaced, and the shard
# trains on without one meanwhile, past the first checkpoint before the first kill).
FAILOVER_AFTER = 3.0
MODEL = ("--model", "mlp", "--dataset", "synthetic", "--lr", "0.02", "--workers", "2",
         "--epochs", "10", "--seed", "0", "--eval-interval", "30", "--servers", "2",
         "--replicas", "2", "--hetero", "3,3",
         "--failover-after", str(FAILOVER_AFTER))  # fmt: skip
# A request lost with a killed primary is sent again after 2 s, not the default 10.
WORKER_ENV = {"MINIPS_WORKER_TIMEOUT": "2"}
FIRST_CHECKPOINT = 50  # an ssgd group's shards checkpoint every 50 rounds (group_checkpoints.py)


def _start(out: Path, rule: str, *extra: str, worker_env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet", "--rule", rule,
         *MODEL, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, **(worker_env or WORKER_ENV)},
    )  # fmt: skip


def _endpoint(out: Path, shard: int) -> Path:
    return out / ("endpoint" if shard == 0 else f"endpoint-shard{shard}")


def _kill_at(proc: subprocess.Popen, out: Path, shard: int, which: str, version: int) -> int:
    """SIGKILL shard `shard`'s primary or backup once it is past `version` with a backup
    holding its state; returns the version it was at."""
    return _kill_when_held(proc, _endpoint(out, shard), out, shard, which, version)


def _finish(proc: subprocess.Popen, out: Path) -> dict:
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    return json.loads((out / "summary.json").read_text())


def _killing(procs: list[subprocess.Popen]):
    """Every run still going when the test ends is killed with its processes."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def _same_models(a: Path, b: Path) -> None:
    """The group checkpoints and every shard's own file hold the same arrays."""
    for name in ("checkpoint.npz", "checkpoint-shard0.npz", "checkpoint-shard1.npz"):
        first, second = load_checkpoint(a / name), load_checkpoint(b / name)
        assert first.version == second.version, name
        assert first.arrays.keys() == second.arrays.keys(), name
        for key, array in first.arrays.items():
            if key != "meta":  # its time differs
                np.testing.assert_array_equal(array, second.arrays[key], err_msg=f"{name} {key}")


def _lost_by_sigkill(replication: dict) -> int:
    """The replicas lost, each replaced; those lost to a SIGKILL (a primary that stalled
    past the bound on a loaded machine costs its backup too: exit status 2, 17.2)."""
    lost = replication["failovers"] + replication["backups_lost"]
    assert len(replication["replacements"]) == len(lost), replication
    assert all(r["exit_code"] in (-signal.SIGKILL, 2) for r in lost), lost
    return sum(r["exit_code"] == -signal.SIGKILL for r in lost)


def test_three_replicas_of_both_shards_killed_change_nothing_in_the_final_model(tmp_path):
    """ssgd: shard 1's primary killed before the first checkpoint (a restart would have
    nothing to restart from), then the root's backup, then the root's primary."""
    calm_out, out = tmp_path / "calm", tmp_path / "killed"
    calm, proc = _start(calm_out, "ssgd"), _start(out, "ssgd")
    try:
        at = _kill_at(proc, out, 1, "primary", version=5)
        assert at < FIRST_CHECKPOINT
        at = _kill_at(proc, out, 0, "backup", version=at + 10)
        _kill_at(proc, out, 0, "primary", version=at + 10)
        calm_summary, summary = _finish(calm, calm_out), _finish(proc, out)
    finally:
        _killing([calm, proc])
    assert (summary["loss"], summary["accuracy"]) == (calm_summary["loss"],
                                                      calm_summary["accuracy"])  # fmt: skip
    assert summary["updates"] == calm_summary["updates"]
    assert summary["group"]["consistent"] and not calm_summary["restarts"]
    _same_models(out, calm_out)
    replication = summary["replication"]
    assert summary["updates_lost"] == 0 and summary["restarts"] == 0
    assert _lost_by_sigkill(replication) == 3
    killed = [(r["shard"], kind) for kind in ("failovers", "backups_lost")
              for r in replication[kind] if r["exit_code"] == -signal.SIGKILL]  # fmt: skip
    assert sorted(killed) == [(0, "backups_lost"), (0, "failovers"), (1, "failovers")]
    for failover in replication["failovers"]:
        assert failover["redone"] >= 0, failover
        assert FAILOVER_AFTER <= failover["takeover_s"] < FAILOVER_AFTER + 2, failover


@pytest.mark.parametrize(("rule", "shard"), [("asgd", 1), ("dana-gap", 0)])
def test_every_acknowledged_push_is_applied_once_on_every_shard(tmp_path, rule, shard):
    """One shard's primary killed mid-training: each shard's updates are exactly the
    workers' steps (each step pushes to both shards, each push one update there)."""
    out = tmp_path / "killed"
    proc = _start(out, rule)
    try:
        _kill_at(proc, out, shard, "primary", version=40)
        summary = _finish(proc, out)
    finally:
        _killing([proc])
    reports = [json.loads(path.read_text()) for path in sorted(out.glob("worker-*.json"))]
    assert len(reports) == 2 and all(report["finished"] for report in reports)
    steps = sum(report["steps"] for report in reports)
    assert [row["updates"] for row in summary["shards"]] == [steps, steps]
    assert [row["version"] for row in summary["shards"]] == [steps, steps]
    assert summary["samples"] == sum(report["samples"] for report in reports)
    replication = summary["replication"]
    assert [f["shard"] for f in replication["failovers"]] == [shard]
    assert summary["updates_lost"] == 0 and summary["restarts"] == 0


def test_an_ssgd_group_whose_shard_lost_both_replicas_goes_back_to_one_version(tmp_path):
    """Shard 1's primary killed; its backup takes over; that one killed too while its
    replacement (held by SIGSTOP) has not joined: no replica of shard 1 holds its state.
    Under ssgd the whole group goes back to one checkpoint, as without replicas: the
    root's primary and backup are stopped with it, both primaries restart from their
    checkpoints at one version and get new backups, and the run ends with its shards at
    one version, its summary recording the failover, the unjoined backup, the backup the
    rollback stopped and both restarts."""
    out = tmp_path / "killed"
    # the workers wait out the failover, the welcome's grace and the rollback (attempts of
    # 6 s each, below the server's 30 s heartbeat timeout)
    proc = _start(out, "ssgd", worker_env={"MINIPS_WORKER_TIMEOUT": "6"})
    try:
        _kill_at(proc, out, 1, "primary", version=FIRST_CHECKPOINT + 10)
        promoted = _serving_primary(_endpoint(out, 1), time.monotonic() + 60)  # took over
        replacement = _new_backup(out, {promoted}, shard=1)
        os.kill(replacement, signal.SIGSTOP)  # it never joins
        os.kill(promoted, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        _killing([proc])
    assert proc.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    finals = [row["version"] for row in summary["shards"]]
    assert finals[0] == finals[1] and summary["group"]["consistent"], finals
    assert summary["group"]["torn"] is None and summary["ended"] == "finished"
    restarts = {r["shard"]: r for r in summary["restart_log"]}
    assert sorted(restarts) == [0, 1] and restarts[0]["rolled_back"]
    assert not restarts[1]["rolled_back"] and restarts[1]["exit_code"] == -signal.SIGKILL
    version = restarts[1]["checkpoint_version"]
    assert version == restarts[0]["checkpoint_version"] >= FIRST_CHECKPOINT
    line = f"shard 1 crashed: the server group went back to version {version} on every shard"
    assert (stdout + stderr).count(line) == 1, stdout + stderr
    replication = summary["replication"]
    assert [f["shard"] for f in replication["failovers"]] == [1]
    assert [(u["shard"], u["exit_code"]) for u in replication["unjoined"]] == [(1, -9)]
    assert [r["shard"] for r in replication["rolled_back"]] == [0]  # the root's backup
    assert replication["backups_lost"] == []
    # each restarted primary got a new backup, after shard 1's own replacement
    replaced_after = [r["shard"] for r in replication["replacements"]
                      if r["at_s"] > replication["unjoined"][0]["at_s"]]  # fmt: skip
    assert sorted(replaced_after) == [0, 1], replication
    # ... which joined it at the version the group went back to
    joined = sorted(log.name.split("-")[0] for log in (out / "logs").glob("*.log")
                    if f"backup joined at version {version} " in log.read_text())  # fmt: skip
    assert joined == ["server", "shard"], joined


def test_a_whole_group_served_here_is_refused_replicas(tmp_path):
    """`minips server --servers K --replicas 2` (every shard in this one command) would
    start primaries no backup ever joins: one line says how to serve the pairs."""
    done = subprocess.run(
        [sys.executable, "-m", "minips", "server", "--servers", "2", "--replicas", "2",
         "--model", "mlp", "--dataset", "synthetic"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --replicas 2 with --servers K: serve each shard's pair with --shard J "
        "(`minips run --servers K --replicas 2` starts them all)"
    ]
