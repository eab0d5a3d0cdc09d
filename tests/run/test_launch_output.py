"""What `minips launch` prints under mpirun: rank 0 the same progress as `minips run`, a
shard what a person needs (its start, the workers it sees, its stop), not every periodic
checkpoint (those go to debug level)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from test_launch_group import _free_port


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (openmpi-bin) is not installed")
def test_under_mpirun_rank_0_shows_progress_and_shards_no_periodic_checkpoints(tmp_path):
    out = tmp_path / "mpi"
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "4",
            sys.executable, "-m", "minips", "launch", "--servers", "2",
            "--port", str(_free_port()), "--out", str(out), "--model", "mlp",
            "--dataset", "synthetic", "--epochs", "2", "--eval-interval", "30",
            "--checkpoint-every", "4"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=os.environ)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    text = done.stdout + done.stderr
    # 64 updates: 16 periodic checkpoints per shard; only each shard's last one is said.
    assert text.count("checkpoint at version") <= 1, text
    assert "serving 4 parameters on" in text and "stopped at version 64" in text, text
    progress = [line for line in done.stderr.splitlines() if line.startswith("training ")]
    assert progress and progress[-1].startswith("training 4000/4000 samples (100%)"), text
