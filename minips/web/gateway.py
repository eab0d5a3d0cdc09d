"""The web gateway: browsers join a minips run as workers, over HTTP and WebSocket.

Browsers cannot speak ZeroMQ, so one asyncio process sits between them and the server:

    browser --HTTP GET--> gateway        the page, its JavaScript, data shards (IDX)
    browser <==WebSocket==> gateway <==DEALER==> parameter server
            one binary WS message = one ZeroMQ message (framing.py, protocol.md §14)

Each WebSocket gets its own DEALER socket, so to the server every browser is an ordinary
worker; the gateway never reads the messages it relays (the browser says hello, pulls,
pushes and says bye itself). When a tab closes, its DEALER closes and the server, hearing
nothing more from that worker, declares it dead after its heartbeat timeout.

`Gateway.serve()` runs it in the current event loop (`minips web`); `start_gateway()` runs
it in a background thread, for a launcher (`minips run --browser N`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

import zmq
import zmq.asyncio

from minips.errors import ConfigError, DataError, MinipsError
from minips.protocol.wire import DEFAULT_LIMITS
from minips.web.framing import FramingError, pack_frames, unpack_frames
from minips.web.shards import DatasetCache

try:  # the optional extra: pip install 'minips[web]'
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.datastructures import Headers
    from websockets.exceptions import ConnectionClosed
    from websockets.http11 import Request, Response
except ImportError:  # pragma: no cover - reported by check_installed()
    serve = None

log = logging.getLogger("minips.web")

STATIC_DIR = Path(__file__).resolve().parent / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
WS_PATH = "/ws"
_STATIC = re.compile(r"^/static/([A-Za-z0-9_-]+\.(?:js|css|html))$")
_SHARD = re.compile(r"^/data/([a-z0-9-]+)/train/(\d{1,6})/(\d{1,6})/(images|labels)$")
_TEST = re.compile(r"^/data/([a-z0-9-]+)/test/(images|labels)$")
_INFO = re.compile(r"^/data/([a-z0-9-]+)/info$")
# A WebSocket message holds a whole ZeroMQ message plus the frame lengths.
MAX_WS_MESSAGE = DEFAULT_LIMITS.max_message_bytes + DEFAULT_LIMITS.max_header_bytes


def check_installed() -> None:
    """ConfigError (one line) when the optional `websockets` package is missing."""
    if serve is None:
        raise ConfigError("the web gateway needs the websockets package: pip install 'minips[web]'")


def parse_listen(listen: str) -> tuple[str, int]:
    """ "HOST:PORT" -> (host, port); ConfigError for anything else. Port 0 picks a free one."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen wants HOST:PORT, e.g. 127.0.0.1:8080, got {listen!r}")
    return host.strip("[]"), int(port)


@dataclass
class GatewayStats:
    """Counters shown in the log and used by tests."""

    connections: int = 0  # WebSockets accepted so far
    open: int = 0  # WebSockets open now
    messages_up: int = 0  # browser -> server
    messages_down: int = 0  # server -> browser
    refused: list[str] = field(default_factory=list)  # why connections were closed by us


