"""`minips server --config RUN/config.json` on a server-group run (README, "by hand") keeps
the trained model: the group resumes from its shards' checkpoints, and stopping it twice
leaves every checkpoint file of the run at the run's version (docs/protocol.md 5.8)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _version(path: Path) -> int:
    with np.load(path) as data:
        return int(data["version"])


def _files(run: Path) -> dict[str, int]:
    names = ["checkpoint.npz", "checkpoint-shard0.npz", "checkpoint-shard1.npz"]
    return {name: _version(run / name) for name in names}


def _serve_and_stop(run: Path, log: Path) -> None:
    """The by-hand server on the run's config, stopped with Ctrl-C once its group is up."""
    argv = [sys.executable, "-m", "minips", "server", "--config", str(run / "config.json")]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while "on ipc://" not in log.read_text().split("shards 1..1 joining")[-1]:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(60) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)


def test_a_group_served_from_its_run_config_keeps_the_trained_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--servers", "2", "--model", "mlp",
            "--dataset", "synthetic", "--epochs", "1", "--out", str(run), "--quiet"]  # fmt: skip
    subprocess.run(argv, check=True, timeout=300, capture_output=True)
    trained = _files(run)
    final = trained["checkpoint.npz"]
    assert final > 0 and set(trained.values()) == {final}, trained
    for attempt in (1, 2):
        _serve_and_stop(run, tmp_path / f"server{attempt}.log")
        assert _files(run) == trained, (attempt, (tmp_path / f"server{attempt}.log").read_text())
    previous = {name: _version(run / name) for name in
                ("checkpoint.prev.npz", "checkpoint-shard0.prev.npz", "checkpoint-shard1.prev.npz")
                if (run / name).exists()}  # fmt: skip
    assert all(version >= final for version in previous.values()), previous


def test_a_group_resumed_run_served_again_keeps_its_newer_model(tmp_path: Path) -> None:
    """A run started with --resume records it in its config; serving that config again
    must not start from the older file and write it over the model the run trained."""
    first, second = tmp_path / "first", tmp_path / "second"
    common = [sys.executable, "-m", "minips", "run", "--servers", "2", "--model", "mlp",
              "--dataset", "synthetic", "--epochs", "1", "--quiet"]  # fmt: skip
    subprocess.run([*common, "--out", str(first)], check=True, timeout=300, capture_output=True)
    resume = ["--resume", str(first / "checkpoint.npz"), "--out", str(second)]
    subprocess.run([*common, *resume], check=True, timeout=300, capture_output=True)
    trained = _files(second)
    assert trained["checkpoint.npz"] > _version(first / "checkpoint.npz")
    _serve_and_stop(second, tmp_path / "server.log")
    assert _files(second) == trained, (tmp_path / "server.log").read_text()
