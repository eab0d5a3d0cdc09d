"""`minips launch --replicas 2` under mpirun and torchrun: rank 0 runs the server's primary and its
backup as its children; the primary SIGKILLed, the backup takes over on the job's root
address, the job (whose ranks all live) finishes with the failover in its summary and no
update lost. A group's shards, ranks of their own, are refused replicas."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_launch_group import _free_port
from test_replicas import WORKER_ENV, _kill_at

from minips.errors import ConfigError
from minips.run.cluster import check_launch_replicas
from minips.run.config import RunConfig

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


def test_launch_refuses_replicas_for_a_group():
    with pytest.raises(ConfigError, match="replicates one server"):
        check_launch_replicas(RunConfig(servers=2, replicas=2))
    check_launch_replicas(RunConfig(servers=1, replicas=2))  # one server: built
