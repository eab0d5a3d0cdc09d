"""Evaluate a finished run at the versions its server kept, afterwards, off the clock.

    python tools/eval_versions.py RUN_DIR [--stop-at 0.85] [--remove]

A run started with `--checkpoint-every N --keep-checkpoints` leaves the model of every N-th
version in RUN_DIR/checkpoint-vVERSION.npz. Each is evaluated on the dataset's test set
(the evaluator's own `minips.trainer.evaluate`) and written to RUN_DIR/versions.jsonl as
an `eval`-like record {version, time, samples, accuracy, loss}: `time` is when the server
wrote that version (updates.jsonl, the run's clock), `samples` the samples the checkpoint
counted. Two runs of ssgd with the same seeds then test the same models at the same
versions (a round's sum is in rank order, docs/protocol.md 6.2), so their times to an
accuracy differ only by how fast each made its versions: not by when an evaluator, sharing
the cores, happened to look. `--stop-at A` stops after the first version at or above A
(the rest of the curve is not needed for a time to A); `--remove` deletes the kept files
once evaluated (each is the model with its optimizer state, ~3.4 MB for LeNet-5).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from minips.data.datasets import load_dataset
from minips.nn.zoo import build_model
from minips.ops.checkpoint_file import read_checkpoint
from minips.provision.locations import find_data
from minips.trainer import evaluate

VERSIONS_FILE = "versions.jsonl"


def kept_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(version, file) of every kept checkpoint, in version order."""
    found = []
    for path in run_dir.glob("checkpoint-v*.npz"):
        found.append((int(path.stem.rsplit("-v", 1)[1]), path))
    return sorted(found)


def version_times(run_dir: Path) -> dict[int, float]:
    """When the server wrote each version, seconds on the run's clock (updates.jsonl)."""
    times = {}
    for line in (run_dir / "updates.jsonl").read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("event") == "update" and not record.get("dropped"):
            times[record["version"]] = record["time"]
    return times


def read_versions(run_dir: Path) -> list[dict[str, Any]]:
    """The records `evaluate_versions` wrote to RUN_DIR/versions.jsonl ([]: none)."""
    path = run_dir / VERSIONS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def evaluate_versions(
    run_dir: Path, stop_at: float | None = None, remove: bool = False
) -> list[dict[str, Any]]:
    """The records of RUN_DIR's kept checkpoints (module docstring), also written to
    RUN_DIR/versions.jsonl."""
    config = json.loads((run_dir / "config.json").read_text())
    data = load_dataset(config["dataset"], config.get("data_dir"), find=find_data)
    model = build_model(config["model"], seed=0)
    times = version_times(run_dir)
    records = []
    for version, path in kept_checkpoints(run_dir):
        arrays = read_checkpoint(path)
        params = {k.removeprefix("param/"): v for k, v in arrays.items() if k.startswith("param/")}
        model.set_params(params, strict=True)
        accuracy, loss = evaluate(model, data.x_test, data.y_test)
        meta = json.loads(str(arrays["meta"]))
        record = {"event": "eval", "version": version, "time": times.get(version)}
        records.append({**record, "samples": meta["samples"], "accuracy": accuracy, "loss": loss})
        if stop_at is not None and accuracy >= stop_at:
            break
    (run_dir / VERSIONS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    if remove:
        for _, path in kept_checkpoints(run_dir):
            path.unlink()
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--stop-at", type=float, help="stop after the first version at >= this")
    parser.add_argument("--remove", action="store_true", help="delete the kept files afterwards")
    args = parser.parse_args(argv)
    for record in evaluate_versions(args.run_dir, args.stop_at, args.remove):
        print(f"v{record['version']:>6}  {record['time']:8.2f} s  {record['samples']:>7} samples"
              f"  accuracy {record['accuracy']:.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
