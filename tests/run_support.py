"""What every finished `minips run` must have left: each process exited 0, except an
evaluator that, on a machine too busy for it to test the final model before the servers
stopped, the launcher stopped (SIGTERM, then SIGKILL if it did not leave) and stood in
for: it tested the final model itself (minips/run/final_test.py) and says so in the
evaluation log. And a live run's workers, paused while a test looks at it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
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


def workers_of(run: subprocess.Popen) -> list[int]:
    """The pids of the `minips worker` processes that the run started (its children)."""
    children = Path(f"/proc/{run.pid}/task/{run.pid}/children").read_text().split()
    workers = []
    for pid in children:
        with contextlib.suppress(FileNotFoundError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            # `python -m minips worker ...` (an evaluator's `--key-name worker` is not one)
            if b"minips" in argv and argv[argv.index(b"minips") + 1 :][:1] == [b"worker"]:
                workers.append(int(pid))
    return workers


@contextlib.contextmanager
def paused(pids: list[int]):
    """The processes `pids` stopped (SIGSTOP) meanwhile, continued after."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
