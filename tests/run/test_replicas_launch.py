"""`minips launch --replicas 2` under mpirun and torchrun: rank 0 runs the server's primary and its
backup as its children; the primary SIGKILLed, the backup takes over on the job's root
address, the job (whose ranks all live) finishes with the failover in its summary and no
update lost. With `--servers 2` the shard's rank runs its shard's pair the same way: its
primary SIGKILLed, an ssgd job ends with exactly the model of the same job never killed,
the failover in the summary. A shard rank stops its replicas on SIGTERM, and says in one
line that its root never listened; DMLC servers are still refused replicas."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_launch_group import _free_port
from test_replicas import WORKER_ENV, _kill_at, _kill_when_held
from test_replicas_group import _lost_by_sigkill, _same_models

from minips.errors import ConfigError
from minips.results.rundir import RunDir
from minips.run.cluster import LaunchedRun, check_launch_replicas
from minips.run.config import RunConfig
from minips.run.replicas import ReplicaSet
from minips.run.shardrank import replication_file

MINIPS = [sys.executable, "-m", "minips"]
# test_replicas.py's run (ssgd, a fixed seed); the workers are ranks 1 and 2
JOB = ("--rule", "ssgd", "--model", "mlp", "--dataset", "synthetic", "--lr", "0.05",
       "--momentum", "0.5", "--epochs", "30", "--seed", "0", "--eval-interval", "30")  # fmt: skip


def _master_port() -> int:
    """A port free with the next one: torchrun's agent listens on the first, the job's root
    on the second (a probe of the first alone leaves the second to chance)."""
    for _ in range(100):
        port = _free_port()
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two free ports in a row")


def _torchrun() -> str | None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    return torchrun if Path(torchrun).exists() else None


def _launcher(name: str, out: Path) -> list[str]:
    """3 processes under `name`: rank 0 the coordinator (primary and backup its
    children), ranks 1 and 2 the workers."""
    if name == "mpirun":
        if shutil.which("mpirun") is None:
            pytest.skip("mpirun (openmpi-bin) is not installed")
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "3", *MINIPS,
                "launch", "--port", str(_free_port()), "--out", str(out), "--replicas", "2",
                *JOB]  # fmt: skip
    if (torchrun := _torchrun()) is None:
        pytest.skip("torchrun (the optional PyTorch) is not installed")
    # the job's root listens on MASTER_PORT + 1 (the agent's rendezvous store on MASTER_PORT)
    return [torchrun, "--nproc-per-node", "3", "--master-port", str(_master_port()), "--no-python",
            *MINIPS, "launch", "--out", str(out), "--replicas", "2", *JOB]  # fmt: skip


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_under_a_launcher_a_killed_primary_fails_over_and_the_job_finishes(tmp_path, launcher):
    out = tmp_path / launcher
    env = {**os.environ, **WORKER_ENV, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(_launcher(launcher, out), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)  # fmt: skip
    try:
        _kill_at(proc, out, "primary", version=40)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stdout[-2000:] + stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "finished" and summary["updates_lost"] == 0
    assert summary["samples"] == 2000 * 30 and summary["restarts"] == 0
    failovers = summary["replication"]["failovers"]
    assert len(failovers) == 1 and failovers[0]["exit_code"] == -signal.SIGKILL
    assert failovers[0]["redone"] >= 0  # the record is whole: the backup's takeover logged
    assert len(summary["replication"]["replacements"]) >= 1  # a new backup joined


# ssgd over a group of 2 shards, each a pair (4 replicas, 2 workers, an evaluator and the
# launchers on 2 cores: a replica can go unscheduled for a second, so the failover bound is
# 3 s, as in test_replicas_group.py).
GROUP_JOB = ("--servers", "2", "--replicas", "2", "--failover-after", "3", "--rule", "ssgd",
             "--model", "mlp", "--dataset", "synthetic", "--lr", "0.05", "--momentum", "0.5",
             "--epochs", "8", "--seed", "0", "--eval-interval", "30")  # fmt: skip


def _group_job(out: Path) -> subprocess.Popen:
    """mpirun -n 4: rank 0 the root's pair, rank 1 shard 1's pair, ranks 2 and 3 the workers."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun (openmpi-bin) is not installed")
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "4", *MINIPS, "launch",
            "--port", str(_free_port()), "--out", str(out), *GROUP_JOB]  # fmt: skip
    env = {**os.environ, **WORKER_ENV, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)  # fmt: skip


def _finished(proc: subprocess.Popen, out: Path) -> dict:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-2000:]
    return json.loads((out / "summary.json").read_text())


