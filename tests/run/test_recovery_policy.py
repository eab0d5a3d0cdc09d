"""The restart policy of a run's server on its own (minips.run.recovery.ServerRestarts):
which file a shard restarts from, what a restart from the start resumes, what a restart
costs. The whole runs are in test_recovery*.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from minips.errors import MinipsError
from minips.ops.checkpoint_file import Checkpoint, save_store
from minips.ops.checkpoints import shard_path
from minips.results.rundir import RunDir
from minips.run.recovery import MAX_RESTARTS, ServerRestarts, describe_restart
from minips.state.store import SGD, ParameterStore


def _checkpoint(path: Path, version: int) -> Path:
    params = {"w": np.zeros((2, 2), np.float32)}
    store = ParameterStore(params, SGD(params, lr=0.1))
    store.version = version
    return save_store(store, path)


def _dead(generation: int = 0, code: int = -9) -> SimpleNamespace:
    """A server process that died (what ServerRestarts reads of a Child)."""
    return SimpleNamespace(generation=generation, code=lambda: code, log_name="server",
                           last_line=lambda logs: "Killed")  # fmt: skip


def test_each_shard_of_a_group_restarts_from_its_own_file_the_root_too(tmp_path):
    """run.npz is the group's checkpoint; shard j's own is run-shardj.npz, shard 0's too."""
    group = tmp_path / "checkpoint.npz"
    _checkpoint(group, 9)  # the group's, made of the shards' files: no shard's own state
    for shard, version in ((0, 5), (1, 4)):
        _checkpoint(shard_path(group, shard), version)
    run_dir = RunDir(tmp_path)
    for shard, version in ((0, 5), (1, 4)):
        restarts = ServerRestarts(run_dir, group, shard=shard, servers=2)
        assert restarts.checkpoint == shard_path(group, shard)
        assert restarts.versions() == {0, version}
    alone = ServerRestarts(run_dir, group, shard=0, servers=1)
    assert alone.checkpoint == group and alone.versions() == {0, 9}


def test_a_server_dead_before_its_first_checkpoint_restarts_from_the_runs_resume(tmp_path):
    """No checkpoint yet: the next server starts where the run started, its own --resume
    file (not the seeded model), on the dead server's address."""
    run_dir = RunDir(tmp_path)
    started_from = _checkpoint(tmp_path / "given.npz", 7)
    restarts = ServerRestarts(run_dir, tmp_path / "checkpoint.npz", resume=str(started_from))
    run_dir.endpoint.write_text("tcp://127.0.0.1:5999\n")
    restarts.prepare(_dead())
    assert restarts.resume_options(1) == ["--resume", str(started_from),
                                          "--bind", "tcp://127.0.0.1:5999"]  # fmt: skip
    record = restarts.records()[0]  # from the start: the --resume file, at its version
    assert (record["resumed_from"], record["checkpoint_version"]) == (str(started_from), 7)
    seeded = ServerRestarts(run_dir, tmp_path / "checkpoint.npz")  # a run without --resume
    run_dir.endpoint.write_text("tcp://127.0.0.1:5999\n")
    seeded.prepare(_dead())
    assert seeded.resume_options(1) == ["--bind", "tcp://127.0.0.1:5999"]
    written = _checkpoint(tmp_path / "checkpoint.npz", 3)  # once it checkpointed: from there
    run_dir.endpoint.write_text("tcp://127.0.0.1:5999\n")
    restarts.prepare(_dead(generation=1))
    assert restarts.resume_options(2)[:2] == ["--resume", str(written)]


def test_a_restart_from_the_runs_resume_counts_its_loss_from_the_resume_files_version(tmp_path):
    """A server started from --resume at version 30 that logged up to 34 and died before
    its first checkpoint lost 4 updates, not 34; its line names the file."""
    run_dir = RunDir(tmp_path)
    given = _checkpoint(tmp_path / "given.npz", 30)
    (tmp_path / "updates.jsonl").write_text(
        "".join(f'{{"event": "update", "version": {v}}}\n' for v in range(31, 35))
    )
    restarts = ServerRestarts(run_dir, tmp_path / "checkpoint.npz", resume=str(given))
    run_dir.endpoint.write_text("tcp://127.0.0.1:5999\n")
    restarts.prepare(_dead())
    restart = restarts.restarts[0]
    assert (restart.resumed_from, restart.checkpoint_version, restart.last_version) == (
        str(given), 30, 34)  # fmt: skip
    assert (restart.updates_lost, restart.checkpoint_age_s) == (4, None)
    assert restart.line() == (
        "warning: the server crashed (exit code -9) and was restarted from the run's start, "
        f"its --resume file {given} at version 30: 4 update(s) lost"
    )
    seeded = ServerRestarts(run_dir, tmp_path / "checkpoint.npz")
    run_dir.endpoint.write_text("tcp://127.0.0.1:5999\n")
    seeded.prepare(_dead())
    assert seeded.restarts[0].line().endswith("restarted from the run's start: 34 update(s) lost")


def test_a_restarts_checkpoint_age_is_in_seconds(tmp_path):
    """checkpoint_age_s: from the checkpoint's time to the crash, in seconds."""
    resumed = Checkpoint(tmp_path / "checkpoint.npz", {"version": np.array(4)}, {"time": 1000.0})
    restart = describe_restart(resumed, tmp_path / "updates.jsonl", -9, now=1002.5)
    assert restart.checkpoint_age_s == 2.5
    assert (restart.checkpoint_version, restart.last_version, restart.updates_lost) == (4, 4, 0)


def test_a_server_is_restarted_at_most_max_restarts_times_rollbacks_not_counted(tmp_path):
    run_dir = RunDir(tmp_path)
    restarts = ServerRestarts(run_dir, tmp_path / "checkpoint.npz")
    for generation in range(MAX_RESTARTS):
        assert restarts.allows(_dead(generation))
        restarts.prepare(_dead(generation))
    restarts.prepare(_dead(MAX_RESTARTS, code=-15), at=0, rolled_back=True)  # not a crash
    assert not restarts.allows(_dead(MAX_RESTARTS + 1))
    assert restarts.final_crash()["exit_code"] == -9
    with pytest.raises(MinipsError) as refused:
        restarts.check_budget(_dead(MAX_RESTARTS + 1), tmp_path / "logs")
    assert str(refused.value).startswith(  # the crashes only: the rollback was no crash
        f"the server crashed {MAX_RESTARTS + 1} times (exit codes -9, -9, -9, -9), once more "
        f"than the {MAX_RESTARTS} restarts allowed"
    )
