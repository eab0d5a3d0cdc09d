"""What a plan costs, per tensor and encoding: bytes, CPU time, and samples (their table:
minips.transmission.planning.plan_samples); and on what: the network (`Network`) and who shares the
machine (`Cluster`).

The planner (minips/transmission/planning/planner.py) adds these up into a predicted time to
accuracy:

    bytes     `push_bytes`, `pull_bytes`: exact array bytes of docs/protocol.md 13
    compute   `measure_layers`: each layer's forward and backward, CPU ms on this machine
    codec CPU `measure_codecs`: each encoding's CPU ms on the worker (encode the gradient,
              apply the pull) and on the server (decode the push, encode the pull), timed
              through the very classes a run uses (minips.transmission.codecs, minips.server.pulls)
    samples   `sample_cost` (minips.transmission.planning.plan_samples): how many more samples than
              dense a plan needs to reach the same accuracy, a measured table per model
              (SAMPLE_COST, docs/algorithms.md "What a rung costs in samples", measured
              by tools/sample_cost.py)

CPU times are the best of a few repeats of CPU time (time.process_time), so other
people's load does not change them; the planner scales them by how many processes share
the machine's cores (planner.Cluster).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from minips.errors import ConfigError
from minips.nn import Sequential, softmax_cross_entropy
from minips.protocol import wire
from minips.transmission.codecs import Encoder, Factors, Spec, decode_gradients, parse_spec
from minips.transmission.plan import ParamPlan, Plan, parse_pull_spec

_ITEM = {"float32": 4, "float16": 2}


# ------------------------------------------------------------------------------ bytes


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


def spec_text(spec: Spec) -> str:
    """A codec spec in a table cell and as a key of SAMPLE_COST: "topk 1% mc" (momentum
    correction), "delta 5% fp16", "topk 1% warm-up 20"."""
    if isinstance(spec, str):
        return spec
    words = [spec["codec"]]
    if "ratio" in spec:
        words.append(f"{spec['ratio'] * 100:g}%")
    if spec.get("dtype") == "float16":
        words.append("fp16")
    if spec.get("momentum"):
        words.append("mc")
    if spec.get("warmup"):
        words.append(f"warm-up {spec['warmup']}")
    return " ".join(words)


# ---------------------------------------------------------------------------- compute


@dataclass
class LayerTime:
    """One parameterised layer's measured compute (CPU ms), its activation layers included."""

    layer: str
    kind: str
    forward_ms: float = 0.0
    backward_ms: float = 0.0


# The planner times real batches of the run's size, so it must hold one in memory: LeNet-5
# takes about 0.5 MB a sample (2 GB and 8 s a pass at 4096, one BLAS thread).
MAX_PLAN_BATCH = 4096


