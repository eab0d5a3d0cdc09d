"""The server's ROUTER socket: opening it, receiving a request, its envelope, the sending side.

ZeroMQ's ROUTER prepends each message with the routing id of the connection it came from;
a reply sent with that id goes back to the same peer. `receive` reads one message, keeping
at most as many frames as a request may have (the rest are read and dropped, so a message
of a million empty frames costs no memory of ours: docs/protocol.md 10); `split_envelope`
takes the id (and a REQ peer's empty delimiter) off a request, `Outbox` sends replies on it
and counts their bytes (an error reply: minips/ops/failures.py). Nothing here knows what
a request means.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from minips.protocol import auth, wire
from minips.state.requests import Origin

if TYPE_CHECKING:
    from minips.state.registry import WorkerState


@dataclass(eq=False)
class Envelope:
    """Where a reply goes: ROUTER routing frames (+ REQ delimiters) and the request id."""

    routing: list[Any]
    rid: int | None = None
    origin: Origin = Origin(b"")  # who sent it: routing id, CURVE key
    answered: bool = False  # a reply went: a failure after it sends no second one


@dataclass
class Received:
    """One message as `receive` read it: its first frames, and what was dropped past them."""

    frames: list[zmq.Frame]  # the routing id first
    dropped: int = 0  # frames read past the limit and let go
    dropped_bytes: int = 0  # their bytes


def receive(socket: zmq.Socket, keep: int) -> Received:
    """Read one whole message (zmq.Again when none is waiting), keeping its first `keep`
    frames: the routing id, a REQ delimiter, the header and the most array frames a request
    may have, plus one, so an over-long message is still seen to be one. Frames past those
    are read one at a time and let go at once."""
    frame = socket.recv(zmq.NOBLOCK, copy=False)
    frames, recv = [frame], socket.recv
    while frame.more and len(frames) < keep:
        frame = recv(0, False)
        frames.append(frame)
    dropped = dropped_bytes = 0
    while frame.more:  # past the limit: each frame let go as soon as it is read
        frame = recv(0, False)
        dropped += 1
        dropped_bytes += len(frame)
    return Received(frames, dropped, dropped_bytes)


def split_envelope(frames: list[Any]) -> tuple[Envelope, list[Any]]:
    """ROUTER prepends the peer's routing id; a REQ peer adds one empty delimiter frame.

    (Only when a frame follows it: a lone empty frame is a malformed header. A second
    empty frame is not a delimiter: it is the header, empty, so the request is malformed.)
    """
    split = 2 if len(frames) > 2 and len(frames[1]) == 0 else 1
    key = auth.sender_key(frames[0]) if isinstance(frames[0], zmq.Frame) else None
    origin = Origin(bytes(frames[0]), key)
    return Envelope(routing=frames[:split], origin=origin), frames[split:]


def open_router(
    context: zmq.Context, keys: auth.ServerSocketKeys | None
) -> tuple[zmq.Socket, auth.Gatekeeper | None]:
    """The server's ROUTER socket and (with keys) CURVE and the thread that checks every
    client's key. Its memory caps are the operations' (set before it binds)."""
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a worker's reconnection takes its id over
    socket.setsockopt(zmq.LINGER, 1000)  # let final replies leave on close
    gatekeeper = keys.secure(context, socket) if keys is not None else None
    return socket, gatekeeper


class Counting(Protocol):
    """The counters the sending side adds to (ops/telemetry.py's Counters; `errors`: the
    error replies, ops/failures.py)."""

    bytes_out: int
    errors: int


class Outbox:
    """The server's sending side: replies on a request's envelope, their bytes counted."""

    def __init__(self, socket: zmq.Socket, counters: Counting) -> None:
        self.socket, self.counters = socket, counters

    def reply(
        self,
        envelope: Envelope,
        header: dict[str, Any],
        worker: WorkerState | None = None,
        parts: Sequence[wire.WirePart] = (),
    ) -> None:
        """Send a reply (with the request's rid) and count its bytes; booked on the worker
        too, with the time: its silence (liveness) counts from its last reply."""
        if envelope.rid is not None:
            header = {**header, "rid": envelope.rid}
        envelope.answered = True
        nbytes = self.send(envelope.routing, wire.encode_parts(header, parts))
        if worker is not None:
            worker.bytes_out += nbytes
            worker.last_answered = time.monotonic()

    def send(self, routing: list[Any], frames: list[Any]) -> int:
        """Send frames without copying; returns their bytes (the routing frames left out)."""
        self.socket.send_multipart([*routing, *frames], copy=False)
        nbytes = sum(len(f) if isinstance(f, bytes) else f.nbytes for f in frames)
        self.counters.bytes_out += nbytes
        return nbytes
