"""A replicated server (`--replicas 2`): SIGKILL the primary (or the backup) of a running
`minips run` under ssgd; the run ends with exactly the final model of the same run never
killed (its loss, accuracy and checkpoint's arrays, bit for bit), and its summary records
the failover with no update lost.

Why exactly: the backup has applied every input the primary answered (a reply leaves only
once the backup holds its request), ssgd sums a round's gradients in rank order, and the
workers' retries are applied once (the backup holds the registry), so no gradient is lost,
doubled or reordered by the failover (minips/ops/replication.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_recovery import _address
from test_server_support import RawPeer

from minips.ops.checkpoint_file import load_checkpoint
from minips.protocol import wire
from minips.run.replicas import welcomed_file

RUN = ("--rule", "ssgd", "--model", "mlp", "--dataset", "synthetic", "--lr", "0.05",
       "--momentum", "0.5", "--workers", "2", "--epochs", "30", "--seed", "0",
       "--eval-interval", "30")  # fmt: skip
# A request lost with the killed primary is sent again after 2 s, not the default 10.
WORKER_ENV = {"MINIPS_WORKER_TIMEOUT": "2"}


def _start(out: Path, *extra: str, worker_env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet", *RUN, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(worker_env or WORKER_ENV)},
    )


def _stats(out: Path) -> dict | None:
    """The run's server's `stats` (None while none answers)."""
    return _stats_at(out / "endpoint")


def _stats_at(endpoint: Path) -> dict | None:
    """The `stats` of the one server whose endpoint file is `endpoint` (None while none
    answers). Asked of that server alone, on a socket of its own: a group root's
    `PSClient.stats` would also ask every shard, and fail while one of them is failing over."""
    address = _address(endpoint)
    if address is None:
        return None
    peer = RawPeer(address)
    try:
        peer.send(wire.encode({"op": "stats", "rid": 1}))
        return peer.recv().header["stats"] if peer.has_reply(2.0) else None
    finally:
        peer.close()


def _backups(out: Path, shard: int | None = None) -> dict[int, list[str]]:
    """The run's backup processes (of shard `shard` when given): pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "--backup-of" not in argv or str(out / "config.json") not in argv:
            continue
        if shard is None or ("--shard" in argv and argv[argv.index("--shard") + 1] == str(shard)):
            found[int(entry.name)] = argv
    return found


def _held_by(endpoint: Path, out: Path, shard: int | None, primary: int) -> int | None:
    """The live backup that holds the state of the server whose endpoint file is
    `endpoint`: the one its welcomed file names (written by the backup once it loaded the
    welcome's snapshot, docs/protocol.md 17.2). None while none does: a primary's stats
    say `backup` from the moment it sends the welcome, before the backup holds anything."""
    try:
        pid = int(welcomed_file(endpoint).read_text())
    except (OSError, ValueError):
        return None
    return pid if pid != primary and pid in _backups(out, shard) else None


def _kill_when_held(
    proc: subprocess.Popen, endpoint: Path, out: Path, shard: int | None, which: str, version: int
) -> int:
    """SIGKILL the primary or the backup of the server whose endpoint file is `endpoint`
    once it is past `version` with a backup holding its state; returns the version.
    A run `proc` that ended first fails the test with its own output."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        _still_running(proc)
        stats = _stats_at(endpoint)
        if stats and stats["version"] > version and stats["replication"]["backup"]:
            primary = stats["replication"]["pid"]
            backup = _held_by(endpoint, out, shard, primary)
            if backup is not None:
                os.kill(primary if which == "primary" else backup, signal.SIGKILL)
                return stats["version"]
        time.sleep(0.1)
    raise AssertionError(f"{endpoint.name}'s server did not train with a backup holding its state")


def _still_running(proc: subprocess.Popen) -> None:
    """AssertionError with the run's exit code and the end of its output once it ended."""
    if proc.poll() is not None:
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the run ended (exit {proc.returncode}) before the kill:\n"
                             f"{stdout[-2000:]}\n{stderr[-2000:]}")  # fmt: skip


def _kill_at(proc: subprocess.Popen, out: Path, which: str, version: int) -> int:
    """SIGKILL the primary or the backup once the run's server is past `version` with a
    backup holding its state; returns the version it was at."""
    return _kill_when_held(proc, out / "endpoint", out, None, which, version)


