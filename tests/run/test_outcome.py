"""Which workers failed (minips/run/outcome.py): one that exited non-zero by itself, not one
the launcher stopped at the run's end (its exit code is the launcher's SIGTERM). Real
processes stand in for the workers."""

from __future__ import annotations

import os
import sys

from minips.run.outcome import crashed_workers, failed_workers
from minips.run.processes import ProcessGroup

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
FAIL = [sys.executable, "-c", "raise SystemExit(3)"]


def test_workers_the_launcher_stopped_did_not_fail(tmp_path):
    processes = ProcessGroup(tmp_path, dict(os.environ))
    try:
        for name in ("worker.0", "worker.1"):
            processes.start(name, SLEEP)
    finally:
        processes.stop_all(grace=5)
    assert [child.code() for child in processes.children.values()] == [-15, -15]
    assert crashed_workers(processes) == [] and failed_workers(processes) == []


def test_a_worker_that_exited_non_zero_by_itself_failed(tmp_path):
    processes = ProcessGroup(tmp_path, dict(os.environ))
    try:
        failing = processes.start("worker.0", FAIL)
        failing.proc.wait(30)
        processes.start("worker.1", SLEEP)
        assert crashed_workers(processes) == [failing]
        assert failed_workers(processes) == []  # one still trains
    finally:
        processes.stop_all(grace=5)
    assert crashed_workers(processes) == [failing]  # the stop did not make it the launcher's
    assert failed_workers(processes) == []
