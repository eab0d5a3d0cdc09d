"""The web gateway: browsers join a minips run as workers, over HTTP and WebSocket.

Browsers cannot speak ZeroMQ, so one asyncio process sits between them and the server:

    browser --HTTP GET--> gateway        the page, its JavaScript, data shards (IDX)
    browser <==WebSocket==> gateway <==DEALER==> parameter server
            one binary WS message = one ZeroMQ message (framing.py, protocol.md §14)

Each WebSocket gets its own DEALER socket, so to the server every browser is an ordinary
worker: the browser says hello, pulls, pushes and says bye itself, and the gateway relays
its messages unchanged. It reads only the worker id of a hello and whether a bye came
(minips.classroom.web.seats): when a tab closes without `bye`, the gateway says it for the tab, so
its seat is free at once. What it lets in (methods, origins, how many browsers, how many
bytes in flight) is minips.classroom.web.admission; how large one message may be (a few times the
model's dense size, known from the server's hello reply) is minips.classroom.web.bounds.

`Gateway.serve()` runs it in the current event loop (`minips web`); minips.classroom.web.running's
`start_gateway()` runs it in a background thread, for a launcher or a test.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

import zmq
import zmq.asyncio

from minips.classroom.web.admission import CLOSE_FULL, FRAME_OVERHEAD, Admission, MemoryBudget
from minips.classroom.web.bounds import HEADER_ROOM, BoundedConnection, MessageBounds
from minips.classroom.web.framing import FramingError, pack_frames, unpack_frames
from minips.classroom.web.memory_return import return_memory_after_bursts
from minips.classroom.web.seats import GATEWAY_RID, Seat, peek_header
from minips.classroom.web.shards import DatasetCache
from minips.errors import ConfigError, DataError, MinipsError

try:  # the optional extra: pip install 'minips[web]'
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.datastructures import Headers
    from websockets.exceptions import ConnectionClosed
    from websockets.http11 import Request, Response
except ImportError:  # pragma: no cover - reported by check_installed()
    serve = None

log = logging.getLogger("minips.classroom.web")

STATIC_DIR = Path(__file__).resolve().parent / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".wasm": "application/wasm",
}
WS_PATH = "/ws"
PEER_PATH = "/peer"
_STATIC = re.compile(r"^/static/([A-Za-z0-9_-]+\.(?:js|css|html|wasm))$")
_SHARD = re.compile(r"^/data/([a-z0-9-]+)/train/([^/]+)/([^/]+)/(images|labels)$")
# a label-skewing partition's shard (docs/model.md 4.2): .../PARTITION/SEED/images
_PARTED = re.compile(
    r"^/data/([a-z0-9-]+)/train/([^/]+)/([^/]+)/([a-z]+:[0-9.]+)/([0-9]{1,20})/(images|labels)$"
)
_TEST = re.compile(r"^/data/([a-z0-9-]+)/test/(images|labels)$")
_INFO = re.compile(r"^/data/([a-z0-9-]+)/info$")
BYE_TIMEOUT = 2.0  # seconds the gateway waits for the server to answer its bye for a tab


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
    seats_given_back: int = 0  # byes the gateway said for tabs that closed without one
    refused: list[str] = field(default_factory=list)  # why connections were closed by us


class Gateway:
    """Serve the worker page and data, relay WebSockets to the server at `connect`.

    connect: the parameter server ("tcp://HOST:PORT"). host, port: where to listen (loopback
    by default: browsers on other machines need host "0.0.0.0"). data_dir: where to look for
    datasets, as `minips worker --data-dir`. admission: its limits (minips.classroom.web.admission).
    """

    def __init__(
        self,
        connect: str,
        host: str = "127.0.0.1",
        port: int = 8080,
        data_dir: str | Path | None = None,
        admission: Admission | None = None,
    ) -> None:
        check_installed()
        self.connect = connect
        self.host, self.port = host, port
        self.datasets = DatasetCache(data_dir)
        self.admission = admission or Admission()
        self.budget = MemoryBudget(self.admission.max_memory)
        self.bounds = MessageBounds()  # each message within its model's (web.bounds)
        self.stats = GatewayStats()
        self._context = zmq.asyncio.Context()
        # ZeroMQ's own cap on sockets (1023 by default) must not be what refuses a browser.
        self._context.set(zmq.MAX_SOCKETS, self.admission.max_browsers + 16)
        self._stop: asyncio.Event | None = None
        self.group: bool | None = None  # the server is a group's root (None: not known yet)

    @property
    def url(self) -> str:
        """The page's address (the real port once serving, when port 0 was asked for)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def serve(self, ready: Callable[[], object] | None = None) -> None:
        """Serve until `stop()` is called (or the task is cancelled); `ready()` once listening."""
        self._stop = asyncio.Event()
        self.admission.raise_fd_limit()
        budget, refused = self.budget, self.stats.refused

        class Connection(BoundedConnection):
            memory, refusals = budget, refused

        async with serve(
            self._relay,
            self.host,
            self.port,
            process_request=self._http,
            create_connection=Connection,
            max_size=HEADER_ROOM,  # until the server's hello reply names the model
            compression=None,  # gradients do not compress; deflate would only cost CPU
            ping_interval=self.admission.ping_interval,
            ping_timeout=self.admission.ping_timeout,
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            log.info("minips web gateway on %s, relaying to %s", self.url, self.connect)
            if ready is not None:
                ready()
            returning = asyncio.create_task(return_memory_after_bursts(self.budget))
            try:
                await self._stop.wait()
            finally:
                returning.cancel()
        self._context.term()

    def stop(self) -> None:
        """Ask `serve()` to return (call from the gateway's own event loop)."""
        if self._stop is not None:
            self._stop.set()

    # ------------------------------------------------------------------------ WebSocket

    async def _relay(self, ws: BoundedConnection) -> None:
        """Relay one browser: to its own DEALER socket (`_relay_to_server`), or to a server
        group through a GroupRelay that joins the group for it (`_relay_to_group`). It is
        counted from here, so a full gateway refuses the next one even while this one is
        still finding out whether the server is a group."""
        if reason := self.admission.full_refusal(self.stats.open):
            await self._refuse(ws, CLOSE_FULL, reason)
            return
        self.stats.connections += 1
        self.stats.open += 1
        try:
            if self.group is None:
                self.group = await asyncio.to_thread(_is_group, self.connect)
            if self.group:
                await self._relay_to_group(ws)
            else:
                await self._relay_to_server(ws)
        finally:
            self.stats.open -= 1

    async def _relay_to_server(self, ws: BoundedConnection) -> None:
        """Pump one browser's messages to its own DEALER socket and the replies back."""
        peer = ws.remote_address
        log.info("browser %s connected", peer)
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.connect)
        seat = Seat()
        down = asyncio.create_task(self._downstream(sock, ws))
        try:
            async for frames in self._requests(ws):
                seat.watch(frames)
                await sock.send_multipart(frames, copy=False)
                del frames  # a browser that goes quiet holds no message it sent
        except ConnectionClosed:
            pass
        finally:
            down.cancel()
            await asyncio.gather(down, return_exceptions=True)
            await self._give_back_seat(sock, seat, peer)
            sock.close(linger=0)
            log.info("browser %s disconnected", peer)

    async def _relay_to_group(self, ws: BoundedConnection) -> None:
        """One browser in front of a server group: each request read and made on the
        group, on the browser's own thread (minips.classroom.web.groupseat: a request held at an
        ssgd barrier holds no other browser's), each reply as one server's (protocol.md
        14.5); its seat given back when it leaves without bye, as 14.3 says."""
        from minips.classroom.web.groupseat import GroupSeat

        seat = GroupSeat(self.connect)
        try:
            async for frames in self._requests(ws):
                reply = await seat.handle(frames)
                del frames  # a browser that goes quiet holds no message it sent
                if reply is not None:
                    await self._size(ws, reply[0])
                    await ws.send(pack_frames([memoryview(f).cast("B") for f in reply]))
                    self.stats.messages_down += 1
                del reply
        except ConnectionClosed:
            pass
        finally:
            self.stats.seats_given_back += await seat.close()

    async def _requests(self, ws: BoundedConnection) -> AsyncIterator[list[memoryview]]:
        """The frames of each message a browser sends, its bytes given back to the memory
        budget once relayed; a text message (1003) or bad framing (1007) closes the
        WebSocket instead."""
        async for message in ws:
            if isinstance(message, str):
                await self._refuse(ws, 1003, "minips sends binary messages only")
                return
            try:
                frames = unpack_frames(message)
            except FramingError as exc:
                await self._refuse(ws, 1007, f"bad framing: {exc}")
                return
            yield frames  # relayed by the caller; then its bytes go back to the budget
            ws.release(len(message) + FRAME_OVERHEAD)
            self.stats.messages_up += 1
            del message, frames  # a browser that goes quiet holds no message it sent

    async def _downstream(self, sock: zmq.asyncio.Socket, ws: ServerConnection) -> None:
        """Every reply the server sends on this DEALER goes to the browser, in order."""
        try:
            while True:
                frames = await sock.recv_multipart(copy=False)
                await self._size(ws, frames[0].buffer)
                await ws.send(pack_frames([frame.buffer for frame in frames]))
                self.stats.messages_down += 1
                del frames
        except ConnectionClosed:
            pass

    async def _size(self, ws: BoundedConnection, header_frame: bytes | memoryview) -> None:
        """Before a hello reply reaches the browser: its messages' bound from the model
        the reply names (minips.classroom.web.bounds; built off the event loop the first time)."""
        if (config := ws.hello_config(header_frame)) is not None:
            model = config.get("model")
            bound = self.bounds.known(model) or await asyncio.to_thread(self.bounds.of, model)
            ws.bound_to(bound)

    async def _give_back_seat(self, sock: zmq.asyncio.Socket, seat: Seat, peer: object) -> None:
        """Say `bye` (finished: false) for a browser that left without one, on its own
        DEALER, and wait briefly for the server's answer (then its rank is free)."""
        header = seat.goodbye()
        if header is None:
            return
        log.info("browser %s (worker %s) left without bye: its seat is free", peer, seat.worker_id)
        self.stats.seats_given_back += 1
        try:
            await sock.send_multipart([header])
            await asyncio.wait_for(self._bye_answered(sock), BYE_TIMEOUT)
        except (asyncio.TimeoutError, zmq.ZMQError):
            log.warning("the server did not answer the bye for worker %s", seat.worker_id)

    @staticmethod
    async def _bye_answered(sock: zmq.asyncio.Socket) -> None:
        while peek_header((await sock.recv_multipart())[0]).get("rid") != GATEWAY_RID:
            pass  # a late reply to the browser's own last request: nobody to give it to

    async def _refuse(self, ws: ServerConnection, code: int, reason: str) -> None:
        log.warning("closing browser %s: %s", ws.remote_address, reason)
        self.stats.refused.append(reason)
        await ws.close(code, reason[:120])  # a close reason is at most 123 bytes

    # ----------------------------------------------------------------------------- HTTP

    async def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        """Answer GET and HEAD; return None to let a WebSocket handshake on /ws go on.

        Every refusal is a status and a one-line `error: ...` body (protocol.md §14.1)."""
        path = request.path.split("?", 1)[0]
        if reason := self.admission.method_refusal(request.method):
            response = _error(HTTPStatus.METHOD_NOT_ALLOWED, reason)
            response.headers["Allow"] = "GET, HEAD"
            return response
        if path == PEER_PATH:  # who the browser is, to the gateway: its hello's info.host
            peer = str((connection.remote_address or ("",))[0])
            response = _response(HTTPStatus.OK, json.dumps({"address": peer}).encode(),
                                 "application/json")  # fmt: skip
            return _without_body(response) if request.method == "HEAD" else response
        if path == WS_PATH:
            headers = request.headers
            if reason := self.admission.origin_refusal(headers.get("Origin"), headers.get("Host")):
                log.warning("refused a WebSocket from %s: %s", connection.remote_address, reason)
                self.stats.refused.append(reason)
                return _error(HTTPStatus.FORBIDDEN, reason)
            return None
        try:
            body, content_type = await asyncio.to_thread(self._route, path)
            response = _response(HTTPStatus.OK, body, content_type)
        except LookupError:
            response = _error(HTTPStatus.NOT_FOUND, f"nothing at {path} (the worker page is /)")
        except MinipsError as exc:  # unknown dataset or bad rank (400), missing files (404)
            status = HTTPStatus.NOT_FOUND if isinstance(exc, DataError) else HTTPStatus.BAD_REQUEST
            response = _error(status, str(exc))
        return _without_body(response) if request.method == "HEAD" else response

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
            rank_n, world_n = _shard_numbers(rank, world_size)
            body = self.datasets.get(name).train_shard(rank_n, world_n, part)
            return body, "application/octet-stream"
        if match := _PARTED.match(path):
            name, rank, world_size, partition, seed, part = match.groups()
            rank_n, world_n = _shard_numbers(rank, world_size)
            served = self.datasets.get(name)
            body = served.train_shard(rank_n, world_n, part, partition, int(seed))
            return body, "application/octet-stream"
        if match := _TEST.match(path):
            return self.datasets.get(match.group(1)).test_set(match.group(2)), (
                "application/octet-stream"
            )
        raise LookupError(path)


