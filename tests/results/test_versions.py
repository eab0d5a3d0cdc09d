"""Which model a figure is of (minips/results/versions.py): a version is newer only when it
is past the other, and what a run stopped during training keeps is said in one line, also
when its checkpoint is missing or damaged."""

from __future__ import annotations

import time

from minips.results.metrics import read_metrics
from minips.results.versions import kept_after_interrupt, newer_version
from minips.run.config import RunConfig
from minips.run.final_test import ensure_final_tested
from tests.run.test_run_record import FAST, _checkpoint, _run_dir


def test_a_version_is_not_newer_than_itself():
    assert not newer_version(7, 7) and not newer_version([3, 3], (3, 3))
    assert newer_version(8, 7) and newer_version([3, 4], [3, 3])


def test_the_launcher_does_not_test_again_the_version_the_evaluator_tested(tmp_path):
    run_dir = _run_dir(tmp_path, [{"version": 7, "accuracy": 0.6}], 10)
    _checkpoint(run_dir.checkpoint, 7)  # the last checkpoint is the model already tested
    config = RunConfig(workers=1, checkpoint=str(run_dir.checkpoint), **FAST)
    assert ensure_final_tested(config, run_dir, time.monotonic()) == (
        "the last checkpoint is of version 7"
    )
    assert [r.get("by") for r in read_metrics(run_dir.eval_log)] == [None]  # no second test


def test_what_a_run_cut_short_keeps_is_one_line_whatever_its_checkpoint(tmp_path):
    kept = tmp_path / "checkpoint.npz"
    assert kept_after_interrupt(kept) == (
        f"training was cut short; no checkpoint of it is kept at {kept}"
    )
    kept.write_bytes(b"PK\x03\x04 cut short as it was written")
    assert kept_after_interrupt(kept) == (
        f"training was cut short; no checkpoint of it is kept at {kept}"
    )
    _checkpoint(kept, 12)  # 64 samples a version
    assert kept_after_interrupt(kept) == (
        f"training was cut short; the model at version 12 (768 samples) is kept in {kept}"
    )
