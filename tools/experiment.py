"""The experiment grid: update rules x environments, one real local cluster per cell.

Every run trains the same model on the same dataset with the same learning rate and the
same total number of samples (a global budget of E epochs over the training set: the
server stops the run when the workers together have processed that many, so fast workers
do more of the work than stragglers), so rules compare on equal work. Environments:

    homogeneous    4 workers at full speed
    heterogeneous  4 workers slowed 1,1,2,8 (one straggler at 8x)
    stale          8 workers (and --stale-lr-scale for a larger learning rate): high
                   staleness, where plain asgd suffers and the delay-aware rules should not

Output, in --out: runs/<env>-<rule>/ (each a `minips run` directory), results.md (a table
per environment: final accuracy, time to --target, updates, staleness, bytes),
results.json, and accuracy-<env>.png / staleness-<env>.png.

    python tools/experiment.py --out results                      # the full grid (hours)
    python tools/experiment.py --out results --rules asgd,dasgd --envs heterogeneous
    python tools/experiment.py --quick --out /tmp/grid            # mlp on synthetic, seconds

Rules this minips does not know are skipped with a message, so the tool runs on any
version. Finished runs whose config.json matches are reused (--redo runs them again), so
an interrupted grid resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from minips.data import find_dataset, load_dataset
from minips.errors import MinipsError
from minips.results.loading import load_run
from minips.results.report import summarize
from minips.rules import RULES
from minips.run.config import RunConfig
from minips.run.launch import run_local

ALL_RULES = ["ssgd", "asgd", "ssp", "dasgd", "vsgd", "dcasgd"]


@dataclass(frozen=True)
class Environment:
    """A cluster shape: how many workers, each one's slowdown, and the lr multiplier."""

    workers: int
    hetero: tuple[float, ...] = ()
    lr_scale: float = 1.0

    def describe(self, lr: float) -> str:
        speeds = ",".join(f"{f:g}" for f in self.hetero) if self.hetero else "all 1"
        return f"{self.workers} workers, slowdown {speeds}, lr {lr * self.lr_scale:g}"


# `stale` doubles the workers at the base lr. On the bundled sample (lenet5, lr 0.01,
# momentum 0.9) 8 asgd workers already collapse to chance while dasgd trains; at 2x or 4x
# the lr every asynchronous rule collapsed, which shows nothing (--stale-lr-scale to try).
FULL = {
    "homogeneous": Environment(4),
    "heterogeneous": Environment(4, (1, 1, 2, 8)),
    "stale": Environment(8),
}
# --quick: the same three shapes, scaled down so the whole grid takes seconds.
QUICK = {
    "homogeneous": Environment(2),
    "heterogeneous": Environment(2, (1, 3)),
    "stale": Environment(4, (), lr_scale=4.0),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="Results folder.")
    parser.add_argument("--rules", default=",".join(ALL_RULES))
    parser.add_argument("--envs", default=",".join(FULL), help="Environments to run.")
    parser.add_argument("--model", default=None, help="Default lenet5 (quick: mlp).")
    parser.add_argument("--dataset", default=None, help="Default fashion-mnist (quick: synthetic).")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument(
        "--epochs", type=int, default=None, help="Sample budget, in epochs (default 3)."
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=None, help="Default 0.01 (quick: 0.05).")
    parser.add_argument("--momentum", type=float, default=None, help="Default 0.9 (quick: 0.5).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=None, help="Default 0.85 (quick: 0.9).")
    parser.add_argument("--eval-interval", type=float, default=None,
                        help="Seconds between evaluations (default 4; quick: 0.5).")  # fmt: skip
    parser.add_argument(
        "--stale-workers",
        type=int,
        default=None,
        help="Workers of the `stale` environment (default 8; quick: 4).",
    )
    parser.add_argument(
        "--stale-lr-scale",
        type=float,
        default=None,
        help="lr multiplier of the `stale` environment (default 1; quick: 4).",
    )
    parser.add_argument("--quick", action="store_true", help="Tiny: mlp on synthetic data.")
    parser.add_argument("--redo", action="store_true", help="Rerun finished runs too.")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {"model": ("lenet5", "mlp"), "dataset": ("fashion-mnist", "synthetic"),
                "epochs": (3, 1), "lr": (0.01, 0.05), "momentum": (0.9, 0.5),
                "target": (0.85, 0.9), "eval_interval": (4.0, 0.5)}  # fmt: skip
    for key, (full, small) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, small if quick else full)
    return args


