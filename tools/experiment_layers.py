"""The layer-aware transmission experiment: links x plans x seeds, one real local cluster each.

    python tools/experiment_layers.py --out layers \\
        --links unlimited,1gbit,100mbit,20mbit,shared-100mbit --plans dense,fp16,auto \\
        --seeds 0,1,2 [--lock /work/locks/cpu] [--plot layers/time-to-85.png]

Every run: LeNet-5 on the full Fashion-MNIST, batch 64, 4 workers, rule ssgd, lr 0.01,
momentum 0.9, a global budget of 120,000 samples (2 epochs), evaluations every 5 s. Links:

    unlimited       TCP loopback
    RATE            each worker's own link of RATE (`minips run --bandwidth RATE`: a token
                    bucket per worker and direction), e.g. 1gbit, 100mbit, 20mbit
    shared-RATE     one link of RATE at the server that every worker crosses (`minips run
                    --netem RATE`: the server in its own network namespace behind a
                    tc-shaped veth; root only)

Plans:

    dense       everything dense both ways (the default)
    auto        the planner's choice for the run's link (minips/transmission/planning/planner.py)
    fp16        every weight fp16 both ways, biases dense, wait-free sending
    FILE.json   a plan file (`minips plan --json`), labelled by its name

Writes OUT/<link>-<plan>-s<seed>/ (run directories), OUT/results.json (one row per run:
time to 0.80 and 0.85, final accuracy, wall time, the server's byte counters per worker
step, the load average around the run) and prints two markdown tables: means over seeds,
and auto against dense per link. Finished runs are reused (delete a directory to redo
it), so an interrupted grid resumes. `--every-versions N` times the runs by version
instead: the server keeps the model every N versions and each is evaluated after the run
(tools/eval_versions.py), so every run tests the same versions, with no evaluator sharing
the cores while it runs. `--lock FILE` holds an flock on FILE for each run
(one run per hold, not the grid), so runs on a shared machine do not overlap timed work.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from eval_versions import evaluate_versions, read_versions
from layers_tables import after_startup, fitted, group_rows, per_seed, table, versus
from sample_cost import fitted_samples_to  # the fit of tools/sample_cost.py's curves

from minips.results.loading import load_run
from minips.results.report import time_to_target
from minips.run.config import RunConfig
from minips.run.launch import run_local
from minips.run.plan_measure import parse_rate
from minips.transmission.plan import ParamPlan, Plan

TARGETS = (0.80, 0.85)
WEIGHTS = ("conv1.w", "conv2.w", "fc1.w", "fc2.w")
FIXED_PLANS: dict[str, Plan] = {
    "fp16": Plan({n: ParamPlan(push="fp16", pull="fp16") for n in WEIGHTS}, wait_free=True),
}


def link_options(link: str) -> dict[str, str | None]:
    """RunConfig's bandwidth / netem for a link name (module doc)."""
    if link == "unlimited":
        return {"bandwidth": None, "netem": None}
    if link.startswith("shared-"):
        return {"bandwidth": None, "netem": link[len("shared-") :]}
    return {"bandwidth": link, "netem": None}


def link_rate_mbit(link: str, workers: int) -> float | None:
    """Each worker's share in Mbit/s (the plot's x), None for unlimited."""
    options = link_options(link)
    if options["netem"]:
        return parse_rate(options["netem"]) * 8 / 1e6 / workers
    return parse_rate(options["bandwidth"]) * 8 / 1e6 if options["bandwidth"] else None


def plan_option(plan: str, directory: Path) -> str:
    """The --plan value for `plan`: dense, auto, or a file (written for a fixed plan)."""
    if plan in ("dense", "auto") or plan.endswith(".json"):
        return plan
    path = directory / f"plan-{plan}.json"
    path.write_text(json.dumps(FIXED_PLANS[plan].to_dict(), indent=2) + "\n")
    return str(path)


def plan_label(plan: str) -> str:
    return Path(plan).stem if plan.endswith(".json") else plan


