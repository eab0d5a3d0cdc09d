"""What the gateway lets in, sent for real: foreign Origins, other HTTP methods, more
WebSockets than its cap, more bytes in flight than its memory bound (docs/protocol.md
§14.4), and the seat a closed tab gives back (§14.3). Real sockets, a real server."""

import asyncio
import http.client
import json
import resource
import subprocess
import sys
import time
from contextlib import ExitStack
from urllib.parse import urlsplit

import msgpack
import pytest
from test_server_support import running_server

from minips.classroom.web.admission import Admission
from minips.classroom.web.framing import pack_frames, unpack_frames
from minips.errors import ConfigError

websockets = pytest.importorskip(
    "websockets", reason="websockets not installed: pip install '.[web]'"
)
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.protocol import State  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from minips.classroom.web import start_gateway  # noqa: E402


def _ws_url(gateway) -> str:
    return gateway.url.replace("http", "ws") + "ws"


def _request(ws, header: dict) -> dict:
    ws.send(pack_frames([msgpack.packb({"v": 1, **header})]))
    return msgpack.unpackb(unpack_frames(ws.recv(timeout=10))[0])


def _http(url: str, method: str, path: str) -> tuple[int, dict, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, path)
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------------- HTTP


def test_only_get_and_head_are_answered_and_errors_are_one_line():
    with running_server() as server, start_gateway(server.endpoint) as gateway:
        for method in ("POST", "PUT", "DELETE", "TRACE", "OPTIONS", "PATCH"):
            for path in ("/", "/static/page.js", "/data/synthetic/info", "/ws"):
                status, headers, body = _http(gateway.url, method, path)
                assert status == 405, (method, path)
                assert headers["Allow"] == "GET, HEAD"
                assert body == f"error: method {method} not allowed: this gateway answers " \
                    "GET and HEAD only\n".encode()  # fmt: skip
        status, headers, body = _http(gateway.url, "GET", "/")
        head_status, head_headers, head_body = _http(gateway.url, "HEAD", "/")
        assert status == head_status == 200 and head_body == b""
        assert head_headers["Content-Length"] == headers["Content-Length"] == str(len(body))

        status, headers, body = _http(gateway.url, "GET", "/peer")
        assert status == 200 and json.loads(body) == {"address": "127.0.0.1"}

        status, _, body = _http(gateway.url, "GET", "/nothing/here")
        assert status == 404 and body == b"error: nothing at /nothing/here (the worker page is /)\n"
        for bad in ("x/3", "0/three", "-1/3", "1.5/3"):
            status, _, body = _http(gateway.url, "GET", f"/data/synthetic/train/{bad}/images")
            assert status == 400 and body.startswith(b"error: bad shard"), (bad, body)
            assert body.count(b"\n") == 1
        status, _, body = _http(gateway.url, "HEAD", "/data/imagenet/info")
        assert status == 400 and body == b""


# ------------------------------------------------------------------------------ Origin


def test_a_page_from_another_site_cannot_open_the_websocket():
    admission = Admission(allow_origins=["https://Class.Example.org/"])
    with running_server() as server, start_gateway(server.endpoint, admission=admission) as gw:
        port = urlsplit(gw.url).port
        for evil in ("http://evil.example", f"http://evil.example:{port}", "null",
                     f"https://127.0.0.1:{port}", f"http://localhost:{port}"):  # fmt: skip
            with pytest.raises(InvalidStatus) as refused:
                connect(_ws_url(gw), origin=evil, open_timeout=10)
            response = refused.value.response
            assert response.status_code == 403, evil
            assert (
                response.body.startswith(b"error: origin ") and b"--allow-origin" in response.body
            )
        # The page's own origin (as the browser wrote the address), an allowed proxy, and a
        # program that sends no Origin at all are let in.
        for origin in (f"http://127.0.0.1:{port}", "https://class.example.org", None):
            with connect(_ws_url(gw), origin=origin, open_timeout=10) as ws:
                assert _request(ws, {"op": "stats", "rid": 1})["op"] == "stats"
        assert sum("may not join" in reason for reason in gw.gateway.stats.refused) == 5


