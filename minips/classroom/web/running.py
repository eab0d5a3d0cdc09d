"""A gateway serving in a background thread: `start_gateway(connect)` for launchers and
tests (`minips web` serves in its own event loop instead: Gateway.serve)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from minips.classroom.web.admission import Admission
from minips.classroom.web.gateway import Gateway, parse_listen
from minips.errors import ConfigError


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
    connect: str,
    listen: str = "127.0.0.1:0",
    data_dir: str | Path | None = None,
    admission: Admission | None = None,
) -> RunningGateway:
    """Start a gateway in a background thread for the server at `connect`; for launchers.

    listen: "HOST:PORT" (port 0: any free port; read `.url`). Returns once it accepts
    connections; ConfigError (one line) when it cannot (websockets missing, port taken).
    """
    host, port = parse_listen(listen)
    return RunningGateway(Gateway(connect, host, port, data_dir, admission)).start()