class Gateway:
    """Serve the worker page and data, relay WebSockets to the server at `connect`.

    connect: the parameter server ("tcp://HOST:PORT"). host, port: where to listen (loopback
    by default: browsers on other machines need host "0.0.0.0"). data_dir: where to look for
    datasets, as `minips worker --data-dir`.
    """

    def __init__(
        self,
        connect: str,
        host: str = "127.0.0.1",
        port: int = 8080,
        data_dir: str | Path | None = None,
    ) -> None:
        check_installed()
        self.connect = connect
        self.host, self.port = host, port
        self.datasets = DatasetCache(data_dir)
        self.stats = GatewayStats()
        self._context = zmq.asyncio.Context()
        self._stop: asyncio.Event | None = None
        self.group: bool | None = None  # the server is a group's root (asked once)

    @property
    def url(self) -> str:
        """The page's address (the real port once serving, when port 0 was asked for)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def serve(self, ready: Callable[[], object] | None = None) -> None:
        """Serve until `stop()` is called (or the task is cancelled); `ready()` once listening."""
        self._stop = asyncio.Event()
        async with serve(
            self._relay,
            self.host,
            self.port,
            process_request=self._http,
            max_size=MAX_WS_MESSAGE,
            compression=None,  # gradients do not compress; deflate would only cost CPU
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            log.info("minips web gateway on %s, relaying to %s", self.url, self.connect)
            if ready is not None:
                ready()
            await self._stop.wait()
        self._context.term()

    def stop(self) -> None:
        """Ask `serve()` to return (call from the gateway's own event loop)."""
        if self._stop is not None:
            self._stop.set()

    # ------------------------------------------------------------------------ WebSocket

    async def _relay(self, ws: ServerConnection) -> None:
        """Pump one browser's messages to its own DEALER socket and the replies back (to
        a server group: through a GroupRelay that joins the group for the browser)."""
        if self.group is None:
            self.group = await asyncio.to_thread(_is_group, self.connect)
        if self.group:
            await self._relay_to_group(ws)
            return
        self.stats.connections += 1
        self.stats.open += 1
        peer = ws.remote_address
        log.info("browser %s connected", peer)
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.connect)
        down = asyncio.create_task(self._downstream(sock, ws))
        try:
            async for message in ws:
                if isinstance(message, str):
                    await self._refuse(ws, 1003, "minips sends binary messages only")
                    return
                try:
                    frames = unpack_frames(message)
                except FramingError as exc:
                    await self._refuse(ws, 1007, f"bad framing: {exc}")
                    return
                await sock.send_multipart(frames, copy=False)
                self.stats.messages_up += 1
        except ConnectionClosed:
            pass
        finally:
            down.cancel()
            sock.close(linger=0)
            self.stats.open -= 1
            log.info("browser %s disconnected", peer)

    async def _relay_to_group(self, ws: ServerConnection) -> None:
        """One browser in front of a server group: each request read and made on the
        group, each reply as one server's (minips.web.grouprelay, protocol.md 14.4)."""
        from minips.web.grouprelay import GroupRelay

        self.stats.connections += 1
        self.stats.open += 1
        relay = GroupRelay(self.connect)
        try:
            async for message in ws:
                if isinstance(message, str):
                    await self._refuse(ws, 1003, "minips sends binary messages only")
                    return
                try:
                    frames = unpack_frames(message)
                except FramingError as exc:
                    await self._refuse(ws, 1007, f"bad framing: {exc}")
                    return
                self.stats.messages_up += 1
                reply = await asyncio.to_thread(relay.handle, [bytes(f) for f in frames])
                if reply is not None:
                    await ws.send(pack_frames([memoryview(f).cast("B") for f in reply]))
                    self.stats.messages_down += 1
        except ConnectionClosed:
            pass
        finally:
            await asyncio.to_thread(relay.close)
            self.stats.open -= 1

    async def _downstream(self, sock: zmq.asyncio.Socket, ws: ServerConnection) -> None:
        """Every reply the server sends on this DEALER goes to the browser, in order."""
        try:
            while True:
                frames = await sock.recv_multipart(copy=False)
                await ws.send(pack_frames([frame.buffer for frame in frames]))
                self.stats.messages_down += 1
        except ConnectionClosed:
            pass

    async def _refuse(self, ws: ServerConnection, code: int, reason: str) -> None:
        log.warning("closing browser %s: %s", ws.remote_address, reason)
        self.stats.refused.append(reason)
        await ws.close(code, reason[:120])  # a close reason is at most 123 bytes

    # ----------------------------------------------------------------------------- HTTP

    async def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        """Answer plain GETs; return None to let a WebSocket handshake on /ws go on."""
        path = request.path.split("?", 1)[0]
        if path == WS_PATH:
            return None
        try:
            body, content_type = await asyncio.to_thread(self._route, path)
        except LookupError:
            return _response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
        except MinipsError as exc:  # unknown dataset or bad rank (400), missing files (404)
            status = HTTPStatus.NOT_FOUND if isinstance(exc, DataError) else HTTPStatus.BAD_REQUEST
            return _response(status, f"error: {exc}\n".encode(), "text/plain")
        return _response(HTTPStatus.OK, body, content_type)

    def _route(self, path: str) -> tuple[bytes, str]:
        """(body, content type) for a GET of `path`; LookupError when there is none."""
        if path in ("/", "/index.html"):
            return (STATIC_DIR / "index.html").read_bytes(), CONTENT_TYPES[".html"]
        if match := _STATIC.match(path):
            file = STATIC_DIR / match.group(1)
            if not file.is_file():
                raise LookupError(path)
            return file.read_bytes(), CONTENT_TYPES[file.suffix]
        if match := _INFO.match(path):
            info = self.datasets.get(match.group(1)).info()
            return json.dumps(info).encode(), "application/json"
        if match := _SHARD.match(path):
            name, rank, world_size, part = match.groups()
            body = self.datasets.get(name).train_shard(int(rank), int(world_size), part)
            return body, "application/octet-stream"
        if match := _TEST.match(path):
            return self.datasets.get(match.group(1)).test_set(match.group(2)), (
                "application/octet-stream"
            )
        raise LookupError(path)


def _is_group(connect: str) -> bool:
    """Whether the server at `connect` is a server group's root (its stats say `group`);
    False when it does not answer (the frames are then relayed as they are)."""
    from minips.worker.client import PSClient, ServerUnavailable

    try:
        with PSClient(connect, timeout=3.0, retries=1) as probe:
            return "group" in probe.stats()
    except ServerUnavailable:
        return False


def _response(status: HTTPStatus, body: bytes, content_type: str) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-cache"),
            ("Connection", "close"),
        ]
    )
    return Response(status.value, status.phrase, headers, body)


class RunningGateway:
    """A gateway serving in a background thread; `url` to open, `close()` to stop it."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="minips-web", daemon=True)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self.gateway.serve(self._ready.set))
        except BaseException as exc:  # reported by start(); the thread must not die silently
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    def start(self, timeout: float = 10.0) -> RunningGateway:
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise ConfigError(f"web gateway did not start: {self._error or 'timed out'}")
        return self

    @property
    def url(self) -> str:
        return self.gateway.url

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and wait for the thread (idempotent)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.gateway.stop)
            self._thread.join(timeout)

    def __enter__(self) -> RunningGateway:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def start_gateway(
    connect: str, listen: str = "127.0.0.1:0", data_dir: str | Path | None = None
) -> RunningGateway:
    """Start a gateway in a background thread for the server at `connect`; for launchers.

    listen: "HOST:PORT" (port 0: any free port; read `.url`). Returns once it accepts
    connections; ConfigError (one line) when it cannot (websockets missing, port taken).
    """
    host, port = parse_listen(listen)
    return RunningGateway(Gateway(connect, host, port, data_dir)).start()
