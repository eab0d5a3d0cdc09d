"""What the planner is given and what it writes down: this machine's measured CPU costs, the
link's rates, and the plan file's record of what the planner predicted.

    network = parse_network(bandwidth="100mbit")   # each worker's own link; netem=: shared
    report = choose_plan(build_model("lenet5"), 64, Cluster(workers=4), network)
    print(format_table(report)); report.plan.to_dict()   # format_table: minips.cli.plan_table

The choice itself, from these measurements, is the core's
(minips/transmission/planning/planner.py, `make_plan`); this module measures what it weighs:

    compute   `measure_layers`: each layer's forward and backward, CPU ms on this machine
    codec CPU `push_time`, `pull_time`: each encoding's CPU ms on the worker (encode the
              gradient, apply the pull) and on the server (decode the push, encode the
              pull), timed through the very classes a run uses (minips.transmission.codecs,
              minips.server.pulls)

CPU times are the best of a few repeats of CPU time (time.process_time), so other
people's load does not change them; the planner scales them by how many processes share
the machine's cores (planner.Cluster).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from minips.errors import ConfigError
from minips.guard import wire_checks
from minips.nn import Sequential, softmax_cross_entropy
from minips.protocol import wire
from minips.server.pulls import PullEncoder
from minips.state.registry import WorkerState
from minips.state.store import SGD, ParameterStore
from minips.transmission.codecs import Encoder, Factors, Spec, decode_gradients, parse_spec
from minips.transmission.plan import ParamPlan, Plan, parse_pull_spec
from minips.transmission.planning.plan_costs import (
    Cluster,
    CodecTime,
    LayerTime,
    Measured,
    Network,
    pull_bytes,
    push_bytes,
    spec_text,
)
from minips.transmission.planning.plan_samples import samples_factor
from minips.transmission.planning.planner import (
    MIN_GAIN,
    PlanReport,
    make_plan,
    predict_step,
    pull_ladder,
    push_ladder,
    time_to_accuracy,
)
from minips.worker.worker import apply_delta

# The planner times real batches of the run's size, so it must hold one in memory: LeNet-5
# takes about 0.5 MB a sample (2 GB and 8 s a pass at 4096, one BLAS thread).
MAX_PLAN_BATCH = 4096


def choose_plan(
    model: Sequential,
    batch_size: int,
    cluster: Cluster,
    network: Network,
    measured: Measured | None = None,
    repeats: int = 7,
    momentum: float = 0.0,
) -> PlanReport:
    """The planner's plan for `model` on `network`, with what it predicts written into the
    plan (`prediction`, the plan file's "predicted"). measured: fixed measurements (a
    test's); None: measured here (`measure`, with `repeats`). momentum: the run's SGD
    momentum (top-k rungs then correct for it)."""
    measured = measured or measure(model, batch_size, repeats, momentum)
    report = make_plan(model, batch_size, cluster, network, measured, momentum)
    plan = replace(report.plan, predicted=prediction(report))
    return replace(report, plan=plan)


# ---------------------------------------------------------------------------- compute


def measure(
    model: Sequential, batch_size: int, repeats: int = 7, momentum: float = 0.0
) -> Measured:
    """Time every layer and every rung of every parameter's ladders, here (CPU time)."""
    layers = measure_layers(model, batch_size, repeats)
    kinds = {t.layer: t.kind for t in layers}
    codecs = {}
    for name, array in model.params.items():
        shape, kind = tuple(array.shape), kinds.get(name.rsplit(".", 1)[0], "")
        for spec in push_ladder(shape, kind, batch_size, momentum):
            codecs[name, "push", spec_text(spec)] = push_time(spec, shape, batch_size)
        for spec in pull_ladder(shape, kind):
            codecs[name, "pull", spec_text(spec)] = pull_time(spec, shape)
    return Measured(layers, codecs)


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
    server_ms = _best_ms(lambda: decode_gradients(wire_checks.decode_request(frames)), repeats)
    return CodecTime(worker_ms, server_ms)


def pull_time(spec: Spec, shape: tuple[int, ...], repeats: int = 5) -> CodecTime:
    """Measured CPU of one pull of a parameter of `shape` with pull codec `spec`, through
    the server's PullEncoder and the worker's apply (a parameter changed by one SGD step)."""
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


# ------------------------------------------------------------------------------ rates


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


def parse_network(bandwidth: str | None = None, netem: str | None = None) -> Network:
    """The Network of the options' text ("100mbit"): `--bandwidth`, each worker's own link,
    and `--netem`, one shared at the server; ConfigError (one line) for a bad rate."""
    return Network(
        parse_rate(bandwidth) if bandwidth else None, parse_rate(netem) if netem else None
    )


def describe_network(network: Network, cluster: Cluster) -> str:
    """What the table and the plan file say the planner assumed: which link, and each
    worker's share of it."""
    parts = []
    if network.bandwidth is not None:
        parts.append(f"each worker's own {_rate(network.bandwidth)} (--bandwidth)")
    if network.shared is not None:
        share = network.shared / cluster.link_users()
        parts.append(
            f"{_rate(network.shared)} at the server shared by {cluster.workers} workers "
            f"(--netem): {_rate(share)} each"
            + (f", {cluster.servers} shards each behind such a link: "
               f"{_rate(share * cluster.link_gain)}" if cluster.link_gain != 1 else "")
        )  # fmt: skip
    return "; ".join(parts) or "unlimited"


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:.4g} Mbit/s"


