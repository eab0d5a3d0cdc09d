"""The dashboard on a projector, in real headless Chromium at 1280x720: a class of 30
workers (20 browsers, 10 NumPy, their hosts and agents) on a real `minips server`, the
page fitting the window with the worker table scrolling inside it, then the run stopped
and the page showing "finished" with the final accuracy, kept after the server is gone.
Screenshots of both are saved beside the test's files."""

import base64
import json
import os
import threading
import time

import numpy as np
import pytest
from test_dashboard import READ_PAGE, ROOT, chromium_page, free_port, minips_process

from minips.classroom.dashboard import start_dashboard
from minips.nn import build_model
from minips.results.rundir import latest_eval
from minips.worker.client import PSClient

pytestmark = pytest.mark.slow
CLASS = 30
BROWSERS = 20
UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36"  # noqa: E501


def _student(address: str, rank_hint: int, steps: int, done: threading.Barrier) -> None:
    """One worker of the class: hello (a browser's or a NumPy worker's info), `steps`
    pushes of small gradients, then (even ranks) bye."""
    browser = rank_hint < BROWSERS
    info = {"role": "worker", "agent": "browser", "ua": UA} if browser else {"role": "worker"}
    info["host"] = f"{'laptop' if browser else 'lab-pc'}-{rank_hint:02d}"
    shapes = {name: p.shape for name, p in build_model("mlp").params.items()}
    rng = np.random.default_rng(rank_hint)
    with PSClient(address, timeout=10.0) as ps:
        ps.hello(info)
        version = ps.pull().version
        for _ in range(steps + rank_hint % 5):  # uneven contributions: bars of many heights
            grads = {n: rng.normal(0, 1e-3, s).astype(np.float32) for n, s in shapes.items()}
            version = ps.push(grads, base=version, samples=64, pull_since=version).pull.version
        done.wait(60)
        if rank_hint % 2 == 0:
            ps.bye()


def _fits(tools) -> dict:
    return tools.evaluate("""JSON.stringify({
      width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
      tableBox: (b => [b.scrollHeight, b.clientHeight, b.getBoundingClientRect().bottom])(
          document.getElementById("table-box")),
      charts: [...document.querySelectorAll("canvas")].map(c => c.getBoundingClientRect().bottom),
      final: (f => f.hidden ? null : f.textContent)(document.getElementById("final")),
      finalAccuracy: document.getElementById("final").dataset.accuracy,
      status: document.getElementById("status").textContent,
      phase: document.body.dataset.phase})""")


def _until(value, timeout: float):
    """value()'s first truthy result, polled; the bound only catches a hang."""
    deadline = time.monotonic() + timeout
    while not (got := value()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)
    return got


