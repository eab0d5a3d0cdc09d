"""One table per environment over every run of tools/experiment.py found in some folders.

    python tools/seed_table.py --target 0.85 out-seed0 out-seed1 out-seed2 out-m0-seed0 ...

Runs are found as <folder>/runs/<env>-<rule>/ and grouped by environment and rule, whatever
folder (seed, or a run with another --momentum) they are in; each group lists accuracy per
seed, mean and range, time and samples to the target (means over the seeds that reached
it), clock staleness, the mean value staleness (vsgd's d, gap's |w - w_then| / C) and the
upload. Unlike tools/combine_seeds.py it reads the run directories themselves, so runs
made by separate invocations into separate folders combine.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from minips.results.loading import load_run
from minips.results.report import summarize

ENVS = ("homogeneous", "heterogeneous", "stale")


def _value_staleness(run_dir: Path) -> float | None:
    """Mean over applied updates and layers of the recorded value staleness (None: none)."""
    values = []
    path = run_dir / "updates.jsonl"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        record = json.loads(line)
        measured = record.get("value_staleness")
        if measured:
            values.append(statistics.mean(measured.values()))
    return statistics.mean(values) if values else None


def one_run(run_dir: Path, target: float) -> dict[str, Any]:
    report = summarize(load_run(run_dir), target=target)
    config = json.loads((run_dir / "config.json").read_text())
    summary, reached = report["summary"], report["target"]["reached"]
    return {
        "seed": config.get("seed"), "momentum": config.get("momentum"),
        "accuracy": summary.get("accuracy"), "wall_s": summary.get("wall_s"),
        "time": reached["time"] if reached else None,
        "samples": reached["samples"] if reached else None,
        "staleness": report["staleness"]["mean"], "value_staleness": _value_staleness(run_dir),
        "mb_up": (summary.get("bytes_up") or 0) / 1e6,
    }  # fmt: skip


def _mean(values: list[Any], spec: str) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    return f"{format(statistics.mean(present), spec)} ({len(present)}/{len(values)})"


def table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| rule | accuracy per seed | mean | range | time to target, mean (reached) |"
        " samples to target, mean | staleness | value staleness | MB up | wall (s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for rule, rows in runs.items():
        rows = sorted(rows, key=lambda r: r["seed"])
        acc = [r["accuracy"] for r in rows]
        vs = [r["value_staleness"] for r in rows if r["value_staleness"] is not None]
        lines.append(
            f"| {rule} | {', '.join(f'{a:.4f}' for a in acc)} | {statistics.mean(acc):.4f}"
            f" | {min(acc):.4f}-{max(acc):.4f} | {_mean([r['time'] for r in rows], '.1f')}"
            f" | {_mean([r['samples'] for r in rows], '.0f')}"
            f" | {statistics.mean(r['staleness'] or 0 for r in rows):.2f}"
            f" | {f'{statistics.mean(vs):.2f}' if vs else '-'}"
            f" | {statistics.mean(r['mb_up'] for r in rows):.0f}"
            f" | {statistics.mean(r['wall_s'] for r in rows):.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--target", type=float, default=0.85)
    args = parser.parse_args()
    for env in ENVS:
        runs: dict[str, list[dict[str, Any]]] = {}
        for folder in args.folders:
            for run_dir in sorted((folder / "runs").glob(f"{env}-*")):
                if (run_dir / "summary.json").exists():
                    rule = run_dir.name[len(env) + 1 :]
                    runs.setdefault(rule, []).append(one_run(run_dir, args.target))
        if runs:
            print(f"### {env}\n")
            print("\n".join(table(runs)) + "\n")


if __name__ == "__main__":
    main()