@contextmanager
def held(lock: str | None):
    """An exclusive flock on `lock` for the duration (nothing when None)."""
    if lock is None:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def one_run(args: argparse.Namespace, link: str, plan: str, seed: int) -> dict[str, Any]:
    out = Path(args.out) / f"{link}-{plan_label(plan)}-s{seed}"
    summary_path = out / "summary.json"
    config = RunConfig(
        model="lenet5", dataset="fashion-mnist", epochs=args.epochs, batch_size=64, seed=seed,
        workers=args.workers, lr=0.01, momentum=0.9, rule=args.rule, max_samples=args.budget,
        trace=str(out / "trace-worker0.json") if args.trace else None, **link_options(link),
    )  # fmt: skip
    eval_interval = args.eval_interval
    if args.every_versions:  # the model kept every N versions, evaluated after the run
        eval_interval = 1e9  # the evaluator only at the start and the end: no CPU in between
        config = replace(config, checkpoint_every=args.every_versions, keep_checkpoints=True,
                         checkpoint_interval=0.0)  # fmt: skip
    load: dict[str, Any] = {}
    if not summary_path.exists():
        out.mkdir(parents=True, exist_ok=True)
        config = replace(config, plan=plan_option(plan, Path(args.out)))
        with held(args.lock):
            load["before"] = os.getloadavg()[0]
            print(f"{time.strftime('%H:%M:%S')} run {out.name} (load {load['before']:.1f})",
                  file=sys.stderr, flush=True)  # fmt: skip
            run_local(config, out, eval_interval=eval_interval)
            load["after"] = os.getloadavg()[0]
            if args.every_versions:  # in the lock: the next run's clock is not shared with it
                evaluate_versions(out, stop_at=max(TARGETS), remove=True)
        (out / "load.json").write_text(json.dumps(load) + "\n")
    elif (out / "load.json").exists():
        load = json.loads((out / "load.json").read_text())
    return row(out, link, plan_label(plan), seed, load)


def row(out: Path, link: str, plan: str, seed: int, load: dict[str, Any]) -> dict[str, Any]:
    """One finished run's figures (the server's own counters for bytes)."""
    run = load_run(out)
    summary = json.loads((out / "summary.json").read_text())
    updates = _records(out / "updates.jsonl")
    stats = next(r for r in updates if r.get("event") == "server")["stats"]
    steps = max(1, stats["worker_steps"])
    by_param = stats.get("bytes_by_param", {})
    evals = read_versions(out) or run.events("eval")  # the kept versions' (eval_versions.py)
    reached = {f"{t:.2f}": time_to_target(evals, t, summary["wall_s"]) for t in TARGETS}
    first_update = next((r["time"] for r in updates if r.get("event") == "update"), None)
    time_to = {t: r and r["time"] for t, r in reached.items()}
    return {
        "link": link, "plan": plan, "seed": seed, "accuracy": summary["accuracy"],
        "wall_s": summary["wall_s"], "samples": summary["samples"], "worker_steps": steps,
        "time_to": time_to,
        "after_first_update": {t: None if v is None or first_update is None else v - first_update
                               for t, v in time_to.items()},  # fmt: skip
        "samples_to": {t: r and r["samples"] for t, r in reached.items()},
        "fitted_time_to": {f"{t:.2f}": fitted_time_to(evals, t) for t in TARGETS},
        "first_update_s": first_update,
        "up_per_step": sum(v["up"] for v in by_param.values()) / steps,
        "down_per_step": sum(v["down"] for v in by_param.values()) / steps,
        "bytes_by_param": by_param, "load": load,
    }  # fmt: skip


def fitted_time_to(evals: list[dict[str, Any]], target: float) -> float | None:
    """The time at which the run's accuracy curve, fitted, reaches `target`: the samples
    to it on tools/sample_cost.py's fit acc(S) = A - B S^-C of every evaluation from 5,000
    samples on, turned into seconds along the evaluations' own (samples, time) pairs.
    Less jagged than the first evaluation at the target, which moves by one evaluation
    interval (5-10 s here) when the curve hovers around it. None: not reached in the run."""
    import numpy as np

    points = [e for e in evals if e.get("accuracy") is not None and e.get("time") is not None]
    if sum(e["samples"] >= 5000 for e in points) < 3:
        return None
    samples = fitted_samples_to(points, target)
    if not samples <= points[-1]["samples"]:
        return None
    return float(np.interp(samples, [e["samples"] for e in points], [e["time"] for e in points]))


