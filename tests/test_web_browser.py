"""Browser workers in headless Chromium against a live `minips server` process.

Each test starts a server process, a gateway and Chromium, opens worker pages through the
DevTools protocol and reads their status (window.minipsStatus) and the server's `stats`.
Skipped, with the reason shown, where Chromium or websockets are missing.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
from test_web_support import Chromium, quiet_env, require_browser, server_process, wait_for

from minips.data import load_dataset
from minips.nn import build_model, load_model
from minips.worker.client import PSClient

pytestmark = pytest.mark.slow
# As tests/test_launch.py: 2000 training examples, so a shard of 1000 is 16 steps of 64.
TRAIN = ["--model", "mlp", "--dataset", "synthetic", "--lr", "0.05", "--momentum", "0.5"]


@pytest.fixture
def browser(tmp_path):
    require_browser()
    chromium = Chromium(tmp_path)
    yield chromium
    chromium.close()


@pytest.fixture
def gateway_for():
    from minips.web import start_gateway

    running = []

    def start(endpoint):
        running.append(start_gateway(endpoint))
        return running[-1]

    yield start
    for gateway in running:
        gateway.close()


def _done(browser, session):
    status = browser.status(session)
    assert status.get("state") != "failed", status.get("error")
    return status if status.get("state") == "done" else None


def _final_stats(updates_log) -> dict:
    """The server's last `stats` (written to --updates-log as it exits: a server whose
    workers all finished their epochs ends the run by itself, docs/protocol.md 5.6)."""
    records = [json.loads(line) for line in updates_log.read_text().splitlines()]
    return next(r["stats"] for r in records if r["event"] == "server")


def _checkpoint_accuracy(path) -> float:
    """Test accuracy of the mlp parameters in a server checkpoint, computed with NumPy."""
    return _accuracy(load_model(path).params)


def _server_accuracy(endpoint: str) -> float:
    """Test accuracy of the server's current mlp parameters, computed with NumPy."""
    with PSClient(endpoint) as observer:
        observer.hello({"role": "observer"})
        params = observer.pull().params
        observer.bye()
    return _accuracy(params)


def _accuracy(params) -> float:
    model = build_model("mlp")
    model.set_params(params, strict=True)
    data = load_dataset("synthetic")
    return float(np.mean(model.forward(data.x_test, train=False).argmax(1) == data.y_test))


def test_two_browser_workers_train_the_model(tmp_path, browser, gateway_for):
    log, checkpoint = tmp_path / "updates.jsonl", tmp_path / "final.npz"
    args = ["--workers", "2", "--rule", "asgd", "--epochs", "2", *TRAIN]
    args += ["--updates-log", str(log), "--checkpoint", str(checkpoint)]
    with server_process(tmp_path, *args) as endpoint:
        before = _server_accuracy(endpoint)
        gateway = gateway_for(endpoint)
        sessions = [browser.open(gateway.url + "?evalsec=1")[1] for _ in range(2)]
        finals = [
            wait_for(lambda s=s: _done(browser, s), 120, "a page to finish") for s in sessions
        ]
    stats, after = _final_stats(log), _checkpoint_accuracy(checkpoint)
    assert sorted(f["rank"] for f in finals) == [0, 1]
    # 2 epochs of a 1000-example shard in batches of 64: 32 steps each, all applied.
    assert [f["steps"] for f in finals] == [32, 32]
    browsers = [w for w in stats["workers"] if w["info"].get("agent") == "browser"]
    assert len(browsers) == 2 and all(w["pushes"] == 32 for w in browsers)
    assert stats["updates"] == 64 and stats["samples"] == 2000 * 2
    assert before < 0.3 and after > 0.8, (before, after)
    assert all(f["accuracy"] > 0.8 for f in finals), finals  # what the pages show


def test_mixed_cluster_numpy_and_browser_finishes_with_dasgd(tmp_path, browser, gateway_for):
    log = tmp_path / "updates.jsonl"
    args = ["--workers", "2", "--rule", "dasgd", "--epochs", "2", *TRAIN, "--updates-log", str(log)]
    with server_process(tmp_path, *args) as endpoint:
        gateway = gateway_for(endpoint)
        report = tmp_path / "numpy-worker.json"
        numpy_worker = subprocess.Popen(
            [sys.executable, "-m", "minips", "worker", "--connect", endpoint, "--quiet"]
            + ["--report", str(report)],
            env=quiet_env(),
        )
        _, session = browser.open(gateway.url)
        final = wait_for(lambda: _done(browser, session), 120, "the browser page to finish")
        assert numpy_worker.wait(120) == 0
    stats = _final_stats(log)
    numpy_report = json.loads(report.read_text())
    assert {final["rank"], numpy_report["rank"]} == {0, 1}
    assert final["steps"] == numpy_report["steps"] == 32  # 2 epochs x 16 batches
    assert stats["rule"]["name"] == "dasgd" and stats["updates"] == 64
    assert {w["info"].get("agent", "numpy") for w in stats["workers"]} == {"browser", "numpy"}


def test_a_closed_tab_is_declared_dead_and_the_run_goes_on(tmp_path, browser, gateway_for):
    args = ["--workers", "2", "--rule", "ssgd", "--epochs", "3", "--heartbeat-timeout", "2"]
    with server_process(tmp_path, *args, *TRAIN) as endpoint:
        gateway = gateway_for(endpoint)
        (target, leaving), (_, staying) = [browser.open(gateway.url) for _ in range(2)]
        wait_for(lambda: browser.status(leaving).get("steps", 0) >= 3, 60, "steps in the tab")
        gone_rank = browser.status(leaving)["rank"]
        browser.close_tab(target)

        def dead():
            with PSClient(endpoint) as ps:
                workers = ps.stats()["workers"]
            return [w for w in workers if w["rank"] == gone_rank and not w["alive"]]

        wait_for(dead, 30, "the closed tab's worker to be declared dead")
        steps_then = browser.status(staying)["steps"]
        final = wait_for(lambda: _done(browser, staying), 120, "the remaining page to finish")
    assert final["steps"] == 48 > steps_then  # 3 epochs x 16 batches, the last ones alone
