"""`minips run --dashboard` in real headless Chromium: a live `minips run` process, its page
read in the browser and compared with the server's own `stats`, and a screenshot
(docs/dashboard.png is refreshed with MINIPS_UPDATE_SCREENSHOT=1).

To compare exact numbers on a live run, the run's workers are paused (SIGSTOP, then
SIGCONT) once the page shows progress: the counters then hold still while the page
renders a snapshot polled after the pause. The DevTools helpers are test_dashboard's.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_support import paused, workers_of
from test_dashboard import READ_PAGE, ROOT, _get, chromium_page

from minips.rules import DEFAULT_RULE
from minips.worker.client import PSClient


def _stats(endpoint: str) -> dict:
    """`stats` without hello: an observer-free look at the server's counters."""
    with PSClient(endpoint, timeout=5.0) as client:
        return client.stats()


def _read_page(tools) -> dict:
    return json.loads(tools.evaluate(READ_PAGE) or "{}")


def _trained_a_while(page: dict) -> bool:
    """Both workers have pushed, 30 updates, 3 evaluations: curves worth a screenshot."""
    pushes = [int(w.get("steps") or 0) for w in page["workers"]]
    updates = int(page["stats"].get("stat-updates") or 0)
    return page["evals"] >= 3 and len(pushes) == 2 and min(pushes) > 0 and updates >= 30


def _wait_page(tools, run: subprocess.Popen, ready, what: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        page = _read_page(tools)
        if page and ready(page):
            return page
        assert run.poll() is None, f"the run ended before the page showed {what}"
        assert time.monotonic() < deadline, f"the page never showed {what}: {page}"
        time.sleep(0.3)


def test_live_run_dashboard_in_chromium_matches_the_servers_stats(tmp_path):
    out = tmp_path / "run"
    run = subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--dashboard", "--dashboard-listen",
         "127.0.0.1:0", "--model", "mlp", "--dataset", "synthetic", "--workers", "2",
         "--hetero", "4,4", "--epochs", "100", "--max-samples", "400000",
         "--eval-interval", "0.5", "--heartbeat-timeout", "300", "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = run.stdout.readline()
        assert first.startswith("dashboard: http://127.0.0.1:"), first + run.stderr.read()
        url = first.split(": ", 1)[1].strip()
        endpoint = (out / "endpoint").read_text().strip()
        with chromium_page(url) as tools:
            _wait_page(tools, run, _trained_a_while, "both workers' pushes and 3 evaluations")
            with paused(workers_of(run)):
                # A push sent just before the pause may land while the page is read (late
                # on a loaded machine): read again until the server's counters held still
                # around it. The paused workers send nothing more, so this ends.
                for _ in range(20):
                    before = _stats(endpoint)
                    seq = json.loads(_get(url + "snapshot.json"))["seq"]
                    page = _wait_page(
                        tools, run, lambda p, seq=seq: p["seq"] > seq, "a snapshot after the pause"
                    )
                    stats = _stats(endpoint)
                    if (before["updates"], before["samples"]) == (
                        stats["updates"],
                        stats["samples"],
                    ):
                        break
                shot = tools.call("Page.captureScreenshot", format="png")["data"]
            evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
        _check_page_against_stats(page, before, stats, evals)
        _stats_stop(endpoint)  # the run ends as after its budget: summary, exit 0
        rest, err = run.communicate(timeout=120)
    finally:
        run.kill()
        run.wait()
    assert run.returncode == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] >= int(page["stats"]["stat-updates"]) > 0
    assert f"{summary['samples']} samples, {summary['updates']} updates" in rest
    _save_screenshot(shot, tmp_path)


def _check_page_against_stats(page: dict, before: dict, stats: dict, evals: list) -> None:
    """The page's tiles and worker rows are the server's numbers (paused: exact)."""
    assert (before["updates"], before["samples"]) == (stats["updates"], stats["samples"]), (
        "the workers were not paused"
    )
    shown = page["stats"]
    assert int(shown["stat-updates"]) == stats["updates"] > 0
    assert int(shown["stat-samples"]) == stats["samples"]
    assert int(shown["stat-version"]) == stats["version"]
    assert float(shown["stat-staleness-mean"]) == pytest.approx(stats["staleness_mean"])
    assert int(shown["stat-staleness-max"]) == stats["staleness_max"]
    assert shown["stat-rule"] == DEFAULT_RULE
    for key in ("bytes_in", "bytes_out"):  # the evaluator's pulls and `stats` go on
        assert before[key] <= int(shown["stat-" + key.replace("_", "-")]) <= stats[key], key
    eval_records = [e for e in evals if e.get("event") == "eval"]
    assert float(shown["stat-accuracy"]) == eval_records[page["evals"] - 1]["accuracy"]
    rows = {w["rank"]: w for w in stats["workers"] if not w["observer"]}
    assert [int(w["rank"]) for w in page["workers"]] == sorted(rows) == [0, 1]
    for w in page["workers"]:
        row = rows[int(w["rank"])]
        for key in ("steps", "samples", "bytes_in"):
            assert int(w[key]) == row[key], (key, w, row)
        assert w["state"] == "training" and w["agent"] == "numpy"


def _stats_stop(endpoint: str) -> None:
    with PSClient(endpoint, timeout=5.0) as client:
        client.stop()


def _save_screenshot(shot: str, tmp_path: Path) -> None:
    import base64

    png = base64.b64decode(shot)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    (tmp_path / "dashboard.png").write_bytes(png)
    if os.environ.get("MINIPS_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs" / "dashboard.png").write_bytes(png)
