"""What a plan costs, per tensor and encoding: bytes, CPU time, and samples (their table:
minips.transmission.planning.plan_samples); and on what: the network (`Network`) and who shares
the machine (`Cluster`).

The planner (minips/transmission/planning/planner.py) adds these up into a predicted time to
accuracy:

    bytes     `push_bytes`, `pull_bytes`: exact array bytes of docs/protocol.md 13
    CPU       `Measured`: each layer's forward and backward (`LayerTime`) and each
              encoding's CPU on the worker and on the server (`CodecTime`), in ms, as
              measured on the planning machine (minips/run/plan_measure.py) or fixed by a test
    samples   `sample_cost` (minips.transmission.planning.plan_samples): how many more samples
              than dense a plan needs to reach the same accuracy, a measured table per model
              (SAMPLE_COST, docs/algorithms.md "What a rung costs in samples", measured
              by tools/sample_cost.py)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from minips.errors import ConfigError
from minips.transmission.codecs import Spec, parse_spec
from minips.transmission.plan import parse_pull_spec

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


# -------------------------------------------------------------------------------- CPU


@dataclass
class LayerTime:
    """One parameterised layer's measured compute (CPU ms), its activation layers included."""

    layer: str
    kind: str
    forward_ms: float = 0.0
    backward_ms: float = 0.0


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


@dataclass
class Measured:
    """What the planner weighs: each layer's compute, each encoding's CPU (measured on the
    planning machine by minips.run.plan_measure.measure, or fixed by a test).

    codecs: (parameter, "push" | "pull", spec_text) -> CodecTime; an encoding absent
    from it costs no CPU (a test that fixes the compute alone)."""

    layers: list[LayerTime]
    codecs: dict[tuple[str, str, str], CodecTime] = field(default_factory=dict)

    def codec(self, name: str, direction: str, spec: Spec) -> CodecTime:
        return self.codecs.get((name, direction, spec_text(spec)), CodecTime(0.0, 0.0, False))


# ------------------------------------------------------------------ link and cluster


@dataclass(frozen=True)
class Network:
    """The network a plan is for, in bytes/s. bandwidth: each worker's own link, both
    directions (`--bandwidth` of `minips run` and `minips plan`: a token bucket per
    worker). shared: ONE link at the server that every worker's traffic crosses (`--netem`
    of both: a tc-shaped veth). None: not limited. Both: each worker gets the smaller.
    The options' text is read by minips.run.plan_measure.parse_network."""

    bandwidth: float | None = None
    shared: float | None = None

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
