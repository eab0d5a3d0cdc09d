"""The experiment grid: update rules x settings x seeds, one real local cluster per run.

Every run trains the same model on the same dataset with the same learning rate and the
same total number of samples (a global budget of E epochs over the training set: the
server stops the run when the workers together have processed that many, so fast workers
do more of the work than stragglers), so rules compare on equal work. The settings
(minips/results/experiment_settings.py): homogeneous, heterogeneous (fixed slowdowns
1,1,2,8), fluctuating, heavy-tailed, noniid-0.1, noniid-1.0 (Dirichlet label skew) and
stale (8 workers on 2 cores). The rules: every one this minips knows, unless --rules.

Output, in --out: runs/<setting>-<rule>-s<seed>/ (each a `minips run` directory),
results.md (rules x settings: final accuracy mean ± sd over the seeds; then a table per
setting: accuracy per seed, time to --target, wall, staleness), results.json (every run's
row and every cell's figures), grid.png (accuracy per setting and rule, error bars one sd)
and accuracy-<setting>.png / staleness-<setting>.png (the first seed's runs).

    python tools/experiment.py --out results --seeds 0,1,2            # the full grid (~10 h here)
    python tools/experiment.py --out results --rules asgd,dana-gap --settings noniid-0.1
    python tools/experiment.py --quick --out /tmp/grid --seeds 0,1    # mlp on synthetic

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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from minips.data import load_dataset
from minips.errors import MinipsError
from minips.provision.locations import find_data, find_dataset
from minips.results.experiment_settings import FULL, Setting, settings_table
from minips.results.experiment_table import (
    cells_of,
    overview_table,
    plot_grid,
    run_row,
    setting_table,
)
from minips.results.loading import load_run
from minips.rules import RULES
from minips.run.config import RunConfig
from minips.run.launch import run_local


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="Results folder.")
    parser.add_argument("--rules", default=",".join(RULES), help="Default: every known rule.")
    parser.add_argument("--settings", "--envs", dest="settings", default=",".join(FULL),
                        help=f"Settings to run (default all: {', '.join(FULL)}).")  # fmt: skip
    parser.add_argument("--seeds", "--seed", dest="seeds", default="0",
                        help="Comma-separated seeds, one run per seed in every cell.")  # fmt: skip
    parser.add_argument("--model", default=None, help="Default lenet5 (quick: mlp).")
    parser.add_argument("--dataset", default=None, help="Default fashion-mnist (quick: synthetic).")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument(
        "--epochs", type=int, default=None, help="Sample budget, in epochs (default 3; quick 1)."
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=None, help="Default 0.01 (quick: 0.05).")
    parser.add_argument("--momentum", type=float, default=None,
                        help="The server's momentum (default: the rule's choice).")  # fmt: skip
    parser.add_argument("--target", type=float, default=None, help="Default 0.85 (quick: 0.9).")
    parser.add_argument("--eval-interval", type=float, default=None,
                        help="Seconds between evaluations (default 4; quick: 0.5).")  # fmt: skip
    parser.add_argument("--stale-workers", type=int, default=None,
                        help="Workers of the `stale` setting (default 8; quick: 4).")  # fmt: skip
    parser.add_argument("--stale-lr-scale", type=float, default=None,
                        help="lr multiplier of `stale` (default 1; quick: 4).")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="Tiny: mlp on synthetic data.")
    parser.add_argument("--redo", action="store_true", help="Rerun finished runs too.")
    args = parser.parse_args(argv)
    defaults = {"model": ("lenet5", "mlp"), "dataset": ("fashion-mnist", "synthetic"),
                "epochs": (3, 1), "lr": (0.01, 0.05), "target": (0.85, 0.9),
                "eval_interval": (4.0, 0.5)}  # fmt: skip
    for key, (full, small) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, small if args.quick else full)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if not args.seeds or min(args.seeds) < 0:
        parser.error("--seeds: give at least one seed, each >= 0")
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
    args: argparse.Namespace, dataset: str, rule: str, setting: Setting, seed: int, train_size: int
) -> RunConfig:
    """One cell's run: a global budget of `args.epochs` passes over the training set.

    The server stops the run once the workers together processed that many samples, so a
    fast worker does more of the work than a straggler (as in a real asynchronous cluster)
    and every rule gets exactly the same amount. A worker's own epoch count is only an
    upper bound (it may need more than one pass over its shard when others are slow).
    args.momentum None leaves the server's momentum to the rule (0 under dana-gap).
    """
    return RunConfig(
        model=args.model, dataset=dataset, data_dir=args.data_dir,
        epochs=args.epochs * setting.workers, max_samples=args.epochs * train_size,
        batch_size=args.batch_size, lr=args.lr * setting.lr_scale, momentum=args.momentum,
        seed=seed, rule=rule, workers=setting.workers, hetero=list(setting.hetero),
        hetero_schedule=setting.schedule, partition=setting.partition,
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
    args: argparse.Namespace, run_dir: Path, spec: RunConfig, setting: str
) -> dict[str, Any]:
    """Run (or reuse) one run of a grid cell; return its row (read back from its files)."""
    label = f"{setting} {spec.rule} seed {spec.seed}"
    started = time.monotonic()
    if not args.redo and _same_config(run_dir, spec):
        print(f"   {label}: reusing {run_dir}")
    else:
        try:
            run_local(spec, run_dir, eval_interval=args.eval_interval)
        except MinipsError as exc:
            print(f"   {label}: FAILED: {exc}")
            return {"run": run_dir.name, "setting": setting, "rule": spec.rule,
                    "seed": spec.seed, "error": str(exc)}  # fmt: skip
    row = run_row(run_dir, setting, spec.seed, args.target)
    print(f"   {label}: accuracy {row['accuracy']:.4f}, wall {row['wall_s']:.1f} s, staleness"
          f" mean {row['staleness_mean'] or 0:.2f} max {row['staleness_max']}"
          f" ({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    return row


def make_plots(out: Path, setting: str, run_dirs: list[Path], target: float) -> list[str]:
    """accuracy-<setting>.png and staleness-<setting>.png; [] (and a note) without matplotlib."""
    from minips.results.plot import plot_accuracy, plot_staleness

    runs = [load_run(d) for d in run_dirs if (d / "metrics.jsonl").exists()]
    if not runs:
        return []
    try:
        accuracy = plot_accuracy(runs, out / f"accuracy-{setting}.png", target, setting)
        staleness = plot_staleness(runs, out / f"staleness-{setting}.png", setting)
    except MinipsError as exc:  # matplotlib missing: the tables are still worth having
        print(f"!! no plots: {exc}")
        return []
    return [accuracy.name, staleness.name]


def _grid_plot(out: Path, cells: dict[str, list[dict[str, Any]]], title: str) -> list[str]:
    try:
        return [plot_grid(cells, out / "grid.png", title).name]
    except MinipsError as exc:
        print(f"!! no grid plot: {exc}")
        return []


def header_line(args: argparse.Namespace, dataset: str, train_size: int) -> str:
    """What every run of this grid shares, the machine and the time."""
    momentum = "the rule's" if args.momentum is None else f"{args.momentum:g}"
    seeds = ",".join(map(str, args.seeds))
    return (
        f"{args.model} on {dataset} ({train_size} training samples), a budget of {args.epochs}"
        f" epoch(s) ({args.epochs * train_size} samples, shared by the workers),"
        f" batch {args.batch_size}, base lr {args.lr:g}, server momentum {momentum},"
        f" evaluation every {args.eval_interval:g} s, seeds {seeds}. {platform.machine()},"
        f" {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start,"
        f" {time.strftime('%Y-%m-%d %H:%M %Z')}."
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    table = settings_table(args.quick, args.stale_workers, args.stale_lr_scale)
    settings = [e.strip() for e in args.settings.split(",") if e.strip()]
    unknown = [e for e in settings if e not in table]
    if unknown:
        print(
            f"error: unknown setting(s) {', '.join(unknown)} (known: {', '.join(table)})",
            file=sys.stderr,
        )
        return 2
    rules = choose_rules(args.rules)
    if not rules:
        print("error: no known rule to run", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    dataset = choose_dataset(args)
    train_size = len(load_dataset(dataset, args.data_dir, find=find_data).y_train)
    header = header_line(args, dataset, train_size)
    print(header)
    md = ["# minips experiment: update rules x settings x seeds", "", header, "",
          f"Accuracy: the final test accuracy, mean ± sample standard deviation over the seeds."
          f" Time to {args.target:g}: wall time of the first evaluation at or above it (so up"
          f" to {args.eval_interval:g} s late), from the launch, process start-up included;"
          " mean over the runs that reached it. Staleness: the clock staleness of every push.",
          ""]  # fmt: skip
    if dataset != args.dataset:
        md += [f"**{args.dataset} was not found: these runs use the bundled `sample`.**", ""]
    results: dict[str, list[dict[str, Any]]] = {}
    cells: dict[str, list[dict[str, Any]]] = {}
    details: list[str] = []
    for name in settings:
        setting = table[name]
        print(f"== {name}: {setting.describe(args.lr)}", flush=True)
        rows, first_seed = [], []
        for rule in rules:
            for seed in args.seeds:
                run_dir = out / "runs" / f"{name}-{rule}-s{seed}"
                spec = make_spec(args, dataset, rule, setting, seed, train_size)
                rows.append(run_cell(args, run_dir, spec, name))
                if seed == args.seeds[0]:
                    first_seed.append(run_dir)
        results[name], cells[name] = rows, cells_of(rows)
        details += [f"## {name}: {setting.describe(args.lr)}", ""]
        details += setting_table(cells[name], args.target) + [""]
        pngs = make_plots(out, name, first_seed, args.target)
        details += [f"![{png}]({png})" for png in pngs] + [""]
    md += ["## Final accuracy, mean ± sd", ""] + overview_table(cells) + [""]
    md += [f"![{png}]({png})" for png in _grid_plot(out, cells, f"{args.model} on {dataset}")]
    (out / "results.md").write_text("\n".join(md + [""] + details))
    (out / "results.json").write_text(json.dumps(
        {"header": header, "dataset": dataset, "target": args.target, "results": results,
         "cells": cells}, indent=2) + "\n")  # fmt: skip
    print(f"results: {out / 'results.md'}")
    failed = sum("error" in row for rows in results.values() for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