def _again(out: str, r: dict[str, Any]) -> dict[str, Any]:
    """A row of results.json read again from its run directory (fields added since)."""
    directory = Path(out) / f"{r['link']}-{r['plan']}-s{r['seed']}"
    if not (directory / "summary.json").exists():
        return r
    return row(directory, r["link"], r["plan"], r["seed"], r.get("load") or {})


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(rows: list[dict[str, Any]], links: list[str], workers: int, path: str) -> None:
    """Time to 0.85 against each worker's link rate, one line per plan (mean ± sd)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = group_rows(rows, links)
    fastest = max((link_rate_mbit(k[0], workers) or 0) for k in groups)
    unlimited_x = 4 * fastest if fastest else 1e4  # unlimited drawn right of the fastest link
    for n, plan in enumerate(sorted({k[1] for k in groups})):
        color = f"C{n}"  # one colour per plan, own and shared links alike
        for shared in (False, True):
            points = []
            for (link, p), group in groups.items():
                if p != plan or link.startswith("shared-") != shared:
                    continue
                times = [r["time_to"]["0.85"] for r in group if r["time_to"]["0.85"]]
                if times:
                    x = link_rate_mbit(link, workers) or unlimited_x
                    sd = statistics.stdev(times) if len(times) > 1 else 0.0
                    points.append((x, statistics.mean(times), sd))
            if not points:
                continue
            points.sort()
            xs, ys, sds = zip(*points, strict=True)
            style = (
                dict(marker="s", linestyle="none", markersize=9, fillstyle="none")
                if shared
                else dict(marker="o")
            )
            label = f"{plan}, shared link (--netem)" if shared else f"{plan}, own link"
            ax.errorbar(xs, ys, yerr=sds, label=label, capsize=3, color=color, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("each worker's link (Mbit/s; rightmost: unlimited loopback)")
    ax.set_ylabel("time to 85 % test accuracy (s)")
    ax.set_title(f"LeNet-5, Fashion-MNIST, ssgd, {workers} workers")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--links", default="unlimited,1gbit,100mbit,20mbit,shared-100mbit")
    parser.add_argument("--plans", default="dense,fp16,auto")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rule", default="ssgd")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--budget", type=int, default=120_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--eval-interval", type=float, default=5.0)
    parser.add_argument("--every-versions", type=int, default=0, help="keep the model every "
                        "N versions and evaluate those after the run (tools/eval_versions.py), "
                        "instead of an evaluator every --eval-interval s")  # fmt: skip
    parser.add_argument("--lock", help="flock this file for each run (e.g. /work/locks/cpu)")
    parser.add_argument("--plot", help="write the time-to-0.85 plot here (png)")
    parser.add_argument("--trace", action="store_true", help="trace worker 0 of each run")
    parser.add_argument(
        "--table", action="store_true", help="run nothing: print the tables of the runs in OUT"
    )
    args = parser.parse_args(argv)
    results = Path(args.out) / "results.json"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    # Rows of earlier invocations are kept: results.json is the whole grid so far.
    done = json.loads(results.read_text()) if results.exists() else []
    rows = {(r["link"], r["plan"], r["seed"]): r for r in done}
    links = args.links.split(",")
    for seed in [] if args.table else [int(s) for s in args.seeds.split(",")]:
        for link in links:
            for plan in args.plans.split(","):
                rows[link, plan_label(plan), seed] = one_run(args, link, plan, seed)
                results.write_text(json.dumps(list(rows.values()), indent=1) + "\n")
    every = [_again(args.out, r) for r in rows.values()]
    order = links + sorted({r["link"] for r in every} - set(links))
    print(table(every, order))
    for plan in ("auto", "fp16"):
        print()
        print(versus(every, order, plan))
    if args.table:
        print()
        print(after_startup(every, order))
        print()
        print(fitted(every, order))
        print()
        print(per_seed(every, order))
    if args.plot:
        plot(every, order, args.workers, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