def _stop_if_running(proc: subprocess.Popen) -> None:
    """A run the test leaves (its assertion failed): its whole process group killed."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _finish(proc: subprocess.Popen, out: Path) -> dict:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    return json.loads((out / "summary.json").read_text())


def _same_model(a: Path, b: Path) -> None:
    first, second = load_checkpoint(a / "checkpoint.npz"), load_checkpoint(b / "checkpoint.npz")
    assert first.version == second.version
    assert first.arrays.keys() == second.arrays.keys()
    for name, array in first.arrays.items():
        if name != "meta":  # its time differs
            np.testing.assert_array_equal(array, second.arrays[name], err_msg=name)


def _calm_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The run never killed (RUN with --replicas 2): its directory and summary. Run once per
    test session and shared by every test that compares a killed run with it (ssgd with a
    fixed seed ends the same whenever and beside whatever it runs): the first test process
    to ask runs it under a lock, the others wait for it and read it. One that failed fails
    every test that asks for it again with its error."""
    shared = tmp_path_factory.getbasetemp()
    if shared.name.startswith("popen-gw"):  # an xdist test process's: the session's is above
        shared = shared.parent
    out, failed = shared / "calm-replicated", shared / "calm-replicated.failed"
    with open(shared / "calm-replicated.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failed.exists():
            raise AssertionError(f"the calm run failed earlier: {failed.read_text()}")
        if not (shared / "calm-replicated.ok").exists():
            proc = _start(out, "--replicas", "2")
            try:
                _finish(proc, out)
            except BaseException as error:
                failed.write_text(f"{type(error).__name__}: {error}"[-3000:])
                raise
            finally:
                _stop_if_running(proc)
            (shared / "calm-replicated.ok").touch()
    return out, json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("killed", ["primary", "backup"])
def test_a_replica_killed_mid_training_changes_nothing_in_the_final_model(
    tmp_path, tmp_path_factory, killed
):
    out = tmp_path / "killed"
    proc = _start(out, "--replicas", "2")
    try:
        _kill_at(proc, out, killed, version=40)
        (calm_out, calm_summary), summary = _calm_run(tmp_path_factory), _finish(proc, out)
    finally:
        _stop_if_running(proc)
    assert summary["loss"] == calm_summary["loss"]
    assert summary["accuracy"] == calm_summary["accuracy"]
    assert summary["updates"] == calm_summary["updates"]
    _same_model(out, calm_out)
    replication = summary["replication"]
    assert summary["updates_lost"] == 0
    _each_lost_replica_replaced(replication)
    if killed == "primary":
        assert len(replication["failovers"]) == 1
        failover = replication["failovers"][0]
        assert failover["exit_code"] == -signal.SIGKILL
        assert failover["version"] > 40
        # the dead primary's updates its backup lacked: at most the round in flight (its
        # replies were held), read from the dead primary's own updates log
        assert 0 <= failover["redone"] <= 1, failover
        assert failover["takeover_s"] < 3  # the 1 s bound, its bind, a busy machine
    else:
        assert replication["failovers"] == []
        assert [b["exit_code"] for b in _killed(replication["backups_lost"])] == [-9]


def _killed(records: list[dict]) -> list[dict]:
    """The replicas lost to this test's SIGKILLs. On a loaded machine a primary may also
    stall past the failover bound: its backup then finds the address still answered and
    exits with its `error:` line (exit status 2), and is replaced too (docs/protocol.md 17.2)."""
    assert all(r["exit_code"] in (-signal.SIGKILL, 2) for r in records), records
    return [r for r in records if r["exit_code"] == -signal.SIGKILL]


def _each_lost_replica_replaced(replication: dict) -> None:
    lost = len(replication["failovers"]) + len(replication["backups_lost"])
    assert len(replication["replacements"]) == lost, replication


def test_three_primaries_killed_in_turn_change_nothing_in_the_final_model(
    tmp_path, tmp_path_factory
):
    """Each kill once the replacement of the last one joined and training went on. Each
    step stretched 3x by sleeping (--hetero 3,3): a quick machine ended the run (480
    rounds in 14.5 s) before the third kill; ssgd's model does not depend on time."""
    out = tmp_path / "killed"
    proc = _start(out, "--replicas", "2", "--hetero", "3,3")
    try:
        at = 30
        for _ in range(3):
            at = _kill_at(proc, out, "primary", version=at) + 15
        (calm_out, calm_summary), summary = _calm_run(tmp_path_factory), _finish(proc, out)
    finally:
        _stop_if_running(proc)
    assert (summary["loss"], summary["accuracy"]) == (
        calm_summary["loss"],
        calm_summary["accuracy"],
    )
    _same_model(out, calm_out)
    replication = summary["replication"]
    assert [0 <= f["redone"] <= 1 for f in replication["failovers"]] == [True] * 3
    assert summary["updates_lost"] == 0
    _each_lost_replica_replaced(replication)
    _killed(replication["backups_lost"])  # none killed; a stalled primary's backup may be


@pytest.mark.parametrize("rule", ["asgd", "dana-gap"])
def test_every_acknowledged_push_is_applied_once_across_a_failover(tmp_path, rule):
    """asgd and the default rule apply each step's push as one update: the server's
    updates are exactly the workers' steps (a push lost would make fewer, one applied
    twice more), with the primary killed mid-training. lr 0.02: asgd's momentum 0.9 at 0.05
    diverged (and the run stopped as collapsed) on a loaded machine."""
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet", "--rule", rule,
         "--model", "mlp", "--dataset", "synthetic", "--lr", "0.02", "--workers", "2",
         "--epochs", "30", "--seed", "0", "--eval-interval", "30", "--replicas", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, **WORKER_ENV},
    )  # fmt: skip
    try:
        _kill_at(proc, out, "primary", version=100)
        summary = _finish(proc, out)
    finally:
        _stop_if_running(proc)
    reports = [json.loads(path.read_text()) for path in sorted(out.glob("worker-*.json"))]
    assert len(reports) == 2 and all(report["finished"] for report in reports)
    assert summary["updates"] == sum(report["steps"] for report in reports)
    assert summary["samples"] == sum(report["samples"] for report in reports)
    assert len(summary["replication"]["failovers"]) == 1 and summary["updates_lost"] == 0


