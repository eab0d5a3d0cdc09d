"""The launcher's restart paths (minips.run.launch.LocalRun) leave a crashed primary to its
backup: a primary that died between the launcher's look at the replicas and its look at the
servers is not restarted from its checkpoint (that would lose the updates since and put a
second server on the shard); the next look at the replicas makes the backup the server.
Real processes stand in for the replicas (sleeps), the primaries really killed."""

from __future__ import annotations

import sys

from minips.results.rundir import RunDir
from minips.run.config import RunConfig
from minips.run.launch import LocalRun

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _replicated_run(tmp_path, servers: int) -> LocalRun:
    """A LocalRun of `servers` shards with --replicas 2 whose primaries and backups run."""
    config = RunConfig(model="mlp", dataset="synthetic", rule="asgd", servers=servers,
                       replicas=2, checkpoint=str(tmp_path / "run.npz"))  # fmt: skip
    run = LocalRun(config, RunDir(tmp_path))
    (tmp_path / "logs").mkdir(exist_ok=True)
    for shard, watch in enumerate(run.replicas.watches):
        run.processes.start(watch.name, SLEEP, run.restarts[shard])
        backup = "backup" if shard == 0 else f"{watch.name}-backup"
        run.processes.start(backup, SLEEP)
        watch.backup = backup
    return run


def _kill(run: LocalRun, name: str) -> None:
    run.processes[name].proc.kill()
    run.processes[name].proc.wait()


def test_a_shard_primary_that_died_after_the_replicas_look_is_left_to_its_backup(tmp_path):
    run = _replicated_run(tmp_path, servers=2)
    try:
        dead = run.processes["shard-1"]
        _kill(run, "shard-1")
        run._restart_crashed_shards()  # the watch's order: replicas, then the servers
        assert run.processes["shard-1"] is dead and dead.generation == 0  # not restarted
        assert run.restarts[1].restarts == []
        backup = run.processes["shard-1-backup"]
        run.replicas.check()
        assert run.processes["shard-1"] is backup  # the backup is the shard's server now
    finally:
        run.processes.stop_all(grace=1)


def test_a_lone_primary_that_died_after_the_replicas_look_is_left_to_its_backup(tmp_path):
    run = _replicated_run(tmp_path, servers=1)
    try:
        dead = run.processes["server"]
        _kill(run, "server")
        assert run._server_exited()  # go on watching: not the run's end, not a restart
        assert run.processes["server"] is dead and dead.generation == 0
        assert run.restarts[0].restarts == [] and run.training_ended is None
        backup = run.processes["backup"]
        run.replicas.check()
        assert run.processes["server"] is backup
    finally:
        run.processes.stop_all(grace=1)


def test_a_primary_whose_backup_died_too_is_restarted_from_its_checkpoint(tmp_path):
    """Without a running backup the crash is the launcher's to recover, as without
    replicas (here: no checkpoint yet, so the shard starts again from the start)."""
    run = _replicated_run(tmp_path, servers=2)
    try:
        _kill(run, "shard-1-backup")
        _kill(run, "shard-1")
        run._restart_crashed_shards()
        assert run.processes["shard-1"].generation == 1 and not run.processes["shard-1"].exited()
        assert len(run.restarts[1].restarts) == 1
    finally:
        run.processes.stop_all(grace=1)
