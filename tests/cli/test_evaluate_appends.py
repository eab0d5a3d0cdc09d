"""`minips evaluate --metrics FILE` appends to FILE, as its help says: the records already
there (an earlier evaluation's) stay, ahead of the new ones. Real processes."""

import json
import signal
import subprocess
import sys
import time

import pytest
from test_web_support import server_process

from minips.results.metrics import read_metrics

pytestmark = pytest.mark.slow
SERVER = ("--model", "mlp", "--dataset", "synthetic", "--epochs", "500", "--workers", "1")


def test_evaluate_appends_to_an_existing_metrics_file(tmp_path):
    metrics = tmp_path / "eval.jsonl"
    earlier = [
        {"event": "eval", "time": 1.0, "samples": 64, "accuracy": 0.5, "loss": 1.0},
        {"event": "eval", "time": 2.0, "samples": 128, "accuracy": 0.6, "loss": 0.9},
    ]
    metrics.write_text("".join(json.dumps(record) + "\n" for record in earlier))
    with server_process(tmp_path, *SERVER) as endpoint:
        argv = [sys.executable, "-m", "minips", "evaluate", "--connect", endpoint]
        argv += ["--metrics", str(metrics), "--interval", "0.1"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while len(metrics.read_text().splitlines()) < len(earlier) + 3:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    records = read_metrics(metrics)
    assert records[: len(earlier)] == earlier
    assert len(records) >= len(earlier) + 3
    assert all(r["event"] == "eval" and "version" in r for r in records[len(earlier) :])