def test_bad_admission_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="--allow-origin wants an origin"):
        Admission(allow_origins=["class.example.org"])
    with pytest.raises(ConfigError, match="--max-browsers must be at least 1"):
        Admission(max_browsers=0)
    done = subprocess.run(
        [sys.executable, "-m", "minips", "web", "--connect", "tcp://127.0.0.1:1",
         "--allow-origin", "ftp://x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("error: --allow-origin wants")


# --------------------------------------------------------------------- connection cap


def _until(condition, what: str, timeout: float = 60) -> None:
    """Wait for `condition()`: an event, not a time (the bound only catches a hang)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_one_browser_past_the_cap_is_refused_clearly_and_the_others_keep_relaying():
    admission = Admission(max_browsers=3)
    with running_server() as server, start_gateway(server.endpoint, admission=admission) as gw:
        with ExitStack() as stack:
            open_ws = [stack.enter_context(connect(_ws_url(gw))) for _ in range(3)]
            with connect(_ws_url(gw)) as extra, pytest.raises(ConnectionClosed) as closed:
                extra.recv(timeout=10)
            assert closed.value.rcvd.code == 1013
            assert closed.value.rcvd.reason == (
                "the gateway is full: 3 browsers connected; try again later"
            )
            for i, ws in enumerate(open_ws):
                assert _request(ws, {"op": "stats", "rid": i})["rid"] == i
            open_ws[0].close()
            _until(lambda: gw.gateway.stats.open == 2, "the gateway to see the close")
            with connect(_ws_url(gw)) as again:  # a place came free
                assert _request(again, {"op": "stats", "rid": 9})["op"] == "stats"


def _minips_web(
    endpoint: str, tmp_path, *args: str, fd_limit: int = 1024
) -> tuple[subprocess.Popen, str]:
    """`minips web` in its own process (open-file limit 1024, as a default shell's)."""
    url_file = tmp_path / "url"

    def low_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, resource.getrlimit(7)[1]))

    proc = subprocess.Popen(
        [sys.executable, "-m", "minips", "web", "--connect", endpoint, "--listen",
         "127.0.0.1:0", "--url-file", str(url_file), *args],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "web.log", "w"),
        preexec_fn=low_fd_limit,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (url_file.exists() and url_file.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, (
            tmp_path / "web.log"
        ).read_text()
        time.sleep(0.05)
    return proc, url_file.read_text().strip()


def test_past_a_thousand_websockets_the_relay_still_works(tmp_path):
    # 1,100 WebSockets against the default cap (256) in a process started with 1,024 open
    # files: the cap refuses the rest with 1013; not one relay fails for want of a file.
    needed = 1100 + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"this test needs {needed} open files and the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    with running_server() as server:
        proc, url = _minips_web(server.endpoint, tmp_path)
        try:
            answered, refused = asyncio.run(_many_websockets(url + "ws", 1100))
        finally:
            proc.terminate()
            proc.wait(30)
    assert answered == 256 and refused == {1013: 1100 - 256}
    log = (tmp_path / "web.log").read_text()
    assert "Traceback" not in log and "Too many open files" not in log


def test_the_gateway_raises_its_open_file_limit_to_what_its_browser_cap_needs(tmp_path):
    # Started with 256 open files and --max-browsers 100: each relay holds about three
    # (its WebSocket, its DEALER's TCP socket and mailbox), so 100 fit only if the gateway
    # raised its own limit for them; every one is relayed, none refused.
    with running_server() as server:
        proc, url = _minips_web(server.endpoint, tmp_path, "--max-browsers", "100", fd_limit=256)
        try:
            answered, refused = asyncio.run(_many_websockets(url + "ws", 100))
        finally:
            proc.terminate()
            proc.wait(30)
    assert answered == 100 and refused == {}
    log = (tmp_path / "web.log").read_text()
    assert "Traceback" not in log and "Too many open files" not in log


async def _many_websockets(url: str, n: int) -> tuple[int, dict[int, int]]:
    from websockets.asyncio.client import connect as aconnect

    url = url.replace("http", "ws")
    sockets, refused, answered = [], {}, 0
    for _ in range(n):
        ws = await aconnect(url, open_timeout=30)
        sockets.append(ws)
    for i, ws in enumerate(sockets):
        try:
            await ws.send(pack_frames([msgpack.packb({"v": 1, "op": "stats", "rid": i})]))
            reply = msgpack.unpackb(unpack_frames(await asyncio.wait_for(ws.recv(), 30))[0])
            answered += reply["rid"] == i
        except ConnectionClosed as closed:
            refused[closed.rcvd.code] = refused.get(closed.rcvd.code, 0) + 1
    await asyncio.gather(*(ws.close() for ws in sockets))
    return answered, refused


# ----------------------------------------------------------------------- memory bound


def test_messages_in_flight_stay_within_the_memory_bound():
    # Four 12 MiB messages at once against a 16 MiB bound: the WebSocket whose bytes would
    # pass it is closed (1009); what was held is given back; an honest browser still relays.
    admission = Admission(max_memory=16 << 20)
    with running_server() as server, start_gateway(server.endpoint, admission=admission) as gw:
        codes = asyncio.run(_send_big_at_once(_ws_url(gw), 4, 12 << 20))
        budget = gw.gateway.budget
        assert budget.peak <= 16 << 20 and 1009 in codes, codes
        _until(lambda: budget.held == 0, "the held bytes given back")  # closed or relayed
        with connect(_ws_url(gw)) as honest:
            assert _request(honest, {"op": "stats", "rid": 1})["op"] == "stats"
        assert any("memory bound" in reason for reason in gw.gateway.stats.refused)


def test_a_relayed_message_gives_back_its_bytes_and_its_frame_header():
    # A long class sends many messages on one WebSocket: each gives back all it took from
    # the budget, its frame header too (6, 8 and 14 bytes: payloads under 126 bytes, under
    # 64 KiB, and past), or the budget runs out message by message (1009).
    with running_server() as server, start_gateway(server.endpoint) as gw:
        budget, stats = gw.gateway.budget, gw.gateway.stats
        with connect(_ws_url(gw)) as ws:
            assert _request(ws, {"op": "stats", "rid": 0})["op"] == "stats"
            for rid, pad in enumerate((0, 200, 70_000, 0, 200, 70_000), start=1):
                header = {"v": 1, "op": "stats", "rid": rid, "pad": "x" * pad}
                ws.send(pack_frames([msgpack.packb(header)]))
            _until(lambda: stats.messages_up == 7, "the gateway to relay the 7 messages")
            assert budget.held == 0


async def _send_big_at_once(url: str, n: int, size: int) -> list[int | None]:
    """n WebSockets each send one message of `size` bytes at once (a header frame too big
    for the server, which answers `too_large`); each one's close code, None: answered.
    Each says hello first (as an observer), so its bound is its model's
    (minips.classroom.web.bounds:
    the test server's model is none the gateway knows, so the protocol's limit)."""
    from websockets.asyncio.client import connect as aconnect

    message = pack_frames([b"\x00" * size])
    hello = {"v": 1, "op": "hello", "rid": 1, "worker": "", "info": {"role": "observer"}}

    async def one(i: int) -> int | None:
        ws = await aconnect(url, max_size=None, open_timeout=30)
        try:
            await ws.send(pack_frames([msgpack.packb({**hello, "worker": f"big-{i}"})]))
            await asyncio.wait_for(ws.recv(), 30)
            await ws.send(message)
            await asyncio.wait_for(ws.recv(), 60)
            return None
        except (ConnectionClosed, OSError):  # refused mid-message: the close frame says why
            await asyncio.wait_for(ws.wait_closed(), 30)
            return ws.close_code
        finally:
            if ws.state is not State.CLOSED:
                await ws.close()

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def _rss_kib(pid: int, key: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(key)


def test_the_gateway_process_memory_stays_bounded_under_four_huge_messages(tmp_path):
    # The audit's case, scaled: four 64 MiB messages at once took an unbounded gateway
    # past 4 x 64 MiB; with a 32 MiB bound its peak grows by a small multiple of 32 MiB.
    with running_server() as server:
        proc, url = _minips_web(server.endpoint, tmp_path, "--max-memory", "32")
        try:
            before = _rss_kib(proc.pid, "VmRSS")
            codes = asyncio.run(_send_big_at_once(url.replace("http", "ws") + "ws", 4, 64 << 20))
            peak = _rss_kib(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            proc.wait(30)
    assert codes.count(1009) >= 2, codes
    assert (peak - before) / 1024 < 3 * 32, (before, peak)


# ---------------------------------------------------------------------------- seats


def test_a_closed_websocket_gives_its_seat_back_at_once():
    # Heartbeat timeout 60 s: without the gateway's bye the rank would stay held a minute.
    with running_server(world_size=2, heartbeat_timeout=60) as server, \
            start_gateway(server.endpoint) as gw:  # fmt: skip
        a, b = connect(_ws_url(gw)).__enter__(), connect(_ws_url(gw)).__enter__()
        assert _request(a, {"op": "hello", "rid": 1, "worker": "tab-a"})["rank"] == 0
        assert _request(b, {"op": "hello", "rid": 1, "worker": "tab-b"})["rank"] == 1
        a.close()  # a reload: no bye from the page

        def alive(worker_id):
            rows = server.stats()["workers"]
            return next(w["alive"] for w in rows if w["worker"] == worker_id)

        deadline = time.monotonic() + 5
        while alive("tab-a"):
            assert time.monotonic() < deadline, "the seat was not given back"
            time.sleep(0.05)
        with connect(_ws_url(gw)) as back:  # the same tab, reloaded: the same rank
            assert _request(back, {"op": "hello", "rid": 1, "worker": "tab-a"})["rank"] == 0
            assert _request(back, {"op": "bye", "rid": 2, "worker": "tab-a"})["op"] == "bye"
        b.close()
        deadline = time.monotonic() + 5
        while alive("tab-b"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with connect(_ws_url(gw)) as newcomer:  # b left unfinished: its rank is free
            reply = _request(newcomer, {"op": "hello", "rid": 1, "worker": "tab-c"})
            assert reply["rank"] == 1
            with connect(_ws_url(gw)) as looker:  # an observer holds no seat to give back
                _request(
                    looker, {"op": "hello", "rid": 1, "worker": "obs", "info": {"role": "observer"}}
                )
        deadline = time.monotonic() + 5
        while alive("tab-c"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Given back: a's first connection, b's and c's; not a's second (it said bye itself)
        # nor the observer's (it holds no seat).
        assert gw.gateway.stats.seats_given_back == 3


def test_protocol_md_states_the_gateways_numbers():
    from pathlib import Path

    from minips.classroom.web import gateway, seats

    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    section = text[text.index("## 14. Browsers") : text.index("## 15.")]
    flat = " ".join(section.split())
    assert f'"rid": {seats.GATEWAY_RID}' in flat and "(rid 2^62)" in flat
    assert seats.GATEWAY_RID == 2**62
    assert f"waits up to {gateway.BYE_TIMEOUT:g} s" in flat
    assert f"every {Admission.ping_interval:g} s" in flat
    assert f"nothing, neither the pong nor any other byte, for {Admission.ping_timeout:g} s" in flat
    assert f"(default {Admission.max_browsers})" in flat
    assert f"(default {Admission.max_memory >> 20})" in flat
