"""Which workers failed (minips/run/outcome.py): one that exited non-zero by itself, not one
the launcher stopped at the run's end (its exit code is the launcher's SIGTERM). Real
processes stand in for the workers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from minips.results.rundir import RunDir
from minips.run.config import RunConfig
from minips.run.outcome import (
    crashed_workers,
    failed_workers,
    lost_workers_line,
    short_of_samples_line,
    workers_failed,
)
from minips.run.processes import ProcessGroup
from tests.run.test_run_record import FAST, _checkpoint, _Failed

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


# --- the figures a run says of what it trained (synthetic: 2000 samples an epoch) ----------


def _ended_with(tmp_path: Path, samples: int) -> RunDir:
    """A run directory whose server's last stats count `samples`."""
    run_dir = RunDir(tmp_path)
    stats = {"version": 10, "samples": samples}
    run_dir.updates_log().write_text(json.dumps({"event": "server", "stats": stats}) + "\n")
    return run_dir


def test_a_resumed_runs_failed_workers_are_judged_on_what_this_run_trained(tmp_path):
    # resumed at 50 x 64 = 3200 samples: the 4000 the server counts are 800 of this run's
    _checkpoint(tmp_path / "resume.npz", 50)
    run_dir = _ended_with(tmp_path, 4000)
    config = RunConfig(epochs=2, workers=2, resume=str(tmp_path / "resume.npz"), **FAST)
    error = workers_failed([_Failed()], run_dir, config)
    assert error is not None and str(error).startswith("every worker failed (800 samples trained)")


def test_a_restart_that_lost_updates_is_said_with_this_runs_figures(tmp_path):
    _checkpoint(tmp_path / "resume.npz", 50)  # 3200 samples before this run
    run_dir = _ended_with(tmp_path, 3800)
    config = RunConfig(epochs=2, workers=2, resume=str(tmp_path / "resume.npz"), **FAST)
    line = short_of_samples_line(run_dir, config, [{"updates_lost": 3}])
    assert line is not None and line.startswith(
        "warning: the final model trained 600 of the 4000 samples the run was to"
    )


def test_a_budget_above_the_epochs_is_not_a_shortfall(tmp_path):
    run_dir = _ended_with(tmp_path, 4000)  # every sample of the 2 epochs
    config = RunConfig(epochs=2, workers=2, max_samples=10_000, **FAST)
    assert short_of_samples_line(run_dir, config, [{"updates_lost": 3}]) is None
    short = _ended_with(tmp_path, 3000)
    assert "trained 3000 of the 4000 samples" in short_of_samples_line(
        short, config, [{"updates_lost": 3}]
    )


def test_a_crashed_worker_whose_report_says_it_was_not_finished_is_said(tmp_path):
    processes = ProcessGroup(tmp_path, dict(os.environ))
    try:
        failing = processes.start("worker.0", FAIL)
        failing.proc.wait(30)
    finally:
        processes.stop_all(grace=5)
    report = {"rank": 0, "pid": failing.proc.pid, "finished": False}
    (tmp_path / "worker-0.json").write_text(json.dumps(report))
    line = lost_workers_line([failing], RunDir(tmp_path), lambda child: "worker-0")
    assert line is not None and line.startswith("warning: worker-0 (exit code 3) stopped before")
    (tmp_path / "worker-0.json").write_text(json.dumps({**report, "finished": True}))
    assert lost_workers_line([failing], RunDir(tmp_path), lambda child: "worker-0") is None
