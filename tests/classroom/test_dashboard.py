"""minips dashboard: snapshot and SSE against a live server, and the page itself in real
headless Chromium (DevTools protocol over a stdlib WebSocket), numbers checked against
the server's `stats`; a screenshot is taken mid-run (docs/dashboard.png is refreshed with
MINIPS_UPDATE_SCREENSHOT=1)."""

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import zmq

from minips.classroom.dashboard import parse_listen, start_dashboard
from minips.classroom.dashboard.collector import Collector, worker_rows
from minips.classroom.dashboard.tails import EvalTail
from minips.classroom.web.headless import remove_profile
from minips.errors import ConfigError
from minips.guard import wire_checks
from minips.protocol import wire
from minips.rules import DEFAULT_RULE
from minips.worker.client import PSClient

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40  # per worker, of 256 samples: a few seconds of a live run


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def minips_process(*args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "minips", *args], stdout=out, stderr=out, env=env
        )


class Cluster:
    """`minips server` (mlp, 2 workers), 2 `minips worker`s of STEPS steps (one 3x slower)
    and `minips evaluate` writing eval records; `finish()` waits for the workers and stops
    the evaluator, after which the server's stats no longer change (except uptime and the
    bytes of `stats` requests themselves)."""

    def __init__(self, tmp: Path) -> None:
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.metrics = tmp / "eval.jsonl"
        self.tmp = tmp
        server = ("server", "--model", "mlp", "--workers", "2", "--batch-size", "256",
                  "--bind", self.address)  # fmt: skip
        self.procs = [minips_process(*server, log=tmp / "server.log")]
        with PSClient(self.address, timeout=1.0, retries=60) as probe:
            probe.stats()
        evaluate = ("evaluate", "--connect", self.address, "--metrics", str(self.metrics))
        self.evaluator = minips_process(*evaluate, "--interval", "0.3", log=tmp / "eval.log")
        self.workers = [
            minips_process("worker", "--connect", self.address, "--max-steps", str(STEPS),
                           "--quiet", *extra, log=tmp / f"worker{i}.log")
            for i, extra in enumerate([(), ("--slowdown", "3")])
        ]  # fmt: skip
        self.procs += [self.evaluator, *self.workers]

    def finish(self) -> None:
        for i, worker in enumerate(self.workers):
            assert worker.wait(timeout=180) == 0, (self.tmp / f"worker{i}.log").read_text()
        deadline = time.monotonic() + 30
        while self.metrics.read_text().count('"eval"') < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.evaluator.poll() is None:
            self.evaluator.send_signal(signal.SIGTERM)  # its pings and pulls move byte counts
            self.evaluator.wait(timeout=30)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("dash"))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def cluster(live):
    live.finish()
    return live.address, live.metrics


def _stats(address: str) -> dict:
    with PSClient(address, timeout=5.0) as client:
        return client.stats()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read()


@contextlib.contextmanager
def dashboard(address, metrics):
    url, stop = start_dashboard(address, metrics, "127.0.0.1:0")
    try:
        yield url
    finally:
        stop()


def _wait_fresh(url: str) -> dict:
    """A snapshot polled after this call began (two polls later, to be sure)."""
    first = json.loads(_get(url + "snapshot.json"))["seq"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        snapshot = json.loads(_get(url + "snapshot.json"))
        if snapshot["seq"] >= first + 2:
            return snapshot
        time.sleep(0.2)
    raise AssertionError("the dashboard stopped polling")


# ------------------------------------------------------------------ the page in Chromium


class DevToolsError(Exception):
    """A DevTools call answered with an error."""


class DevTools:
    """The Chrome DevTools protocol over a minimal RFC 6455 WebSocket (stdlib only)."""

    def __init__(self, ws_url: str) -> None:
        host_port, path = ws_url.removeprefix("ws://").split("/", 1)
        host, port = host_port.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(1)
        assert b" 101 " in response.split(b"\r\n")[0], response
        self.next_id = 0

    def _send(self, text: str) -> None:
        payload, mask = text.encode(), os.urandom(4)
        n = len(payload)
        header = bytes([0x81]) + (
            bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
            if n < 65536 else bytes([0x80 | 127]) + n.to_bytes(8, "big")
        )  # fmt: skip
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "DevTools closed the connection"
            data += chunk
        return data

    def _receive(self) -> str:
        message = b""
        while True:
            first, second = self._exact(2)
            n = second & 0x7F
            if n == 126:
                n = int.from_bytes(self._exact(2), "big")
            elif n == 127:
                n = int.from_bytes(self._exact(8), "big")
            message += self._exact(n)
            if first & 0x80:  # FIN: the last fragment
                return message.decode()

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._receive())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")


