"""What a transmission plan costs in samples: synchronous SGD replayed in one process.

    python tools/sample_cost.py --out costs --plans dense,fp16,auto-100mbit,FILE.json \\
        --seeds 0,1,2 [--workers 4] [--budget 120000] [--eval-every 20]

Under `ssgd` the accuracy a run reaches after S samples does not depend on the link or on
the machine's speed: every update is the mean of one gradient from each worker, computed
at the same parameters. So what a plan costs in *samples* can be measured here, without
sockets or timing, and exactly: this replays `minips run --rule ssgd` round by round with
the project's own parts, in the order the real run uses them:

    each worker  forward/backward on its next batch (its shard, its rng: seed * 1000 + rank)
                 -> its Encoder (minips.transmission.codecs: top-k residuals, float16, sufficient
                    factors)
                 -> wire frames (minips.protocol.wire.encode_parts, decode_request)
    server       decode_gradients -> the mean over workers (the SSGD rule's formula)
                 -> ParameterStore.write with the server's SGD (momentum, or none for a
                    parameter pushed with momentum correction)
                 -> each worker's pull reply by the plan (minips.server.pulls.PullEncoder:
                    fp16, delta with its per-worker replica)
    each worker  set_params / apply_delta (minips.worker.worker)

and tests the model on the whole test set every `--eval-every` rounds (every 5 in the
first 80, where accuracy climbs fastest), with no scheduling noise. What it leaves out does not
change ssgd's arithmetic: wait-free sending (the server sums a step's pushes into one),
retries, heartbeats. The order in which the server adds the workers' gradients is fixed
here (rank order) where a real run adds them as they arrive, so a real run of the same
seed is a slightly different float32 trajectory (same-seed real runs spread ~0.3 point).

Plans: `dense`, `fp16` (every weight fp16 both ways), `auto-RATE` (what the planner
chooses for each worker's link of RATE, compute measured here), or a plan JSON file.
Writes OUT/<plan>-s<seed>.json (the curve) and prints samples to 0.80 and 0.85 and the
final accuracy per plan, means over seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from minips.data import iterate_batches, load_dataset
from minips.guard import wire_checks
from minips.nn import build_model, softmax_cross_entropy
from minips.protocol import wire
from minips.provision.locations import find_data
from minips.run.plan_checks import load_plan
from minips.server.pulls import PullEncoder
from minips.state.registry import WorkerState
from minips.state.store import SGD, ParameterStore
from minips.trainer import evaluate
from minips.transmission.codecs import Encoder, Factors, decode_gradients, parse_spec
from minips.transmission.plan import ParamPlan, Plan
from minips.worker.worker import apply_delta

TARGETS = (0.80, 0.85)
EARLY_ROUNDS, EARLY_EVERY = 80, 5  # rounds 1-80 (20,480 samples of 4 x 64) tested every 5


def named_plan(name: str, model_name: str, batch_size: int, workers: int) -> Plan:
    """dense, fp16, auto-RATE (each worker's own link) or a plan file."""
    if name == "fp16":
        model = build_model(model_name)
        weights = [n for n, a in model.params.items() if a.ndim > 1]
        return Plan({n: ParamPlan(push="fp16", pull="fp16") for n in weights})
    if name.startswith("auto-"):  # the planner's choice for each worker's own link of RATE
        from minips.run.plan_measure import choose_plan, parse_network
        from minips.transmission.planning.plan_costs import Cluster

        network, cluster = parse_network(bandwidth=name[5:]), Cluster(workers=workers)
        model = build_model(model_name)
        return choose_plan(model, batch_size, cluster, network, momentum=0.9).plan
    return load_plan(name)


class SimWorker:
    """One worker: its model copy, shard, batches and encoder (minips.worker.Worker's state)."""

    def __init__(self, rank: int, config: dict[str, Any], data: Any, plan: Plan) -> None:
        self.rank = rank
        self.model = build_model(config["model"], seed=0)
        self.shard = data.shard(rank, config["workers"])
        self.rng = np.random.default_rng(config["seed"] * 1000 + rank)
        self.batch_size = config["batch_size"]
        self.batches = iter(())
        self.encoder = Encoder()
        self.specs = plan.push_specs()
        self.sf = {n for n, s in self.specs.items() if parse_spec(s)[0] == "sf"}
        self.state = WorkerState(f"w{rank}", rank, {}, 0.0)
        self.version: int | None = None

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        for batch in self.batches:
            return batch
        self.batches = iterate_batches(
            self.shard.x_train, self.shard.y_train, self.batch_size, self.rng
        )
        return next(self.batches)

    def push_frames(self) -> tuple[list[Any], int]:
        """Forward/backward on the next batch; the push's frames and the batch size."""
        xb, yb = self.next_batch()
        logits = self.model.forward(xb, train=True)
        _, dlogits = softmax_cross_entropy(logits, yb)
        self.model.backward(dlogits)
        grads: dict[str, Any] = {}
        for name, grad in self.model.grads.items():
            layer = self.model.layers[name.rsplit(".", 1)[0]]
            grads[name] = Factors(*layer.sufficient_factors()) if name in self.sf else grad
        parts = self.encoder.encode(grads, self.specs)
        header = {"op": "push", "worker": self.state.worker_id, "seq": 0,
                  "base": self.version or 0, "last": True}  # fmt: skip
        return wire.encode_parts(header, parts), len(xb)

    def apply_pull(self, frames: list[Any], version: int) -> None:
        message = wire.decode(frames)
        if message.arrays:
            self.model.set_params(dict(message.arrays))
        params = self.model.params
        for name, parts in message.parts.items():
            apply_delta(params[name], parts["indices"], parts["values"])
        self.version = version


def simulate(
    plan: Plan, seed: int, model_name: str, workers: int, batch_size: int, budget: int,
    lr: float, momentum: float, eval_every: int, data: Any,
) -> dict[str, Any]:  # fmt: skip
    """One ssgd run of `budget` samples by `plan`; the accuracy curve and timings."""
    config = {"model": model_name, "workers": workers, "batch_size": batch_size, "seed": seed}
    server_model = build_model(model_name, seed=seed)
    params = server_model.params
    store = ParameterStore(params, SGD(params, lr, momentum))
    store.optimizer.plain_for(plan.worker_momentum())  # as ParameterServer.use_plan does
    pulls = PullEncoder(store, plan)
    sims = [SimWorker(rank, config, data, plan) for rank in range(workers)]
    for sim in sims:  # the first pull: everything, dense
        sim.apply_pull(wire.encode_parts({"op": "pull"}, pulls.parts(sim.state, None)), 0)
    probe = build_model(model_name, seed=0)
    curve: list[dict[str, Any]] = []
    samples, rounds = 0, 0
    cpu = {"worker": 0.0, "server": 0.0, "eval": 0.0}
    bytes_up = bytes_down = 0

    def test() -> None:
        start = time.process_time()
        probe.set_params(store.params)
        accuracy, loss = evaluate(probe, data.x_test, data.y_test, batch_size=250)
        cpu["eval"] += time.process_time() - start
        curve.append({"round": rounds, "samples": samples, "accuracy": accuracy, "loss": loss})

    test()
    while samples < budget:
        start = time.process_time()
        pushes = [sim.push_frames() for sim in sims]
        cpu["worker"] += time.process_time() - start
        start = time.process_time()
        totals: dict[str, np.ndarray] = {}
        for frames, batch in pushes:
            bytes_up += sum(memoryview(f).nbytes for f in frames[1:])
            grads, _ = decode_gradients(wire_checks.decode_request(frames))
            for name, grad in grads.items():
                totals[name] = totals[name] + grad if name in totals else np.array(grad, np.float32)
            samples += batch
        mean = np.float32(workers)  # every worker sends every parameter each round
        store.write([(n, totals[n] / mean, 1.0) for n in store.params if n in totals])
        replies = []
        for sim in sims:
            replies.append(wire.encode_parts({"op": "pull"}, pulls.parts(sim.state, sim.version)))
            bytes_down += sum(memoryview(f).nbytes for f in replies[-1][1:])
        cpu["server"] += time.process_time() - start
        start = time.process_time()
        for sim, frames in zip(sims, replies, strict=True):
            sim.apply_pull(frames, store.version)
        cpu["worker"] += time.process_time() - start
        rounds += 1
        # Accuracy climbs fastest early: tested every EARLY_EVERY rounds there.
        every = min(eval_every, EARLY_EVERY) if rounds <= EARLY_ROUNDS else eval_every
        if rounds % every == 0 or samples >= budget:
            test()
    return {
        "seed": seed, "rounds": rounds, "samples": samples, "curve": curve,
        "final": curve[-1]["accuracy"],
        "to": {f"{t:.2f}": samples_to(curve, t) for t in TARGETS},
        "cpu_ms_per_round": {k: v / rounds * 1e3 for k, v in cpu.items()},
        "bytes_up_per_step": bytes_up / rounds / workers,
        "bytes_down_per_step": bytes_down / rounds / workers,
        "plan": plan.to_dict(),
    }  # fmt: skip


def samples_to(curve: list[dict[str, Any]], target: float) -> float | None:
    """Samples at which accuracy first reaches `target`, linearly interpolated between the
    two evaluations around the crossing (None: never reached)."""
    for before, after in zip(curve, curve[1:], strict=False):
        if after["accuracy"] >= target:
            if before["accuracy"] >= target:
                return float(before["samples"])
            share = (target - before["accuracy"]) / (after["accuracy"] - before["accuracy"])
            return before["samples"] + share * (after["samples"] - before["samples"])
    return None


def fitted_samples_to(curve: list[dict[str, Any]], target: float, start: int = 5000) -> float:
    """Samples to `target` on a fit acc(S) = A - B S^-C of the whole curve from `start`
    samples on: every test counts, not only the one that first crossed (a curve jagged by
    +-0.5 point moves a first crossing of 85 % by 10,000 samples). Least squares on A, B
    for each C of a grid; infinity when the fit's ceiling A is below the target."""
    s = np.array([c["samples"] for c in curve if c["samples"] >= start], float)
    a = np.array([c["accuracy"] for c in curve if c["samples"] >= start])
    best = None
    for c in np.linspace(0.1, 2.0, 96):
        design = np.stack([np.ones_like(s), -(s**-c)], axis=1)
        (ceiling, scale), *_ = np.linalg.lstsq(design, a, rcond=None)
        error = float(((design @ [ceiling, scale] - a) ** 2).sum())
        if best is None or error < best[0]:
            best = (error, ceiling, scale, c)
    _, ceiling, scale, c = best
    return float((scale / (ceiling - target)) ** (1 / c)) if target < ceiling else math.inf


def _mean(values: list[float], digits: str) -> str:
    if not values:
        return "-"
    text = format(statistics.mean(values), digits)
    if len(values) == 1:
        return text
    return f"{text} ± {format(statistics.stdev(values), digits.lstrip('+'))}"


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: per plan, the samples to 80 % and to 85 % against dense's on the same seed
    (fitted_samples_to; per seed, then mean ± sd), the final accuracy against dense's, and
    the bytes per worker step."""
    dense = {r["seed"]: r for r in results.get("dense", [])}
    lines = [
        "| plan (fc1.w push / pull) | seeds | samples to 80 %, x dense | samples to 85 %, "
        "x dense | final accuracy - dense's (points) | KB up / down a step |",
        "| --- | --- | --- | --- | ---: | ---: |",
    ]
    for name, runs in results.items():
        paired = [r for r in runs if r["seed"] in dense]
        cells = []
        for target in TARGETS:
            ratios = [
                fitted_samples_to(r["curve"], target)
                / fitted_samples_to(dense[r["seed"]]["curve"], target)
                for r in paired
            ]
            each = " ".join(f"{x:.2f}" for x in ratios)
            cells.append(f"{each} (mean {_mean(ratios, '.2f')})" if len(ratios) > 1 else each)
        gaps = [100 * (r["final"] - dense[r["seed"]]["final"]) for r in paired]
        up = statistics.mean(r["bytes_up_per_step"] for r in runs) / 1e3
        down = statistics.mean(r["bytes_down_per_step"] for r in runs) / 1e3
        seeds = ",".join(str(r["seed"]) for r in runs)
        lines.append(f"| {name} | {seeds} | {cells[0]} | {cells[1]} | "
                     f"{_mean(gaps, '+.2f')} | {up:,.0f} / {down:,.0f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--plans", default="dense,fp16")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--budget", type=int, default=120_000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--eval-every", type=int, default=20, help="rounds between tests")
    parser.add_argument(
        "--table", action="store_true", help="only print the table of the runs in OUT"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_dataset(args.dataset, find=find_data)
    results: dict[str, list[dict[str, Any]]] = {}
    for name in args.plans.split(","):
        label = Path(name).stem if name.endswith(".json") else name
        plan = named_plan(name, args.model, args.batch_size, args.workers)
        for seed in [int(s) for s in args.seeds.split(",")]:
            path = out / f"{label}-s{seed}.json"
            if path.exists():  # finished runs are reused: delete the file to redo one
                result = json.loads(path.read_text())
            elif args.table:
                continue
            else:
                result = simulate(
                    plan, seed, args.model, args.workers, args.batch_size, args.budget,
                    args.lr, args.momentum, args.eval_every, data,
                )  # fmt: skip
                path.write_text(json.dumps(result) + "\n")
            results.setdefault(label, []).append(result)
            print(f"{label} s{seed}: final {result['final']:.4f} to {result['to']}", flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
