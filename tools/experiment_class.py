"""A class on one shared link: NumPy and browser workers mixed, dense against auto.

    python tools/experiment_class.py --out class --link 100mbit --mixes 2+2,0+4 \\
        --plans dense,auto --rules ssgd,dana-gap [--model mlp] [--budget 60000] \\
        [--seeds 0,1,2] [--lock /work/locks/cpu]

Every run is a real `minips run` (minips.run.launch.run_local): the server behind a shaped
link shared by every worker (`--netem RATE`, as a classroom's Wi-Fi access point: root
only), N NumPy workers and B browser workers in headless Chromium (`--browser B
--browser-headless`; the browsers' WebSockets end at the gateway, whose connections to the
server cross the link like the NumPy workers'), Fashion-MNIST, batch 64, lr 0.01, the
rule's momentum (ssgd's SGD 0.9, dana-gap's own), one global sample budget, evaluations
every 2 s. A mix is "N+B". `auto` is the planner's plan for that link and class (browser
steps counted as slower, ssgd's barrier).

Writes OUT/<mix>-<rule>-<plan>/ for seed 0 and OUT/<mix>-<rule>-<plan>-s<seed>/ for the
others (run directories; a finished one is reused, so an interrupted grid resumes),
OUT/results.json, and prints a markdown table: time to the target accuracy, final
accuracy, wall time, the workers' bytes per step each way (the server's counters of every
worker's messages, the evaluator's pulls left out), and the browsers' share of the steps.
With --lock, each run holds an flock on that file (and notes the load average before and
after it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from experiment_layers import held  # one flock helper for the tools' grids

from minips.results.loading import load_run
from minips.results.report import time_to_target
from minips.run.config import RunConfig
from minips.run.launch import run_local


def _final_stats(out: Path) -> dict[str, Any]:
    lines = (out / "updates.jsonl").read_text().splitlines()
    return next(json.loads(x) for x in lines if '"event": "server"' in x)["stats"]


def one_run(
    args: argparse.Namespace, mix: str, rule: str, plan: str, seed: int = 0
) -> dict[str, Any]:
    numpy_workers, browsers = (int(n) for n in mix.split("+"))
    out = Path(args.out) / (f"{mix}-{rule}-{plan}" + (f"-s{seed}" if seed else ""))
    config = RunConfig(
        model=args.model, dataset="fashion-mnist", epochs=args.epochs, batch_size=64,
        workers=numpy_workers + browsers, browser=browsers, browser_headless=browsers > 0,
        listen="127.0.0.1:0", lr=0.01, rule=rule, max_samples=args.budget,
        netem=args.link, plan=plan, heartbeat_timeout=60.0, seed=seed,
    )  # fmt: skip
    loads = None
    if not (out / "summary.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        with held(args.lock):
            before = os.getloadavg()[0]
            print(f"run {out.name} (load {before:.1f}) ...", file=sys.stderr, flush=True)
            run_local(config, out, eval_interval=2.0)
            loads = [round(before, 1), round(os.getloadavg()[0], 1)]
        (out / "load.json").write_text(json.dumps(loads))
    loads = json.loads((out / "load.json").read_text()) if (out / "load.json").exists() else None
    run = load_run(out)
    stats = _final_stats(out)
    steps = max(1, stats["worker_steps"])
    rows = [w for w in stats["workers"] if not w.get("observer")]  # not the evaluator's pulls
    # The share counts clocked steps on both sides: the pushes accepted while the server
    # stops (in worker_steps, and in the bytes) are no worker's step.
    browser_steps = sum(w["clock"] for w in rows if (w.get("info") or {}).get("agent") == "browser")
    clocked = sum(w["clock"] for w in rows)
    up, down = sum(w["bytes_in"] for w in rows), sum(w["bytes_out"] for w in rows)
    reached = time_to_target(run.events("eval"), args.target, run.summary["wall_s"])
    return {
        "mix": mix, "rule": rule, "plan": plan, "seed": seed, "accuracy": run.summary["accuracy"],
        "wall_s": run.summary["wall_s"], "time_to_target": reached and reached["time"],
        "samples": run.summary["samples"], "worker_steps": steps,
        "browser_steps": browser_steps, "clocked_steps": clocked, "up_per_step": up / steps,
        "down_per_step": down / steps, "load": loads,
    }  # fmt: skip


def table(rows: list[dict[str, Any]], target: float) -> str:
    """One markdown line per run."""
    lines = [
        f"| NumPy + browsers | rule | plan | seed | time to {target:g} (s) | final accuracy "
        "| wall (s) "
        "| KB up/step | KB down/step | browsers' steps | load before, after |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        reached = "not reached" if r["time_to_target"] is None else f"{r['time_to_target']:.1f}"
        share = f"{r['browser_steps']} of {r['clocked_steps']}"
        load = ", ".join(str(x) for x in r["load"]) if r["load"] else "-"
        lines.append(
            f"| {r['mix']} | {r['rule']} | {r['plan']} | {r.get('seed', 0)} | {reached} "
            f"| {r['accuracy']:.4f} | "
            f"{r['wall_s']:.1f} | {r['up_per_step'] / 1e3:.1f} | {r['down_per_step'] / 1e3:.1f} "
            f"| {share} | {load} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--link", default="100mbit", help="the shared link's rate (tc units)")
    parser.add_argument("--mixes", default="2+2,0+4", help="NumPy+browser worker counts")
    parser.add_argument("--plans", default="dense,auto")
    parser.add_argument("--rules", default="ssgd,dana-gap")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--budget", type=int, default=60_000, help="global sample budget")
    parser.add_argument("--epochs", type=int, default=10, help="per worker (the budget ends first)")
    parser.add_argument("--target", type=float, default=0.80)
    parser.add_argument("--seeds", default="0", help="comma-separated run seeds")
    parser.add_argument("--lock", help="an flock file held during each run")
    args = parser.parse_args(argv)
    rows = []
    for mix in args.mixes.split(","):
        for rule in args.rules.split(","):
            for plan in args.plans.split(","):
                for seed in (int(s) for s in args.seeds.split(",")):
                    rows.append(one_run(args, mix, rule, plan, seed))
                (Path(args.out) / "results.json").write_text(json.dumps(rows, indent=2))
    print(table(rows, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
