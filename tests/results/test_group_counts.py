"""A server group's summary counts what its kept model trained (minips/results/group_counts.py):
a shard a restart left behind makes the run's samples and updates its own, the fewest,
and the summary, the run's warning and `minips report` say which shard is behind and by
how much; without a restart the root's counts are the run's, as before."""

from __future__ import annotations

import json
from pathlib import Path

from minips.results.group_counts import behind_line, kept_counts
from minips.results.loading import load_run
from minips.results.report import summarize
from minips.results.report_text import format_report
from minips.results.rundir import RunDir, write_results
from minips.run.config import RunConfig
from minips.run.outcome import short_of_samples_line

ROOT = {"version": 688, "updates": 688, "samples": 44000}
BEHIND = {"version": 673, "updates": 673, "samples": 43040}
RESTART = [{"shard": 1, "updates_lost": 13}]


def _group_dir(tmp_path: Path, shard1: dict) -> RunDir:
    """A group's run directory: the root's and shard 1's last stats, one evaluation."""
    run_dir = RunDir(tmp_path)
    for shard, stats in ((0, ROOT), (1, shard1)):
        record = {"event": "server", "time": 9.0, "stats": stats}
        run_dir.updates_log(0, shard).write_text(json.dumps(record) + "\n")
    evaluation = {"event": "eval", "time": 9.5, "version": [688, 673], "accuracy": 0.85}
    run_dir.eval_log.write_text(json.dumps(evaluation) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"rule": "asgd", "workers": 2}))
    return run_dir


def test_a_shard_left_behind_by_its_restart_makes_the_runs_counts_its_own(tmp_path):
    run_dir = _group_dir(tmp_path, BEHIND)
    summary = write_results(run_dir, "asgd", 2, 10.0, {"server": 0}, restarts=RESTART,
                            servers=2)  # fmt: skip
    assert (summary["samples"], summary["updates"]) == (43040, 673)  # before: the root's
    assert summary["behind"] == {"shard": 1, "of": 0, "samples": 960, "updates": 15}
    assert [row["samples"] for row in summary["shards"]] == [44000, 43040]
    line = ("shard 1 is 960 samples and 15 updates behind shard 0 (a restart lost them): the "
            "run's samples and updates are the fewest, which every slice of the kept model "
            "trained")  # fmt: skip
    assert behind_line(summary["behind"]) == line
    text = format_report(summarize(load_run(tmp_path)))
    assert "samples 43040" in text and "updates 673" in text and f"  {line}" in text


def test_the_runs_warning_names_the_shard_behind(tmp_path):
    run_dir = _group_dir(tmp_path, BEHIND)
    config = RunConfig(servers=2, epochs=22, dataset="synthetic", model="mlp")  # 2000 a pass
    assert short_of_samples_line(run_dir, config, RESTART) == (
        "warning: the final model trained 43040 of the 44000 samples the run was to: shard 1 "
        "is 960 samples and 15 updates behind shard 0 (a restart lost them): the run's "
        "samples and updates are the fewest, which every slice of the kept model trained"
    )
    assert short_of_samples_line(_group_dir(tmp_path, ROOT), config, RESTART) is None


def test_without_a_restart_the_roots_counts_are_the_runs(tmp_path):
    """A plan may push a shard's parameters less often: it counts fewer pushes, not fewer
    samples in its slices, so a calm run keeps the root's counts."""
    run_dir = _group_dir(tmp_path, BEHIND)
    summary = write_results(run_dir, "asgd", 2, 10.0, {"server": 0}, servers=2)
    assert (summary["samples"], summary["updates"], summary["behind"]) == (44000, 688, None)
    assert "behind shard" not in format_report(summarize(load_run(tmp_path)))


def test_kept_counts_at_the_edges():
    assert kept_counts([ROOT], RESTART) == {"samples": 44000, "updates": 688, "behind": None}
    assert kept_counts([ROOT, ROOT], RESTART)["behind"] is None  # a rollback: one version
    assert kept_counts([ROOT, {}], RESTART)["samples"] == 44000  # a shard's stats unknown
    ahead = kept_counts([BEHIND, ROOT], RESTART)  # the root restarted: it is behind
    assert ahead["behind"] == {"shard": 0, "of": 1, "samples": 960, "updates": 15}
    assert behind_line(None) is None
