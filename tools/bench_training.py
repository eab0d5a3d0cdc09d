"""Distributed training against the single-process baseline, same samples processed.

For each configuration it runs `minips run` (real processes on loopback) or the
single-process trainer, on the same model, dataset, batch size, learning rate and number
of samples (E epochs in total over the training set: each of N workers does E epochs over
its 1/N shard), and prints a markdown table: final accuracy, accuracy minus the
baseline's, wall time, throughput (samples/s) and its ratio to one worker's.

    python tools/bench_training.py --dataset fashion-mnist --epochs 3
    python tools/bench_training.py --configs asgd:1,asgd:2 --epochs 1   # throughput only

A configuration is `train` (the baseline) or `RULE:WORKERS[:LR[:MOMENTUM]]`
(`asgd:4::0.8` keeps the common lr and sets momentum 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the baseline runs single-threaded too

from minips.run.config import RunConfig
from minips.run.launch import run_local  # noqa: E402
from minips.trainer import TrainConfig, train  # noqa: E402


def run_config(config: str, args: argparse.Namespace, out_root: Path) -> dict:
    """Run one configuration; return {config, accuracy, wall_s, samples}."""
    if config == "train":
        cfg = TrainConfig(
            model=args.model, dataset=args.dataset, epochs=args.epochs,
            batch_size=args.batch_size, lr=args.lr, momentum=args.momentum, seed=args.seed,
        )  # fmt: skip
        _, result = train(cfg)
        return {"config": config, "accuracy": result.accuracy, "wall_s": result.wall_s,
                "samples": result.samples, "updates": result.steps}  # fmt: skip
    rule, workers, *rest = config.split(":")
    lr = float(rest[0]) if rest and rest[0] else args.lr
    momentum = float(rest[1]) if len(rest) > 1 else args.momentum
    spec = RunConfig(
        model=args.model, dataset=args.dataset, epochs=args.epochs, batch_size=args.batch_size,
        lr=lr, momentum=momentum, seed=args.seed, rule=rule, workers=int(workers),
    )  # fmt: skip
    summary = run_local(spec, out_root / config.replace(":", "_"), eval_interval=30.0)
    return {"config": config, "accuracy": summary["accuracy"], "wall_s": summary["wall_s"],
            "samples": summary["samples"], "updates": summary["updates"],
            "staleness_mean": summary["staleness_mean"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", default="train,asgd:1,ssgd:2,asgd:2,ssgd:4,asgd:4")
    parser.add_argument("--out", default=None, help="Keep run directories here.")
    parser.add_argument("--json", default=None, help="Also write the rows as JSON here.")
    args = parser.parse_args()

    if args.out:
        report(args, Path(args.out))
        return
    with tempfile.TemporaryDirectory(prefix="minips-bench-") as runs:  # not kept
        report(args, Path(runs))


def report(args: argparse.Namespace, out_root: Path) -> None:
    """Run every configuration into `out_root` and print the table (and --json)."""
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"{args.model} on {args.dataset}, {args.epochs} epochs of samples, batch "
          f"{args.batch_size}, lr {args.lr}, momentum {args.momentum}")  # fmt: skip
    rows = []
    for config in args.configs.split(","):
        started = time.monotonic()
        row = run_config(config, args, out_root)
        row["throughput"] = row["samples"] / row["wall_s"]
        rows.append(row)
        print(f"  {config}: {row['accuracy']:.4f} in {time.monotonic() - started:.1f} s",
              flush=True)  # fmt: skip
    baseline = next((r for r in rows if r["config"] == "train"), None)
    one_worker = next((r for r in rows if r["config"].endswith(":1")), None)
    print(
        "\n| config | accuracy | vs train | wall s | samples | updates | samples/s | vs 1 worker |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        delta = f"{100 * (row['accuracy'] - baseline['accuracy']):+.2f} pt" if baseline else "-"
        speed = f"{row['throughput'] / one_worker['throughput']:.2f}x" if one_worker else "-"
        cells = [row["config"], f"{row['accuracy']:.4f}", delta, f"{row['wall_s']:.1f}",
                 row["samples"], row["updates"], f"{row['throughput']:.0f}", speed]  # fmt: skip
        print("| " + " | ".join(str(cell) for cell in cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
