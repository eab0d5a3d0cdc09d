"""What every finished `minips run` must have left: each process exited 0, except an
evaluator that, on a machine too busy for it to test the final model before the servers
stopped, the launcher stopped (SIGTERM, then SIGKILL if it did not leave) and stood in
for: it tested the final model itself (minips/run/final_test.py) and says so in the
evaluation log."""

from __future__ import annotations

import signal
from pathlib import Path

from minips.results.metrics import read_metrics


def assert_clean_exits(summary: dict, run_dir: Path) -> None:
    """Every exit code in `summary` is 0, the evaluator's stop by a signal aside when the
    last record of run_dir/eval.jsonl is the launcher's test of the final model."""
    codes = dict(summary["exit_codes"])
    if codes.get("evaluator") in (-signal.SIGTERM, -signal.SIGKILL):
        last = read_metrics(run_dir / "eval.jsonl")[-1]
        assert last.get("by") == "launcher" and last.get("final"), last
        codes["evaluator"] = 0
    assert set(codes.values()) == {0}, summary["exit_codes"]
