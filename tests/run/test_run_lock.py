"""A run directory belongs to one live run (minips/run/runlock.py): `--force` or `minips
server` onto a live run is one `error:` line, exit 2, its files untouched; a finished or
dead run's directory is replaced as before, and a crash leaves no stale lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minips.errors import RunDirError
from minips.run.config import RunConfig
from minips.run.prepare import claim_run_dir
from minips.run.runlock import LOCK_NAME, RunLock, server_locks

HOLD = """
import sys, time
from minips.run.runlock import RunLock
lock = RunLock.{how}(sys.argv[1], "--out")
print("held", flush=True)
time.sleep(120)
"""


def _holder(directory: Path, how: str = "claim") -> subprocess.Popen:
    """A process holding `directory`'s lock (claimed or joined) until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(how=how), str(directory)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "held"
    return proc


def _a_finished_run(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    config = RunConfig(model="mlp", checkpoint=str(directory / "checkpoint.npz"))
    (directory / "config.json").write_text(config.to_json())
    (directory / "summary.json").write_text('{"ended": "finished", "accuracy": 0.81}\n')


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_force_onto_a_live_run_is_refused_and_removes_nothing(tmp_path):
    run = tmp_path / "run"
    _a_finished_run(run)
    holder = _holder(run)
    try:
        with pytest.raises(RunDirError) as refused:
            claim_run_dir(run, force=True)
        assert str(refused.value).startswith(
            f"--out {run} is in use by a live run (started as pid "
        )
        assert f"pid {holder.pid}:" in str(refused.value)
        with pytest.raises(RunDirError, match="in use by a live run"):
            claim_run_dir(run, force=False)  # said so, not "already holds files"
        assert json.loads((run / "summary.json").read_text())["accuracy"] == 0.81
    finally:
        _kill(holder)
    # Its owner died: no stale lock; --force replaces that run.
    with claim_run_dir(run, force=True):
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]
        assert (run / LOCK_NAME).read_text().startswith(f"pid {os.getpid()}: minips")


def test_force_keeps_the_checkpoint_the_new_run_resumes_from_and_removes_the_rest(tmp_path):
    """`--force --resume OUT/checkpoint.npz`: the previous run's files go, the one the new
    run starts from stays as it was, however its path is spelled."""
    run = tmp_path / "run"
    _a_finished_run(run)
    (run / "checkpoint.npz").write_bytes(b"the model to resume")
    (run / "checkpoint.prev.npz").write_bytes(b"an older one")
    (run / "checkpoint-v000030.npz").write_bytes(b"kept by --keep-checkpoints")
    (run / "checkpoint.npz12ab.tmp").write_bytes(b"a killed writer's")
    (run / "logs").mkdir()
    (run / "logs" / "server.log").write_text("old\n")
    with claim_run_dir(run, force=True, keep=run / "logs" / ".." / "checkpoint.npz"):
        left = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
        assert left == ["checkpoint.npz", LOCK_NAME]
        assert (run / "checkpoint.npz").read_bytes() == b"the model to resume"
    with claim_run_dir(run, force=True):  # nothing to keep: it goes too
        assert sorted(p.name for p in run.iterdir() if p.is_file()) == [LOCK_NAME]


def test_a_launched_server_joins_its_runs_lock_and_holds_it_past_its_launcher(tmp_path):
    run = tmp_path / "run"
    _a_finished_run(run)
    owner = _holder(run)
    try:
        launched = _holder(run, "join")  # beside its owner
    finally:
        _kill(owner)
    try:  # the owner is gone, its server still writes there: still refused
        with pytest.raises(RunDirError, match="in use by a live run"):
            claim_run_dir(run, force=True)
    finally:
        _kill(launched)
    claim_run_dir(run, force=True).release()


def test_a_new_directory_is_made_and_held(tmp_path):
    run = tmp_path / "new"
    with claim_run_dir(run, force=False):
        with pytest.raises(RunDirError, match="in use"):
            RunLock.claim(run, "--out")  # even by this process, through another file
    claim_run_dir(run, force=False).release()  # only the lock file: still an empty run dir


def test_a_server_claims_only_run_directories(tmp_path):
    run = tmp_path / "run"
    _a_finished_run(run)
    with server_locks([None, tmp_path / "elsewhere" / "ckpt.npz"], launched=False):
        assert not (tmp_path / "elsewhere").exists()
    with server_locks([run / "config.json", run / "checkpoint.npz"], launched=False):
        with pytest.raises(RunDirError, match=f"--out {run} is in use by a live run"):
            claim_run_dir(run, force=True)


def _minips(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minips", *args], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_the_cli_refuses_a_live_run_in_one_line(tmp_path):
    run = tmp_path / "run"
    _a_finished_run(run)
    holder = _holder(run)
    try:
        for argv in (["run", "--out", str(run), "--force", "--quiet"],
                     ["server", "--config", str(run / "config.json")]):  # fmt: skip
            done = _minips(*argv)
            assert done.returncode == 2, done.stderr
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
            assert "is in use by a live run" in lines[0]
        assert json.loads((run / "summary.json").read_text())["accuracy"] == 0.81
        assert sorted(p.name for p in run.iterdir()) == ["config.json", LOCK_NAME, "summary.json"]
    finally:
        _kill(holder)


@pytest.mark.slow
def test_a_second_run_onto_a_live_out_is_refused_and_the_first_ends_as_usual(tmp_path):
    """The second run must meet the first still live: on a loaded machine its own start may
    outlast a short first run, which makes that attempt say nothing; it is tried again with
    a first run ten times longer (an epoch of the synthetic set is 2,000 samples)."""
    budgets = (["--max-samples", "3000"], ["--epochs", "20"], ["--epochs", "200"])
    for attempt, budget in enumerate(budgets):
        out = tmp_path / f"run{attempt}"
        outcome = _second_run_onto(out, budget)
        if outcome is not None:
            break
    assert outcome is not None, "every first run ended before the second one started"
    second, first_code, err = outcome
    assert second.returncode == 2 and "in use by a live run" in second.stderr, second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert first_code == 0, err
    assert json.loads((out / "summary.json").read_text())["ended"] == "finished"


def _second_run_onto(out: Path, budget: list[str]):
    """Start a run into `out`, then a second with --force once the first's server listens:
    (the second's result, the first's exit code, its stderr), or None when the first had
    ended before the second was done (the lock was then rightly free)."""
    argv = [sys.executable, "-m", "minips", "run", "--model", "mlp", "--dataset", "synthetic",
            "--workers", "2", *budget, "--out", str(out), "--quiet"]  # fmt: skip
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (out / "endpoint").exists():  # its server listens: the run is under way
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.1)
        second = subprocess.run([*argv, "--force"], capture_output=True, text=True, timeout=300)
        still_live = first.poll() is None
        _, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:  # the run and every process it started
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
    if not still_live and second.returncode != 2:
        return None
    return second, first.returncode, err