def _shard_numbers(rank: str, world_size: str) -> tuple[int, int]:
    """RANK and WORLD_SIZE of a shard path as numbers; ConfigError (400) otherwise."""
    if not (rank.isdigit() and world_size.isdigit() and len(rank) <= 6 >= len(world_size)):
        raise ConfigError(f"bad shard {rank}/{world_size}: rank and world size are numbers")
    return int(rank), int(world_size)


def _without_body(response: Response) -> Response:
    """The answer to a HEAD: the GET's status and headers (Content-Length too), no body."""
    return Response(response.status_code, response.reason_phrase, response.headers)


def _error(status: HTTPStatus, reason: str) -> Response:
    """A refusal: `status` with the one-line body "error: REASON"."""
    return _response(status, f"error: {reason}\n".encode(), "text/plain; charset=utf-8")


def _is_group(connect: str) -> bool | None:
    """Whether the server at `connect` is a server group's root (its stats say `group`);
    None when it does not answer within about 30 s (a busy or starting server: asked again
    at the next browser; this one's frames are relayed as they are)."""
    from minips.group.root import GROUPS
    from minips.ops.client_retries import RetryingClient
    from minips.worker.client import ServerUnavailable

    try:
        with RetryingClient(connect, timeout=5.0, retries=5, groups=GROUPS) as probe:
            return "group" in probe.stats()
    except ServerUnavailable:
        return None


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
