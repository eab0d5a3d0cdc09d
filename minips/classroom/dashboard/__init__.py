"""A live view of a running parameter server in the browser, read-only like the evaluator.

    url, stop = start_dashboard("tcp://127.0.0.1:5555", "run/eval.jsonl", "127.0.0.1:8050")

A standard-library HTTP server serves one page (minips/classroom/dashboard/page.py, no CDN),
`snapshot.json` (the latest view) and `events` (Server-Sent Events: one `data:` line of JSON
per poll). The numbers come from the server's `stats` op, polled every second by
minips/classroom/dashboard/collector.py, from the `eval` records of a metrics JSONL file and the
`update` records of the server's update log when they are given. `RunDashboard` is the
page of `minips run --dashboard`, which shows the run's summary when it ends.

Bounded, whoever connects: at most MAX_THREADS requests are served at once (one more gets
503 at once), at most MAX_STREAMS of them event streams; a connection that sends nothing,
or half a request, for SOCKET_TIMEOUT seconds is dropped, and so is a stream its reader
stopped reading; an event stream ends after STREAM_LIFETIME seconds (the page's
EventSource opens a new one by itself).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any

from minips.classroom.dashboard.collector import Collector
from minips.classroom.dashboard.page import PAGE
from minips.classroom.dashboard.tails import UpdateTail, run_logs, single_log
from minips.errors import ConfigError
from minips.guard.curve import ClientKeys

KEEPALIVE = 15.0  # seconds between SSE comments when nothing changed (proxies close idle streams)
MAX_THREADS = 32  # requests served at once
MAX_STREAMS = 16  # of them, event streams (open dashboard pages)
SOCKET_TIMEOUT = 10.0  # seconds a connection may stay silent (or a stream unread)
STREAM_LIFETIME = 300.0  # seconds an event stream lasts before the page opens a new one


def parse_listen(listen: str) -> tuple[str, int]:
    """ "HOST:PORT" -> (host, port); ConfigError when it is not one."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen must be HOST:PORT (e.g. 127.0.0.1:8050), got {listen!r}")
    return host, int(port)


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that runs at most MAX_THREADS handler threads: a connection
    past that is answered 503 at once and closed, from the accepting thread."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a class's pages may connect at once

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_THREADS)
        self.streams = threading.BoundedSemaphore(MAX_STREAMS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            _refuse_busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that went away mid-answer is not an error worth a traceback."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def _error_body(reason: str) -> bytes:
    """A refusal's body: `error: REASON` on one line (a request line may hold a CR)."""
    return f"error: {' '.join(reason.split())}\n".encode()


def _refuse_busy(request: socket.socket) -> None:
    body = b"error: the dashboard is busy (too many connections); try again in a moment\n"
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    try:
        request.settimeout(1.0)
        request.sendall(head + body)
    except OSError:
        pass  # it was not listening anyway


def _handler(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """GET and HEAD of / (the page), /snapshot.json, /events (SSE); nothing else,
        nothing written; every refusal a status and a one-line `error: ...` body."""

        timeout = SOCKET_TIMEOUT  # the socket's: a silent or half-sent request is dropped
        server: BoundedHTTPServer

        def do_HEAD(self) -> None:  # noqa: N802 (the http.server name)
            self.do_GET()  # _send and _stream leave the body out

        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            path = self.path.split("?")[0]
            if path in ("/", "/index.html"):
                self._send(200, "text/html; charset=utf-8", PAGE.encode())
            elif path == "/snapshot.json":
                body = json.dumps(collector.snapshot()).encode()
                self._send(200, "application/json", body)
            elif path == "/events":
                self._stream()
            else:
                self._send(404, "text/plain; charset=utf-8", _error_body(f"nothing at {path}"))

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            """The refusals http.server makes itself (a request line or headers it cannot
            read, too many headers, a method it has no do_ for) as a status and a one-line
            `error: ...` body, like the dashboard's own; a method is 405, not 501."""
            headers = {"Connection": "close"}
            if code == HTTPStatus.NOT_IMPLEMENTED:  # what http.server answers an unknown method
                code, headers["Allow"] = HTTPStatus.METHOD_NOT_ALLOWED, "GET, HEAD"
                message = f"method {self.command} not allowed: GET and HEAD only"
            self.close_connection = True
            # The status line and headers even when no version could be read (http.server
            # then assumes HTTP/0.9, which has neither): the refusal must be readable.
            self.request_version = self.protocol_version
            self._send(code, "text/plain; charset=utf-8",
                       _error_body(message or HTTPStatus(code).phrase), headers)  # fmt: skip

        def _send(
            self, code: int, content_type: str, body: bytes, headers: dict[str, str] | None = None
        ) -> None:
            """Status, headers and (but to a HEAD) the body."""
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _stream(self) -> None:
            if not self.server.streams.acquire(blocking=False):
                body = f"error: {MAX_STREAMS} dashboard pages are open already\n".encode()
                self._send(503, "text/plain; charset=utf-8", body)
                return
            try:
                self._events()
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                pass  # the browser went away, or stopped reading
            finally:
                self.server.streams.release()

        def _events(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command == "HEAD":
                return
            self.wfile.write(b"retry: 1000\n\n")  # EventSource: reconnect after 1 s
            seq, ends = -1, time.monotonic() + STREAM_LIFETIME
            while not collector.stopped and (left := ends - time.monotonic()) > 0:
                snapshot = collector.wait_newer(seq, min(KEEPALIVE, left))
                if snapshot["seq"] > seq:
                    seq = snapshot["seq"]
                    self.wfile.write(b"data: " + json.dumps(snapshot).encode() + b"\n\n")
                else:
                    self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # a request log line per second of SSE would drown the terminal

    return Handler


def start_dashboard(
    connect: str,
    metrics_path: str | Path | None = None,
    listen: str = "127.0.0.1:8050",
    updates: UpdateTail | str | Path | None = None,
    keys: ClientKeys | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> tuple[str, Callable[[], None]]:
    """Serve the dashboard for the server at `connect`; return (page URL, stop function).

    listen "HOST:PORT" (port 0: any free port; the URL says which). updates: the server's
    update log (a path, or a tails.UpdateTail), for the staleness histogram. keys: the
    client keys of an authenticated server. on_notice: told in one line when nothing
    answers at `connect` and when it answers again (Collector). Runs in daemon threads;
    call the stop function to close the HTTP server and the `stats` poller.
    """
    url, collector, stop = _serve(connect, metrics_path, listen, updates, keys, on_notice)
    return url, stop


def _serve(
    connect: str,
    metrics_path: str | Path | None,
    listen: str,
    updates: UpdateTail | str | Path | None,
    keys: ClientKeys | None,
    on_notice: Callable[[str], None] | None = None,
) -> tuple[str, Collector, Callable[[], None]]:
    host, port = parse_listen(listen)
    if not isinstance(updates, UpdateTail):
        updates = UpdateTail(single_log(updates))
    collector = Collector(connect, metrics_path, updates=updates, keys=keys, on_notice=on_notice)
    try:
        httpd = BoundedHTTPServer((host, port), _handler(collector))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    collector.start()
    thread = Thread(target=httpd.serve_forever, name="dashboard-http", daemon=True)
    thread.start()
    url = f"http://{host}:{httpd.server_address[1]}/"

    def stop() -> None:
        collector.stop()  # ends the SSE loops first, so shutdown does not wait on them
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)

    return url, collector, stop


class RunDashboard:
    """`minips run --dashboard`: the live page of a run directory from the moment its
    processes are started (`start(endpoint)`) until it ends (`finish(summary)`: the page
    then shows "finished" and the summary, and keeps them once the run's process exits).
    listen None: no page. keys_dir: an authenticated run's key directory (the page asks
    `stats` with its operator key)."""

    FINAL_GRACE = 2.0  # seconds the open pages get to receive the final snapshot

    def __init__(self, listen: str | None, out: Path, keys_dir: str | Path | None = None) -> None:
        self.listen, self.out, self.keys_dir = listen, out, keys_dir
        self.collector: Collector | None = None
        self._stop: Callable[[], None] | None = None

    def __enter__(self) -> RunDashboard:
        return self

    def start(self, endpoint: str) -> str | None:
        """Serve the page; its URL (None without a page)."""
        if self.listen is None:
            return None
        from minips.provision.keyfiles import OPERATOR, load_client_keys

        keys = load_client_keys(self.keys_dir, OPERATOR) if self.keys_dir else None
        url, self.collector, self._stop = _serve(
            endpoint, self.out / "eval.jsonl", self.listen, UpdateTail(run_logs(self.out)), keys
        )
        self.collector.labels = run_labels(self.out)
        return url

    def finish(self, summary: dict[str, Any] | None) -> None:
        """The run ended: show its summary, give the open pages a moment to receive it."""
        if self.collector is not None:
            self.collector.finish(summary)
            time.sleep(self.FINAL_GRACE)

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._stop()


def run_labels(out: Path) -> dict[str, Any] | None:
    """Each worker's examples per label under the run's --partition (None: iid, or no
    config.json to read it from): a row per worker on the page."""
    from minips.results.report_labels import label_summary

    try:
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return label_summary(config)


__all__ = ["RunDashboard", "start_dashboard"]
