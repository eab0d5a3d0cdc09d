"""A run file whose last line a killed process left half-written is read without it (a
note says so); any other line that is not JSON is one error naming the file and line."""

from __future__ import annotations

import json

import pytest

from minips.errors import RunDirError
from minips.results.loading import load_run
from minips.results.metrics import read_metrics
from minips.results.report import summarize
from minips.results.report_text import format_report

UPDATE = {"event": "update", "time": 0.5, "version": 1, "workers": [0], "staleness": [1]}
EVAL = {"event": "eval", "time": 1.0, "version": 1, "samples": 64, "accuracy": 0.5}


def _killed_run(tmp_path, eval_tail: str):
    (tmp_path / "config.json").write_text(json.dumps({"rule": "asgd", "workers": 1}))
    (tmp_path / "updates.jsonl").write_text(json.dumps(UPDATE) + "\n")
    (tmp_path / "eval.jsonl").write_text(json.dumps(EVAL) + "\n" + eval_tail)
    return tmp_path


def test_a_half_written_last_line_is_skipped_with_a_note(tmp_path):
    run = _killed_run(tmp_path, '{"event": "eval", "time": 2.0, "acc')  # cut: no newline
    report = summarize(load_run(run))
    assert report["summary"]["accuracy"] == 0.5 and report["evals"] == 1
    note = f"{run / 'eval.jsonl'} line 2 is half-written (a process killed mid-write?): skipped"
    assert report["notes"] == [note]
    assert f"  NOTE: {note}" in format_report(report).splitlines()
    # a cut inside a multi-byte character too
    (run / "eval.jsonl").write_bytes(json.dumps(EVAL).encode() + b'\n{"a": "\xc3')
    assert read_metrics(run / "eval.jsonl") == [EVAL]


@pytest.mark.parametrize(
    "tail, where",
    [
        ('{"event": "eval", "ti\n' + json.dumps(EVAL) + "\n", "line 2"),  # inside the file
        ('{"event": "eval", "ti\n', "line 2"),  # its newline: written whole, then damaged
        ("\xff\xfe\n" + json.dumps(EVAL) + "\n", "line 2"),
    ],
)
def test_any_other_line_that_is_not_json_is_an_error_naming_the_file_and_line(
    tmp_path, tail, where
):
    run = _killed_run(tmp_path, tail)
    with pytest.raises(RunDirError) as refused:
        load_run(run)
    assert str(refused.value).startswith(f"{run / 'eval.jsonl'} {where} is not valid JSON (")
