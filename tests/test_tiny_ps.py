"""examples/00_tiny_ps.py speaks minips's protocol: a real `minips worker` trains against its
tiny server and its tiny worker against a real `minips server` (real processes, loopback
sockets), and its rules and VSGD sample compute what minips's do."""

import importlib.util
import json
import math
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minips.protocol.sampling import sample_indices
from minips.rules import DASGD
from minips.worker.client import PSClient

TINY = Path(__file__).resolve().parents[1] / "examples" / "00_tiny_ps.py"
# "update 7: rank 1 tau 2 scale 0.500", with " d 1.234" before the scale under vsgd
UPDATE = re.compile(r"^update (\d+): rank (\d+) tau (\d+)(?: d (\S+))? scale (\S+)$", re.M)
# The real server's plan in the second test: fc1.w up as top-k 5 %, fc2.w as float16.
PLAN = {"format": 1, "params": {"fc1.w": {"push": {"codec": "topk", "ratio": 0.05}},
                                "fc2.w": {"push": "fp16"}}}  # fmt: skip
# minips's default mlp (model.md 3.4): the real server's model in the second test
MLP = {"fc1.w": (784, 256), "fc1.b": (256,), "fc2.w": (256, 128), "fc2.b": (128,),
       "fc3.w": (128, 10), "fc3.b": (10,)}  # fmt: skip


