"""Plans, the planner's byte counts and choices, and the worker's StepSender."""

import json
import math
import threading

import numpy as np
import pytest

from minips.codecs import Encoder
from minips.errors import ConfigError
from minips.nn import build_model, lenet5, softmax_cross_entropy
from minips.protocol.plan import ParamPlan, Plan, load_plan
from minips.run.config import RunConfig
from minips.run.planner import make_plan, pull_bytes, push_bytes
from minips.worker.client import PushReply
from minips.worker.netlimit import parse_rate
from minips.worker.transmit import StepSender

LENET_SHAPES = {name: a.shape for name, a in lenet5().params.items()}


# ------------------------------------------------------------------------------ plans


def test_plan_round_trips_and_the_default_is_dense(tmp_path):
    plan = Plan(
        params={
            "fc1.w": ParamPlan(push={"codec": "topk", "ratio": 0.01}, pull="fp16", every=2),
            "conv1.w": ParamPlan(priority=-1),
        },
        wait_free=True,
    )
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    assert load_plan(str(path)) == plan
    assert not plan.is_dense() and Plan().is_dense() and load_plan("dense").is_dense()
    assert plan.param("fc2.w") == ParamPlan()  # absent: dense
    assert plan.pull_order(["conv1.b", "conv1.w", "fc1.w"]) == ["conv1.w", "conv1.b", "fc1.w"]


