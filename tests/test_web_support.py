"""Helpers for the browser tests (no tests here): a `minips server` process, a gateway, and
headless Chromium driven through the DevTools protocol over a WebSocket.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def require_browser() -> None:
    """Skip (with the reason shown in the summary) unless Chromium and websockets exist."""
    pytest.importorskip("websockets", reason="websockets not installed: pip install '.[web]'")
    if CHROMIUM is None:
        pytest.skip("chromium not found: apt-get install chromium to run the browser tests")


@contextmanager
def server_process(tmp_path: Path, *args: str):
    """A `minips server` on a free loopback port; yields its endpoint; stopped at exit."""
    endpoint_file = tmp_path / "endpoint"
    endpoint_file.unlink(missing_ok=True)  # a stale one would point to a dead server
    log = open(tmp_path / "server.log", "w")
    cmd = [sys.executable, "-m", "minips", "server", "--bind", "tcp://127.0.0.1:*"]
    cmd += ["--endpoint-file", str(endpoint_file), *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not endpoint_file.exists():
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        yield endpoint_file.read_text().strip()
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(10)
        log.close()


class Chromium:
    """Headless Chromium with one DevTools WebSocket; tabs are opened and read through it."""

    def __init__(self, tmp_path: Path, flags: tuple[str, ...] = ()) -> None:
        """flags: more command-line flags (e.g. --js-flags=--jitless: no WebAssembly)."""
        from websockets.sync.client import connect

        profile = tmp_path / "chromium-profile"
        self._tmp = tempfile.mkdtemp(prefix="minips-chromium-")
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless=new",
                "--no-sandbox",  # tests run as root
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-background-timer-throttling",  # several tabs train at once
                "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                *flags,
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # its org.chromium.* files in a folder of its own, removed on close (short: a
            # socket's path in it must fit 107 bytes, which a test's tmp_path may not)
            env={**os.environ, "TMPDIR": self._tmp},
        )
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            match = re.search(r"DevTools listening on (ws://\S+)", line)
            url = match.group(1) if match else None
        assert url, "chromium did not start its DevTools endpoint"
        self._stack = ExitStack()  # the sync client wants to be a context manager
        self.ws = self._stack.enter_context(connect(url, max_size=None, open_timeout=20))
        self._id = 0

    def call(self, method: str, session: str | None = None, **params) -> dict:
        """Send one DevTools command and return its result (events are skipped)."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == self._id:
                assert "error" not in reply, reply["error"]
                return reply["result"]

    def open(self, url: str) -> tuple[str, str]:
        """A new tab at url: (target id, session id)."""
        target = self.call("Target.createTarget", url=url)["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        return target, session

    def status(self, session: str) -> dict:
        """The page's window.minipsStatus."""
        result = self.call(
            "Runtime.evaluate",
            session,
            expression="JSON.stringify(window.minipsStatus || null)",
            returnByValue=True,
        )
        return json.loads(result["result"].get("value") or "null") or {}

    def close_tab(self, target: str) -> None:
        self.call("Target.closeTarget", targetId=target)

    def screenshot(self, session: str, path: Path) -> None:
        import base64

        data = self.call("Page.captureScreenshot", session, format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self._tmp, ignore_errors=True)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.3, detail=None):
    """Poll predicate() until it returns something truthy; fail with `what` after timeout
    (and what `detail()` then says: the state a failure is read from)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    seen = f"; then: {detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{seen}")


def quiet_env() -> dict:
    """Environment for worker subprocesses: one BLAS thread, as `minips run` gives them."""
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def numpy_case(model_name: str, batch: int, seed: int) -> dict:
    """NumPy's forward and backward on one batch of the synthetic data, for the JavaScript
    network to match: spec (the model's {name, kwargs}), params, x, labels, logits, loss,
    grads (float32 arrays by parameter name)."""
    from minips.data import load_dataset
    from minips.nn import build_model, softmax_cross_entropy

    model = build_model(model_name, seed=seed)
    data = load_dataset("synthetic").shard(0, 4)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(data.y_train), batch, replace=False)
    x, labels = data.x_train[pick], data.y_train[pick]
    # Perturb the biases off zero so a wrong bias gradient or broadcast cannot hide.
    for name, param in model.params.items():
        if name.endswith(".b"):
            param += rng.normal(0, 0.1, param.shape).astype(np.float32)
    logits = model.forward(x)
    loss, dlogits = softmax_cross_entropy(logits, labels)
    model.backward(dlogits)
    params = {name: param.copy() for name, param in model.params.items()}
    grads = {name: model.grads[name].copy() for name in params}
    return {"spec": model.spec, "params": params, "x": x, "labels": labels, "logits": logits,
            "loss": float(loss), "grads": grads}  # fmt: skip
