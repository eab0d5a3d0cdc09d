"""Exercise staleness-experiment (about 45 minutes, most of it waiting and thinking).

Goal: see asynchrony. Under asgd every push is applied at once; while one worker computes,
the others push, so its gradient arrives `tau = t - base` versions late. Measure the mean
and max of tau for 1, 2 and 4 workers (equal speeds), write them to staleness.csv, check
the table, then answer the questions in staleness_experiment.md.

    python staleness_experiment.py           # runs `minips run` 3 times, about a minute
    minips exercise check staleness-experiment --file staleness.csv
"""

import csv
import json
import subprocess
import sys
from pathlib import Path

WORKER_COUNTS = [1, 2, 4]


def measure(workers: int, out: Path) -> dict[str, float]:
    """Run asgd with `workers` workers; return {"staleness_mean": ..., "staleness_max": ...}."""
    command = [
        sys.executable, "-m", "minips", "run", "--workers", str(workers), "--rule", "asgd",
        "--model", "mlp", "--max-samples", "6000", "--out", str(out),
    ]  # fmt: skip
    subprocess.run(command, check=True)
    summary = json.loads((out / "summary.json").read_text())
    # TODO: return the two numbers this run measured (look at what summary.json holds)
    raise NotImplementedError(f"read staleness_mean and staleness_max from {sorted(summary)}")


def main() -> None:
    rows = []
    for workers in WORKER_COUNTS:
        row = measure(workers, Path("runs") / f"staleness-{workers}")
        rows.append({"workers": workers, **row})
        print(rows[-1])
    with open("staleness.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["workers", "staleness_mean", "staleness_max"])
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
