"""A results file the disk will not take (ENOSPC) ends the run in one line naming the file
and the cause, leaves no partial file, and keeps the model (said kept)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from minips.errors import RunDirError
from minips.results.metrics import MetricsLog
from minips.results.rundir import RunDir, write_results


def _finished(tmp_path) -> RunDir:
    run_dir = RunDir(tmp_path)
    stats = {"version": 5, "updates": 5, "samples": 320}
    run_dir.updates_log().write_text(
        json.dumps({"event": "server", "time": 9.0, "stats": stats}) + "\n"
    )
    record = {"event": "eval", "time": 8.0, "version": 5, "samples": 320, "accuracy": 0.7}
    run_dir.eval_log.write_text(json.dumps(record) + "\n")
    run_dir.checkpoint.write_bytes(b"the trained model")
    return run_dir


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_at_the_summary_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch):
    run_dir = _finished(tmp_path)
    real = Path.write_text

    def write_text(path, text, *args, **kwargs):
        if path.name.endswith(".partial"):
            real(path, "")  # the file is made; its bytes find no room
            _full()
        return real(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(RunDirError) as refused:
        write_results(run_dir, "asgd", 1, 10.0, {"server": 0})
    assert str(refused.value) == (
        f"cannot write {run_dir.summary}: No space left on device; the model is kept in "
        f"{run_dir.checkpoint}"
    )
    assert not list(tmp_path.glob(".*.partial")) and not run_dir.summary.exists()
    assert run_dir.checkpoint.read_bytes() == b"the trained model"


def test_a_full_disk_at_the_metrics_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch):
    run_dir = _finished(tmp_path)
    monkeypatch.setattr(MetricsLog, "write_record", _full)
    with pytest.raises(RunDirError, match=rf"cannot write {run_dir.metrics}: No space left"):
        write_results(run_dir, "asgd", 1, 10.0, {"server": 0})
    assert not list(tmp_path.glob(".*.partial")) and not run_dir.metrics.exists()
    run_dir.checkpoint.unlink()
    with pytest.raises(RunDirError, match="; no checkpoint is kept$"):
        write_results(run_dir, "asgd", 1, 10.0, {"server": 0})
