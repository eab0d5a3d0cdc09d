"""`minips report` says when the accuracy it shows is not of the model the run directory
keeps (its checkpoint.npz): an interrupted run whose server wrote a later checkpoint than
its last evaluation saw, a finished run whose checkpoint a server started later replaced;
in the text (NOT THE FINAL MODEL) and in the JSON (final_version, final_tested)."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from minips.cli import cli
from minips.results.loading import load_run
from minips.results.report import summarize
from minips.results.report_text import format_report
from minips.results.versions import kept_fields


def _eval(version: int, accuracy: float, samples: int) -> dict:
    return {"event": "eval", "time": 0.1 * version + 1, "version": version, "samples": samples,
            "updates": version, "accuracy": accuracy, "loss": 1.0}  # fmt: skip


def _interrupted_run(path, kept: int | None):
    """A run whose launcher was killed: its logs, no summary, a checkpoint at `kept`."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"rule": "asgd", "workers": 1, "servers": 1}))
    update = {"event": "update", "time": 0.5, "version": 1, "workers": [0], "staleness": [0]}
    (path / "updates.jsonl").write_text(json.dumps(update) + "\n")
    (path / "eval.jsonl").write_text(json.dumps(_eval(0, 0.104, 0)) + "\n")
    if kept is not None:  # only its version is read
        np.savez(path / "checkpoint.npz", version=np.array(kept, dtype=np.int64))
    return path


def test_an_interrupted_run_whose_kept_model_is_later_than_its_accuracy_says_so(tmp_path):
    run = _interrupted_run(tmp_path / "killed", kept=258)
    report = summarize(load_run(run))
    s = report["summary"]
    assert (s["accuracy_version"], s["final_version"], s["final_tested"]) == (0, 258, False)
    text = format_report(report)
    assert (
        "  NOT THE FINAL MODEL: the final model (version 258) was not tested (the run ended "
        "before testing the model it keeps): the accuracy 0.1040 is of version 0"
    ) in text.splitlines()
    printed = json.loads(CliRunner().invoke(cli, ["report", str(run), "--json"]).output)
    assert printed[0]["summary"]["final_version"] == 258
    assert printed[0]["summary"]["final_tested"] is False


def test_an_interrupted_run_whose_last_evaluation_saw_its_kept_model_is_not_warned(tmp_path):
    run = _interrupted_run(tmp_path / "killed", kept=0)
    s = summarize(load_run(run))["summary"]
    assert s["final_version"] == 0 and s["final_tested"] is True
    assert "NOT THE FINAL MODEL" not in format_report(summarize(load_run(run)))
    run = _interrupted_run(tmp_path / "nothing-kept", kept=None)
    assert "final_version" not in summarize(load_run(run))["summary"]


def test_a_finished_runs_checkpoint_replaced_later_is_said_not_its_accuracys(tmp_path):
    run = _interrupted_run(tmp_path / "continued", kept=1465)
    summary = {"ended": "finished", "accuracy": 0.843, "accuracy_version": 1121,
               "final_version": 1121, "final_tested": True, "untested_why": None}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    text = format_report(summarize(load_run(run)))
    assert (
        "  NOT THE FINAL MODEL: the final model (version 1465) was not tested (its checkpoint "
        "was replaced after the run ended at version 1121): the accuracy 0.8430 is of "
        "version 1121"
    ) in text.splitlines()
    np.savez(run / "checkpoint.npz", version=np.array(1121, dtype=np.int64))  # as it ended
    assert "NOT THE FINAL MODEL" not in format_report(summarize(load_run(run)))


def test_kept_fields_agree_with_a_summary_that_already_says_it():
    untested = {"accuracy_version": 5, "final_version": 9, "final_tested": False}
    assert kept_fields(untested, 9) == {} and kept_fields(untested, None) == {}
