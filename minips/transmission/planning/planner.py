"""The planner: how each tensor travels, chosen for the least predicted time to accuracy.

    network = Network(bandwidth=12.5e6)      # bytes/s: each worker's own link; shared=: one
    report = make_plan(build_model("lenet5"), 64, Cluster(workers=4), network, measured)
    report.plan.to_dict()

`measured` holds each layer's and each encoding's CPU ms (plan_costs.Measured): timed on the
planning machine by minips/run/plan_measure.py (`choose_plan` measures, chooses, and writes
the prediction into the plan), or fixed by a test.

The objective, the step's cost model and the four steps of the choice (all dense without
a link; coordinate descent over measured (push, pull) pairs, lossless then lossy; each step
down taken only below MIN_GAIN; wait-free when compressed) are docs/algorithms.md, "The
cost model", with their sources and measurements:

    T(plan) = step(plan) x samples(plan) / samples(dense)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from minips.nn import Sequential
from minips.transmission.codecs import Spec
from minips.transmission.plan import ParamPlan, Plan
from minips.transmission.planning.plan_costs import (
    Cluster,
    Measured,
    Network,
    pull_bytes,
    push_bytes,
)
from minips.transmission.planning.plan_samples import is_lossless, sample_cost, samples_factor

TIE = 0.02  # pairs whose T is within 2 % of the least count as equal: the most faithful wins
MIN_GAIN = 0.8  # each step down (dense, lossless, lossy) must cut T to at most 0.8x
# Dense goes wait-free only at <= 0.9x: its per-layer pushes cost CPU the model leaves out
# (measured at 1 Gbit/s each on 2 cores: +5.3 ms of compute a 99 ms step, docs/algorithms.md)
WAIT_FREE_GAIN = 0.9
SMALL = 10_000  # entries: smaller tensors are never sparsified

SF16: Spec = {"codec": "sf", "dtype": "float16"}
TOPK_RATIOS = (0.02, 0.01)
DELTA_RATIOS = (0.1, 0.05)
DELTA_WARMUP = 20  # versions of fp16 pulls before the deltas (measured, docs/algorithms.md)


def topk(ratio: float, momentum: float = 0.0) -> Spec:
    """Top-k at `ratio`, with momentum correction when the run has momentum (measured: it
    takes most of top-k's cost in samples away, docs/algorithms.md)."""
    spec: dict[str, Any] = {"codec": "topk", "ratio": ratio}
    return {**spec, "momentum": momentum} if momentum else spec


def delta(ratio: float) -> Spec:
    """A delta pull at `ratio` with float16 values, after DELTA_WARMUP fp16 pulls."""
    return {"codec": "delta", "ratio": ratio, "dtype": "float16", "warmup": DELTA_WARMUP}


# ----------------------------------------------------------------------- ladders


def push_ladder(
    shape: tuple[int, ...], kind: str, batch_size: int, momentum: float = 0.0
) -> list[Spec]:
    """A gradient's encodings, most faithful first: biases dense; conv weights and tensors
    below SMALL entries dense, fp16; fc matrices also sf (float16 factors) when B (in + out)
    < in x out (Poseidon's rule), then top-k; other big weights top-k after fp16. With the
    run's `momentum` top-k corrects for it (minips.transmission.codecs.topk)."""
    if len(shape) == 1:
        return ["dense"]
    if not _sparsifiable(shape, kind):
        return ["dense", "fp16"]
    ladder: list[Spec] = ["dense", "fp16"]
    if kind == "fc" and len(shape) == 2 and batch_size * (shape[0] + shape[1]) < math.prod(shape):
        ladder.append(SF16)
    return ladder + [topk(r, momentum) for r in TOPK_RATIOS]


def pull_ladder(shape: tuple[int, ...], kind: str) -> list[Spec]:
    """A parameter's pull encodings, most faithful first: biases dense; conv weights and
    small tensors dense, fp16; big non-conv weights then delta (fp16 values)."""
    if len(shape) == 1:
        return ["dense"]
    if not _sparsifiable(shape, kind):
        return ["dense", "fp16"]
    return ["dense", "fp16"] + [delta(r) for r in DELTA_RATIOS]


def _sparsifiable(shape: tuple[int, ...], kind: str) -> bool:
    """Whether a weight may go below fp16 (top-k up, delta down): a big non-conv one only.

    Conv weights never do: each is shared by every position of the image, so each entry
    moves the whole layer's output; on LeNet-5 top-k 1 % up and delta 5 % down on conv2
    cost 2.5 points of accuracy, fp16 both ways 91 KB a step more (docs/algorithms.md).
    Below SMALL entries the indices cost more than the saved values are worth.
    """
    return kind != "conv" and math.prod(shape) >= SMALL


# ------------------------------------------------------------------------- the model


@dataclass
class ParamChoice:
    """The planner's row for one parameter: its ladders and the rung chosen on each."""

    name: str
    layer: str
    shape: tuple[int, ...]
    push_ladder: list[Spec]
    pull_ladder: list[Spec]
    push_rung: int = 0
    pull_rung: int = 0

    @property
    def push(self) -> Spec:
        return self.push_ladder[self.push_rung]

    @property
    def pull(self) -> Spec:
        return self.pull_ladder[self.pull_rung]


def predict_step(
    measured: Measured,
    choices: list[ParamChoice],
    batch_size: int,
    cluster: Cluster,
    rate: float | None,
    wait_free: bool,
) -> dict[str, float]:
    """One worker's predicted step, ms: {compute, push, server, pull, step} (module doc).

    push is the part of sending not hidden behind backward; step their sum.
    """
    layers = measured.layers
    cpu = sum(t.forward_ms + t.backward_ms for t in layers)
    scale = cluster.contention() if cluster.compute_ms is None else cluster.compute_ms / cpu
    scale *= cluster.pace()  # the pace-setting worker's step, in this machine's steps
    send = {t.layer: 0.0 for t in layers}
    server = pull = 0.0
    for c in choices:
        up, down = measured.codec(c.name, "push", c.push), measured.codec(c.name, "pull", c.pull)
        wire_up = 0.0 if rate is None else push_bytes(c.push, c.shape, batch_size) / rate * 1e3
        send[c.layer] = send.get(c.layer, 0.0) + up.worker_ms * scale + wire_up
        server += cluster.workers * up.server_ms
        server += down.server_ms * (cluster.workers if down.per_worker else 1)
        pull += down.worker_ms * scale
        pull += 0.0 if rate is None else pull_bytes(c.pull, c.shape) / rate * 1e3
    server *= cluster.contention() / cluster.servers  # the server shares the cores too
    clock = sum(t.forward_ms for t in layers) * scale
    end_of_backward = cpu * scale
    if wait_free:
        sender = clock
        for t in reversed(layers):
            clock += t.backward_ms * scale
            sender = max(sender, clock) + send.get(t.layer, 0.0)
        pushed = sender
    else:
        pushed = end_of_backward + sum(send.values())
    return {
        "compute": end_of_backward,
        "push": pushed - end_of_backward,
        "server": server,
        "pull": pull,
        "step": pushed + server + pull,
    }


def time_to_accuracy(
    model_name: str, measured: Measured, choices: list[ParamChoice], batch_size: int,
    cluster: Cluster, rate: float | None, wait_free: bool,
) -> float:  # fmt: skip
    """T = predicted step ms x samples factor (the objective; module doc)."""
    step = predict_step(measured, choices, batch_size, cluster, rate, wait_free)["step"]
    return step * samples_factor(model_name, _chosen(choices))


def _chosen(choices: list[ParamChoice]) -> dict[str, tuple[Spec, Spec]]:
    return {c.name: (c.push, c.pull) for c in choices}


# ------------------------------------------------------------------------ the choice


@dataclass
class PlanReport:
    """What `make_plan` was given and chose. candidates: the predicted time to accuracy (ms)
    of each candidate of step 3 of the module doc: "dense", "dense wait-free", "lossless",
    "lossy" (without a link limit all four are dense's)."""

    plan: Plan
    measured: Measured
    choices: list[ParamChoice]
    model_name: str
    batch_size: int
    cluster: Cluster
    network: Network
    rate: float | None  # bytes/s of each worker's share of the link (None: unlimited)
    candidates: dict[str, float]


def make_plan(
    model: Sequential,
    batch_size: int,
    cluster: Cluster,
    network: Network,
    measured: Measured,
    momentum: float = 0.0,
) -> PlanReport:
    """Choose a plan for `model` on `network` (module doc), weighing the layers' and
    encodings' CPU in `measured`. momentum: the run's SGD momentum (top-k rungs then
    correct for it)."""
    name = str(model.spec.get("name", "")) if model.spec else ""
    kinds = {t.layer: t.kind for t in measured.layers}
    rate = network.share(cluster)
    choices = []
    for param, array in model.params.items():
        layer, shape = param.rsplit(".", 1)[0], tuple(array.shape)
        kind = kinds.get(layer, "")
        push = push_ladder(shape, kind, batch_size, momentum)
        choices.append(ParamChoice(param, layer, shape, push, pull_ladder(shape, kind)))

    def objective(rows: list[ParamChoice], wait_free: bool | None = None) -> float:
        wait_free = _compressed(rows) if wait_free is None else wait_free
        return time_to_accuracy(name, measured, rows, batch_size, cluster, rate, wait_free)

    dense = list(choices)
    dense_t = dense_wait_free_t = lossless_t = lossy_t = objective(dense)
    dense_wait_free = False
    if rate is not None:
        dense_wait_free_t = objective(dense, wait_free=True)
        dense_wait_free = dense_wait_free_t <= WAIT_FREE_GAIN * dense_t
        least_dense_t = min(dense_t, dense_wait_free_t)
        lossless = _descend(dense, objective, name, batch_size, lossless_only=True)
        lossy = _descend(lossless, objective, name, batch_size, lossless_only=False)
        lossless_t, lossy_t = objective(lossless), objective(lossy)
        if lossless_t <= MIN_GAIN * least_dense_t:
            choices = lossless
        if lossy_t <= MIN_GAIN * min(least_dense_t, lossless_t):
            choices = lossy
    wait_free = _compressed(choices) or dense_wait_free
    params = {c.name: ParamPlan(push=c.push, pull=c.pull) for c in choices}
    plan = Plan(params=params if wait_free else {}, wait_free=wait_free)
    candidates = {"dense": dense_t, "dense wait-free": dense_wait_free_t,
                  "lossless": lossless_t, "lossy": lossy_t}  # fmt: skip
    return PlanReport(plan, measured, choices, name, batch_size, cluster, network, rate, candidates)


def _compressed(choices: list[ParamChoice]) -> bool:
    return any(c.push_rung or c.pull_rung for c in choices)


def _descend(
    start: list[ParamChoice], objective: Any, model_name: str, batch_size: int,
    lossless_only: bool, sweeps: int = 10,
) -> list[ParamChoice]:  # fmt: skip
    """Step 2 of the module doc: coordinate descent over each tensor's (push, pull) pairs,
    from `start`; over the lossless pairs alone if `lossless_only`. A new list."""
    choices = list(start)
    order = sorted(range(len(choices)), key=lambda i: -math.prod(choices[i].shape))
    for _ in range(sweeps):
        changed = False
        for i in order:
            c = choices[i]
            pairs = [
                (up, down)
                for up in range(len(c.push_ladder))
                for down in range(len(c.pull_ladder))
                if not lossless_only or is_lossless(
                    model_name, c.name, c.push_ladder[up], c.pull_ladder[down])
            ]  # fmt: skip
            if len(pairs) == 1:
                continue
            times = []
            for up, down in pairs:
                choices[i] = replace(c, push_rung=up, pull_rung=down)
                times.append(objective(choices))
            least = min(times)
            near = [pair for pair, t in zip(pairs, times, strict=True) if t <= least * (1 + TIE)]
            up, down = min(near, key=lambda pair: _loss_then_bytes(c, pair, model_name,
                                                                   batch_size))  # fmt: skip
            choices[i] = replace(c, push_rung=up, pull_rung=down)
            changed |= (up, down) != (c.push_rung, c.pull_rung)
        if not changed:
            break
    return choices


def _loss_then_bytes(
    c: ParamChoice, pair: tuple[int, int], model_name: str, batch_size: int
) -> tuple[float, int]:
    """The tie-break among pairs of about the same T: the least sample cost, then the
    fewest bytes (an encoding that costs no samples, fp16, is then taken for free)."""
    push, pull = c.push_ladder[pair[0]], c.pull_ladder[pair[1]]
    cost = sample_cost(model_name, c.name, push, pull)
    return cost, push_bytes(push, c.shape, batch_size) + pull_bytes(pull, c.shape)