def _new_backup(out: Path, known: set[int], shard: int | None = None, timeout: float = 60) -> int:
    """The pid of the run's (of shard `shard`'s) first backup process not in `known`, as
    soon as it exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in _backups(out, shard):
            if pid not in known:
                return pid
        time.sleep(0.01)
    raise AssertionError("no replacement backup")


def _serving_primary(endpoint: Path, deadline: float) -> int:
    """The pid of the replica that answers `stats` at the address in `endpoint` (a run's
    or a shard's endpoint file) once it is a primary."""
    while time.monotonic() < deadline:
        stats = _stats_at(endpoint)
        if stats is not None and stats["replication"]["role"] == "primary":
            return stats["replication"]["pid"]
        time.sleep(0.05)
    raise AssertionError("no primary serves")


def test_the_new_primary_lost_before_its_backup_joined_restarts_from_a_checkpoint(tmp_path):
    """The primary killed, then the backup that took over killed while its replacement
    (held by SIGSTOP) has not joined: that replacement holds no state, so the launcher
    stops it and restarts the server from its checkpoint, as without replicas; the run
    ends, its summary records the failover whole, the unjoined backup and the restart."""
    out = tmp_path / "killed"
    # the workers wait out the failover, the welcome's grace and the restart (4 attempts
    # of 6 s each, below the server's 30 s heartbeat timeout)
    slower = {"MINIPS_WORKER_TIMEOUT": "6"}
    proc = _start(out, "--replicas", "2", "--checkpoint-every", "20", worker_env=slower)
    try:
        _kill_at(proc, out, "primary", version=30)
        promoted = _serving_primary(out / "endpoint", time.monotonic() + 60)  # the backup took over
        replacement = _new_backup(out, {promoted})
        os.kill(replacement, signal.SIGSTOP)  # it never joins
        os.kill(promoted, signal.SIGKILL)
        summary = _finish(proc, out)
    finally:
        _stop_if_running(proc)
    replication = summary["replication"]
    assert len(replication["failovers"]) == 1
    assert replication["failovers"][0]["takeover_s"] > 0  # the record is whole
    assert [u["exit_code"] for u in replication["unjoined"]] == [-signal.SIGKILL]
    assert summary["restarts"] == 1 and summary["restart_log"][0]["exit_code"] == -9
    assert summary["ended"] == "finished" and summary["accuracy"] is not None


def test_a_backup_lost_before_it_joined_at_start_up_is_replaced_and_the_run_trains(tmp_path):
    """The first backup SIGKILLed as soon as it exists, before its primary welcomed it (a
    primary serves only once a backup joined): the launcher replaces it while it waits
    for the evaluator, and the run trains to its end, the loss and replacement recorded."""
    out = tmp_path / "startup"
    proc = _start(out, "--replicas", "2", "--epochs", "3")
    try:
        first = _new_backup(out, set())
        os.kill(first, signal.SIGKILL)
        summary = _finish(proc, out)
    finally:
        _stop_if_running(proc)
    replication = summary["replication"]
    assert [b["exit_code"] for b in _killed(replication["backups_lost"])] == [-signal.SIGKILL]
    assert replication["failovers"] == [] and summary["updates_lost"] == 0
    _each_lost_replica_replaced(replication)
    assert summary["ended"] == "finished" and summary["samples"] == 3 * 2000
