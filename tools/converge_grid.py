"""Does a run's configuration converge? Repeated `minips run`s per seed, and their table.

Each *cell* is a name and the `minips run` options it adds; each run of it is
`flock LOCK minips run OPTIONS --seed S --out OUT/NAME/seedS` (one run per hold of the
machine-wide lock, so other people's measurements and ours do not overlap), with the load
average at its start written beside it (load.txt). A run whose summary.json exists is
reused, so an interrupted grid resumes. A run that ended at or below --chance (default
0.2: ten classes, chance 0.1) is counted as collapsed.

    python tools/converge_grid.py run --out DIR --name asgd-4w --seeds 0-5 -- \\
        --workers 4 --dataset fashion-mnist --max-samples 60000 --rule asgd
    python tools/converge_grid.py table DIR/asgd-4w DIR/ssgd-4w ...   # markdown rows

The table gives per cell: each seed's final accuracy, mean, min, how many ended at or
below --chance, mean wall time, mean CPU seconds of all the run's processes (cpu-S.txt,
for the runs that recorded it: how many in brackets), mean clock staleness, and the load
averages seen at the runs' starts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

LOCK = "/work/locks/cpu"


def parse_seeds(text: str) -> list[int]:
    """'0-5' -> [0..5]; '0,3,7' -> [0, 3, 7]."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def run_cell(out: Path, name: str, seeds: list[int], options: list[str], lock: str) -> None:
    """Run `minips run OPTIONS --seed S` for every seed not yet done, one lock hold each."""
    cell = out / name
    cell.mkdir(parents=True, exist_ok=True)
    (cell / "options.txt").write_text(shlex.join(options) + "\n")
    for seed in seeds:
        run_dir = cell / f"seed{seed}"
        if (run_dir / "summary.json").exists():
            continue
        command = ["minips", "run", *options, "--seed", str(seed), "--out", str(run_dir)]
        # The load average as the lock is taken, beside the run: load-<seed>.txt
        note_load = 'cat /proc/loadavg > "$0/../load-$1.txt"; shift; exec "$@"'
        held = ["flock", lock, "sh", "-c", note_load, str(run_dir), str(seed), *command]
        run_dir.mkdir(parents=True, exist_ok=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(cell / f"log-{seed}.txt", "w") as log:
            status = subprocess.call(held, stdout=log, stderr=subprocess.STDOUT)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU seconds of every process of the run (each waits for its children): what the
        # run cost, much less dependent on other people's load than its wall time
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        (cell / f"cpu-{seed}.txt").write_text(f"{cpu:.2f}\n")
        load = (cell / f"load-{seed}.txt").read_text().split()[:3]
        summary = _summary(run_dir)
        print(
            f"{name} seed {seed}: exit {status}, accuracy {summary.get('accuracy')}, "
            f"wall {summary.get('wall_s')} s, load {' '.join(load)}",
            flush=True,
        )


def _summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def cell_row(cell: Path, chance: float) -> dict[str, Any]:
    """The figures of one cell's finished runs."""
    runs = sorted(cell.glob("seed*"), key=lambda p: int(p.name[4:]))
    accs, walls, stale, loads, seeds, cpus = [], [], [], [], [], []
    for run_dir in runs:
        summary = _summary(run_dir)
        if summary.get("accuracy") is None:
            continue
        seeds.append(int(run_dir.name[4:]))
        accs.append(summary["accuracy"])
        walls.append(summary.get("wall_s") or 0.0)
        stale.append(summary.get("staleness_mean") or 0.0)
        load_file = cell / f"load-{seeds[-1]}.txt"
        if load_file.exists():
            loads.append(float(load_file.read_text().split()[0]))
        if (cpu_file := cell / f"cpu-{seeds[-1]}.txt").exists():
            cpus.append(float(cpu_file.read_text()))
    options = (cell / "options.txt").read_text().strip() if (cell / "options.txt").exists() else ""
    return {
        "name": cell.name, "options": options, "seeds": seeds, "accuracy": accs,
        "mean": statistics.mean(accs) if accs else None, "min": min(accs, default=None),
        "collapsed": sum(a <= chance for a in accs),
        "wall": statistics.mean(walls) if walls else None,
        "staleness": statistics.mean(stale) if stale else None,
        "load": (min(loads), max(loads)) if loads else None,
        "cpu": statistics.mean(cpus) if cpus else None, "cpu_runs": len(cpus),
    }  # fmt: skip


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| cell | accuracy per seed | mean | min | <= chance | wall (s) | CPU (s) | staleness "
        "| load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if not row["accuracy"]:
            continue
        per_seed = ", ".join(f"{a:.4f}" for a in row["accuracy"])
        load = f"{row['load'][0]:.1f}-{row['load'][1]:.1f}" if row["load"] else "-"
        cpu = f"{row['cpu']:.1f} ({row['cpu_runs']})" if row["cpu"] is not None else "-"
        lines.append(
            f"| {row['name']} | {per_seed} | {row['mean']:.4f} | {row['min']:.4f} | "
            f"{row['collapsed']}/{len(row['accuracy'])} | {row['wall']:.1f} | {cpu} | "
            f"{row['staleness']:.2f} | {load} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one cell's seeds")
    run.add_argument("--out", required=True, type=Path)
    run.add_argument("--name", required=True)
    run.add_argument("--seeds", default="0-2", type=parse_seeds)
    run.add_argument("--lock", default=os.environ.get("MINIPS_LOCK", LOCK))
    run.add_argument("options", nargs=argparse.REMAINDER, help="-- then minips run options")
    table = commands.add_parser("table", help="markdown rows of finished cells")
    table.add_argument("cells", nargs="+", type=Path)
    table.add_argument("--chance", type=float, default=0.2)
    table.add_argument("--json", action="store_true", help="JSON instead of markdown")
    args = parser.parse_args(argv)
    if args.command == "run":
        options = args.options[1:] if args.options[:1] == ["--"] else args.options
        run_cell(args.out, args.name, args.seeds, options, args.lock)
        return 0
    rows = [cell_row(cell, args.chance) for cell in args.cells]
    print(json.dumps(rows, indent=2) if args.json else markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