def measure_layers(model: Sequential, batch_size: int, repeats: int = 7) -> list[LayerTime]:
    """Best-of-`repeats` forward and backward CPU ms of each layer on a random batch, here.

    CPU time of this process (time.process_time), and the minimum over passes: the machine
    may be shared, and wall time would charge a layer for other processes' turns on the
    CPU; with one BLAS thread (as workers run) CPU time is the layer's own cost. (With
    several BLAS threads it also counts their spinning: measure as workers run,
    OPENBLAS_NUM_THREADS=1.)

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


# -------------------------------------------------------------------------- codec CPU


@dataclass(frozen=True)
class CodecTime:
    """CPU ms of one tensor's encoding, per step: on the worker, on the server.

    push: worker = encode the gradient; server = decode the push's frames (wire checks
    included). pull: worker = apply the reply (copy, widen, or add the delta); server =
    encode it: `per_worker` True when the server does it for each worker's pull (a delta,
    from that worker's replica), False when once per version (an fp16 copy is shared).
    """

    worker_ms: float
    server_ms: float
    per_worker: bool = True


def _best_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first call warms up and is not counted
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times[1:]) * 1e3


def push_time(spec: Spec, shape: tuple[int, ...], batch_size: int, repeats: int = 5) -> CodecTime:
    """Measured CPU of pushing one gradient of `shape` with `spec` (a worker's Encoder, the
    server's decode_gradients of the real frames)."""
    rng = np.random.default_rng(1)
    if parse_spec(spec)[0] == "sf":
        x = rng.standard_normal((batch_size, shape[0])).astype(np.float32)
        grad = Factors(x, rng.standard_normal((batch_size, shape[1])).astype(np.float32))
    else:
        grad = rng.standard_normal(shape).astype(np.float32) * 1e-3
    encoder = Encoder()
    worker_ms = _best_ms(lambda: encoder.encode({"p": grad}, {"p": spec}), repeats)
    header = {"op": "push", "worker": "planner", "seq": 0, "base": 0, "last": True}
    frames = wire.encode_parts(header, encoder.encode({"p": grad}, {"p": spec}))
    server_ms = _best_ms(lambda: decode_gradients(wire.decode_request(frames)), repeats)
    return CodecTime(worker_ms, server_ms)


def pull_time(spec: Spec, shape: tuple[int, ...], repeats: int = 5) -> CodecTime:
    """Measured CPU of one pull of a parameter of `shape` with pull codec `spec`, through
    the server's PullEncoder and the worker's apply (a parameter changed by one SGD step)."""
    from minips.server.pulls import PullEncoder
    from minips.state.registry import WorkerState
    from minips.state.store import SGD, ParameterStore
    from minips.worker.worker import apply_delta

    rng = np.random.default_rng(2)
    params = {"p": rng.standard_normal(shape).astype(np.float32)}
    store = ParameterStore(params, SGD(params, lr=0.01, momentum=0.9))
    steady = spec if isinstance(spec, str) else {k: v for k, v in spec.items() if k != "warmup"}
    pulls = PullEncoder(store, Plan({"p": ParamPlan(pull=steady)}))  # after any warm-up
    worker = WorkerState("planner", 0, {}, 0.0)
    pulls.parts(worker, None)  # the first pull: dense, the replica starts
    mine = np.array(store.params["p"])

    per_worker = parse_pull_spec(spec)[0] == "delta"
    times, parts = [], []
    for _ in range(repeats + 1):
        # One update (not timed), then this worker's pull of it: a new version each time,
        # so an fp16 copy is made afresh and a delta has something to send.
        store.write([("p", rng.standard_normal(shape).astype(np.float32) * 1e-3, 1.0)])
        start = time.process_time()
        parts = pulls.parts(worker, store.version - 1)
        times.append(time.process_time() - start)
    server_ms = min(times[1:]) * 1e3

    def apply() -> None:
        for part in parts:
            if part.part is None:
                np.copyto(mine, part.array, casting="unsafe")
        if per_worker:
            arrays = {p.part: p.array for p in parts}
            apply_delta(mine, arrays["indices"], arrays["values"])

    return CodecTime(_best_ms(apply, repeats), server_ms, per_worker)


@dataclass
class Measured:
    """What the planner measured here: each layer's compute, each encoding's CPU.

    codecs: (parameter, "push" | "pull", spec_text) -> CodecTime; an encoding absent
    from it costs no CPU (a test that fixes the compute alone)."""

    layers: list[LayerTime]
    codecs: dict[tuple[str, str, str], CodecTime] = field(default_factory=dict)

    def codec(self, name: str, direction: str, spec: Spec) -> CodecTime:
        return self.codecs.get((name, direction, spec_text(spec)), CodecTime(0.0, 0.0, False))


# ------------------------------------------------------------------ link and cluster


# tc's rate units (tc(8), "RATES"): decimal SI, bits or bytes per second; the IEC ones
# (kibit = 1024 bit/s) are accepted too, as tc does.
_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_BITS.update({"kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40})
_BYTES = {"bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12}
_BYTES.update({"kibps": 2**10, "mibps": 2**20, "gibps": 2**30, "tibps": 2**40})
_RATE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]+)\s*", re.IGNORECASE)


def parse_rate(text: str) -> float:
    """A tc-style rate ("100mbit", "1gbit", "12.5mbps") in bytes per second.

    Units as in tc(8): bit, kbit, mbit, gbit, tbit (bits/s, powers of 1000), bps, kbps,
    mbps, gbps, tbps (BYTES/s, as tc means them), and IEC kibit, mibit, ... kibps, mibps.
    A bare number is refused: tc reads it as bits, people often mean bytes.
    """
    match = _RATE.fullmatch(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _BITS and unit not in _BYTES:
        raise ConfigError(
            f"bad rate {text!r}: expected a number and a unit, e.g. 100mbit, 1gbit, 500kbit, "
            "10mbps (bytes/s)"
        )
    value = float(match.group(1))
    rate = value * _BITS[unit] / 8 if unit in _BITS else value * _BYTES[unit]
    if not (rate > 0 and math.isfinite(rate)):
        raise ConfigError(f"bad rate {text!r}: it must be positive and finite")
    return rate


@dataclass(frozen=True)
class Network:
    """The network a plan is for, in bytes/s. bandwidth: each worker's own link, both
    directions (`--bandwidth` of `minips run` and `minips plan`: a token bucket per
    worker). shared: ONE link at the server that every worker's traffic crosses (`--netem`
    of both: a tc-shaped veth). None: not limited. Both: each worker gets the smaller."""

    bandwidth: float | None = None
    shared: float | None = None

    @classmethod
    def parse(cls, bandwidth: str | None = None, netem: str | None = None) -> Network:
        """From the options' text ("100mbit"); ConfigError (one line) for a bad rate."""
        return cls(
            parse_rate(bandwidth) if bandwidth else None, parse_rate(netem) if netem else None
        )

    def share(self, cluster: Cluster) -> float | None:
        """Each worker's rate in bytes/s (None: unlimited). A shared link carries every
        worker's traffic of a step at once, so each gets rate / N (rate / `link_users` in a
        class of slower and faster workers), times `cluster.link_gain` when each of K
        server shards has such a link of its own (a worker's own link carries every
        shard's part, so there the group changes nothing)."""
        shares = [] if self.bandwidth is None else [self.bandwidth]
        if self.shared is not None:
            shares.append(self.shared / cluster.link_users() * cluster.link_gain)
        return min(shares) if shares else None

    def describe(self, cluster: Cluster) -> str:
        """What the table says it assumed: which link, and each worker's share."""
        parts = []
        if self.bandwidth is not None:
            parts.append(f"each worker's own {_rate(self.bandwidth)} (--bandwidth)")
        if self.shared is not None:
            parts.append(
                f"{_rate(self.shared)} at the server shared by {cluster.workers} workers "
                f"(--netem): {_rate(self.shared / cluster.link_users())} each"
                + (f", {cluster.servers} shards each behind such a link: "
                   f"{_rate(self.shared / cluster.link_users() * cluster.link_gain)}"
                   if cluster.link_gain != 1 else "")
            )  # fmt: skip
        return "; ".join(parts) or "unlimited"


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:.4g} Mbit/s"


@dataclass(frozen=True)
class Cluster:
    """Who runs the plan. workers: N. servers: K server processes the parameters are
    spread over (a server group: the server's CPU per round divides by K in
    `predict_step`, and each shard's own link is `link_gain`). cores: the machine's
    (None: this one's). compute_ms: one step's forward + backward as a worker really
    gets it, when known (measured in a run's first steps, or fixed by a test); None: the
    layers' CPU time x `contention`. step_factors: each worker's compute per step as a
    multiple of this machine's (a browser's is larger, minips.run.build; empty: all 1).
    barrier: the rule waits for the slowest worker every round (ssgd). link_gain: how many
    times a worker's share of a shared link grows when each of the K shards is behind a
    link of its own (minips.group.partition.group_gain; 1 for one server)."""

    workers: int
    servers: int = 1
    cores: int | None = None
    compute_ms: float | None = None
    step_factors: tuple[float, ...] = ()
    barrier: bool = False
    link_gain: float = 1.0

    def pace(self) -> float:
        """The compute factor of the step that sets the pace. The plan is one for all, so
        it is sized for the slowest step under a barrier (every worker waits for it each
        round), the fastest one otherwise."""
        factors = self.step_factors or (1.0,)
        return max(factors) if self.barrier else min(factors)

    def link_users(self) -> float:
        """How many workers' worth of traffic a shared link carries at once: a worker k
        times slower than the pace uses 1/k of a share (all N under a barrier)."""
        if not self.step_factors:
            return float(self.workers)
        pace = self.pace()
        return sum(pace / max(pace, f) for f in self.step_factors)

    def contention(self) -> float:
        """How much slower a process computes when the N workers and K servers share the
        cores: max(1, (N + K) / cores) (each busy process gets cores / (N + K) of them)."""
        cores = self.cores or os.cpu_count() or 1
        return max(1.0, (self.workers + self.servers) / cores)