def _shot(tools, path) -> None:
    png = base64.b64decode(tools.call("Page.captureScreenshot", format="png")["data"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    path.write_bytes(png)


def test_a_class_of_30_fits_1280x720_and_the_end_is_kept(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    updates, metrics = tmp_path / "updates.jsonl", tmp_path / "eval.jsonl"
    server = minips_process(
        "server", "--model", "mlp", "--dataset", "synthetic", "--workers", str(CLASS),
        "--bind", address, "--updates-log", str(updates), log=tmp_path / "server.log",
    )  # fmt: skip
    evaluator = None
    try:
        with PSClient(address, timeout=1.0, retries=60) as probe:
            probe.stats()
        evaluator = minips_process(
            "evaluate", "--connect", address, "--metrics", str(metrics), "--interval", "0.5",
            log=tmp_path / "eval.log",
        )  # fmt: skip
        done = threading.Barrier(CLASS + 1)
        students = [
            threading.Thread(target=_student, args=(address, i, 4, done), daemon=True)
            for i in range(CLASS)
        ]
        for student in students:
            student.start()
        url, stop = start_dashboard(address, metrics, "127.0.0.1:0", updates)
        try:
            with chromium_page(url) as tools:
                tools.call("Emulation.setDeviceMetricsOverride", width=1280, height=720,
                           deviceScaleFactor=1, mobile=False)  # fmt: skip
                deadline = time.monotonic() + 60
                while True:
                    page = json.loads(tools.evaluate(READ_PAGE) or "{}")
                    pushed = [int(w.get("steps") or 0) for w in page.get("workers", [])]
                    if len(pushed) == CLASS and min(pushed) >= 4 and page["evals"] >= 2:
                        break
                    assert time.monotonic() < deadline, page
                    time.sleep(0.3)

                # A poll more, seen as every row's staleness and scale: the update log's
                # pushes are in the histogram (an event; a loaded machine polls late).
                def polled() -> dict:
                    shown = json.loads(tools.evaluate(READ_PAGE) or "{}")
                    rows = shown.get("workers", [])
                    full = rows and all(
                        r.get("staleness_mean") not in (None, "") and r.get("scale_mean")
                        for r in rows
                    )
                    return shown if full else {}

                live = _until(polled, 60)
                fit = json.loads(_fits(tools))
                _shot(tools, tmp_path / "dashboard-class.png")
                done.wait(60)
                for student in students:
                    student.join(30)
                with PSClient(address, timeout=5.0) as operator:
                    operator.stop()
                assert server.wait(60) == 0
                # The evaluator writes its final record after the server stopped (late on a
                # loaded machine): wait for it to leave, then for the page to show it.
                evaluator.wait(120)
                deadline = time.monotonic() + 60
                shown_final = "finished · final accuracy"
                while not ((end := json.loads(_fits(tools)))["final"] or "").startswith(
                    shown_final
                ):
                    assert time.monotonic() < deadline, end
                    time.sleep(0.3)
                time.sleep(1.5)  # a poll more: the page keeps what it shows
                end, after = json.loads(_fits(tools)), json.loads(tools.evaluate(READ_PAGE))
                _shot(tools, tmp_path / "dashboard-finished.png")
        finally:
            stop()
    finally:
        for proc in (server, evaluator):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    # The page fits the projector; the table scrolls inside its box, the charts are in view.
    assert fit["width"] <= 1280 and fit["height"] <= 720, fit
    scroll_height, client_height, bottom = fit["tableBox"]
    assert scroll_height > client_height and bottom <= 720, fit
    assert all(bottom <= 720 for bottom in fit["charts"]) and len(fit["charts"]) == 3
    rows = live["workers"]
    assert [int(r["rank"]) for r in rows] == list(range(CLASS))
    agents = sorted({r["agent"] for r in rows})
    assert agents == ["Chrome 120", "numpy"] and all(r["host"] for r in rows)
    assert {r["host"][:6] for r in rows} == {"laptop", "lab-pc"}
    assert all(float(r["staleness_mean"]) >= 0 and r["scale_mean"] for r in rows)
    # The end: "finished", the final accuracy (the evaluator's last, final record), kept.
    # The last `eval` record: a `collapse` record may follow it (this class's random
    # gradients leave the model at chance, and the final evaluation can be the one that
    # finds it: the evaluator writes the collapse after the evaluation that saw it).
    final = latest_eval(metrics)
    assert final["final"] and end["status"] == "finished" and end["phase"] == "finished"
    assert float(end["finalAccuracy"]) == final["accuracy"]
    assert end["final"].startswith(f"finished · final accuracy {100 * final['accuracy']:.1f}%")
    assert int(after["stats"]["stat-updates"]) >= int(live["stats"]["stat-updates"]) > 0
    states = {r["state"] for r in after["workers"]}
    assert states == {"finished", "stopped"}  # even ranks said bye early; odd ones trained on
    if os.environ.get("MINIPS_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs" / "dashboard.png").write_bytes(
            (tmp_path / "dashboard-class.png").read_bytes()
        )
