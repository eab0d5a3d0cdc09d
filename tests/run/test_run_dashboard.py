"""`minips run --dashboard`: the live page of a local run, its URL printed, its numbers the
server's. (The page itself in a real browser: tests/classroom/test_dashboard.py.)"""

import json
import os
import subprocess
import sys
import time
import urllib.request

from minips.rules import DEFAULT_RULE


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def test_run_dashboard_prints_its_url_and_serves_the_runs_stats(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--dashboard", "--dashboard-listen", "127.0.0.1:0",
         "--model", "mlp", "--dataset", "synthetic", "--epochs", "2", "--hetero", "6,6",
         "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    try:
        first = proc.stdout.readline()
        assert first.startswith("dashboard: http://127.0.0.1:"), first + proc.stderr.read()
        url = first.split(": ", 1)[1].strip()
        with urllib.request.urlopen(url, timeout=10) as page:
            assert b"<canvas" in page.read()
        deadline = time.monotonic() + 60
        snapshot = _get_json(url + "snapshot.json")
        while not (snapshot["connected"] and snapshot["stats"]) and time.monotonic() < deadline:
            time.sleep(0.2)
            snapshot = _get_json(url + "snapshot.json")
        assert snapshot["stats"]["rule"]["name"] == DEFAULT_RULE
        assert snapshot["stats"]["world_size"] == 2
        rest, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert f"{summary['samples']} samples, {summary['updates']} updates" in rest
