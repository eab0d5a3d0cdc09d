"""`minips launch --replicas 2` under mpirun: rank 0 runs the server's primary and its
backup as its children; the primary SIGKILLed, the backup takes over on the job's root
address, the job (whose ranks all live) finishes with the failover in its summary and no
update lost. A group's shards, ranks of their own, are refused replicas."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

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


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (openmpi-bin) is not installed")
def test_under_mpirun_a_killed_primary_fails_over_and_the_job_finishes(tmp_path):
    out = tmp_path / "mpi"
    # rank 0: the coordinator (primary and backup its children); ranks 1, 2: the workers
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "3", *MINIPS, "launch",
            "--port", str(_free_port()), "--out", str(out), "--replicas", "2",
            *JOB]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **WORKER_ENV})  # fmt: skip
    try:
        _kill_at(out, "primary", version=40)
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