@contextlib.contextmanager
def chromium_page(url: str):
    """Headless Chromium on a page; yields a DevTools session to it."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip(
            "no chromium on PATH (apt-get install chromium): the page was not tested in a browser"
        )
    # Not a TemporaryDirectory: Chromium's helper processes may still write in the profile
    # for a moment after the browser is killed, so it is removed with retries (and the
    # whole process group is killed, not only the browser).
    profile = tempfile.mkdtemp(prefix="minips-test-chromium-")
    try:
        proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "--window-size=1320,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "TMPDIR": profile},  # its org.chromium.* files go with it
        )  # fmt: skip
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                assert time.monotonic() < deadline and proc.poll() is None, "chromium did not start"
                time.sleep(0.1)
            port = port_file.read_text().split()[0]
            targets = json.loads(_get(f"http://127.0.0.1:{port}/json/list"))
            page = next(t for t in targets if t["type"] == "page")
            tools = DevTools(page["webSocketDebuggerUrl"])
            tools.call("Page.navigate", url=url)
            _wait_loaded(tools, url)
            yield tools
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        remove_profile(Path(profile))


def _wait_loaded(tools: DevTools, url: str, timeout: float = 60) -> None:
    """Until the page at `url` has loaded. Right after Page.navigate the tab may be between
    renderers and answer "Not attached to an active page" (seen under load)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(DevToolsError):
            where = tools.evaluate("[location.href, document.readyState]")
            if where and where[0] != "about:blank" and where[1] == "complete":
                return
        assert time.monotonic() < deadline, f"the page did not load: {url}"
        time.sleep(0.1)


READ_PAGE = """JSON.stringify({
  seq: Number(document.body.dataset.seq || 0),
  evals: document.body.dataset.evals ? Number(document.body.dataset.evals) : 0,
  stats: Object.fromEntries([...document.querySelectorAll("[id^=stat-]")]
      .map(e => [e.id, e.dataset.value])),
  workers: [...document.querySelectorAll("#workers tbody tr")].map(tr =>
      Object.fromEntries([...tr.children].map(td => [td.dataset.key, td.dataset.value]))),
  text: document.body.innerText,
})"""


def test_page_in_chromium_shows_the_servers_stats(live):
    # First in the module, so that it sees the run live (the other tests finish it).
    address, metrics = live.address, live.metrics
    with dashboard(address, metrics) as url, chromium_page(url) as tools:
        # While the run is live: a screenshot once the page shows progress and curves.
        # (Or, when the run already ended, once it shows a first snapshot.)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            page = json.loads(tools.evaluate(READ_PAGE) or "{}")
            running = any(w.poll() is None for w in live.workers)
            progress = page.get("evals", 0) >= 3 and float(
                page.get("stats", {}).get("stat-updates-per-s") or 0
            )
            if page.get("seq", 0) >= 1 and (progress or not running):
                break
            time.sleep(0.3)
        shot = tools.call("Page.captureScreenshot", format="png")["data"]
        live.finish()
        seq_before = json.loads(_get(url + "snapshot.json"))["seq"]
        deadline = time.monotonic() + 60
        while True:  # until the page has rendered a snapshot polled after the run ended
            page = json.loads(tools.evaluate(READ_PAGE) or "{}")
            if page.get("seq", 0) > seq_before + 1:
                break
            assert time.monotonic() < deadline, f"the page never updated: {page}"
            time.sleep(0.3)
    stats = _stats(address)
    shown = page["stats"]
    assert int(shown["stat-updates"]) == stats["updates"] == 2 * STEPS
    assert int(shown["stat-samples"]) == stats["samples"]
    assert int(shown["stat-version"]) == stats["version"]
    for key in ("bytes_in", "bytes_out"):  # the polls' own `stats` traffic comes on top
        assert 0 <= stats[key] - int(shown["stat-" + key.replace("_", "-")]) < 20_000, key
    assert float(shown["stat-staleness-mean"]) == pytest.approx(stats["staleness_mean"])
    assert int(shown["stat-staleness-max"]) == stats["staleness_max"]
    assert shown["stat-rule"] == DEFAULT_RULE
    last_eval = json.loads(metrics.read_text().splitlines()[-1])
    assert float(shown["stat-accuracy"]) == last_eval["accuracy"]
    rows = {w["rank"]: w for w in stats["workers"] if not w["observer"]}
    assert [int(w["rank"]) for w in page["workers"]] == sorted(rows)
    for w in page["workers"]:
        row = rows[int(w["rank"])]
        for key in ("steps", "samples", "bytes_in", "bytes_out"):
            assert int(w[key]) == row[key], (key, w, row)
        assert w["state"] == "left" and w["agent"] == "numpy"  # --max-steps: before its epochs
    assert "test accuracy vs samples" not in page["text"]  # drawn on canvas, not text
    png = base64.b64decode(shot)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # Saved beside the run's logs; MINIPS_UPDATE_SCREENSHOT=1 refreshes docs/dashboard.png
    # (not on every run: the test suite must not dirty the working tree).
    (live.tmp / "dashboard.png").write_bytes(png)
    if os.environ.get("MINIPS_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs" / "dashboard.png").write_bytes(png)