@pytest.mark.parametrize(
    "document, words",
    [
        ({"params": {"fc1.w": {"push": "zip"}}}, "unknown codec"),
        ({"params": {"fc1.w": {"pull": {"codec": "delta"}}}}, "ratio"),
        ({"params": {"fc1.w": {"every": 0}}}, "every"),
        ({"params": {"fc1.w": {"speed": 1}}}, "unknown key"),
        ({"wait_free": "yes"}, "wait_free"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_plans_are_one_line_config_errors(document, words):
    with pytest.raises(ConfigError, match=words):
        Plan.from_dict(document)


def test_plan_is_checked_against_the_model(tmp_path):
    kinds = {"conv1": "conv", "conv2": "conv", "fc1": "fc", "fc2": "fc"}
    with pytest.raises(ConfigError, match="sf needs an fc"):
        Plan.from_dict({"params": {"conv2.w": {"push": "sf"}}}).check_model(LENET_SHAPES, kinds)
    with pytest.raises(ConfigError, match="does not have"):
        Plan.from_dict({"params": {"fc9.w": {}}}).check_model(LENET_SHAPES, kinds)
    every = {name: {"every": 2} for name in ("conv1.w", "conv1.b")}
    with pytest.raises(ConfigError, match="first layer"):
        Plan.from_dict({"wait_free": True, "params": every}).check_model(LENET_SHAPES, kinds)
    with pytest.raises(ConfigError, match="neither dense, auto nor an existing file"):
        load_plan(str(tmp_path / "missing.json"))


def test_a_default_run_sends_no_plan_and_no_bandwidth_in_hello():
    assert set(RunConfig().hello_config({"name": "lenet5"})) == {
        "model", "dataset", "data_dir", "epochs", "batch_size", "seed", "hetero", "lr"
    }  # fmt: skip
    limited = RunConfig(bandwidth="100mbit").hello_config({"name": "lenet5"})
    assert limited["bandwidth"] == "100mbit"


# ---------------------------------------------------------------------------- planner


def test_codec_bytes_are_the_encoders_bytes():
    """The planner's byte counts equal what the Encoder really produces."""
    rng = np.random.default_rng(0)
    model = lenet5(seed=0)
    x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    _, dlogits = softmax_cross_entropy(model.forward(x), rng.integers(0, 10, 64))
    model.backward(dlogits)
    from minips.codecs import Factors

    x1, dy1 = model.layers["fc1"].sufficient_factors()
    specs = ["dense", "fp16", {"codec": "topk", "ratio": 0.01},
             {"codec": "sf", "dtype": "float16"}, {"codec": "lowrank", "rank": 4}]  # fmt: skip
    for spec in specs:
        encoder = Encoder()
        is_sf = isinstance(spec, dict) and spec["codec"] == "sf"
        grad = Factors(x1, dy1) if is_sf else model.grads["fc1.w"]
        encoder.encode({"fc1.w": grad}, {"fc1.w": spec})
        assert encoder.bytes_sent["fc1.w"] == push_bytes(spec, (800, 500), 64), spec
    assert pull_bytes({"codec": "delta", "ratio": 0.05, "dtype": "float16"}, (800, 500)) == (
        20_000 * 6
    )


def test_planner_is_dense_when_fast_and_compresses_on_a_slow_shared_link(monkeypatch):
    """With fixed layer times (this test must not depend on the machine's load)."""
    import minips.run.planner as planner

    times = [("conv1", "conv", 2.0, 2.0), ("conv2", "conv", 8.0, 12.0),
             ("fc1", "fc", 0.5, 1.0), ("fc2", "fc", 0.1, 0.1)]  # fmt: skip
    fixed = [planner.LayerTime(*row) for row in times]
    monkeypatch.setattr(planner, "measure_layers", lambda *a, **k: fixed)
    model = build_model("lenet5")
    fast = make_plan(model, 64, 4, None, repeats=1)
    assert fast.plan.is_dense() and fast.predicted["up_bytes_per_step"] == 431_080 * 4
    slow = make_plan(model, 64, 4, parse_rate("100mbit"), repeats=1)
    plan = slow.plan
    assert plan.wait_free
    assert plan.param("fc1.w").push == {"codec": "topk", "ratio": 0.01}
    # Conv weights stop at fp16 both ways, even on a slower link than the budget allows:
    # sparsifying conv2 cost 2.5 points of accuracy (docs/algorithms.md, the cost model).
    slowest = make_plan(model, 64, 4, parse_rate("5mbit"), repeats=1).plan
    for conv in ("conv1.w", "conv2.w"):
        for chosen in (plan, slowest):
            assert chosen.param(conv).push in ("dense", "fp16")
            assert chosen.param(conv).pull in ("dense", "fp16")
    for bias in ("conv1.b", "conv2.b", "fc1.b", "fc2.b"):
        assert plan.param(bias).push == "dense" and plan.param(bias).pull == "dense"
    up, down = slow.predicted["up_bytes_per_step"], slow.predicted["down_bytes_per_step"]
    dense = 431_080 * 4
    assert dense / up >= 10 and 2 * dense / (up + down) >= 5
    assert slow.predicted["step_ms"] < predicted_dense_ms(slow)


def predicted_dense_ms(report):
    return report.predicted["compute_ms"] + 2 * 431_080 * 4 / report.rate * 1e3


# ------------------------------------------------------------------------ StepSender


class RecordingClient:
    """Stands in for PSClient: records each push (thread, names, base, last), encodes it."""

    def __init__(self, delay: float = 0.0):
        self.pushes = []
        self.encoder = Encoder()
        self.delay = delay
        self.lock = threading.Lock()

    def push(self, grads, base, extra=None, last=True, codecs=None, samples=None, loss=None):
        with self.lock:
            parts = self.encoder.encode(grads, codecs)
            self.pushes.append(
                {"names": list(grads), "base": base, "last": last,
                 "thread": threading.current_thread().name, "parts": parts,
                 "dense": {n: np.array(g, copy=True) for n, g in grads.items()
                           if isinstance(g, np.ndarray)}}
            )  # fmt: skip
        return PushReply(base, True, 0, False)


def _batch(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((8, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 8)


def _step(model, sender, base, seed):
    x, y = _batch(seed)
    sender.start_step(base)
    _, dlogits = softmax_cross_entropy(model.forward(x), y)
    model.backward(dlogits)
    return sender.finish({}, samples=8)


def test_wait_free_sends_each_layer_from_the_sender_thread_then_the_first_layer_last():
    model = lenet5(seed=0)
    client = RecordingClient()
    sender = StepSender(client, model, Plan(wait_free=True))
    model.add_grad_hook(sender.layer_ready)
    try:
        _step(model, sender, base=3, seed=0)
    finally:
        sender.close()
    order = [(p["names"], p["last"], p["thread"]) for p in client.pushes]
    assert order == [
        (["fc2.w", "fc2.b"], False, "sender"),
        (["fc1.w", "fc1.b"], False, "sender"),
        (["conv2.w", "conv2.b"], False, "sender"),
        (["conv1.w", "conv1.b"], True, "MainThread"),
    ]
    assert all(p["base"] == 3 for p in client.pushes)


def test_without_wait_free_one_push_in_model_order_with_sf_factors():
    model = lenet5(seed=0)
    client = RecordingClient()
    plan = Plan(params={"fc1.w": ParamPlan(push={"codec": "sf"})})
    sender = StepSender(client, model, plan)
    model.add_grad_hook(sender.layer_ready)
    _step(model, sender, base=0, seed=0)
    (push,) = client.pushes
    assert push["names"] == list(model.params) and push["last"]
    sf_parts = [p for p in push["parts"] if p.name == "fc1.w"]
    assert [p.part for p in sf_parts] == ["x", "dy"]
    rebuilt = sf_parts[0].array.T @ sf_parts[1].array
    np.testing.assert_allclose(rebuilt, model.grads["fc1.w"], rtol=1e-5, atol=1e-7)


def test_push_interval_accumulates_and_sends_with_the_oldest_base():
    model = lenet5(seed=0)
    client = RecordingClient()
    plan = Plan(params={"fc1.w": ParamPlan(every=3)})
    sender = StepSender(client, model, plan)
    model.add_grad_hook(sender.layer_ready)
    grads = []
    for step in range(3):
        _step(model, sender, base=10 + step, seed=step)
        grads.append(model.grads["fc1.w"].copy())
    with_fc1 = [p for p in client.pushes if "fc1.w" in p["names"]]
    assert len(with_fc1) == 1  # steps 0 and 1 only accumulated
    (accumulated,) = with_fc1
    assert accumulated["base"] == 10 and not accumulated["last"]  # its own push, oldest base
    np.testing.assert_allclose(accumulated["dense"]["fc1.w"], grads[0] + grads[1] + grads[2],
                               rtol=1e-6, atol=1e-7)  # fmt: skip
    lasts = [p for p in client.pushes if p["last"]]
    assert [p["base"] for p in lasts] == [10, 11, 12]
    assert all("fc1.w" not in p["names"] for p in lasts)


def test_sf_with_a_push_interval_stacks_the_factors():
    model = lenet5(seed=0)
    client = RecordingClient()
    sender = StepSender(client, model, Plan(params={"fc1.w": ParamPlan(push="sf", every=2)}))
    model.add_grad_hook(sender.layer_ready)
    total = np.zeros((800, 500), np.float32)
    for step in range(2):
        _step(model, sender, base=0, seed=step)
        total += model.grads["fc1.w"]
    parts = [p for push in client.pushes for p in push["parts"] if p.name == "fc1.w"]
    assert [p.array.shape for p in parts] == [(16, 800), (16, 500)]  # 2 batches of 8 stacked
    error = np.abs(parts[0].array.T @ parts[1].array - total).max() / np.abs(total).max()
    assert error < 1e-5 and math.isfinite(error)


def test_minips_plan_prints_the_table_and_writes_a_plan_run_accepts(tmp_path):
    from click.testing import CliRunner

    from minips.cli import cli
    from minips.run.build import resolve_plan

    path = tmp_path / "plan.json"
    result = CliRunner().invoke(
        cli, ["plan", "--bandwidth", "100mbit", "--repeats", "1", "--json", str(path)]
    )
    assert result.exit_code == 0, result.output
    assert "fc1.w" in result.output and "topk 1%" in result.output and "choice:" in result.output
    plan = resolve_plan(RunConfig(plan=str(path)))
    assert plan == Plan.from_dict(json.loads(path.read_text()))
    # 1.72 MB each way at 3.1 MB/s per worker never fits half a step: something is compressed
    assert plan.wait_free and plan.param("fc1.w").push != "dense"
    bad = CliRunner().invoke(cli, ["plan", "--bandwidth", "fast"])
    assert isinstance(bad.exception, ConfigError) and "bad rate" in str(bad.exception)
