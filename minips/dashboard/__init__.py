"""A live view of a running parameter server in the browser, read-only like the evaluator.

    url, stop = start_dashboard("tcp://127.0.0.1:5555", "run/eval.jsonl", "127.0.0.1:8050")

A standard-library HTTP server (one thread per connection) serves one page
(minips/dashboard/page.py, no CDN), `snapshot.json` (the latest view) and `events`
(Server-Sent Events: one `data:` line of JSON per poll). The numbers come from the
server's `stats` op, polled every second by minips/dashboard/collector.py, and from the
`eval` records of a metrics JSONL file when one is given.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

from minips.dashboard.collector import Collector
from minips.dashboard.page import PAGE
from minips.errors import ConfigError

KEEPALIVE = 15.0  # seconds between SSE comments when nothing changed (proxies close idle streams)


def parse_listen(listen: str) -> tuple[str, int]:
    """ "HOST:PORT" -> (host, port); ConfigError when it is not one."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen must be HOST:PORT (e.g. 127.0.0.1:8050), got {listen!r}")
    return host, int(port)


def _handler(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """GET / (the page), /snapshot.json, /events (SSE); nothing else, nothing written."""

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
                self._send(404, "text/plain", b"not found\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            seq = -1
            try:
                while not collector.stopped:
                    snapshot = collector.wait_newer(seq, KEEPALIVE)
                    if snapshot["seq"] > seq:
                        seq = snapshot["seq"]
                        self.wfile.write(b"data: " + json.dumps(snapshot).encode() + b"\n\n")
                    else:
                        self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the browser went away

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # a request log line per second of SSE would drown the terminal

    return Handler


def start_dashboard(
    connect: str, metrics_path: str | Path | None = None, listen: str = "127.0.0.1:8050"
) -> tuple[str, Callable[[], None]]:
    """Serve the dashboard for the server at `connect`; return (page URL, stop function).

    listen "HOST:PORT" (port 0: any free port; the URL says which). Runs in daemon threads;
    call the stop function to close the HTTP server and the `stats` poller.
    """
    host, port = parse_listen(listen)
    collector = Collector(connect, metrics_path)
    try:
        httpd = ThreadingHTTPServer((host, port), _handler(collector))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    httpd.daemon_threads = True
    collector.start()
    thread = Thread(target=httpd.serve_forever, name="dashboard-http", daemon=True)
    thread.start()
    url = f"http://{host}:{httpd.server_address[1]}/"

    def stop() -> None:
        collector.stop()  # ends the SSE loops first, so shutdown does not wait on them
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)

    return url, stop


__all__ = ["start_dashboard"]