def test_a_launched_shards_primary_killed_fails_over_and_changes_nothing(tmp_path):
    """Shard 1's primary, a child of rank 1, SIGKILLed while training: its backup takes
    over, mpirun sees no rank die, and the job ends with the calm job's exact model."""
    calm_out, out = tmp_path / "calm", tmp_path / "killed"
    calm, proc = _group_job(calm_out), _group_job(out)
    try:
        _kill_when_held(proc, out / "endpoint-shard1", out, 1, "primary", version=10)
        calm_summary, summary = _finished(calm, calm_out), _finished(proc, out)
    finally:
        for job in (calm, proc):
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.communicate()
    assert (summary["loss"], summary["accuracy"]) == (calm_summary["loss"],
                                                      calm_summary["accuracy"])  # fmt: skip
    assert summary["updates"] == calm_summary["updates"]
    _same_models(out, calm_out)
    assert summary["ended"] == "finished" and summary["group"]["consistent"]
    assert summary["updates_lost"] == 0 and summary["restarts"] == 0
    replication = summary["replication"]
    assert _lost_by_sigkill(replication) == 1  # each replica lost replaced, one by the kill
    killed = [f for f in replication["failovers"] if f["exit_code"] == -signal.SIGKILL]
    assert [f["shard"] for f in killed] == [1] and killed[0]["redone"] >= 0, replication
    assert any(r["shard"] == 1 for r in replication["replacements"]), replication
    assert calm_summary["replication"]["replicas"] == 2  # the calm job was replicated too


def _shard_rank(out: Path, root_port: int, *extra: str) -> subprocess.Popen:
    """Rank 1 of 3 of a torchrun-like job of two servers with replicas, alone."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_", "PMIX_", "SLURM_", "DMLC_"))}  # fmt: skip
    env.update(RANK="1", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(root_port))
    argv = [*MINIPS, "launch", "--out", str(out), "--servers", "2", "--replicas", "2",
            "--model", "mlp", "--dataset", "synthetic", *extra]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip


def test_a_shard_rank_whose_root_never_listens_ends_with_one_line(tmp_path):
    out = tmp_path / "never"
    proc = _shard_rank(out, _free_port(), "--startup-timeout", "2")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert stderr.strip().splitlines() == [
        "error: shard 1: the root at 127.0.0.1:" + stderr.split("127.0.0.1:")[1].split()[0]
        + " did not listen within 2 s (did rank 0 start?)"
    ]  # fmt: skip
    assert not out.exists()  # nothing written where rank 0 would have claimed the directory


def _pids_of(argv_part: str, inside: str) -> list[int]:
    """The processes whose command line has `argv_part` and an argument containing `inside`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv_part in argv and any(inside in arg for arg in argv):
            found.append(int(entry.name))
    return found


def test_a_shard_rank_stops_its_primary_on_sigterm(tmp_path):
    """A root that accepts connections but never answers: the rank has started its shard's
    primary (which waits for its join), and SIGTERM stops that child before the rank ends."""
    out = tmp_path / "sigterm"
    with socket.socket() as root:
        root.bind(("127.0.0.1", 0))
        root.listen()
        proc = _shard_rank(out, root.getsockname()[1])
        try:
            deadline = time.monotonic() + 30
            # the primary has started and says it waits for the root (a signal while the
            # rank is still starting a child is a narrower case than this one)
            while not (primaries := _pids_of("server", str(out))) or not any(
                "waiting for the group's root" in log.read_text(errors="replace")
                for log in (out / "logs").glob("*.log")
            ):
                assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert _pids_of("server", str(out)) == []  # stopped and reaped by the rank
    assert all(not Path(f"/proc/{pid}").exists() for pid in primaries)


def test_the_coordinator_merges_the_records_each_shard_rank_wrote(tmp_path):
    """Rank 0 watches the root's pair only; shard 1's rank wrote its pair's records once
    both stopped, and the summary's `replication` has them among the root's, in time order."""
    run_dir = RunDir(tmp_path)
    run_dir.updates_log(0, 1).write_text("")  # shard 1 joined
    shard1 = {"replicas": 2, "failovers": [{"shard": 1, "exit_code": -9, "at_s": 4.0}],
              "backups_lost": [], "replacements": [{"shard": 1, "name": "b", "at_s": 5.0}],
              "unjoined": [], "rolled_back": []}  # fmt: skip
    replication_file(run_dir.shard_endpoint(1)).write_text(json.dumps(shard1))
    replicas = ReplicaSet(None, run_dir.config, run_dir, 0.0, servers=2, shards=1)
    root = replicas.watches[0]
    assert [watch.shard for watch in replicas.watches] == [0]
    root.replacements.append({"shard": 0, "name": "backup-2", "at_s": 4.5})
    run = SimpleNamespace(config=SimpleNamespace(servers=2), dir=run_dir, replicas=replicas)
    run._stopped = lambda shard: LaunchedRun._stopped(run, shard)
    LaunchedRun.wait_for_shards(run, timeout=5)
    merged = replicas.records()
    assert merged["failovers"] == shard1["failovers"]
    assert [r["shard"] for r in merged["replacements"]] == [0, 1]  # by at_s


def test_launch_refuses_replicas_only_for_dmlc_servers():
    with pytest.raises(ConfigError, match="--replicas 2 under DMLC"):
        check_launch_replicas(RunConfig(servers=2, replicas=2), "dmlc")
    for launcher in ("openmpi", "torchrun", "slurm"):  # a group's shards: built
        check_launch_replicas(RunConfig(servers=2, replicas=2), launcher)
    check_launch_replicas(RunConfig(servers=1, replicas=2), "dmlc")  # the scheduler alone