def choose_dataset(args: argparse.Namespace) -> str:
    """The requested dataset, or the bundled sample when it is not on this machine."""
    if args.dataset == "sample" or find_dataset(args.dataset, args.data_dir) is not None:
        return args.dataset
    print(f"!! {args.dataset} not found (get it with `minips data download {args.dataset}`);"
          " using the bundled `sample` instead: these are NOT full-dataset results")  # fmt: skip
    return "sample"


def choose_rules(requested: str) -> list[str]:
    """The requested rules this minips knows, in order; the others are skipped, loudly."""
    rules = []
    for rule in (r.strip() for r in requested.split(",") if r.strip()):
        if rule in RULES:
            rules.append(rule)
        else:
            print(f"!! skipping rule {rule!r}: not in this minips (known: {', '.join(RULES)})")
    return rules


def make_spec(
    args: argparse.Namespace, dataset: str, rule: str, env: Environment, train_size: int
) -> RunConfig:
    """One cell's run: a global budget of `epochs` passes over the training set.

    The server stops the run once the workers together processed that many samples, so a
    fast worker does more of the work than a straggler (as in a real asynchronous cluster)
    and every rule gets exactly the same amount. A worker's own epoch count is only an
    upper bound (it may need more than one pass over its shard when others are slow).
    """
    return RunConfig(
        model=args.model, dataset=dataset, data_dir=args.data_dir,
        epochs=args.epochs * env.workers, max_samples=args.epochs * train_size,
        batch_size=args.batch_size, lr=args.lr * env.lr_scale, momentum=args.momentum,
        seed=args.seed, rule=rule, workers=env.workers, hetero=list(env.hetero),
    )  # fmt: skip


def _same_config(run_dir: Path, spec: RunConfig) -> bool:
    """True when run_dir finished a run of exactly this spec (addresses and paths aside)."""
    if not (run_dir / "summary.json").exists() or not (run_dir / "config.json").exists():
        return False
    ignore = {"bind", "checkpoint"}
    done = json.loads((run_dir / "config.json").read_text())
    wanted = json.loads(json.dumps(asdict(spec)))  # tuples -> lists, as stored
    return all(done.get(k) == v for k, v in wanted.items() if k not in ignore)