# ------------------------------------------------------- after the run, without a browser


def test_snapshot_matches_stats_and_eval_file(cluster):
    address, metrics = cluster
    with dashboard(address, metrics) as url:
        snapshot = _wait_fresh(url)
    stats = _stats(address)
    assert snapshot["connected"] and snapshot["error"] is None
    for key in ("updates", "samples", "version", "staleness_max"):
        assert snapshot["stats"][key] == stats[key], key
    for key in ("bytes_in", "bytes_out"):  # `stats` requests and replies count too: a few
        assert 0 <= stats[key] - snapshot["stats"][key] < 20_000, key  # polls' worth, no more
    assert snapshot["stats"]["updates"] == 2 * STEPS
    assert snapshot["stats"]["rule"]["name"] == DEFAULT_RULE
    rows = {w["rank"]: w for w in stats["workers"] if not w["observer"]}
    assert [w["rank"] for w in snapshot["workers"]] == [0, 1]  # the evaluator is left out
    for row in snapshot["workers"]:
        assert row["clock"] == rows[row["rank"]]["clock"] == STEPS
        assert row["bytes_in"] == rows[row["rank"]]["bytes_in"]
        assert not row["alive"] and row["samples_per_s"] == 0.0  # finished: no progress
    evals = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [e["accuracy"] for e in snapshot["evals"]] == [e["accuracy"] for e in evals]


def test_events_stream_sends_snapshots(cluster):
    address, metrics = cluster
    with dashboard(address, metrics) as url:
        with urllib.request.urlopen(url + "events", timeout=10) as stream:
            assert stream.headers["Content-Type"] == "text/event-stream"
            seqs = []
            while len(seqs) < 2:
                line = stream.readline().decode()
                if line.startswith("data: "):
                    seqs.append(json.loads(line[6:])["seq"])
        assert seqs[1] > seqs[0]
        with pytest.raises(urllib.error.HTTPError, match="404"):
            _get(url + "nothing")
        assert b"<canvas" in _get(url) and b"http" not in _get(url).split(b"<script>")[1]


def test_no_server_is_shown_not_fatal(tmp_path):
    with dashboard(f"tcp://127.0.0.1:{free_port()}", None) as url:
        deadline = time.monotonic() + 20
        while (snapshot := json.loads(_get(url + "snapshot.json")))["seq"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert not snapshot["connected"] and "no reply" in snapshot["error"]


def test_eval_tail_reads_complete_lines_only(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"event": "eval", "time": 1, "samples": 5, "accuracy": 0.5, "loss": 1}\n'
                    '{"event": "update"}\n{"event": "eval", "time": 2, "sam')  # fmt: skip
    tail = EvalTail(path)
    tail.poll()
    assert [r["accuracy"] for r in tail.records] == [0.5]
    with open(path, "a") as f:
        f.write('ples": 9, "accuracy": 0.7, "loss": 0.9}\n')
    tail.poll()
    assert [r["samples"] for r in tail.records] == [5, 9]


