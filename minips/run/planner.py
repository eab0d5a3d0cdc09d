"""The planner: measure each layer here, count each codec's bytes, choose a plan for a link.

    report = make_plan(build_model("lenet5"), batch_size=64, workers=4, rate=parse_rate("100mbit"))
    print(format_table(report)); report.plan.to_dict()

The cost model (docs/algorithms.md, "The transmission cost model", with its sources):

1. Per worker, a step costs `compute` (forward + backward, measured here as CPU time,
   best of a few batches) plus its traffic over the link: up = the gradients' bytes,
   down = the pulled parameters' bytes, at `rate` bytes/s each way (a shared link of
   rate R at the server gives each of N workers R / N, and a group of K shards, each
   behind such a link, R / N times `group_gain`; the two directions add up because a
   step sends, then receives).
2. The link is fast enough when the dense step's traffic takes at most BUDGET (1/2) of
   the compute time: then the plan is all dense (no codec costs CPU or accuracy).
3. Otherwise start from dense and, while the predicted traffic time exceeds the budget,
   move the tensor (and direction) with the most bytes one rung down its ladder, from the
   most faithful encoding to the most compressed:
     biases                    dense (tiny; their gradients are sums, not worth a codec)
     conv weights, and weights < SMALL entries
                               dense -> fp16 (halves the bytes, rounding 2^-11 relative)
     fc weights, B(in+out) < in*out (Poseidon's rule)
                               dense -> fp16 -> sf (float16 factors) -> topk
     other weights             dense -> fp16 -> topk
     pulls of weights          dense -> fp16 -> delta (fc and other non-conv, >= SMALL)
   top-k keeps TOPK_RATIO of the entries (error feedback), delta pulls DELTA_RATIO. Like
   PowerSGD's rule of thumb (compress only where compression pays), tensors below SMALL
   entries are never sparsified: their bytes are a rounding error of the step. Conv
   weights are never sparsified either way: each is shared by every position of the
   image, so each entry moves the whole layer's output; on LeNet-5 top-k 1 % up and
   delta 5 % down on conv2 cost 2.5 points of accuracy against fp16 both ways, which
   costs 91 KB a step more (2.6 % of the dense step's bytes; docs/algorithms.md). When
   the ladders run out the plan is what remains: the budget then stays exceeded (the
   predicted step says by how much).
4. With a limited link the plan is wait-free: a sender thread pushes each layer as soon as
   backward produced it. The predicted step simulates that one sender.

Bytes are exact (array bytes of every frame; headers, ~100 bytes a tensor, not counted):
`push_bytes` and `pull_bytes` follow docs/protocol.md 13.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minips.codecs import Factors, Spec, make_codec, parse_spec
from minips.errors import ConfigError
from minips.nn import Sequential, softmax_cross_entropy
from minips.protocol.partition import partition_of_model
from minips.protocol.plan import ParamPlan, Plan, parse_pull_spec

BUDGET = 0.5  # traffic time allowed per step, as a fraction of the compute time
SMALL = 10_000  # entries: smaller tensors are never sparsified
TOPK_RATIO = 0.01
DELTA_RATIO = 0.05

TOPK: Spec = {"codec": "topk", "ratio": TOPK_RATIO}
SF16: Spec = {"codec": "sf", "dtype": "float16"}
DELTA: Spec = {"codec": "delta", "ratio": DELTA_RATIO, "dtype": "float16"}

_ITEM = {"float32": 4, "float16": 2}


def push_bytes(spec: Spec, shape: tuple[int, ...], batch_size: int) -> int:
    """Array bytes of one push of a gradient of `shape` with codec `spec` (protocol 13)."""
    name, options = parse_spec(spec)
    n = math.prod(shape)
    item = _ITEM[options.get("dtype", "float32")]
    if name == "dense":
        return 4 * n
    if name == "fp16":
        return 2 * n
    if name == "topk":
        k = min(n, math.ceil(options["ratio"] * n))
        return k * (4 + item)
    if name == "sf":
        return batch_size * (shape[0] + shape[1]) * item
    if name == "lowrank":
        rows, cols = shape[0], n // shape[0]
        rank = min(options.get("rank", 4), rows, cols)
        return (rows + cols) * rank * item
    raise ConfigError(f"no byte count for codec {name!r}")


def pull_bytes(spec: Spec, shape: tuple[int, ...]) -> int:
    """Array bytes of one pull of a parameter of `shape` with pull codec `spec` (13.7)."""
    name, options = parse_pull_spec(spec)
    n = math.prod(shape)
    if name == "dense":
        return 4 * n
    if name == "fp16":
        return 2 * n
    k = min(n, math.ceil(options["ratio"] * n))
    return k * (4 + _ITEM[options.get("dtype", "float32")])


@dataclass
class LayerTime:
    """One parameterised layer's measured compute (ms), its activation layers included."""

    layer: str
    kind: str
    forward_ms: float = 0.0
    backward_ms: float = 0.0


