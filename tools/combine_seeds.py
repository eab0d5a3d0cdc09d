"""Combine the results.json of several experiment runs (other seeds) into one table.

    python tools/combine_seeds.py results-seed0 results-seed1 results-seed2

For each environment and rule present in every folder: accuracy per seed, its mean and
range, and the mean time to the target (over the seeds that reached it).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def combine(folders: list[Path]) -> str:
    """The markdown table over all `folders` (each holding an experiment's results.json)."""
    loaded = [json.loads((folder / "results.json").read_text()) for folder in folders]
    lines = []
    for env in loaded[0]["results"]:
        rows: dict[str, list[dict]] = {}
        for result in loaded:
            for row in result["results"].get(env, []):
                if "error" not in row:  # a failed cell has no figures; the rule drops out
                    rows.setdefault(row["rule"], []).append(row)
        lines += [
            f"### {env}",
            "",
            "| rule | accuracy per seed | mean | range | time to target, mean (reached) |"
            " staleness mean |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for rule, runs in rows.items():
            if len(runs) != len(loaded):
                continue  # not run with every seed: no fair mean
            accuracies = [run["accuracy"] for run in runs]
            times = [run["time_to_target"] for run in runs if run["time_to_target"] is not None]
            reached = f"{statistics.mean(times):.1f} s ({len(times)}/{len(runs)})" if times else "-"
            spread = f"{min(accuracies):.4f}-{max(accuracies):.4f}"
            stale = statistics.mean(run["staleness_mean"] for run in runs)
            per_seed = ", ".join(f"{a:.4f}" for a in accuracies)
            lines.append(
                f"| {rule} | {per_seed} | {statistics.mean(accuracies):.4f} | {spread} |"
                f" {reached} | {stale:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(combine([Path(arg) for arg in sys.argv[1:]]))