def load_tiny():
    """The example as a module (its file name is not an importable name)."""
    spec = importlib.util.spec_from_file_location("tiny_ps", TINY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def falling(text: str, pattern: str) -> tuple[float, float]:
    first, last = map(float, re.search(pattern, text).groups()[:2])
    assert last < 0.7 * first, text
    return first, last


@pytest.mark.parametrize("rule", ["dasgd", "vsgd"])
def test_a_real_minips_worker_trains_against_the_tiny_server(tmp_path, rule):
    address, report = free_address(), tmp_path / "worker.json"
    argv = [sys.executable, str(TINY), "server", "--address", address, "--workers", "1"]
    server = subprocess.Popen([*argv, "--rule", rule], stdout=subprocess.PIPE, text=True)
    try:
        worker = subprocess.run(
            [sys.executable, "-m", "minips", "worker", "--connect", address, "--max-steps", "20",
             "--quiet", "--report", str(report)],
            capture_output=True, text=True, timeout=50,
        )  # fmt: skip
        out, _ = server.communicate(timeout=20)  # it ends once its only rank said bye
    finally:
        server.kill()
    assert worker.returncode == 0, worker.stderr
    assert server.returncode == 0
    updates = UPDATE.findall(out)
    # Every push applied once, in order; the only worker is never stale.
    assert [int(u[0]) for u in updates] == list(range(1, 21)), out
    assert {(rank, tau, scale) for _, rank, tau, _, scale in updates} == {("0", "0", "1.000")}
    if rule == "vsgd":
        # At staleness 0 the worker's sample holds the server's own values at S_P: d is 0
        # exactly when both picked the same coordinates (past the first update, which has
        # no typical step yet, other coordinates would give d > 0).
        assert {d for *_, d, _ in updates} == {"0.000"}
    falling(out, r"loss reported (\S+) -> (\S+)")
    # The tiny server's plan reached the real worker, and what it encoded was decoded here:
    # fc1.w (784 x 64) as top-k 10 % (int32 index + float32 value), fc2.w as float16.
    pushed = json.loads(report.read_text())["push_bytes"]
    assert pushed["fc1.w"] == 20 * math.ceil(0.1 * 784 * 64) * 8
    assert pushed["fc2.w"] == 20 * 64 * 10 * 2
    assert pushed["fc1.b"] == 20 * 64 * 4


@pytest.mark.parametrize("rule", ["dasgd", "vsgd"])
def test_the_tiny_worker_trains_against_a_real_minips_server(tmp_path, rule):
    plan, log, address = tmp_path / "plan.json", tmp_path / "updates.jsonl", free_address()
    plan.write_text(json.dumps(PLAN))
    argv = [sys.executable, "-m", "minips", "server", "--model", "mlp", "--dataset", "sample",
            "--workers", "1", "--rule", rule, "--plan", str(plan), "--bind", address,
            "--updates-log", str(log)]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        with PSClient(address, timeout=1.0, retries=30) as probe:
            probe.stats()  # any answer: it is serving
        done = subprocess.run(
            [sys.executable, str(TINY), "worker", "--address", address, "--fast"],
            capture_output=True, text=True, timeout=50,
        )  # fmt: skip
        with PSClient(address, timeout=5.0) as operator:
            stats = operator.stats()
            operator.stop()
        server.wait(timeout=20)
    finally:
        server.kill()
    assert done.returncode == 0, done.stderr
    assert re.search(r"in 30 steps", done.stdout), done.stdout
    falling(done.stdout, r"loss (\S+) -> (\S+) in")
    # Every push accepted by the real server's checks (shapes, dtypes, each codec's parts)
    # and counted as the codec's wire form: top-k's k int32 indices and k float32 values,
    # fc2.w's float16, the rest float32.
    assert (stats["updates"], stats["errors"], stats["dropped"]) == (30, 0, 0)
    k = math.ceil(0.05 * 784 * 256)
    dense = sum(4 * math.prod(shape) for name, shape in MLP.items() if name not in PLAN["params"])
    assert stats["grad_bytes_in"] == 30 * (k * 8 + 256 * 128 * 2 + dense)
    if rule == "vsgd":
        per_push = sum(len(sample_indices(n, math.prod(s), 0.01, 32)) for n, s in MLP.items())
        assert stats["extra_bytes_in"] == 30 * 4 * per_push
        # The real server's own measure of value staleness is 0 at tau 0 only when the tiny
        # worker sent the values at the very coordinates the server samples.
        records = [json.loads(line) for line in log.read_text().splitlines()]
        gaps = [d for r in records if r["event"] == "update" for d in r["value_staleness"].values()]
        assert len(gaps) == 30 * 3 and set(gaps) == {0.0}


@pytest.mark.parametrize(
    ("name", "size", "rho", "least"),
    [("fc1.w", 1000, 0.01, 4), ("fc1.w", 784 * 64, 0.01, 32), ("conv2.b", 50, 0.01, 32),
     ("fc3.b", 10, 0.01, 32), ("élan.w", 4096, 0.3, 1)],
)  # fmt: skip
def test_the_tiny_vsgd_sample_is_minips_s(name, size, rho, least):
    rule = {"rho": rho, "min_samples": least}
    assert np.array_equal(
        load_tiny().vsgd_sample(name, size, rule), sample_indices(name, size, rho, least)
    )


def test_the_tiny_server_scales_by_clock_and_by_value_staleness(capsys):
    """Four pushes of the same gradient, all computed at version 0 (tau 0, 1, 2, 3).

    dasgd: 1 / max(1, tau), as minips's DASGD. vsgd: each update moves a layer's sample by
    s * m (s its scale, m the same for every update), so after the first update the worker
    is d = 1 typical update behind; after two, 2 (step still m); after a third of scale
    1/2, 2.5 behind while the typical step is 0.9 m + 0.1 m / 2 = 0.95 m.
    """
    tiny = load_tiny()
    expected = {"dasgd": [DASGD().factor(tau) for tau in range(4)],
                "vsgd": [1, 1, 1 / 2, 0.95 / 2.5]}  # fmt: skip
    for rule, scales in expected.items():
        server = tiny.TinyServer(rule, 1)
        server.handle({"op": "hello", "worker": "w"}, {})
        _, frames = server.handle({"op": "pull", "worker": "w", "since": None}, {})
        params = {desc["name"]: array.copy() for desc, array in frames}
        push = {n: np.full_like(p, 0.01) for n, p in params.items()}
        if rule == "vsgd":
            push |= {f"extra/sample/{n}": p.flat[server.samples[n]] for n, p in params.items()}
        for seq in range(4):
            reply, _ = server.handle({"op": "push", "worker": "w", "seq": seq, "base": 0}, push)
            assert (reply["staleness"], reply["version"]) == (seq, seq + 1)
        printed = [float(scale) for *_, scale in UPDATE.findall(capsys.readouterr().out)]
        assert printed == pytest.approx(scales, abs=1e-3), rule
    # Its refusals (protocol.md 9): a base from the future, a wrong shape, a missing or a
    # short sample; and nothing changed.
    short = {"fc1.w": push["fc1.w"], "extra/sample/fc1.w": np.zeros(3, np.float32)}
    bad = [({"base": 9}, push, "bad_base"),
           ({"base": 0}, {"fc1.w": np.zeros(3, np.float32)}, "shape"),
           ({"base": 0}, {"fc1.w": push["fc1.w"]}, "rule"),
           ({"base": 0}, short, "rule")]  # fmt: skip
    for fields, tensors, code in bad:
        with pytest.raises(tiny.Refused) as refused:
            server.handle({"op": "push", "worker": "w", "seq": 9, **fields}, tensors)
        assert refused.value.args[0] == code
    assert server.t == 4


def test_the_tiny_worker_refuses_a_run_it_cannot_do(tmp_path):
    # A plan asking for sufficient factors: the tiny worker says bye with `refused` (5.6).
    plan, address = tmp_path / "plan.json", free_address()
    plan.write_text(json.dumps({"format": 1, "params": {"fc1.w": {"push": {"codec": "sf"}}}}))
    argv = [sys.executable, "-m", "minips", "server", "--model", "mlp", "--workers", "1",
            "--plan", str(plan), "--bind", address]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with PSClient(address, timeout=1.0, retries=30) as probe:
            probe.stats()
        done = subprocess.run(
            [sys.executable, str(TINY), "worker", "--address", address, "--fast"],
            capture_output=True, text=True, timeout=50,
        )  # fmt: skip
        with PSClient(address, timeout=5.0) as operator:
            stats = operator.stats()
            operator.stop()
        server.wait(timeout=20)
    finally:
        server.kill()
    assert (
        done.returncode != 0
        and done.stderr == "error: the tiny worker cannot do {'sf'} (a model, data or codec)\n"
    )
    assert [w["refused"] for w in stats["workers"]] == ["the tiny worker cannot do {'sf'}"]
    assert stats["updates"] == 0