def test_listen_errors_are_one_line():
    assert parse_listen("0.0.0.0:8050") == ("0.0.0.0", 8050)
    for bad in ("8050", "host:", ":80", "h:99999"):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            parse_listen(bad)
    argv = [sys.executable, "-m", "minips", "dashboard", "--connect", "tcp://x:1", "--listen", "x"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: --listen must be HOST:PORT")


def test_worker_rates_use_the_oldest_poll_that_knew_the_worker():
    def poll(uptime, *workers):
        rows = [{"worker": w, "rank": r, "observer": False, "alive": True, "clock": c,
                 "pushes": c, "samples": 64 * c, "bytes_in": 0, "bytes_out": 0}
                for w, r, c in workers]  # fmt: skip
        return {"uptime": uptime, "workers": rows}

    window = [poll(0.0, ("a", 0, 0)), poll(1.0, ("a", 0, 10), ("b", 1, 0))]
    rows = worker_rows(poll(2.0, ("a", 0, 20), ("b", 1, 5)), window)
    assert [(r["rank"], r["steps_per_s"], r["samples_per_s"], r["behind"]) for r in rows] == [
        (0, 10.0, 640.0, 0),  # 20 steps in 2 s
        (1, 5.0, 320.0, 15),  # joined at 1.0: 5 steps in 1 s, not 0 for a missing start
    ]


# ------------------------------------------------- the collector against scripted stats


@contextlib.contextmanager
def scripted_stats(script, then="repeat"):
    """A ROUTER on loopback answering the collector's `stats` requests with the entries of
    `script` in turn (a server whose uptime and counters the test chooses); after the last,
    the last again (then="repeat") or no answer (then="gone": the server stopped).
    Yields its address."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    done = threading.Event()

    def serve():
        answered = 0
        while not done.is_set():
            if not router.poll(20):
                continue
            routing, *frames = router.recv_multipart()
            request = wire_checks.decode_request(frames)
            if answered >= len(script) and then == "gone":
                continue
            stats = script[min(answered, len(script) - 1)]
            reply = {"op": "stats", "rid": request.header["rid"], "stats": stats}
            router.send_multipart([routing, *wire.encode(reply)])
            answered += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        done.set()
        thread.join(timeout=10)
        context.destroy(linger=0)


def _counters(uptime, updates):
    return {"uptime": uptime, "updates": updates, "samples": 64 * updates, "workers": []}


def _rate_at(collector, uptime):
    """The updates/s the collector computed at the first poll of `uptime` (its history)."""
    deadline = time.monotonic() + 10
    while True:
        history = collector.snapshot().get("history", [])
        if found := [point for point in history if point["uptime"] == uptime]:
            return found[0]["updates_per_s"]
        assert time.monotonic() < deadline, history
        time.sleep(0.01)


def test_the_update_rate_is_averaged_over_the_last_three_seconds_of_uptime():
    # Idle for 6 s, then 30 updates a second: at uptime 10 the last 3 s say 30/s (the
    # whole run would say 12/s).
    script = [_counters(t, 30 * max(0, t - 6)) for t in range(11)]
    with scripted_stats(script) as address:
        collector = Collector(address, interval=0.01)
        collector.start()
        try:
            assert _rate_at(collector, 10) == 30.0
        finally:
            collector.stop()


def test_a_restarted_servers_counters_are_not_subtracted_from_the_old_ones():
    # Uptime 10..12 at 100 updates/s, then a new server: uptime 1 and 2, 5 updates/s.
    script = [
        _counters(10, 1000),
        _counters(11, 1100),
        _counters(12, 1200),
        _counters(1, 5),
        _counters(2, 10),
    ]
    with scripted_stats(script) as address:
        collector = Collector(address, interval=0.01)
        collector.start()
        try:
            assert _rate_at(collector, 1) == 0.0  # nothing before it in this server's life
            assert _rate_at(collector, 2) == 5.0
        finally:
            collector.stop()


def test_a_server_gone_after_the_final_eval_is_finished_and_one_gone_while_live_is_lost(
    tmp_path,
):
    metrics = tmp_path / "eval.jsonl"
    final = {"event": "eval", "time": 1, "samples": 64, "accuracy": 0.9, "loss": 0.3}
    metrics.write_text(json.dumps({**final, "final": True}) + "\n")  # the evaluator's last
    with (
        scripted_stats([_counters(1, 1)], then="gone") as ended,
        scripted_stats([_counters(1, 1)], then="gone") as crashed,
    ):
        collectors = [Collector(ended, metrics, interval=0.01), Collector(crashed, interval=0.01)]
        for collector in collectors:
            collector.start()
        try:
            deadline = time.monotonic() + 20
            while any(c.snapshot()["phase"] in ("connecting", "live") for c in collectors):
                assert time.monotonic() < deadline, [c.snapshot()["phase"] for c in collectors]
                time.sleep(0.02)
            assert [c.snapshot()["phase"] for c in collectors] == ["finished", "lost"]
        finally:
            for collector in collectors:
                collector.stop()


def test_the_snapshot_before_the_first_poll_says_it_is_not_connected():
    collector = Collector("tcp://127.0.0.1:9", interval=0.01)  # never started: no poll yet
    snapshot = collector.snapshot()
    assert snapshot["connected"] is False and snapshot["phase"] == "connecting"


def test_the_page_holds_a_notice_before_the_terminal_says_it(tmp_path):
    """Nothing answers, then a server does: each line the terminal is told, the snapshot
    the page reads already holds (the page and the terminal never disagree)."""
    from test_server_support import running_server

    where = f"ipc://{tmp_path}/s.sock"
    seen: list[tuple[str, str | None]] = []
    collector = Collector(where, interval=0.05, on_notice=lambda line: seen.append(
        (line, collector.snapshot().get("notice", "absent"))))  # fmt: skip
    collector.start()
    try:
        deadline = time.monotonic() + 30
        while not seen:
            assert time.monotonic() < deadline, "nothing answers was never said"
            time.sleep(0.02)
        with running_server(bind=where):
            while len(seen) < 2:
                assert time.monotonic() < deadline + 30, "the server was never said to answer"
                time.sleep(0.02)
    finally:
        collector.stop()
    (nothing, page_then), (answers, page_now) = seen[:2]
    assert nothing.startswith("nothing answers at") and page_then == nothing
    assert answers.endswith("answers: live") and page_now is None
