"""Plans (minips/transmission/plan.py) and the worker's StepSender
(tests/transmission/test_planner.py: the planner)."""

import json
import math
import threading

import numpy as np

from minips.nn import lenet5, softmax_cross_entropy
from minips.run.config import RunConfig
from minips.transmission.codecs import Encoder
from minips.transmission.plan import ParamPlan, Plan, plan_from_hello
from minips.worker.client import PushReply
from minips.worker.transmit import StepSender

LENET_SHAPES = {name: a.shape for name, a in lenet5().params.items()}


# ------------------------------------------------------------------------------ plans


def test_plan_round_trips_and_the_default_is_dense():
    plan = Plan(
        params={
            "fc1.w": ParamPlan(push={"codec": "topk", "ratio": 0.01}, pull="fp16", every=2),
            "conv1.w": ParamPlan(priority=-1),
        },
        wait_free=True,
    )
    sent = json.loads(json.dumps(plan.to_dict()))  # as hello carries it
    assert plan_from_hello({"plan": sent}) == plan and plan_from_hello({}) == Plan()
    assert not plan.is_dense() and Plan().is_dense()
    assert plan.param("fc2.w") == ParamPlan()  # absent: dense
    assert plan.pull_order(["conv1.b", "conv1.w", "fc1.w"]) == ["conv1.w", "conv1.b", "fc1.w"]


def test_a_default_run_sends_no_plan_and_no_bandwidth_in_hello():
    assert set(RunConfig().hello_config({"name": "lenet5"})) == {
        "model", "dataset", "data_dir", "epochs", "batch_size", "seed", "hetero", "lr"
    }  # fmt: skip
    limited = RunConfig(bandwidth="100mbit").hello_config({"name": "lenet5"})
    assert limited["bandwidth"] == "100mbit"


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
