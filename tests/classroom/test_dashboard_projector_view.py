"""The projector view (`?projector`) in real headless Chromium at 1280x720: numbers and
a table in type a class reads from the back of the room, the charts filling the page (no
empty lower half), the page still fitting the screen. Its screenshot is saved beside the
test's files (MINIPS_UPDATE_SCREENSHOT=1 refreshes docs/dashboard-projector.png)."""

import base64
import contextlib
import json
import os
import shutil
import time

import numpy as np
import pytest
from test_dashboard import ROOT, chromium_page, free_port, minips_process

from minips.classroom.dashboard import start_dashboard
from minips.nn import build_model
from minips.worker.client import PSClient

pytestmark = pytest.mark.slow

MEASURE = """JSON.stringify({
  projector: document.body.classList.contains("projector"),
  width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
  number: parseFloat(getComputedStyle(document.getElementById("stat-accuracy")).fontSize),
  label: parseFloat(getComputedStyle(document.querySelector(".tile span")).fontSize),
  cell: parseFloat(getComputedStyle(document.querySelector("#workers td")).fontSize),
  visibleTiles: [...document.querySelectorAll(".tile")].filter(t => t.offsetParent).length,
  columns: [...document.querySelectorAll("#workers thead th")].filter(t => t.offsetParent).length,
  charts: [...document.querySelectorAll("canvas")].map(c => c.getBoundingClientRect().height),
  bottom: document.getElementById("table-box").getBoundingClientRect().bottom})"""


def _push_a_little(address: str, workers: int) -> None:
    """Every worker says hello first: the server holds pulls until its `--workers` have
    registered (or its assembly grace, 30 s, ran out), so one at a time would wait that."""
    shapes = {name: p.shape for name, p in build_model("mlp").params.items()}
    rng = np.random.default_rng(0)
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(PSClient(address, timeout=10.0)) for _ in range(workers)]
        for ps in clients:
            ps.hello({"role": "worker"})
        for ps in clients:
            version = ps.pull().version
            for _ in range(3):
                grads = {n: rng.normal(0, 1e-3, s).astype(np.float32) for n, s in shapes.items()}
                version = ps.push(grads, base=version, samples=64, pull_since=version).pull.version


def _measure(url: str, shot) -> tuple[dict, dict]:
    with chromium_page(url) as tools:
        tools.call("Emulation.setDeviceMetricsOverride", width=1280, height=720,
                   deviceScaleFactor=1, mobile=False)  # fmt: skip
        deadline = time.monotonic() + 60
        while not (page := json.loads(tools.evaluate(MEASURE) or "{}")).get("cell"):
            assert time.monotonic() < deadline, "the worker table never filled"
            time.sleep(0.3)
        if shot is not None:
            png = base64.b64decode(tools.call("Page.captureScreenshot", format="png")["data"])
            shot.write_bytes(png)
        return page


def test_the_projector_view_fills_1280x720_in_large_type(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    server = minips_process(
        "server", "--model", "mlp", "--dataset", "synthetic", "--workers", "6",
        "--bind", address, log=tmp_path / "server.log",
    )  # fmt: skip
    try:
        _push_a_little(address, workers=6)
        url, stop = start_dashboard(address, None, "127.0.0.1:0")
        try:
            plain = _measure(url, None)
            projector = _measure(url + "?projector", tmp_path / "projector.png")
        finally:
            stop()
    finally:
        server.kill()
        server.wait()
    assert not plain["projector"] and projector["projector"]
    # Large type: numbers 48 px (3x the plain page's), labels and the table 20+ px.
    assert projector["number"] >= 44 and projector["number"] >= 2.5 * plain["number"]
    assert projector["label"] >= 20 and projector["cell"] >= 20, projector
    # A few numbers and columns, the rest left to the plain view.
    assert projector["visibleTiles"] <= 6 < plain["visibleTiles"]
    assert projector["columns"] <= 7 < plain["columns"]
    # The page is filled: the charts take the height, the table ends at the bottom; it fits.
    assert min(projector["charts"]) >= 1.4 * max(plain["charts"]), (plain, projector)
    assert projector["width"] <= 1280 and projector["height"] <= 720, projector
    assert projector["bottom"] >= 600, projector
    if os.environ.get("MINIPS_UPDATE_SCREENSHOT") == "1":
        shutil.copy(tmp_path / "projector.png", ROOT / "docs" / "dashboard-projector.png")