def run_cell(
    args: argparse.Namespace, run_dir: Path, spec: RunConfig, label: str
) -> dict[str, Any]:
    """Run (or reuse) one grid cell; return its row for the table."""
    started = time.monotonic()
    if not args.redo and _same_config(run_dir, spec):
        print(f"   {label}: reusing {run_dir}")
    else:
        try:
            run_local(spec, run_dir, eval_interval=args.eval_interval)
        except MinipsError as exc:
            print(f"   {label}: FAILED: {exc}")
            return {"run": run_dir.name, "error": str(exc)}
    report = summarize(load_run(run_dir), target=args.target)
    s, reached = report["summary"], report["target"]["reached"]
    row = {
        "run": run_dir.name, "rule": spec.rule, "accuracy": s.get("accuracy"),
        "time_to_target": reached["time"] if reached else None, "wall_s": s.get("wall_s"),
        "samples": s.get("samples"), "updates": s.get("updates"),
        "staleness_mean": report["staleness"]["mean"], "staleness_p90": report["staleness"]["p90"],
        "staleness_max": report["staleness"]["max"], "bytes_up": s.get("bytes_up"),
        "bytes_down": s.get("bytes_down"),
    }  # fmt: skip
    print(f"   {label}: accuracy {row['accuracy']:.4f}, wall {row['wall_s']:.1f} s, staleness"
          f" mean {row['staleness_mean'] or 0:.2f} max {row['staleness_max']}"
          f" ({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    return row


def _cell(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


def markdown_table(rows: list[dict[str, Any]], target: float) -> list[str]:
    """One environment's rows as a markdown table (failed runs say so)."""
    lines = [
        f"| rule | accuracy | time to {target:g} (s) | wall (s) | samples | updates "
        "| staleness mean | p90 | max | MB up | MB down |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['run']} | failed: {r['error']} |" + " |" * 9)
            continue
        mb = [None if r[k] is None else r[k] / 1e6 for k in ("bytes_up", "bytes_down")]
        lines.append(
            f"| {r['rule']} | {_cell(r['accuracy'], '.4f')} | {_cell(r['time_to_target'], '.1f')}"
            f" | {_cell(r['wall_s'], '.1f')} | {_cell(r['samples'])} | {_cell(r['updates'])}"
            f" | {_cell(r['staleness_mean'])} | {_cell(r['staleness_p90'])}"
            f" | {_cell(r['staleness_max'])} | {_cell(mb[0], '.1f')} | {_cell(mb[1], '.1f')} |"
        )
    return lines


def make_plots(out: Path, env_name: str, run_dirs: list[Path], target: float) -> list[str]:
    """accuracy-<env>.png and staleness-<env>.png; [] (and a note) without matplotlib."""
    from minips.results.plot import plot_accuracy, plot_staleness

    runs = [load_run(d) for d in run_dirs if (d / "metrics.jsonl").exists()]
    if not runs:
        return []
    try:
        accuracy = plot_accuracy(runs, out / f"accuracy-{env_name}.png", target, env_name)
        staleness = plot_staleness(runs, out / f"staleness-{env_name}.png", env_name)
    except MinipsError as exc:  # matplotlib missing: the tables are still worth having
        print(f"!! no plots: {exc}")
        return []
    return [accuracy.name, staleness.name]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = dict(QUICK if args.quick else FULL)
    stale = table["stale"]
    table["stale"] = Environment(
        args.stale_workers or stale.workers, stale.hetero, args.stale_lr_scale or stale.lr_scale
    )
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    unknown = [e for e in envs if e not in table]
    if unknown:
        print(f"unknown environment(s) {', '.join(unknown)} (known: {', '.join(table)})")
        return 2
    rules = choose_rules(args.rules)
    if not rules:
        print("no known rule to run")
        return 2
    dataset = choose_dataset(args)
    train_size = len(load_dataset(dataset, args.data_dir).y_train)
    header = (
        f"{args.model} on {dataset} ({train_size} training samples), a budget of {args.epochs}"
        f" epoch(s) ({args.epochs * train_size} samples, shared by the workers),"
        f" batch {args.batch_size}, base lr {args.lr:g}, momentum {args.momentum:g},"
        f" evaluation every {args.eval_interval:g} s. {platform.machine()}, {os.cpu_count()}"
        f" cores, {time.strftime('%Y-%m-%d %H:%M')}."
    )
    print(header)
    md = ["# minips experiment: update rules x environments", "", header, "",
          f"Time to {args.target:g}: wall time of the first evaluation at or above it (so up to"
          f" {args.eval_interval:g} s late); wall time counts from the launch, process start-up"
          " included. Staleness: the clock staleness of every push.", ""]  # fmt: skip
    if dataset != args.dataset:
        md += [f"**{args.dataset} was not found: these runs use the bundled `sample`.**", ""]
    results: dict[str, list[dict[str, Any]]] = {}
    for env_name in envs:
        env = table[env_name]
        print(f"== {env_name}: {env.describe(args.lr)}", flush=True)
        rows, dirs = [], []
        for rule in rules:
            run_dir = out / "runs" / f"{env_name}-{rule}"
            spec = make_spec(args, dataset, rule, env, train_size)
            rows.append(run_cell(args, run_dir, spec, f"{env_name} {rule}"))
            dirs.append(run_dir)
        results[env_name] = rows
        md += [f"## {env_name}: {env.describe(args.lr)}", ""]
        md += markdown_table(rows, args.target) + [""]
        md += [f"![{png}]({png})" for png in make_plots(out, env_name, dirs, args.target)] + [""]
    (out / "results.md").write_text("\n".join(md))
    (out / "results.json").write_text(
        json.dumps({"header": header, "dataset": dataset, "results": results}, indent=2) + "\n"
    )
    print(f"results: {out / 'results.md'}")
    failed = sum("error" in row for rows in results.values() for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
