"""Ctrl-C (SIGINT) or SIGTERM to `minips run` once training is over, while the run wraps up
(the server stopping, the final test, the results written): the wrap-up is cut short, not
the run (minips/run/wrapup.py). Its model and summary.json are kept, the summary says
`"interrupted"`, one `warning:` line says so, and the exit status is still 130. Real
processes: the evaluator is paused (SIGSTOP) before the run's sample budget is spent, so
the server waits for it and the launcher is in its wrap-up when the signal comes."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minips.worker.client import PSClient

pytestmark = pytest.mark.slow
FAST = ["--model", "mlp", "--dataset", "synthetic", "--eval-interval", "0.5", "--quiet"]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _evaluator(run: subprocess.Popen) -> int:
    for pid in Path(f"/proc/{run.pid}/task/{run.pid}/children").read_text().split():
        with contextlib.suppress(FileNotFoundError):
            if b"evaluate" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                return int(pid)
    raise AssertionError("no evaluator among the run's children")


def _stopping(endpoint: str) -> bool:
    try:
        with PSClient(endpoint, timeout=2, retries=0) as client:
            return bool(client.stats().get("stopping"))
    except Exception:  # exiting: it stopped
        return True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_wrap_up_keeps_the_model_and_the_summary(tmp_path, signum):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), *FAST]
    argv += ["--workers", "2", "--epochs", "50", "--max-samples", "12000", "--rule", "asgd"]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    evaluator = None
    try:
        _wait(
            lambda: (out / "eval.jsonl").exists() and (out / "eval.jsonl").read_text().strip(),
            60,
            "the evaluator",
        )
        evaluator = _evaluator(run)
        os.kill(evaluator, signal.SIGSTOP)  # the server waits for it when stopping
        endpoint = (out / "endpoint").read_text().strip()
        _wait(lambda: _stopping(endpoint), 120, "the sample budget to be spent")
        time.sleep(2.0)  # the launcher saw it too (it asks every 0.2 s; the server waits 5 s)
        os.kill(run.pid, signum)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
        if evaluator is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(evaluator, signal.SIGKILL)
    assert run.returncode == 130, stderr[-1500:]
    assert "Traceback" not in stderr and "aborted" not in stderr, stderr[-1500:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "during the wrap-up, once training was over"
    assert summary["samples"] >= 12000 and summary["accuracy"] is not None
    assert summary["ended"] == "finished_untested_final", summary  # the evaluator was paused
    assert "interrupted" in summary["untested_why"]
    assert (out / "checkpoint.npz").exists()
    assert (
        "warning: the run was interrupted during the wrap-up, once training was over" in stderr
    ), stderr[-1500:]
    assert f"{summary['samples']} samples" in stdout  # its usual lines too


def test_the_report_of_a_run_interrupted_while_training_gives_the_samples_trained(tmp_path):
    """No summary: `minips report` reads the partial logs. Its samples are the server's
    last count (its `stats` written as it stopped), not the last evaluation's, which lags."""
    from minips.results.loading import load_run
    from minips.results.metrics import read_metrics
    from minips.results.report import summarize

    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), *FAST]
    argv += ["--workers", "2", "--epochs", "300", "--rule", "asgd"]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        _wait(
            lambda: (out / "eval.jsonl").exists() and len(read_metrics(out / "eval.jsonl")) >= 3,
            120,
            "a few evaluations",
        )
        os.kill(run.pid, signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
    assert run.returncode == 130 and not (out / "summary.json").exists(), stderr[-1500:]
    server = [r for r in read_metrics(out / "updates.jsonl") if r.get("event") == "server"]
    trained = server[-1]["stats"]["samples"]
    last_eval = read_metrics(out / "eval.jsonl")[-1]["samples"]
    report = summarize(load_run(out))
    assert report["summary"]["samples"] == trained >= last_eval
    assert "samples_from" not in report["summary"]
