"""A client pointed at a wrong address says so: `minips worker` in one line within its
--wait (naming keys as a possible cause), `minips dashboard` on its page and in the
terminal, while it keeps trying. Real processes and sockets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from test_server_support import running_server

from minips.provision import keyfiles
from minips.worker.client import PSClient, ServerUnavailable


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(connect: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minips", "worker", "--connect", connect, *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_a_worker_to_nothing_says_so_in_one_line_within_10_s_by_default():
    connect = f"tcp://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    result = _worker(connect)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: nothing answers at {connect} (no reply in 10 s)"), lines
    assert "--keys DIR" in lines[0], lines
    # 10 s of waiting plus the start of a Python process: far from the 4 x 10 s of retries.
    assert elapsed < 35, elapsed


def test_a_worker_without_keys_or_with_others_is_told_keys_may_be_why(tmp_path):
    keyfiles.make_keys(tmp_path / "run", clients=("worker", "operator"))
    keyfiles.make_keys(tmp_path / "other", clients=("worker",), operators=())
    keys = keyfiles.load_server_keys(tmp_path / "run")
    options = [("--wait", "2"), ("--wait", "2", "--keys", str(tmp_path / "other"))]
    with running_server(bind="tcp://127.0.0.1:*", keys=keys) as server:
        with ThreadPoolExecutor(2) as pool:  # both at once: each waits its 2 s alone
            bare, other = pool.map(lambda args: _worker(server.endpoint, *args), options)
    for result in (bare, other):
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert f"error: nothing answers at {server.endpoint}" in result.stderr
    assert "give this client the run's key directory too: --keys DIR" in bare.stderr
    assert "Check that --keys holds this server's server.key" in other.stderr


class Lines:
    """A process's stdout lines, read as they come (a thread per stream would be overkill:
    select on the pipe, up to a deadline)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.seen = proc, []

    def until(self, text: str, timeout: float = 60) -> str:
        import select

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                assert line, f"the process ended: {self.seen}"
                self.seen.append(line.rstrip("\n"))
                if text in line:
                    return line
        raise AssertionError(f"no line with {text!r} in {timeout} s: {self.seen}")


def test_a_dashboard_to_nothing_says_so_on_the_page_and_terminal_and_keeps_trying():
    from test_dashboard import _wait_loaded, chromium_page

    port = _free_port()
    connect = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "minips", "dashboard", "--connect", connect,
         "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        lines = Lines(proc)
        url = lines.until("dashboard for").split(" on ")[1].split()[0]
        said = lines.until("nothing answers at")
        assert said.startswith(f"nothing answers at {connect} (still trying)"), said
        assert "--keys DIR" in said
        snapshot = json.loads(urllib.request.urlopen(url + "snapshot.json", timeout=10).read())
        assert snapshot["phase"] == "connecting" and snapshot["notice"] == said.strip()
        with chromium_page(url) as tools:
            _wait_loaded(tools, url)
            deadline = time.monotonic() + 60
            while "nothing answers" not in (tools.evaluate("document.body.innerText") or ""):
                assert time.monotonic() < deadline, "the page never said nothing answers"
                time.sleep(0.2)
        # It keeps trying: a server started there now is found.
        with running_server(bind=connect):
            assert lines.until("answers: live").strip() == f"{connect} answers: live"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_client_without_the_key_is_told_no_reply_in_bounded_time_every_time(tmp_path):
    """A CURVE server drops a plain client's connection at the handshake: a DEALER then has
    no connection to send on, and its send must time out like the wait for a reply (it
    blocked for ever, now and then: the request never left)."""
    keyfiles.make_keys(tmp_path / "run", clients=("worker", "operator"))
    keys = keyfiles.load_server_keys(tmp_path / "run")
    outcomes: list[str] = []

    def ask_many_times(address: str) -> None:
        for _ in range(20):
            with PSClient(address, timeout=0.3, retries=2) as stranger:
                try:
                    stranger.stats()
                except ServerUnavailable:
                    outcomes.append("no reply")

    with running_server(bind="tcp://127.0.0.1:*", keys=keys) as server:
        asking = threading.Thread(target=ask_many_times, args=(server.endpoint,), daemon=True)
        asking.start()
        asking.join(timeout=120)  # 20 x 3 attempts of 0.3 s (and as long to send): ~36 s
        assert not asking.is_alive(), f"a request hung after {len(outcomes)} of 20"
    assert outcomes == ["no reply"] * 20
