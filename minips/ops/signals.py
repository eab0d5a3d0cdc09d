"""A server run as a process: SIGINT and SIGTERM ask for its stop, and it closes on its way out.

The core loop (`ParameterServer.run`) stops when anyone calls `request_stop`; turning a
signal into that request, and a second signal into no grace at all, is the process's
business: `serve_forever(server)` does both, `stop_on_signals(stop)` the first alone (a
launcher that must not be killed while it waits for its shards).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minips.server.server import ParameterServer
    from minips.server.stop import Stop

log = logging.getLogger("minips.server")


@contextmanager
def stop_on_signals(stop: Stop, after: Any = None) -> Iterator[None]:
    """SIGINT and SIGTERM request `stop` while inside (a second one cuts the grace); on
    leaving, the previous handlers come back, or `after` (signal.SIG_IGN: a process whose
    work is done ends as it stopped, whatever signal follows) in their place."""

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        if stop.requested:
            stop.cut, stop.deadline = True, 0.0
        stop.request(f"signal {signum}")
        stop.signalled = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if after is None else after)


def serve_forever(server: ParameterServer, after: Any = None) -> None:
    """`server.run()` with SIGINT/SIGTERM handlers (a second one cuts the grace), then
    `server.close()`; `after`: the handlers left once it stopped (`stop_on_signals`)."""
    with stop_on_signals(server.stop, after):
        try:
            server.run()
        finally:  # closed first: a signal while the last replies linger does not kill it
            server.close()
