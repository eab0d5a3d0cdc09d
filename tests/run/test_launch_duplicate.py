"""A launcher that starts two processes with the same shard rank (docs/protocol.md 16.3):
the second is refused before it opens any of the live shard's files, and rank 0 writes
its summary whatever a peer did (a damaged peer log: one line, never a traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from minips.group.root import GROUPS
from minips.results.rundir import RunDir, write_results
from minips.worker.client import PSClient

MINIPS = [sys.executable, "-m", "minips"]
# Long enough that the job still trains while the duplicate is refused; stopped by hand.
JOB = ["--model", "mlp", "--dataset", "synthetic", "--epochs", "500", "--eval-interval", "30"]


def _launch(out: Path, port: int, rank: int) -> subprocess.Popen:
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "4"}
    argv = [*MINIPS, "launch", "--out", str(out), *JOB, "--servers", "2", "--port", str(port)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _wait_for(path: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.1)


def _records(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert b"\0" not in data, "the live shard's update log was clobbered"
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def test_a_second_process_with_a_live_shards_rank_is_refused_and_clobbers_nothing(tmp_path):
    from test_group_orphan import _free_port

    out, port = tmp_path / "job", _free_port()
    job = [_launch(out, port, rank) for rank in range(4)]
    try:
        _wait_for(out / "endpoint-shard1")
        log = out / "updates-shard1.jsonl"
        _wait_for(log)
        before = log.stat().st_size
        started = time.monotonic()
        duplicate = _launch(out, port, 1)
        _, stderr = duplicate.communicate(timeout=60)
        assert log.stat().st_size >= before and b"\0" not in log.read_bytes()  # not truncated
        assert "serving" not in stderr  # it never built the shard (nor opened its files)
        assert duplicate.returncode == 2 and time.monotonic() - started < 40
        assert (
            stderr.strip()
            .splitlines()[-1]
            .startswith(
                "error: the group's root refused this shard (full): shard 1 is held by a live shard"
            )
        ), stderr[-1500:]
        assert "Traceback" not in stderr
        with PSClient(f"tcp://127.0.0.1:{port}", groups=GROUPS, timeout=5.0) as operator:
            operator.stop()  # every shard of the group
        results = [proc.communicate(timeout=120) + (proc.returncode,) for proc in job]
    finally:
        for proc in job:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert [code for _, _, code in results] == [0, 0, 0, 0], [r[1][-800:] for r in results]
    assert all("Traceback" not in stderr for _, stderr, _ in results)
    assert _records(log)[-1]["event"] == "server"  # whole, to its final record
    summary = json.loads((out / "summary.json").read_text())
    assert [row["shard"] for row in summary["shards"]] == [0, 1]
    # stopped by hand under an async rule: a push in flight may reach one shard only
    assert summary["shards"][1]["updates"] > 0 and summary["shards"][0]["updates"] > 0


def test_rank_0_writes_its_summary_over_a_damaged_peer_log(tmp_path, capsys):
    run_dir = RunDir(tmp_path)
    stats = {"updates": 3, "samples": 96, "version": 3, "workers": []}
    (tmp_path / "updates.jsonl").write_text(
        json.dumps({"event": "server", "time": 2.0, "stats": stats}) + "\n"
    )
    (tmp_path / "eval.jsonl").write_text(
        json.dumps({"event": "eval", "time": 1.0, "accuracy": 0.5, "loss": 1.0, "updates": 3})
        + "\n"
    )
    (tmp_path / "updates-shard1.jsonl").write_bytes(b"\0" * 64 + b'{"event": "server"}\n')
    summary = write_results(run_dir, "asgd", 0, 3.0, {}, servers=2)
    assert json.loads(run_dir.summary.read_text()) == summary
    assert summary["shards"][0]["updates"] == 3 and summary["shards"][1]["updates"] is None
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "shard 1's update log (updates-shard1.jsonl) is damaged" in lines[0]
