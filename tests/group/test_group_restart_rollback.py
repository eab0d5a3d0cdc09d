"""The version an ssgd group goes back to when one of its shards crashed
(minips/run/group_recovery.py): the highest one every shard can restart from that lies
below the round in flight, so that round's retries are refused by every shard. Real
processes stand in for the shards (sleeps), one really killed; the files are real shard
checkpoints and update logs."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest
from test_group_parts import _shard_file

from minips.results.rundir import RunDir
from minips.run.group_recovery import GroupRollback
from minips.run.processes import ProcessGroup
from minips.run.recovery import ServerRestarts
from minips.run.replicas import ReplicaSet, link_file

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _log(path: Path, last: int) -> None:
    records = ({"event": "update", "time": 0.01 * v, "version": v} for v in range(1, last + 1))
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


@pytest.mark.parametrize(
    ("root_reached", "expected"),
    [(70, 50), (51, 0)],  # 51: the root applied round 51, based at 50, the saved version
)
def test_the_group_goes_back_below_the_round_in_flight(tmp_path, root_reached, expected):
    """Both shards saved round 50; shard 1 crashed at round 50 or later, the root reached
    `root_reached`. The round in flight is based at root_reached - 1 at least: the group
    goes back to a version below it, every later checkpoint set aside."""
    (tmp_path / "logs").mkdir()
    run_dir = RunDir(tmp_path)
    for shard in (0, 1):
        _shard_file(tmp_path, shard, 50, keep_previous=True)
        run_dir.shard_endpoint(shard).write_text(f"ipc://{tmp_path}/shard{shard}.sock\n")
    _log(run_dir.updates_log(0, 0), root_reached)
    _log(run_dir.updates_log(0, 1), 50)
    policies = [ServerRestarts(run_dir, tmp_path / "run.npz", j, 2) for j in (0, 1)]
    processes = ProcessGroup(tmp_path / "logs", {})
    lines: list[str] = []
    try:
        processes.start("server", SLEEP, policies[0])
        processes.start("shard-1", SLEEP, policies[1])
        processes["shard-1"].proc.send_signal(signal.SIGKILL)
        processes["shard-1"].proc.wait()
        rollback = GroupRollback.of("ssgd", processes, ["server", "shard-1"], policies,
                                    lines.append)  # fmt: skip
        assert rollback is not None and rollback.recover()
        assert not processes["server"].exited() and processes["server"].generation == 1
        restarts = [policy.restarts[-1] for policy in policies]
        assert [r.checkpoint_version for r in restarts] == [expected, expected]
        assert [r.rolled_back for r in restarts] == [True, False]
        assert restarts[0].updates_lost == root_reached - expected
        assert lines == [
            f"shard 1 crashed: the server group went back to version {expected} on every "
            f"shard ({root_reached - expected} round(s) dropped), so its shards stay at one "
            f"version"
        ]
        set_aside = sorted(p.name for p in tmp_path.glob("run-shard*.rolled-back-*.npz"))
        assert len(set_aside) == (2 if expected < 50 else 0), set_aside
    finally:
        processes.stop_all(grace=1)


def test_with_replicas_only_a_shard_that_lost_every_replica_rolls_the_group_back(tmp_path):
    """`--replicas 2`: shard 1's primary crashed while its backup runs is a failover, not a
    rollback (nothing is stopped); once no backup of it runs, the group goes back, the
    root's backup stopped before the root's primary (else it would take over) and recorded
    as stopped by the rollback, neither lost nor replaced."""
    (tmp_path / "logs").mkdir()
    run_dir = RunDir(tmp_path)
    for shard in (0, 1):
        _shard_file(tmp_path, shard, 50, keep_previous=True)
        run_dir.shard_endpoint(shard).write_text(f"ipc://{tmp_path}/shard{shard}.sock\n")
        # the primaries' replication links (nothing listens: no backup may be sent there)
        link_file(run_dir.shard_endpoint(shard)).write_text(f"ipc://{tmp_path}/link{shard}\n")
    _log(run_dir.updates_log(0, 0), 70)
    _log(run_dir.updates_log(0, 1), 50)
    policies = [ServerRestarts(run_dir, tmp_path / "run.npz", j, 2) for j in (0, 1)]
    processes = ProcessGroup(tmp_path / "logs", {})
    replicas = ReplicaSet(processes, run_dir.config, run_dir, 0.0, servers=2)
    try:
        for name, policy in (("server", policies[0]), ("shard-1", policies[1])):
            processes.start(name, SLEEP, policy)
        for watch, name in zip(replicas.watches, ("backup", "shard-1-backup"), strict=True):
            processes.start(name, SLEEP)
            watch.backup = name
        processes["shard-1"].proc.kill()
        processes["shard-1"].proc.wait()
        rollback = GroupRollback.of("ssgd", processes, ["server", "shard-1"], policies,
                                    [].append, replicas)  # fmt: skip
        assert rollback is not None and not rollback.recover()  # shard 1's backup takes over
        assert not any(processes[n].exited() for n in ("server", "backup", "shard-1-backup"))
        processes["shard-1-backup"].proc.kill()  # now no replica of shard 1 runs
        processes["shard-1-backup"].proc.wait()
        assert rollback.recover()
        assert processes["backup"].exited() and not processes["server"].exited()
        assert [r.checkpoint_version for r in (p.restarts[-1] for p in policies)] == [50, 50]
        records = replicas.records()
        assert [(r["shard"], r["name"]) for r in records["rolled_back"]] == [(0, "backup")]
        # shard 1's backup died by itself: lost (the launcher's next look would say so)
        assert [(r["shard"], r["exit_code"]) for r in records["backups_lost"]] == [(1, -9)]
        assert records["replacements"] == []
        assert replicas.live_backups() == []
        # the restarted primaries have not written their new links yet: the killed ones'
        # are no place to start a backup
        replicas.check()
        assert replicas.live_backups() == [] and replicas.records()["replacements"] == []
    finally:
        processes.stop_all(grace=1)


def test_an_interrupt_while_the_version_is_chosen_leaves_no_shard_frozen(tmp_path, monkeypatch):
    """Ctrl-C while the launcher reads the shards' files (the live ones are SIGSTOPped
    then): they run again, so the SIGTERM that stops the run reaches them."""
    (tmp_path / "logs").mkdir()
    run_dir = RunDir(tmp_path)
    policies = [ServerRestarts(run_dir, tmp_path / "run.npz", j, 2) for j in (0, 1)]
    processes = ProcessGroup(tmp_path / "logs", {})

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(ServerRestarts, "versions", interrupted)
    try:
        processes.start("server", SLEEP, policies[0])
        processes.start("shard-1", SLEEP, policies[1])
        processes["shard-1"].proc.send_signal(signal.SIGKILL)
        processes["shard-1"].proc.wait()
        rollback = GroupRollback.of("ssgd", processes, ["server", "shard-1"], policies, print)
        with pytest.raises(KeyboardInterrupt):
            rollback.recover()
        time.sleep(0.5)  # a signal's effect shows in /proc once the process is scheduled
        stat = Path(f"/proc/{processes['server'].proc.pid}/stat").read_text()
        assert stat.rsplit(")", 1)[1].split()[0] != "T", stat  # not stopped
    finally:
        processes.stop_all(grace=1)
