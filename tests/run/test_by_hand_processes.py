"""The README's by-hand section, tried end to end on loopback with real processes: a
`minips server`, an evaluator and workers started as separate commands; the server exits by
itself when its workers are done; a worker killed mid-run is replaced with `--rank`."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from minips.ops.model_file import load_model
from minips.worker.client import PSClient

README = Path(__file__).resolve().parents[2] / "README.md"
FAST = ["--model", "mlp", "--dataset", "synthetic", "--epochs", "1"]  # the same, quicker


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _readme_commands(port: int) -> dict[str, list[str]]:
    """The by-hand block of the README, by command, its addresses put on loopback."""
    text = README.read_text()
    block = text.split("By hand, across machines", 1)[1].split("```sh\n", 1)[1].split("```")[0]
    commands = {}
    for line in block.strip().splitlines():
        line = line.split("#")[0].replace("0.0.0.0:5555", f"127.0.0.1:{port}")
        argv = shlex.split(line.replace("SERVER:5555", f"127.0.0.1:{port}"))
        commands[argv[1]] = argv[1:]
    return commands


def _minips(args: list[str], cwd: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "minips", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args} did not exit:\n{out}\n{err}") from None
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{out}\n{err}"
    return out, err


def _wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _ready(endpoint: str) -> bool:
    try:
        with PSClient(endpoint, timeout=0.5, retries=0) as probe:
            probe.stats()
        return True
    except Exception:
        return False


def test_readme_by_hand_section_on_loopback(tmp_path):
    port = _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    commands = _readme_commands(port)
    assert set(commands) == {"server", "evaluate", "worker"}, commands
    server = _minips(commands["server"] + FAST, tmp_path)
    _wait_for(lambda: _ready(endpoint), "the server")
    evaluator = _minips(commands["evaluate"], tmp_path)
    _wait_for(lambda: (tmp_path / "eval.jsonl").exists(), "the first evaluation")
    workers = [_minips(commands["worker"], tmp_path) for _ in range(2)]
    for worker in workers:
        out, err = _finish(worker)
        first, joined, *_, last = out.strip().splitlines()
        assert first.startswith(f"worker on {socket.gethostname()}: joining {endpoint}")
        assert re.fullmatch(rf"joined as rank [01] of 2 \(host {socket.gethostname()}\)", joined)
        assert re.fullmatch(r"rank [01]: 16 steps, 1000 samples in .* finished its shard", last)
        assert "samples" in err  # progress: piped, so a compact line, not a bar
    out, _ = _finish(server)  # exits by itself: nobody sent stop
    assert "every worker finished its epochs" in out and "checkpoint run.npz" in out
    _finish(evaluator)
    final = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()][-1]
    assert final["final"] and final["accuracy"] > 0.5
    assert load_model(tmp_path / "run.npz").n_params > 0  # a checkpoint, with its model spec


def test_a_killed_worker_is_replaced_with_rank_and_every_shard_is_trained(tmp_path):
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    server = _minips(
        [
            "server",
            "--bind",
            endpoint,
            "--workers",
            "2",
            "--heartbeat-timeout",
            "2",
            "--updates-log",
            "updates.jsonl",
            *FAST,
            "--epochs",
            "2",
        ],
        tmp_path,
    )
    _wait_for(lambda: _ready(endpoint), "the server")
    fast = _minips(["worker", "--connect", endpoint], tmp_path)
    doomed = _minips(["worker", "--connect", endpoint, "--slowdown", "30"], tmp_path)
    with PSClient(endpoint, timeout=5) as operator:

        def doomed_pushes() -> int:
            rows = [w for w in operator.stats()["workers"] if w["info"].get("pid") == doomed.pid]
            return rows[0]["pushes"] if rows else 0

        _wait_for(lambda: doomed_pushes() >= 2, "the slow worker's first pushes")
        doomed.send_signal(signal.SIGKILL)  # a crash: no bye
        doomed.communicate()
        rank = next(
            w["rank"] for w in operator.stats()["workers"] if w["info"].get("pid") == doomed.pid
        )
    _finish(fast)
    for _attempt in range(60):  # `full` until the server declares the dead one dead
        restarted = _minips(
            ["worker", "--connect", endpoint, "--rank", str(rank), "--report", "restarted.json"],
            tmp_path,
        )
        out, err = restarted.communicate(timeout=120)
        if restarted.returncode == 0:
            break
        assert "(full): rank" in err and "held by live worker" in err, err
        time.sleep(0.5)
    report = json.loads((tmp_path / "restarted.json").read_text())
    assert report["rank"] == rank and report["finished"] and report["samples"] == 2 * 1000
    out, _ = _finish(server)
    assert "every worker finished its epochs" in out
    records = [json.loads(line) for line in (tmp_path / "updates.jsonl").read_text().splitlines()]
    stats = next(r["stats"] for r in records if r["event"] == "server")
    by_rank: dict[int, int] = {}
    for row in stats["workers"]:
        by_rank[row["rank"]] = by_rank.get(row["rank"], 0) + row["samples"]
    # Each 1000-sample shard trained for 2 epochs; rank `rank` also holds the dead one's part.
    assert by_rank[1 - rank] == 2000 and by_rank[rank] >= 2000
    assert re.search(r"from 3 workers", out)
