"""`minips run --dashboard` on the projector, for real: a run of NumPy workers and headless
Chromium browser seats, its dashboard open in headless Chromium at 1280x720 until after the
run's process exits; the page says "finished" with the run's final accuracy, and `minips
report` names each worker's agent, host and speed. And the page of an authenticated run
(`--auth`) connects. (docs/dashboard.png is refreshed with MINIPS_UPDATE_SCREENSHOT=1.)"""

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from test_dashboard import READ_PAGE, ROOT, chromium_page
from test_web_support import require_browser

pytestmark = pytest.mark.slow
FAST = ["--model", "mlp", "--dataset", "synthetic", "--lr", "0.05"]


def _start_run(tmp_path, *args: str) -> tuple[subprocess.Popen, str]:
    out = tmp_path / "run"
    run = subprocess.Popen(
        [sys.executable, "-m", "minips", "run", "--dashboard", "--dashboard-listen",
         "127.0.0.1:0", *FAST, "--out", str(out), "--quiet", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = run.stdout.readline()
    while first and not first.startswith("dashboard: "):
        first = run.stdout.readline()
    assert first.startswith("dashboard: http://127.0.0.1:"), first + run.stderr.read()
    return run, first.split(": ", 1)[1].strip()


def _final(tools) -> dict:
    return json.loads(
        tools.evaluate("""JSON.stringify({phase: document.body.dataset.phase,
          status: document.getElementById("status").textContent,
          final: document.getElementById("final").textContent,
          accuracy: document.getElementById("final").dataset.accuracy,
          height: document.documentElement.scrollHeight})""")
    )


def test_the_runs_page_says_finished_with_its_accuracy_and_report_names_agents(tmp_path):
    require_browser()
    seats = ["--browser", "2", "--browser-headless", "--listen", "127.0.0.1:0"]
    run, url = _start_run(tmp_path, "--workers", "4", *seats, "--epochs", "3",
                          "--eval-interval", "1")  # fmt: skip
    try:
        with chromium_page(url) as tools:
            tools.call("Emulation.setDeviceMetricsOverride", width=1280, height=720,
                       deviceScaleFactor=1, mobile=False)  # fmt: skip
            deadline = time.monotonic() + 180
            shot = None
            while run.poll() is None:
                page = json.loads(tools.evaluate(READ_PAGE) or "{}")
                if shot is None and page.get("evals", 0) >= 3 and len(page["workers"]) == 4:
                    shot = tools.call("Page.captureScreenshot", format="png")["data"]
                assert time.monotonic() < deadline, "the run did not end"
                time.sleep(0.5)
            rest, err = run.communicate(timeout=60)
            time.sleep(1.0)  # the run's process (and its dashboard) is gone: the page stays
            end = _final(tools)
            finished_shot = tools.call("Page.captureScreenshot", format="png")["data"]
    finally:
        if run.poll() is None:
            run.kill()
        run.wait()
    assert run.returncode == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert end["phase"] == "finished" and end["status"] == "finished", end
    assert float(end["accuracy"]) == summary["accuracy"]
    assert end["final"].startswith(f"finished · final accuracy {100 * summary['accuracy']:.1f}%")
    assert f"{summary['wall_s']:.1f} s" in end["final"] and end["height"] <= 720
    report = subprocess.run([sys.executable, "-m", "minips", "report", str(tmp_path / "run"),
                             "--json"], capture_output=True, text=True, timeout=60)  # fmt: skip
    (shown,) = json.loads(report.stdout)
    agents = sorted(w["agent"].split()[0] for w in shown["workers"].values())
    assert agents == ["Chrome", "Chrome", "numpy", "numpy"], shown["workers"]
    for worker in shown["workers"].values():
        assert worker["host"] and worker["samples_per_s"] > 0, worker
    browsers = [w for w in shown["workers"].values() if w["agent"].startswith("Chrome")]
    assert {w["host"] for w in browsers} == {"127.0.0.1"}  # the address the gateway saw
    for name, data in (("dashboard.png", shot), ("dashboard-finished.png", finished_shot)):
        png = base64.b64decode(data)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        (tmp_path / name).write_bytes(png)
    if os.environ.get("MINIPS_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs" / "dashboard.png").write_bytes(base64.b64decode(shot))


def test_the_dashboard_of_an_authenticated_run_connects(tmp_path):
    run, url = _start_run(tmp_path, "--auth", "--workers", "2", "--epochs", "20",
                          "--hetero", "4,4")  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(url + "snapshot.json", timeout=10) as reply:
                snapshot = json.loads(reply.read())
            if snapshot.get("connected") and snapshot["stats"]["updates"] > 0:
                break
            assert run.poll() is None and time.monotonic() < deadline, snapshot
            time.sleep(0.3)
    finally:
        run.terminate()
        run.wait(30)
    assert snapshot["phase"] == "live" and snapshot["error"] is None
    assert [w["rank"] for w in snapshot["workers"]] == [0, 1]
