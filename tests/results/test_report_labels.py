"""`minips report` under --partition: each worker's examples per label, a row per worker,
the very shards the workers trained on (docs/model.md 4.2)."""

from __future__ import annotations

import json
import subprocess
import sys

from minips.results.labels import label_histograms, training_labels
from minips.results.report_labels import label_lines, label_summary


def _minips(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minips", *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_the_report_shows_the_label_histogram_each_worker_trained_on(tmp_path):
    out = tmp_path / "run"
    done = _minips("run", "--model", "mlp", "--dataset", "synthetic", "--workers", "4",
                   "--partition", "shards:3", "--seed", "2", "--epochs", "1",
                   "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = label_histograms(training_labels("synthetic"), 4, "shards:3", 2)
    report = json.loads(_minips("report", "--json", str(out)).stdout)[0]
    assert report["labels"] == {"partition": "shards:3", "histograms": expected.tolist()}
    assert "shards:3" in report["label"]
    for rank, row in enumerate(expected):  # one epoch: each worker's samples are its shard
        assert report["workers"][str(rank)]["samples"] == row.sum()
    text = _minips("report", str(out)).stdout
    assert "  examples per label (--partition shards:3):\n" in text, text
    lines = text.splitlines()
    at = lines.index("  examples per label (--partition shards:3):")
    for rank, row in enumerate(expected):
        cells = lines[at + 2 + rank].split()
        assert cells == [str(rank), *map(str, row), str((row > 0).sum())]
        assert int(cells[-1]) <= 3


def test_an_iid_run_has_no_label_section_and_a_missing_dataset_says_why(tmp_path):
    assert label_summary({"dataset": "sample", "workers": 2}) is None
    assert label_summary({"dataset": "sample", "workers": 2, "partition": "iid"}) is None
    assert label_lines({}) == []
    missing = label_summary({"dataset": "mnist", "data_dir": str(tmp_path), "workers": 2,
                             "partition": "dirichlet:1"})  # fmt: skip
    assert missing["histograms"] is None
    (line,) = label_lines({"labels": missing})
    assert line.startswith("  examples per label (--partition dirichlet:1): not computed here:")
