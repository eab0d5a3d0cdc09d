"""Browser workers in headless Chromium against a live `minips server` process.

Each test starts a server process, a gateway and Chromium, opens worker pages through the
DevTools protocol and reads their status (window.minipsStatus) and the server's `stats`.
Skipped, with the reason shown, where Chromium or websockets are missing.
"""

import base64
import json
import subprocess
import sys

import numpy as np
import pytest
from test_web_support import (
    Chromium,
    numpy_case,
    quiet_env,
    require_browser,
    server_process,
    wait_for,
)

from minips.data import load_dataset
from minips.nn import build_model
from minips.ops.model_file import load_model
from minips.worker.client import PSClient

pytestmark = pytest.mark.slow
# As tests/run/test_launch.py: 2000 training examples, so a shard of 1000 is 16 steps of 64.
TRAIN = ["--model", "mlp", "--dataset", "synthetic", "--lr", "0.05", "--momentum", "0.5"]


@pytest.fixture
def browser(tmp_path):
    require_browser()
    chromium = Chromium(tmp_path)
    yield chromium
    chromium.close()


@pytest.fixture
def gateway_for():
    from minips.classroom.web import start_gateway

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
    # Chromium has WebAssembly SIMD: the pages train on gemm.wasm and kernels.wasm, and say so
    assert [f["engine"] for f in finals] == ["wasm-simd", "wasm-simd"]
    shown = browser.call("Runtime.evaluate", sessions[0], returnByValue=True,
                         expression="document.getElementById('engine').textContent")  # fmt: skip
    assert shown["result"]["value"] == "WebAssembly SIMD (gemm.wasm, kernels.wasm)"


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
        # The plain JavaScript engine (where WebAssembly SIMD is missing) trains the same.
        _, session = browser.open(gateway.url + "?engine=js")
        final = wait_for(lambda: _done(browser, session), 120, "the browser page to finish")
        assert numpy_worker.wait(120) == 0
    stats = _final_stats(log)
    numpy_report = json.loads(report.read_text())
    assert {final["rank"], numpy_report["rank"]} == {0, 1}
    assert final["steps"] == numpy_report["steps"] == 32  # 2 epochs x 16 batches
    assert stats["rule"]["name"] == "dasgd" and stats["updates"] == 64
    assert {w["info"].get("agent", "numpy") for w in stats["workers"]} == {"browser", "numpy"}
    assert final["engine"] == "js"


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


# Run in the page (its origin is the gateway's, so /static/ imports work): NumPy's case on
# the network of nn.js with the engine the worker would pick (or the plain one), two passes
# (the WebAssembly engine's first runs on plain arrays, the second in its memory).
_PASSES_IN_THE_PAGE = """
(async () => {
  const { buildModel, softmaxCrossEntropy } = await import("/static/nn.js");
  const { bestEngine, jsEngine } = await import("/static/engine.js");
  const fetchBytes = async (name) => (await fetch(`/static/${name}`)).arrayBuffer();
  const engine = CASE.engine === "js" ? jsEngine : await bestEngine(fetchBytes);
  const f32 = (b64) => new Float32Array(Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)).buffer);
  const b64 = (a) => {
    const bytes = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
    let text = "";
    for (let i = 0; i < bytes.length; i += 8192) {
      text += String.fromCharCode(...bytes.subarray(i, i + 8192));
    }
    return btoa(text);
  };
  const model = buildModel(CASE.spec, engine);
  for (const [name, values] of Object.entries(CASE.params)) model.setParam(name, f32(values));
  const x = { data: f32(CASE.x), shape: CASE.shape };
  const passes = [];
  for (let pass = 0; pass < 2; pass++) {
    const logits = model.forward(x, true);
    const { dlogits } = softmaxCrossEntropy(logits, CASE.labels);
    model.backward(dlogits);
    const grads = Object.fromEntries([...model.grads].map(([name, g]) => [name, b64(g.data)]));
    passes.push({ logits: b64(logits.data), grads });
  }
  return JSON.stringify({ engine: engine.name, passes });
})()
"""


def _relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize(
    ("model_name", "engine"), [("lenet5", "wasm-simd"), ("mlp", "wasm-simd"), ("mlp", "js")]
)
def test_chromium_computes_numpys_gradients(tmp_path, browser, gateway_for, model_name, engine):
    case = numpy_case(model_name, batch=16, seed=3)
    encode = lambda a: base64.b64encode(np.ascontiguousarray(a, "<f4").tobytes()).decode()  # noqa: E731
    given = {"engine": "js" if engine == "js" else "best", "spec": case["spec"],
             "params": {name: encode(p) for name, p in case["params"].items()},
             "x": encode(case["x"]), "shape": list(case["x"].shape),
             "labels": case["labels"].tolist()}  # fmt: skip
    with server_process(tmp_path, "--workers", "1", "--model", model_name) as endpoint:
        gateway = gateway_for(endpoint)
        _, session = browser.open(gateway.url + "static/page.css")  # the origin, no worker
        wait_for(lambda: browser.status(session) == {}, 30, "the page to load")
        expression = f"const CASE = {json.dumps(given)};" + _PASSES_IN_THE_PAGE
        result = browser.call("Runtime.evaluate", session, expression=expression,
                              awaitPromise=True, returnByValue=True)  # fmt: skip
    assert "exceptionDetails" not in result, result.get("exceptionDetails")
    answer = json.loads(result["result"]["value"])
    assert answer["engine"] == engine  # the WebAssembly engine where Chromium has SIMD
    decode = lambda b64: np.frombuffer(base64.b64decode(b64), "<f4")  # noqa: E731
    for computed in answer["passes"]:
        assert _relative_error(decode(computed["logits"]), case["logits"].ravel()) < 1e-4
        for name, grad in case["grads"].items():
            assert _relative_error(decode(computed["grads"][name]), grad.ravel()) < 1e-4, name
