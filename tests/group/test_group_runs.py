"""`minips run --servers K`: real processes. The same seed gives exactly the final test
loss and accuracy of one server (the same arithmetic in slices); a shard SIGKILLed twice,
once before its first checkpoint, is restarted while the other keeps serving; the group
checkpoint is the whole model, and resumes a group of another size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from minips.group.root import GROUPS
from minips.ops.checkpoints import shard_path
from minips.ops.model_file import load_model
from minips.run.config import RunConfig
from minips.run.launch import run_local
from minips.worker.client import PSClient

TINY = {"model": "mlp", "dataset": "synthetic", "epochs": 1, "seed": 3, "lr": 0.05}
# Workers re-send a request lost with a killed server after 5 s, not their default 10
# (MINIPS_WORKER_TIMEOUT is their --timeout): the restart is awaited, not its timeout.
WORKER_ENV = {"MINIPS_WORKER_TIMEOUT": "5"}


@pytest.mark.parametrize(("rule", "workers"), [("asgd", 1), ("ssgd", 2)])
def test_two_and_three_shards_end_exactly_where_one_server_does(tmp_path, rule, workers):
    def run(servers: int) -> dict:
        config = RunConfig(**TINY, rule=rule, workers=workers, servers=servers)
        return run_local(config, tmp_path / f"k{servers}", eval_interval=30)

    with ThreadPoolExecutor(3) as pool:  # the three runs at once: none depends on timing
        summaries = dict(zip((1, 2, 3), pool.map(run, (1, 2, 3)), strict=True))
    finals = {k: (s["loss"], s["accuracy"], s["updates"]) for k, s in summaries.items()}
    assert finals[2] == finals[1] and finals[3] == finals[1], finals
    for servers in (2, 3):
        rows = summaries[servers]["shards"]
        assert [row["shard"] for row in rows] == list(range(servers))
        assert all(row["updates"] == finals[1][2] for row in rows)
    # the group checkpoint is the whole model, the one server's to the last bit
    one = load_model(tmp_path / "k1" / "checkpoint.npz").params
    three = load_model(tmp_path / "k3" / "checkpoint.npz").params
    for name, array in one.items():
        np.testing.assert_array_equal(three[name], array)


def test_a_group_checkpoint_resumes_a_group_of_another_size(tmp_path):
    first = run_local(RunConfig(**TINY, workers=1, servers=3), tmp_path / "a", eval_interval=30)
    resumed = RunConfig(**{**TINY, "epochs": 1}, workers=1, servers=2,
                        resume=str(tmp_path / "a" / "checkpoint.npz"))  # fmt: skip
    second = run_local(resumed, tmp_path / "b", eval_interval=30)
    assert second["shards"][0]["version"] == 2 * first["updates"]  # went on from there
    meta = json.loads(str(np.load(tmp_path / "b" / "checkpoint.npz")["meta"]))
    assert meta["group"]["servers"] == 2 and meta["group"]["consistent"]


def _shard_pid(out: Path, shard: int) -> int | None:
    """The pid of the live process of shard `shard` of the run in `out`."""
    marker = str(out / f"endpoint-shard{shard}").encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in argv:
                return int(entry.name)
    return None


def _wait(what: str, condition, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := condition()) is not None and value is not False:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_shard_killed_twice_is_restarted_and_the_summary_says_so(tmp_path):
    # No checkpoint by time or by count: shard 1 writes one only when the test asks, so the
    # first kill lands before its first checkpoint however slowly the run starts (a timed
    # one would be due as soon as the first updates are, on a loaded machine).
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet",
            "--servers", "2", "--workers", "2", "--model", "mlp", "--dataset", "synthetic",
            "--epochs", "100", "--max-samples", "24000", "--checkpoint-interval", "0",
            "--eval-interval", "1"]  # fmt: skip
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, env={**os.environ, **WORKER_ENV})  # fmt: skip
    try:
        own_file = shard_path(out / "checkpoint.npz", 1)
        updates = out / "updates-shard1.jsonl"
        # 1: as soon as shard 1 has applied updates, before its first checkpoint
        _wait("shard 1's first updates", lambda: updates.exists() and updates.stat().st_size > 0)
        assert not own_file.exists()
        os.kill(_wait("shard 1", lambda: _shard_pid(out, 1)), signal.SIGKILL)
        # 2: once its restarted self has applied updates and written a checkpoint of its own
        restarted = out / "updates-shard1-1.jsonl"
        _wait("shard 1's restart", lambda: restarted.exists() and restarted.stat().st_size > 0)
        endpoint = (out / "endpoint-shard1").read_text().strip()
        with PSClient(endpoint, groups=GROUPS, timeout=10, retries=5) as operator:
            assert Path(operator.checkpoint()) == own_file
        time.sleep(0.5)
        os.kill(_wait("shard 1 again", lambda: _shard_pid(out, 1)), signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    shard1 = [r for r in summary["restart_log"] if r["shard"] == 1]
    assert summary["shards"][1]["restarts"] == 2 == summary["restarts"] == len(shard1)
    assert shard1[0]["checkpoint_age_s"] is None  # before its first checkpoint: from the start
    assert shard1[0]["updates_lost"] == shard1[0]["last_version"] > 0
    assert shard1[1]["checkpoint_version"] > 0 and shard1[1]["checkpoint_age_s"] is not None
    rows = summary["shards"]
    assert rows[0]["restarts"] == 0 and rows[0]["samples"] >= 24000  # the root trained on
    # the run counts what its whole kept model trained: the shard the restarts left behind
    assert summary["samples"] == min(row["samples"] for row in rows) < rows[0]["samples"]
    assert summary["behind"]["shard"] == 1
    assert "test accuracy" in stdout


GUIDE = Path(__file__).resolve().parents[2] / "examples" / "05_two_machines.md"


def test_the_lab_guides_group_placed_by_hand_runs_on_loopback(tmp_path):
    """examples/05_two_machines.md section 5's two `minips server` commands (the root, and
    shard 1 joining it), on loopback ports, with two workers: the run ends by itself, each
    shard wrote its own checkpoint, and the second one got the run's options from the root."""
    import shlex

    section = GUIDE.read_text().split("placed by hand", 1)[1].split("## 6.", 1)[0]
    blocks = [b.split("```")[0] for b in section.split("```sh\n")[1:]]
    root_port, shard_port = (str(p) for p in _free_ports(2))
    commands = []
    for block in blocks:
        line = block.replace("\\\n", " ").strip()
        line = line.replace("0.0.0.0:5555", f"127.0.0.1:{root_port}")
        line = line.replace("SERVER:5555", f"127.0.0.1:{root_port}")
        line = line.replace("0.0.0.0:5556", f"127.0.0.1:{shard_port}")
        argv = shlex.split(line)
        assert argv[:2] == ["minips", "server"]
        quick = ["--model", "mlp", "--dataset", "synthetic"] if "--root" not in argv else []
        commands.append([*argv[1:], *quick])  # the root's run, quicker; the shard's as it is
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    servers = [subprocess.Popen([sys.executable, "-m", "minips", *argv], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for argv in commands]  # fmt: skip
    try:
        connect = ["--connect", f"tcp://127.0.0.1:{root_port}", "--quiet"]
        workers = [subprocess.Popen([sys.executable, "-m", "minips", "worker", *connect], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(2)]  # fmt: skip
        for proc in workers + servers:
            proc.communicate(timeout=180)
            assert proc.returncode == 0, proc.args
    finally:
        for proc in servers:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert (tmp_path / "run-shard0.npz").exists() and (tmp_path / "run-shard1.npz").exists()
    meta = json.loads(str(np.load(tmp_path / "run-shard1.npz")["meta"]))
    assert meta["shard"] == {"shard": 1, "servers": 2} and meta["rule"] == "asgd"


def _free_ports(count: int) -> list[int]:
    import socket

    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()
