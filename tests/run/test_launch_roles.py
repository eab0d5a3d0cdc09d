"""The role each process of a launched job takes (minips.run.cluster.role_of), what the
coordinator runs, and how it names who never arrived: on their own, without a job."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from minips.errors import ConfigError, MinipsError
from minips.results.rundir import RunDir
from minips.run import cluster
from minips.run.cluster import COORDINATOR, SHARD, WORKER, LaunchedRun, Role, role_of
from minips.run.config import RunConfig
from minips.run.launchenv import LaunchEnv


def _ranked(rank: int, world_size: int) -> LaunchEnv:
    return LaunchEnv("torchrun", rank, world_size, "127.0.0.1", 5555)


def _dmlc(role: str, servers: int = 2, workers: int = 3, worker_id: int | None = None):
    return LaunchEnv("dmlc", None, None, "10.0.0.1", 9092, role, servers, workers, worker_id)


def test_the_first_servers_ranks_serve_and_the_rest_train():
    """N = 5 processes, K = 2: rank 0 the coordinator (the root), rank 1 shard 1, ranks
    2..4 workers 0..2; rank K is worker 0, not a shard."""
    roles = [role_of(_ranked(rank, 5), servers=2) for rank in range(5)]
    assert roles == [
        Role(COORDINATOR, 0, 2, 3),
        Role(SHARD, 1, 2, 3),
        Role(WORKER, 0, 2, 3),
        Role(WORKER, 1, 2, 3),
        Role(WORKER, 2, 2, 3),
    ]
    assert role_of(_ranked(1, 2), servers=1) == Role(WORKER, 0, 1, 1)


@pytest.mark.parametrize(("world_size", "servers"), [(2, 2), (1, 1), (3, 4)])
def test_a_job_with_no_process_left_to_train_is_refused(world_size, servers):
    with pytest.raises(ConfigError, match=f"{world_size} processes cannot be {servers} server"):
        role_of(_ranked(0, world_size), servers)
    assert role_of(_ranked(0, servers + 1), servers).workers == 1  # one more: one worker


def test_under_dmlc_the_scheduler_serves_shard_0_beside_the_server_processes():
    """DMLC_NUM_SERVER server processes and the scheduler: K = DMLC_NUM_SERVER + 1 shards;
    --servers may say so, or be left at 1; anything else is refused."""
    for servers in (1, 3):
        assert role_of(_dmlc("scheduler"), servers) == Role(COORDINATOR, 0, 3, 3)
        assert role_of(_dmlc("server"), servers) == Role(SHARD, None, 3, 3)
        assert role_of(_dmlc("worker", worker_id=2), servers) == Role(WORKER, 2, 3, 3)
    for servers in (2, 4):
        with pytest.raises(ConfigError, match=f"--servers {servers}: a DMLC job .* has 3 shards"):
            role_of(_dmlc("scheduler"), servers)


def test_the_coordinator_runs_a_root_that_awaits_the_evaluator(tmp_path, monkeypatch):
    """The evaluator starts beside the root, the workers anywhere: the root awaits one
    observer before it stops (a short job would end before the final evaluation)."""
    ran = []

    class Recorded:
        def __init__(self, config, run_dir, eval_interval, startup_timeout, **kw):
            ran.append(config)

        def run(self):
            return {}

    monkeypatch.setattr(cluster, "LaunchedRun", Recorded)
    config = RunConfig(model="mlp", dataset="synthetic")
    run_dir = RunDir(tmp_path / "run")
    cluster.coordinate(config, _ranked(0, 3), run_dir, eval_interval=2.0, startup_timeout=5.0)
    assert ran[0].observers_awaited == 1 and ran[0].bind == "tcp://127.0.0.1:5555"
    assert json.loads(run_dir.config.read_text())["observers_awaited"] == 1


def _assembly(stats: dict, launcher: str, servers: int = 2, workers: int = 3) -> str:
    """The error _check_assembly raises for `stats` once the startup timeout passed."""
    stopped = []
    processes = SimpleNamespace(stop_all=lambda: stopped.append(1))
    run = SimpleNamespace(config=SimpleNamespace(servers=servers, workers=workers),
                          launcher=launcher, startup_timeout=5.0, _elapsed=lambda: 6.0,
                          _assembled=False, processes=processes)  # fmt: skip
    with pytest.raises(MinipsError) as err:
        LaunchedRun._check_assembly(run, stats)
    assert stopped == [1]
    return str(err.value)


def test_a_job_that_did_not_assemble_names_each_missing_process_by_its_launcher_rank():
    """K = 2, 3 workers: worker r is rank r + 2 of the job; a missing shard j is rank j."""
    group = {"addresses": ["tcp://a:1", "tcp://b:2"]}
    stats = {"group": group, "workers": [{"rank": 1}, {"rank": 5, "observer": True}]}
    assert _assembly(stats, "torchrun") == (
        "the job did not assemble within 5 s: worker 0 (rank 2), worker 2 (rank 4) never arrived"
    )
    assert "worker 0 (a DMLC worker), worker 2 (a DMLC worker)" in _assembly(stats, "dmlc")
    no_shard = {"group": {"addresses": ["tcp://a:1", ""]}, "workers": []}
    assert _assembly(no_shard, "torchrun").endswith(": shard 1 (rank 1) never arrived")
