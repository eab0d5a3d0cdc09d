"""Ringmaster ASGD's experiment, emulated in one process with a simulated clock.

    python tools/ringmaster_repro.py --out DIR [--workers 100] [--delay sqrt-noise]
        [--lrs 0.2,0.1,...] [--Rs 5,10,20,40] [--Bs 5,10,20,40] [--seeds 0,1,2]
        [--time-budget 2000] [--stops] [--plot PNG] [--quick]

Maranjyan, Tyurin, Richtarik, "Ringmaster ASGD: The First Asynchronous SGD with Optimal
Time Complexity" (ICML 2025, arXiv:2501.16168) compare, on a small two-layer ReLU network,
three methods whose workers have heterogeneous, fluctuating computation times. The
distributed system is emulated as such papers do: one process keeps the workers' finish
times in an event queue, pops the earliest, and the simulated clock jumps to it:

    worker i (1..n) starts at time t a stochastic gradient at the point it last read
      (x^{k_i}, the version k_i); it finishes at t + tau_i, tau_i drawn at each start:
      sqrt-noise: tau_i = sqrt(i) + |eta|, eta ~ N(0, i)   (fluctuating, slower with i)
      sqrt:       tau_i = sqrt(i)                           (fixed, heterogeneous)
      equal:      tau_i = 1                                 (homogeneous)
    at its finish the server decides (below), and the worker starts again at x^k, the
    current point (every method here hands a worker the newest point).

The decisions, with delay delta = k - k_i:
    ringmaster      delta < R: x <- x - lr g; else the gradient is ignored. This calls
                    minips's rule (minips/rules/ringmaster.py, Ringmaster.on_push). With
                    --stops (the paper's Algorithm 5), after every step each worker whose
                    computation has reached delta >= R is restarted at once at x^k.
    delay-adaptive  x <- x - lr s(delta) g, s from minips's rule (DelayAdaptive.factor:
                    s = 1 while delta <= 2n, else 2n / delta).
    asgd            x <- x - lr g (plain asynchronous SGD, a reference; not in the paper's
                    figure as far as could be checked).
    rennala         Rennala SGD (Tyurin, Richtarik, "Optimal Time Complexities of Parallel
                    Stochastic Optimization Methods Under a Fixed Computation Model",
                    NeurIPS 2023, arXiv:2305.12387, Algorithm 2 there / Algorithm 2 of the
                    Ringmaster paper): the server collects B gradients computed AT x^k, from
                    whichever workers finish first (a fast one may give several); a gradient
                    computed at an older point is discarded; then
                        x^{k+1} = x^k - lr * (1/B) * sum_{j=1..B} g_j(x^k).
                    Not in minips (it is a synchronous batch collector); written here.

A gradient that will be ignored or discarded is not computed (its data draw is skipped
too): the decision depends only on the times, so the trajectory is the same and the CPU
is spent only on gradients that are used. Same seed -> same output: the times, the batches
and the initial weights are drawn from generators seeded by --seeds.

Every --eval-points of the simulated time budget the current x is tested on the test set
(accuracy, loss) and on a fixed subset of the training set (loss; the step sizes are tuned
on it, never on the test set). Output: DIR/runs.json (every curve), DIR/table.md, and
with --plot the accuracy-vs-time figure of the tuned runs.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from minips.data.datasets import load_dataset
from minips.nn.losses import softmax_cross_entropy
from minips.nn.zoo import mlp
from minips.provision.locations import find_data
from minips.rules.delay_adaptive import DelayAdaptive
from minips.rules.ringmaster import Ringmaster
from minips.state.registry import Push

METHODS = ("ringmaster", "delay-adaptive", "rennala", "asgd")
DELAYS = ("sqrt-noise", "sqrt", "equal")


def draw_time(delay: str, worker: int, rng: np.random.Generator) -> float:
    """One computation time of worker `worker` (1-based) under the delay model (module doc)."""
    if delay == "equal":
        return 1.0
    base = math.sqrt(worker)
    if delay == "sqrt":
        return base
    return base + abs(float(rng.normal(0.0, math.sqrt(worker))))  # eta ~ N(0, i): sd sqrt(i)


class Problem:
    """The data and the network: x_train (N, 784) float32, labels; a minips MLP to compute with."""

    def __init__(self, hidden: int, test_size: int, probe_size: int) -> None:
        data = load_dataset("fashion-mnist", seed=0, find=find_data)
        self.x_train = data.x_train.reshape(len(data.x_train), -1)
        self.y_train = data.y_train
        self.x_test = data.x_test.reshape(len(data.x_test), -1)[:test_size]
        self.y_test = data.y_test[:test_size]
        self.x_probe = self.x_train[:probe_size]  # fixed training subset: the tuning loss
        self.y_probe = self.y_train[:probe_size]
        self.hidden = hidden
        self.model = mlp(hidden=(hidden,), seed=0)

    def initial(self, seed: int) -> dict[str, np.ndarray]:
        """x^0: the minips MLP's initial weights for `seed` (784 -> hidden -> 10, ReLU)."""
        return {k: v.copy() for k, v in mlp(hidden=(self.hidden,), seed=seed).params.items()}

    def gradient(self, x: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        """The minibatch gradient of the mean cross-entropy at x on training rows `rows`."""
        self.model.set_params(x)
        logits = self.model.forward(self.x_train[rows].reshape(-1, 1, 28, 28))
        _, dlogits = softmax_cross_entropy(logits, self.y_train[rows])
        self.model.backward(dlogits)
        return {k: g.copy() for k, g in self.model.grads.items()}

    def evaluate(self, x: dict[str, np.ndarray]) -> tuple[float, float, float]:
        """(test accuracy, test loss, training-subset loss) at x."""
        self.model.set_params(x)
        logits = self.model.forward(self.x_test.reshape(-1, 1, 28, 28), train=False)
        loss, _ = softmax_cross_entropy(logits, self.y_test)
        accuracy = float(np.mean(np.argmax(logits, axis=1) == self.y_test))
        probe = self.model.forward(self.x_probe.reshape(-1, 1, 28, 28), train=False)
        probe_loss, _ = softmax_cross_entropy(probe, self.y_probe)
        return accuracy, loss, probe_loss


def step(x: dict, grads: dict, rate: float) -> dict:
    """x - rate * g as NEW arrays: the old point stays intact for workers that read it."""
    return {k: x[k] - np.float32(rate) * grads[k] for k in x}


def ringmaster_keeps(rule: Ringmaster, delay: int) -> bool:
    """minips's Ringmaster decision for a gradient of this delay: applied (True) or dropped."""
    push = Push(worker=None, seq=0, base=0, last=True, grads={}, staleness=delay)
    return not rule.on_push(push).drops


def simulate(problem: Problem, method: str, lr: float, seed: int, opts, knob: int = 0) -> dict:
    """One run of `method` at step size `lr` (knob: R for ringmaster, B for rennala): its
    curve and counts (module doc)."""
    n, budget, R, B = opts.workers, opts.time_budget, knob, knob
    time_rng = np.random.default_rng([seed, 1])
    data_rng = np.random.default_rng([seed, 2])
    ringmaster, adaptive = Ringmaster(delay_threshold=max(1, R)), DelayAdaptive()
    x, k = problem.initial(seed), 0
    read = [0] * (n + 1)  # the version each worker computes at; points by version:
    points = {0: x}
    generation = [0] * (n + 1)  # a stopped computation's queue entry is stale
    queue = [(draw_time(opts.delay, i, time_rng), i, 0) for i in range(1, n + 1)]
    heapq.heapify(queue)
    batch_sum, batch_count = None, 0  # Rennala's collected gradients at x^k
    marks = [budget * (j + 1) / opts.eval_points for j in range(opts.eval_points)]
    curve = [(0.0, *problem.evaluate(x))]
    counts = {"computed": 0, "applied": 0, "ignored": 0, "stopped": 0}
    while marks:
        now, worker, gen = heapq.heappop(queue)
        while marks and marks[0] <= now:  # x is constant between events
            curve.append((marks.pop(0), *problem.evaluate(x)))
        if gen != generation[worker]:
            continue
        delay, base = k - read[worker], read[worker]
        use = {
            "ringmaster": ringmaster_keeps(ringmaster, delay),
            "rennala": delay == 0,
        }.get(method, True)
        if use:
            rows = data_rng.integers(0, len(problem.y_train), opts.batch)
            grads = problem.gradient(points[base], rows)
            counts["computed"] += 1
            if method == "rennala":
                batch_sum = grads if batch_sum is None else {
                    key: batch_sum[key] + grads[key] for key in grads}  # fmt: skip
                batch_count += 1
                if batch_count == B:
                    x, k = step(x, batch_sum, lr / B), k + 1
                    batch_sum, batch_count = None, 0
                    counts["applied"] += 1
            else:
                scale = adaptive.factor(delay, lr, n) if method == "delay-adaptive" else 1.0
                x, k = step(x, grads, lr * scale), k + 1
                counts["applied"] += 1
                if method == "ringmaster" and opts.stops:
                    stop_stale(queue, read, generation, k, now, worker, R, opts, counts, time_rng)
        else:
            counts["ignored"] += 1
        points[k] = x
        read[worker] = k
        heapq.heappush(queue, (now + draw_time(opts.delay, worker, time_rng), worker,
                               generation[worker]))  # fmt: skip
        live = set(read[1:])
        for version in [v for v in points if v not in live]:
            del points[version]  # no worker computes at it any more
    return {"method": method, "lr": lr, "knob": knob, "seed": seed, "curve": curve,
            "counts": counts, "steps": k}  # fmt: skip


def stop_stale(queue, read, generation, k, now, current, R, opts, counts, time_rng) -> None:
    """Algorithm 5's stops: a worker whose computation has delay >= R restarts at x^k now
    (`current`, the worker that just finished, restarts in the main loop)."""
    for worker in range(1, opts.workers + 1):
        if worker != current and k - read[worker] >= R:
            generation[worker] += 1
            read[worker] = k
            counts["stopped"] += 1
            heapq.heappush(queue, (now + draw_time(opts.delay, worker, time_rng), worker,
                                   generation[worker]))  # fmt: skip


def time_to(curve: list, target: float) -> float | None:
    """The first evaluated simulated time at which test accuracy >= target (None: never)."""
    return next((t for t, acc, *_ in curve if acc >= target), None)


def summary(runs: list[dict], target: float) -> str:
    """A markdown table: per method the tuned lr, final accuracy / loss and time to target,
    mean +- sd over seeds (sample sd), and the steps and ignored gradients of a run."""
    lines = [
        f"| method | setting | seeds | final test acc | final test loss | time to {target:.2f} "
        "| steps | ignored |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method in dict.fromkeys(r["method"] for r in runs):
        group = [r for r in runs if r["method"] == method]
        acc = np.array([r["curve"][-1][1] for r in group])
        loss = np.array([r["curve"][-1][2] for r in group])
        reach = [time_to(r["curve"], target) for r in group]
        hit = [t for t in reach if t is not None]
        reach_text = (f"{np.mean(hit):.0f} +- {sd(hit):.0f}" if hit else "never") + (
            f" ({len(hit)}/{len(group)} reached)" if len(hit) < len(group) else ""
        )
        lines.append(
            f"| {method} | {setting(group[0])} | {len(group)} | {acc.mean():.4f} +- {sd(acc):.4f}"
            f" | {loss.mean():.4f} +- {sd(loss):.4f} | {reach_text} "
            f"| {np.mean([r['steps'] for r in group]):.0f} "
            f"| {np.mean([r['counts']['ignored'] for r in group]):.0f} |"
        )
    return "\n".join(lines)


def sd(values) -> float:
    """Sample standard deviation (0 for one value)."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def plot(runs: list[dict], path: Path, opts) -> None:
    """Test accuracy vs simulated time, one line per method (mean over seeds, band min-max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for method in dict.fromkeys(r["method"] for r in runs):
        group = [r for r in runs if r["method"] == method]
        t = np.array([p[0] for p in group[0]["curve"]])
        acc = np.array([[p[1] for p in r["curve"]] for r in group])
        ax.plot(t, acc.mean(0), label=f"{method} ({setting(group[0])})")
        ax.fill_between(t, acc.min(0), acc.max(0), alpha=0.2)
    ax.set(xlabel="simulated time", ylabel="test accuracy", ylim=(0.5, 0.9),
           title=f"Fashion-MNIST, MLP 784-{opts.hidden}-10, n={opts.workers}, "
                 f"{opts.delay} times")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options; defaults are the setting of docs/results.md's section (say which are the
    paper's there)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workers", type=int, default=100)
    p.add_argument("--delay", choices=DELAYS, default="sqrt-noise")
    p.add_argument("--methods", default="ringmaster,delay-adaptive,rennala")
    p.add_argument("--lrs", default=",".join(f"{0.4 / 2**j:g}" for j in range(9)), help="steps")
    p.add_argument("--Rs", default="5,10,20,40", help="Ringmaster's delay thresholds R (tuned)")
    p.add_argument("--Bs", default="5,10,20,40", help="Rennala's batches B (tuned)")
    p.add_argument("--stops", action="store_true", help="Ringmaster with stops (Alg. 5)")
    p.add_argument("--batch", type=int, default=32, help="examples per stochastic gradient")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--time-budget", type=float, default=2000.0)
    p.add_argument("--eval-points", type=int, default=40)
    p.add_argument("--tune-seed", type=int, default=100, help="the seed the grid is tuned on")
    p.add_argument("--seeds", default="0,1,2", help="the seeds reported, at the tuned setting")
    p.add_argument("--target", type=float, default=0.80)
    p.add_argument("--test-size", type=int, default=10000)
    p.add_argument("--probe-size", type=int, default=10000)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="a < 20 s smoke run")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.workers, opts.time_budget, opts.eval_points, opts.lrs = 10, 60.0, 6, "0.1"
        opts.seeds, opts.test_size, opts.probe_size, opts.Rs, opts.Bs = "0", 2000, 2000, "3", "3"
    bad = [m for m in opts.methods.split(",") if m not in METHODS]
    opts.Rs, opts.Bs = ([int(v) for v in text.split(",")] for text in (opts.Rs, opts.Bs))
    if bad or opts.workers < 1 or min(opts.Rs + opts.Bs) < 1:
        p.error(f"methods from {METHODS}; workers, R and B >= 1 (got {bad or 'bad counts'})")
    return opts


def main(argv: list[str] | None = None) -> int:
    """Tune each method on --tune-seed (its lr x R or B grid, by the final training-subset
    loss), then run the reported --seeds at the chosen setting; write runs.json, table.md."""
    opts = parse(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    problem = Problem(opts.hidden, opts.test_size, opts.probe_size)
    seeds = [int(s) for s in opts.seeds.split(",")]
    lrs = [float(v) for v in opts.lrs.split(",")]
    knobs = {"ringmaster": opts.Rs, "rennala": opts.Bs}
    started, grid, chosen = time.monotonic(), [], []
    for method in opts.methods.split(","):
        tried = [simulate(problem, method, lr, opts.tune_seed, opts, knob)
                 for knob in knobs.get(method, [0]) for lr in lrs]  # fmt: skip
        grid += tried
        for run in tried:
            print(f"{method:15s} {setting(run):14s} tune seed: acc {run['curve'][-1][1]:.4f} "
                  f"probe loss {run['curve'][-1][3]:.4f} steps {run['steps']} "
                  f"{run['counts']}", flush=True)  # fmt: skip
        best = min(tried, key=lambda r: nan_last(r["curve"][-1][3]))
        chosen += [simulate(problem, method, best["lr"], s, opts, best["knob"]) for s in seeds]
    wall = time.monotonic() - started
    table = summary(chosen, opts.target)
    text = f"{table}\n\nwall time {wall:.0f} s; options {vars(opts)}\n"
    print(text)
    (opts.out / "table.md").write_text(text)
    payload = {"options": {k: str(v) for k, v in vars(opts).items()}, "grid": grid,
               "chosen": chosen, "wall_seconds": wall}  # fmt: skip
    (opts.out / "runs.json").write_text(json.dumps(payload))
    if opts.plot:
        plot(chosen, opts.plot, opts)
    return 0


def setting(run: dict) -> str:
    """A run's tuned knobs as text: lr, and R or B."""
    knob = {"ringmaster": "R", "rennala": "B"}.get(run["method"])
    return f"lr {run['lr']:g}" + (f", {knob} {run['knob']}" if knob else "")


def nan_last(value: float) -> float:
    """A diverged run's loss (nan / inf) sorts after every finite one."""
    return value if math.isfinite(value) else math.inf


if __name__ == "__main__":
    sys.exit(main())
