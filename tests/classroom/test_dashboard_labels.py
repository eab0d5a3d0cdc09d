"""The dashboard under --partition: each worker's examples per label, a row per worker
(the snapshot's `labels`, drawn as ten bars in the workers table)."""

import json
import os
import subprocess
import sys
import time
import urllib.request

from test_dashboard import chromium_page
from test_server_support import running_server

from minips.classroom.dashboard import run_labels
from minips.classroom.dashboard.collector import Collector
from minips.classroom.dashboard.page import PAGE
from minips.results.labels import label_histograms, training_labels
from minips.worker.client import PSClient

READ_CELLS = """JSON.stringify([...document.querySelectorAll("#workers td[data-key=labels]")]
  .map(td => ({value: td.dataset.value, text: td.textContent})))"""


def _stats(address: str) -> dict:
    with PSClient(address, timeout=30) as operator:
        return operator.stats()


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def test_run_labels_reads_the_partition_from_config_json(tmp_path):
    assert run_labels(tmp_path) is None  # no config.json
    config = {"dataset": "synthetic", "workers": 3, "seed": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert run_labels(tmp_path) is None  # iid: every shard alike
    (tmp_path / "config.json").write_text(json.dumps({**config, "partition": "dirichlet:0.5"}))
    expected = label_histograms(training_labels("synthetic"), 3, "dirichlet:0.5", 4).tolist()
    assert run_labels(tmp_path) == {"partition": "dirichlet:0.5", "histograms": expected}


def test_the_page_has_a_labels_column_shown_only_under_a_partition():
    assert '<th id="labels-head" hidden>' in PAGE
    assert 'td.dataset.key = "labels"' in PAGE


def test_a_run_dashboard_serves_each_workers_label_histogram(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--dashboard", "--dashboard-listen", "127.0.0.1:0",
         "--model", "mlp", "--dataset", "synthetic", "--epochs", "2", "--workers", "3",
         "--hetero", "6,6,6", "--partition", "shards:4", "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    try:
        first = proc.stdout.readline()
        assert first.startswith("dashboard: http://127.0.0.1:"), first + proc.stderr.read()
        url = first.split(": ", 1)[1].strip()
        snapshot = _get_json(url + "snapshot.json")
        deadline = time.monotonic() + 60
        while snapshot.get("labels") is None and time.monotonic() < deadline:
            time.sleep(0.2)
            snapshot = _get_json(url + "snapshot.json")
        with chromium_page(url) as tools:  # the table's labels cells, while the run is live
            cells = []
            while len(cells) < 3 and time.monotonic() < deadline:
                time.sleep(0.3)
                cells = json.loads(tools.evaluate(READ_CELLS) or "[]")
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    expected = label_histograms(training_labels("synthetic"), 3, "shards:4", 0)
    assert snapshot["labels"] == {"partition": "shards:4", "histograms": expected.tolist()}
    assert all((row > 0).sum() <= 4 for row in expected)
    assert [c["value"] for c in cells] == [" ".join(map(str, row)) for row in expected]
    assert all(len(c["text"]) == 10 for c in cells)
    assert all(sum(ch != " " for ch in c["text"]) <= 4 for c in cells)


def test_a_by_hand_servers_dashboard_shows_the_label_rows_from_its_stats():
    """`minips dashboard --connect` to a server started by hand: no run directory, the
    partition comes from `stats` (its `data`)."""

    config = {"model": "test", "dataset": "synthetic", "partition": "dirichlet:0.3", "seed": 5}
    with running_server(bind="tcp://127.0.0.1:*", world_size=3, config=config) as server:
        collector = Collector(server.endpoint, None)
        collector._publish(_stats(server.endpoint))
        labels = collector.snapshot()["labels"]
    expected = label_histograms(training_labels("synthetic"), 3, "dirichlet:0.3", 5)
    assert labels == {"partition": "dirichlet:0.3", "histograms": expected.tolist()}


def test_an_iid_by_hand_server_has_no_label_rows():

    with running_server(bind="tcp://127.0.0.1:*") as server:
        collector = Collector(server.endpoint, None)
        collector._publish(_stats(server.endpoint))
        assert collector.snapshot()["labels"] is None
