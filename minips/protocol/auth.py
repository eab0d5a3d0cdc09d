"""Authentication as the core's sockets see it: the keys they are given secure them, and
every frame a CURVE server receives carries its sender's public key.

A server's keys make its ROUTER a CURVE server and start the gatekeeper that admits only
allowed client keys (before it binds); a client's make its DEALER a CURVE client of the
server (before it connects). The keys, the allow-list and the operators are
minips/guard/curve.py's (docs/protocol.md 15); the core asks only `keys.secure(...)`.
"""

from __future__ import annotations

from typing import Protocol

import zmq


class Gatekeeper(Protocol):
    """The thread that checks each connecting client's key, until `stop()`."""

    def stop(self) -> None: ...


class ServerSocketKeys(Protocol):
    """A server's keys (guard/curve.py's ServerKeys): secure its socket, before it binds."""

    def secure(self, context: zmq.Context, socket: zmq.Socket) -> Gatekeeper: ...


class ClientSocketKeys(Protocol):
    """A client's keys (guard/curve.py's ClientKeys): secure its socket, before it connects."""

    def secure(self, socket: zmq.Socket) -> None: ...


def sender_key(frame: zmq.Frame) -> bytes | None:
    """The Z85 public key a received frame came with (None without CURVE)."""
    try:
        user_id = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError):  # no metadata: a plain or in-process peer
        return None
    return user_id.encode("ascii") if user_id else None
