"""Browser workers under --partition: the gateway serves each rank the shard the partition
gives it (docs/model.md 4.2, protocol.md 14.1), and a browser in a real run trains exactly
that shard, having checked it against the one its own partition.js computes."""

import json
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from test_server_support import running_server
from test_web_support import quiet_env, require_browser

from minips.data import load_dataset, normalize, parse_idx
from minips.results.labels import label_histograms, training_labels
from minips.results.loading import load_run

pytest.importorskip("websockets", reason="websockets not installed: pip install '.[web]'")
from minips.classroom.web import start_gateway  # noqa: E402


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_gateway_serves_the_partitions_shards():
    data = load_dataset("synthetic")
    with running_server() as server, start_gateway(server.endpoint) as gateway:
        for partition in ("dirichlet:0.3", "shards:3"):
            sizes = []
            for rank in range(4):
                url = f"{gateway.url}data/synthetic/train/{rank}/4/{partition}/7"
                images = parse_idx(_get(url + "/images")[1])
                labels = parse_idx(_get(url + "/labels")[1])
                expected = data.shard(rank, 4, partition, 7)
                np.testing.assert_array_equal(normalize(images, "synthetic"), expected.x_train)
                np.testing.assert_array_equal(labels, expected.y_train)
                sizes.append(len(labels))
            assert sum(sizes) == 2000
        status, body = _get(f"{gateway.url}data/synthetic/train/0/4/dirichlet:0/7/labels")
        assert status == 400 and body.startswith(b"error: --partition dirichlet:0: ALPHA")
        status, body = _get(f"{gateway.url}data/synthetic/train/0/4/shards:2/7/labels")
        assert status == 400 and b"need labels <= workers * K" in body


@pytest.mark.slow
def test_browsers_train_exactly_their_partitions_shards(tmp_path):
    require_browser()
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet",
            "--workers", "3", "--browser", "2", "--browser-headless", "--listen", "127.0.0.1:0",
            "--join-wait", "120", "--model", "mlp", "--dataset", "synthetic", "--epochs", "1",
            "--partition", "dirichlet:0.5", "--seed", "3"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=quiet_env())
    assert done.returncode == 0, done.stderr[-3000:]
    expected = label_histograms(training_labels("synthetic"), 3, "dirichlet:0.5", 3).sum(axis=1)
    workers = {int(w["rank"]): w for w in load_run(out).events("worker")}
    assert sorted(workers) == [0, 1, 2]
    agents = sorted(w.get("agent", "numpy") for w in workers.values())
    assert agents.count("numpy") == 1, agents
    for rank, worker in workers.items():  # one epoch: each worker's samples are its shard
        assert worker["samples"] == expected[rank], (rank, json.dumps(worker))