def measure_layers(model: Sequential, batch_size: int, repeats: int = 7) -> list[LayerTime]:
    """Best-of-`repeats` forward and backward CPU ms of each layer on a random batch, here.

    CPU time of this process (time.process_time), and the minimum over passes: the machine
    may be shared, and wall time would charge a layer for other processes' turns on the
    CPU; with one BLAS thread (as workers run) CPU time is the layer's own cost, so the
    plan does not change with other people's load. (With several BLAS threads it also
    counts their spinning: measure as workers run, OPENBLAS_NUM_THREADS=1.)

    A layer without parameters (ReLU, pooling, flatten) counts for the parameterised
    layer before it (conv1's row holds relu1 and pool1): that is what runs before that
    layer's gradient is ready, and after its parameters are needed.
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch_size, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, 10, batch_size)
    owner, rows, current = {}, {}, None
    for name, layer in model.layers.items():
        if layer.params or current is None:
            current = name
            rows[name] = LayerTime(name, layer.kind)
        owner[name] = current
    samples: dict[tuple[str, str], list[float]] = {}
    for repeat in range(repeats + 1):  # the first pass warms caches up and is not counted
        passed: dict[tuple[str, str], float] = {}
        h = x
        for name, layer in model.layers.items():
            start = time.process_time()
            h = layer.forward(h, train=True)
            key = (owner[name], "f")
            passed[key] = passed.get(key, 0.0) + time.process_time() - start
        _, grad = softmax_cross_entropy(h, y)
        for name, layer in reversed(model.layers.items()):
            start = time.process_time()
            grad = layer.backward(grad)
            key = (owner[name], "b")
            passed[key] = passed.get(key, 0.0) + time.process_time() - start
            if grad is None:
                break
        for key, seconds in passed.items():
            if repeat:
                samples.setdefault(key, []).append(seconds)
    for (layer, way), values in samples.items():
        ms = min(values) * 1e3
        setattr(rows[layer], "forward_ms" if way == "f" else "backward_ms", ms)
    return [rows[name] for name in rows if model.layers[name].params]


def encode_ms(spec: Spec, shape: tuple[int, ...], batch_size: int, repeats: int = 5) -> float:
    """Best-of-`repeats` ms of one worker-side encode with `spec` on a random gradient."""
    rng = np.random.default_rng(1)
    codec = make_codec(spec)
    if parse_spec(spec)[0] == "sf":
        x = rng.standard_normal((batch_size, shape[0])).astype(np.float32)
        grad = Factors(x, rng.standard_normal((batch_size, shape[1])).astype(np.float32))
    else:
        grad = rng.standard_normal(shape).astype(np.float32)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        codec.encode("p", grad)
        times.append(time.perf_counter() - start)
    return min(times[1:]) * 1e3


def _sparsifiable(shape: tuple[int, ...], kind: str) -> bool:
    """Whether a weight may go below fp16 (top-k up, delta down): a big fc matrix only.

    Conv weights never do (measured: sparsifying conv2 cost LeNet-5 2.5 points, see
    docs/algorithms.md); tensors below SMALL entries never do (the indices cost more than
    the saved values are worth).
    """
    return kind != "conv" and math.prod(shape) >= SMALL


def _push_ladder(shape: tuple[int, ...], kind: str, batch_size: int) -> list[Spec]:
    if len(shape) == 1:
        return ["dense"]
    if not _sparsifiable(shape, kind):
        return ["dense", "fp16"]
    ladder: list[Spec] = ["dense", "fp16"]
    if kind == "fc" and len(shape) == 2 and batch_size * (shape[0] + shape[1]) < math.prod(shape):
        ladder.append(SF16)  # Poseidon's rule: the factors are smaller than the matrix
    return [*ladder, TOPK]


def _pull_ladder(shape: tuple[int, ...], kind: str) -> list[Spec]:
    if len(shape) == 1:
        return ["dense"]
    return ["dense", "fp16", DELTA] if _sparsifiable(shape, kind) else ["dense", "fp16"]


@dataclass
class ParamChoice:
    """The planner's row for one parameter: its options' bytes and what it chose."""

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


@dataclass
class PlanReport:
    """What `make_plan` measured, predicted and chose."""

    plan: Plan
    layers: list[LayerTime]
    choices: list[ParamChoice]
    batch_size: int
    workers: int
    rate: float | None  # bytes/s of each worker's share of the link (None: unlimited)
    predicted: dict[str, Any] = field(default_factory=dict)


def _traffic(choices: list[ParamChoice], batch_size: int) -> tuple[int, int]:
    up = sum(push_bytes(c.push, c.shape, batch_size) for c in choices)
    down = sum(pull_bytes(c.pull, c.shape) for c in choices)
    return up, down


def predict_step_ms(
    layers: list[LayerTime],
    choices: list[ParamChoice],
    batch_size: int,
    rate: float | None,
    wait_free: bool,
) -> float:
    """Predicted step time: compute, then (or, wait-free, overlapping backward) the traffic.

    Wait-free: backward produces layers from the output down; one sender sends each layer's
    bytes from max(its backward's end, the sender's previous end); the first layer's push
    and the pull follow. Serial: compute + up + down.
    """
    compute = sum(t.forward_ms + t.backward_ms for t in layers)
    if rate is None:
        return compute
    ms = {c.layer: 0.0 for c in choices}
    for c in choices:
        ms[c.layer] += push_bytes(c.push, c.shape, batch_size) / rate * 1e3
    down = sum(pull_bytes(c.pull, c.shape) for c in choices) / rate * 1e3
    if not wait_free:
        return compute + sum(ms.values()) + down
    clock = sum(t.forward_ms for t in layers)
    sender = clock
    for t in reversed(layers):
        clock += t.backward_ms
        sender = max(sender, clock) + ms.get(t.layer, 0.0)
    return sender + down


def group_gain(model: Sequential, servers: int) -> float:
    """How many times a worker's share of a server's link grows with a group of `servers`
    shards, each behind a link of its own: a step's bytes split by the partition, every
    shard's part crossing its own link at once, so the largest part sets the time. 1 for
    one server; LeNet-5: 1.98 at 2 shards, 3.87 at 4."""
    if servers == 1:
        return 1.0
    shard_bytes = partition_of_model(model.params, servers).shard_bytes()
    return sum(shard_bytes) / max(shard_bytes)


def make_plan(
    model: Sequential,
    batch_size: int,
    workers: int,
    rate: float | None,
    shared: bool = True,
    repeats: int = 7,
    servers: int = 1,
) -> PlanReport:
    """Measure `model` here and choose a plan for a link of `rate` bytes/s (None: unlimited).

    shared: the rate is the server's link, split among `workers` (minips/run/netem.py, --netem);
    otherwise each worker's own (--bandwidth). servers: a server group's size, each shard
    behind a shared link of that rate (`group_gain`); a worker's own link is crossed by
    every shard's part, so then the group changes nothing.
    """
    layers = measure_layers(model, batch_size, repeats)
    kinds = {t.layer: t.kind for t in layers}
    gain = group_gain(model, servers) if shared else 1.0
    per_worker = None if rate is None else (rate / workers * gain if shared else rate)
    choices = []
    for name, param in model.params.items():
        layer = name.rsplit(".", 1)[0]
        shape = tuple(param.shape)
        kind = kinds.get(layer, "")
        ladder = _push_ladder(shape, kind, batch_size)
        choices.append(ParamChoice(name, layer, shape, ladder, _pull_ladder(shape, kind)))
    compute = sum(t.forward_ms + t.backward_ms for t in layers)
    if per_worker is not None:
        _descend(choices, batch_size, per_worker, budget_ms=BUDGET * compute)
    params = {c.name: ParamPlan(push=c.push, pull=c.pull) for c in choices}
    limited = any(not p.is_dense() for p in params.values())
    up, down = _traffic(choices, batch_size)
    predicted = {
        "batch_size": batch_size,
        "workers": workers,
        "servers": servers,
        "rate_bytes_per_s": per_worker,
        "up_bytes_per_step": up,
        "down_bytes_per_step": down,
        "up_bytes_by_param": {c.name: push_bytes(c.push, c.shape, batch_size) for c in choices},
        "down_bytes_by_param": {c.name: pull_bytes(c.pull, c.shape) for c in choices},
        "compute_ms": round(compute, 3),
        "step_ms": round(predict_step_ms(layers, choices, batch_size, per_worker, limited), 3),
    }
    plan = Plan(params=params if limited else {}, wait_free=limited, predicted=predicted)
    return PlanReport(plan, layers, choices, batch_size, workers, per_worker, predicted)


def _descend(choices: list[ParamChoice], batch_size: int, rate: float, budget_ms: float) -> None:
    """Step 3 of the cost model: compress the biggest tensor one rung until within budget."""
    while True:
        up, down = _traffic(choices, batch_size)
        if (up + down) / rate * 1e3 <= budget_ms:
            return
        options = []
        for c in choices:
            if c.push_rung + 1 < len(c.push_ladder):
                options.append((push_bytes(c.push, c.shape, batch_size), c, "push"))
            if c.pull_rung + 1 < len(c.pull_ladder):
                options.append((pull_bytes(c.pull, c.shape), c, "pull"))
        if not options:
            return
        _, choice, direction = max(options, key=lambda o: o[0])
        if direction == "push":
            choice.push_rung += 1
        else:
            choice.pull_rung += 1


def spec_text(spec: Spec) -> str:
    """A codec spec in a table cell: "topk 1%", "sf fp16", "delta 5% fp16"."""
    if isinstance(spec, str):
        return spec
    name = spec["codec"]
    words = [name]
    if "ratio" in spec:
        words.append(f"{spec['ratio'] * 100:g}%")
    if spec.get("dtype") == "float16":
        words.append("fp16")
    return " ".join(words)


def format_table(report: PlanReport) -> str:
    """The per-layer table `minips plan` prints, then the predicted step and the choice."""
    b = report.batch_size
    times = {t.layer: t for t in report.layers}
    head = (
        f"{'param':8} {'shape':>10} {'fwd ms':>7} {'bwd ms':>7} {'dense':>9} {'fp16':>9} "
        f"{'sf fp16':>9} {'topk 1%':>9}  {'push':>12} {'bytes':>9}  {'pull':>14} {'bytes':>9}"
    )
    lines = [head]
    shown = set()
    for c in report.choices:
        t = times.get(c.layer)
        fwd = bwd = ""
        if t is not None and c.layer not in shown:
            fwd, bwd = f"{t.forward_ms:.2f}", f"{t.backward_ms:.2f}"
            shown.add(c.layer)
        sf = push_bytes(SF16, c.shape, b) if SF16 in c.push_ladder else None
        cells = [push_bytes(s, c.shape, b) for s in ("dense", "fp16")]
        cells += [sf, push_bytes(TOPK, c.shape, b)]
        text = [f"{v:9,d}" if v is not None else f"{'-':>9}" for v in cells]
        lines.append(
            f"{c.name:8} {'x'.join(map(str, c.shape)):>10} {fwd:>7} {bwd:>7} {' '.join(text)}  "
            f"{spec_text(c.push):>12} {push_bytes(c.push, c.shape, b):9,d}  "
            f"{spec_text(c.pull):>14} {pull_bytes(c.pull, c.shape):9,d}"
        )
    p = report.predicted
    dense_up = sum(push_bytes("dense", c.shape, b) for c in report.choices)
    rate = "unlimited" if report.rate is None else f"{report.rate * 8 / 1e6:.3g} Mbit/s"
    dense_step = predict_step_ms(report.layers, _dense(report.choices), b, report.rate, False)
    lines += [
        "",
        f"each worker's link: {rate} ({report.workers} workers"
        + (f", {p['servers']} shards each behind such a link" if p.get("servers", 1) > 1 else "")
        + f"); compute {p['compute_ms']:.1f} ms per step of {b}",
        f"bytes per step: up {p['up_bytes_per_step']:,} (dense {dense_up:,}), "
        f"down {p['down_bytes_per_step']:,} (dense {dense_up:,})",
        f"predicted step: {p['step_ms']:.1f} ms (dense: {dense_step:.1f} ms)",
        "choice: "
        + (
            "all dense (the link is fast enough)"
            if report.plan.is_dense()
            else "per-layer codecs above, wait-free sending"
        ),  # fmt: skip
    ]
    return "\n".join(lines)


def _dense(choices: list[ParamChoice]) -> list[ParamChoice]:
    return [ParamChoice(c.name, c.layer, c.shape, ["dense"], ["dense"]) for c in choices]
