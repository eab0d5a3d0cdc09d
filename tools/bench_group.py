"""Server groups behind shaped links: training samples/s with 1, 2, 4 shards, each shard in
its own network namespace behind its own tc-shaped link (`minips run --servers K --netem
RATE`: the links add up). Root only (ip netns, tc).

    sudo python tools/bench_group.py [--servers 1,2,4] [--rate 100mbit] [--rounds 3] \\
        [--workers 4] [--rule ssgd] [--samples 10240] [--lock /work/locks/cpu]

Each run is a real `minips run` (dense LeNet-5 on the bundled sample, `--workers` workers,
`--rule`); the figure is its steady training rate, from the root's update records: the
samples of the updates after the first `--skip` (start-up: processes starting, the
evaluator's first test) over the time they took (each ssgd update is one round: every
worker's batch). The sizes are run in turn, `--rounds` times (so load drift hits all of
them alike); medians and ratios to one shard are printed. With `--lock FILE` every run holds
`flock FILE` while it runs (a machine shared with others: one measurement at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def steady_rate(out: Path, batch: int, workers: int, skip: int, rule: str) -> float:
    """Samples/s of the run in `out` after its first `skip` updates (root's records)."""
    updates = [json.loads(line) for line in (out / "updates.jsonl").read_text().splitlines()]
    times = [r["time"] for r in updates if r.get("event") == "update"]
    if len(times) <= skip + 1:
        raise SystemExit(f"{out}: only {len(times)} updates; raise --samples")
    per_update = batch * (workers if rule == "ssgd" else 1)
    return (len(times) - 1 - skip) * per_update / (times[-1] - times[skip])


def one_run(servers: int, args: argparse.Namespace, out: Path) -> float:
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--force", "--quiet",
            "--servers", str(servers), "--netem", args.rate, "--workers", str(args.workers),
            "--rule", args.rule, "--max-samples", str(args.samples), "--epochs", "100",
            "--eval-interval", "600", "--checkpoint-interval", "0"]  # fmt: skip
    if args.lock:
        argv = ["flock", args.lock, *argv]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"minips run --servers {servers} failed: {done.stderr.strip()[-500:]}")
    return steady_rate(out, 64, args.workers, args.skip, args.rule)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="1,2,4")
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rule", default="ssgd")
    parser.add_argument("--samples", type=int, default=10240)
    parser.add_argument("--skip", type=int, default=3, help="start-up updates left out")
    parser.add_argument("--lock", help="run each `minips run` under `flock LOCK`")
    args = parser.parse_args()
    sizes = [int(k) for k in args.servers.split(",")]
    os.environ.setdefault("MINIPS_NETEM_NAME", "group")  # this tool's links: group-ps-*
    rates: dict[int, list[float]] = {k: [] for k in sizes}
    with tempfile.TemporaryDirectory(prefix="minips-group-") as tmp:
        for round_ in range(args.rounds):
            for k in sizes:
                load = os.getloadavg()[0]
                rate = one_run(k, args, Path(tmp) / f"k{k}")
                rates[k].append(rate)
                print(f"round {round_ + 1}, {k} shard(s): {rate:7.1f} samples/s "
                      f"(load before {load:.2f})", flush=True)  # fmt: skip
    base = statistics.median(rates[sizes[0]])
    print(f"\n{args.workers} {args.rule} workers, dense lenet5, each shard behind {args.rate}")
    print("| shards | samples/s (median) | runs | ratio to 1 |")
    print("| --- | --- | --- | --- |")
    for k in sizes:
        median = statistics.median(rates[k])
        runs = ", ".join(f"{r:.0f}" for r in rates[k])
        print(f"| {k} | {median:.0f} | {runs} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