# ------------------------------------------------------------------- the plan's record


def prediction(report: PlanReport) -> dict[str, Any]:
    """What the plan file records as "predicted" (docs/protocol.md 13): the link, bytes per
    step, the predicted step and its parts, the samples factor, each candidate's time to
    accuracy relative to dense's, and which candidate was chosen."""
    choices, b, cluster, rate = report.choices, report.batch_size, report.cluster, report.rate
    measured, wait_free, name = report.measured, report.plan.wait_free, report.model_name
    step = predict_step(measured, choices, b, cluster, rate, wait_free)
    dense_rows = [replace(c, push_rung=0, pull_rung=0) for c in choices]
    dense_step = predict_step(measured, dense_rows, b, cluster, rate, False)
    warm = {c.name for c in choices if isinstance(c.pull, dict) and c.pull.get("warmup")}
    samples = samples_factor(name, {c.name: (c.push, c.pull) for c in choices})
    time = time_to_accuracy(name, measured, choices, b, cluster, rate, wait_free)
    dense_t = report.candidates["dense"]
    if any(c.push_rung or c.pull_rung for c in choices):
        chosen = "lossy" if samples > 1 else "lossless"
    else:
        chosen = "dense wait-free" if wait_free else "dense"
    return {
        "batch_size": b,
        "workers": cluster.workers,
        "servers": cluster.servers,
        "pace_factor": cluster.pace(),  # the pace-setting step, in units of this machine's
        "link": describe_network(report.network, cluster),
        "rate_bytes_per_s": rate,
        "up_bytes_per_step": sum(push_bytes(c.push, c.shape, b) for c in choices),
        "down_bytes_per_step": sum(pull_bytes(c.pull, c.shape) for c in choices),
        # A delta's warm-up: its first replies to each worker carry it whole, fp16.
        "warmup_pulls": max((c.pull["warmup"] for c in choices if c.name in warm), default=0),
        "down_bytes_per_step_warmup": sum(
            pull_bytes("fp16" if c.name in warm else c.pull, c.shape) for c in choices),
        "up_bytes_by_param": {c.name: push_bytes(c.push, c.shape, b) for c in choices},
        "down_bytes_by_param": {c.name: pull_bytes(c.pull, c.shape) for c in choices},
        "compute_cpu_ms": round(sum(t.forward_ms + t.backward_ms for t in measured.layers), 3),
        "compute_ms": round(step["compute"], 3),
        "step_ms": round(step["step"], 3),
        "step_parts_ms": {k: round(v, 3) for k, v in step.items()},
        "dense_step_ms": round(dense_step["step"], 3),
        "samples_factor": round(samples, 4),
        "time_to_accuracy_vs_dense": round(time / dense_t, 4),
        # The candidates of step 3 of the planner's module doc, the chosen one among them.
        "dense_wait_free_time_vs_dense": round(report.candidates["dense wait-free"] / dense_t, 4),
        "lossless_time_vs_dense": round(report.candidates["lossless"] / dense_t, 4),
        "lossy_time_vs_dense": round(report.candidates["lossy"] / dense_t, 4),
        "min_gain": MIN_GAIN,
        "chosen": chosen,
    }  # fmt: skip
