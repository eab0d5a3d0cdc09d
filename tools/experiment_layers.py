"""The layer-aware transmission experiment: plans x links x seeds, one real local cluster each.

    python tools/experiment_layers.py --out layers --links unlimited,100mbit \\
        --plans dense,auto --seeds 0,1,2 [--rule ssgd] [--budget 120000]

Every run: LeNet-5 on the full Fashion-MNIST, batch 64, 4 workers, lr 0.01, momentum 0.9,
the same global sample budget as docs/results.md's grid (120,000 = 2 epochs), evaluations
every 5 s. A link is `unlimited` (TCP loopback) or a rate: the SHARED bottleneck at the
server (`minips run --netem RATE`: the server in its own network namespace behind a
tc-shaped veth; root only), or with `--per-worker` each worker's token bucket
(`--bandwidth RATE`). Plans:

    dense       everything dense both ways (today's default)
    auto        the planner's choice for the link (minips.run.planner), wait-free sending
    auto-serial the same codecs without the sender thread (one push per step)
    auto-RATE   the plan auto chooses for a shared link of RATE (e.g. auto-100mbit), run on
                the given link: at `unlimited` it measures the plan's accuracy cheaply
                (under ssgd accuracy does not depend on the link)
    fp16        every weight fp16 both ways
    sf-fc       fc1's weight as float16 sufficient factors (the rest dense)
    topk-fc     fc weights top-k 1 % (the rest dense)

Writes OUT/<link>-<plan>-s<seed>/ (run directories), OUT/results.json (one row per run)
and prints a markdown table of means over seeds. Finished runs are reused (delete the
directory to redo one), so an interrupted grid resumes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from minips.protocol.plan import ParamPlan, Plan
from minips.run.build import resolve_plan
from minips.run.config import RunConfig
from minips.run.launch import run_local
from minips.run.report import time_to_target
from minips.run.rundir import load_run

FIXED_PLANS: dict[str, Plan] = {
    "fp16": Plan(
        {n: ParamPlan(push="fp16", pull="fp16") for n in ("conv1.w", "conv2.w", "fc1.w", "fc2.w")}
    ),  # noqa: E501
    "sf-fc": Plan({"fc1.w": ParamPlan(push={"codec": "sf", "dtype": "float16"})}),
    "topk-fc": Plan(
        {n: ParamPlan(push={"codec": "topk", "ratio": 0.01}) for n in ("fc1.w", "fc2.w")}
    ),  # noqa: E501
}


def plan_file(config: RunConfig, plan: str, directory: Path) -> str:
    """The --plan value for `plan` (a file for everything but dense and auto)."""
    if plan in ("dense", "auto"):
        return plan
    if plan == "auto-serial":
        chosen = replace(resolve_plan(replace(config, plan="auto")), wait_free=False)
    elif plan.startswith("auto-"):  # auto-RATE: the plan auto chooses for a shared RATE
        chosen = resolve_plan(replace(config, plan="auto", netem=plan[5:], bandwidth=None))
    else:
        chosen = FIXED_PLANS[plan]
    path = directory / f"plan-{plan}.json"
    path.write_text(json.dumps(chosen.to_dict(), indent=2) + "\n")
    return str(path)


def one_run(args: argparse.Namespace, link: str, plan: str, seed: int) -> dict[str, Any]:
    out = Path(args.out) / f"{link}-{plan}-s{seed}"
    summary_path = out / "summary.json"
    limited = link != "unlimited"
    config = RunConfig(
        model="lenet5", dataset="fashion-mnist", epochs=args.epochs, batch_size=64, seed=seed,
        workers=args.workers, lr=0.01, momentum=0.9, rule=args.rule, max_samples=args.budget,
        netem=link if limited and not args.per_worker else None,
        bandwidth=link if limited and args.per_worker else None,
        trace=str(out / "trace-worker0.json") if args.trace else None,
    )  # fmt: skip
    if not summary_path.exists():
        out.mkdir(parents=True, exist_ok=True)
        config = replace(config, plan=plan_file(config, plan, Path(args.out)))
        print(f"run {out.name} ...", file=sys.stderr, flush=True)
        run_local(config, out, eval_interval=args.eval_interval)
    run = load_run(out)
    summary = json.loads(summary_path.read_text())
    stats = next(r for r in _records(out / "updates.jsonl") if r.get("event") == "server")["stats"]
    steps = max(1, stats["worker_steps"])
    by_param = stats.get("bytes_by_param", {})
    reached = time_to_target(run.events("eval"), args.target, summary["wall_s"])
    return {
        "link": link, "plan": plan, "seed": seed, "accuracy": summary["accuracy"],
        "wall_s": summary["wall_s"], "time_to_target": reached and reached["time"],
        "samples": summary["samples"], "worker_steps": steps,
        "up_per_step": sum(v["up"] for v in by_param.values()) / steps,
        "down_per_step": sum(v["down"] for v in by_param.values()) / steps,
        "bytes_by_param": by_param,
    }  # fmt: skip


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    text = f"{statistics.mean(got):.4g}"
    if len(got) > 1:
        text += f" ± {statistics.stdev(got):.2g}"
    return text + ("" if len(got) == len(values) else f" ({len(got)}/{len(values)})")


def table(rows: list[dict[str, Any]], target: float) -> str:
    """Markdown: one line per (link, plan), means ± sd over seeds."""
    lines = [
        f"| link | plan | seeds | accuracy | time to {target:g} (s) | wall (s) | "
        "KB up/step | KB down/step |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    keys = sorted({(r["link"], r["plan"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for link, plan in keys:
        group = [r for r in rows if (r["link"], r["plan"]) == (link, plan)]
        lines.append(
            f"| {link} | {plan} | {len(group)} | {_mean([r['accuracy'] for r in group])} | "
            f"{_mean([r['time_to_target'] for r in group])} | "
            f"{_mean([r['wall_s'] for r in group])} | "
            f"{_mean([r['up_per_step'] / 1e3 for r in group])} | "
            f"{_mean([r['down_per_step'] / 1e3 for r in group])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--links", default="unlimited,100mbit")
    parser.add_argument("--plans", default="dense,auto")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rule", default="ssgd")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--budget", type=int, default=120_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--eval-interval", type=float, default=5.0)
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--per-worker", action="store_true", help="--bandwidth, not --netem")
    parser.add_argument("--trace", action="store_true", help="trace worker 0 of each run")
    args = parser.parse_args(argv)
    results = Path(args.out) / "results.json"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    # Rows of earlier invocations are kept: results.json is the whole grid so far.
    done = json.loads(results.read_text()) if results.exists() else []
    rows = {(r["link"], r["plan"], r["seed"]): r for r in done}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for link in args.links.split(","):
            for plan in args.plans.split(","):
                rows[link, plan, seed] = one_run(args, link, plan, seed)
                results.write_text(json.dumps(list(rows.values()), indent=1) + "\n")
    print(table(list(rows.values()), args.target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
