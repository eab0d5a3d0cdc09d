"""A run's samples and updates in summary.json come from the best source there is: the
server's last stats, else (a server that died and was not brought back left none) the last
evaluation's counts, said to lag; never 0 samples beside a nonzero update count."""

from __future__ import annotations

import json

from minips.results.loading import load_run
from minips.results.report import summarize
from minips.results.report_text import format_report
from minips.results.rundir import LAST_EVALUATION, RunDir, run_counts, write_results


def _server_died(tmp_path) -> RunDir:
    """A run whose server died mid-run: update records and no final stats, the evaluator's
    records, and a worker's report of the samples it had trained when the server failed
    it (none: it reports 0)."""
    run_dir = RunDir(tmp_path)
    update = {"event": "update", "time": 1.0, "version": 1, "workers": [0], "staleness": [0]}
    run_dir.updates_log().write_text(json.dumps(update) + "\n")
    counts = [(300, 19000), (608, 38884)]
    evals = [{"event": "eval", "time": 2.0 + i, "version": v, "samples": n, "updates": v,
              "accuracy": 0.8, "loss": 0.5} for i, (v, n) in enumerate(counts)]  # fmt: skip
    run_dir.eval_log.write_text("".join(json.dumps(r) + "\n" for r in evals))
    run_dir.worker_report(0).write_text(json.dumps({"rank": 0, "samples": 0, "steps": 0}))
    (tmp_path / "config.json").write_text(json.dumps({"rule": "asgd", "workers": 1}))
    return run_dir


def test_a_run_whose_server_died_counts_the_last_evaluations_samples_and_says_so(tmp_path):
    run_dir = _server_died(tmp_path)
    summary = write_results(run_dir, "asgd", 1, 10.0, {"server": -9},
                            ended="error: the server stopped answering")  # fmt: skip
    assert (summary["samples"], summary["updates"]) == (38884, 608)
    assert summary["samples_from"] == LAST_EVALUATION
    assert json.loads(run_dir.summary.read_text())["samples"] == 38884
    text = format_report(summarize(load_run(tmp_path)))
    assert "samples 38884 (" in text
    assert "(the last evaluation's count; the server left none)  updates 608" in text


def test_the_servers_count_is_the_runs_when_it_left_one():
    stats = {"samples": 40000, "updates": 610}
    assert run_counts(stats, {"samples": 38884, "updates": 608}, []) == stats
    reports = [{"samples": 300}, {"samples": 200}]
    assert run_counts({}, {}, reports) == {"samples": 500, "updates": None}  # nothing else
