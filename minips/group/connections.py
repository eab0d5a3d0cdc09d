"""A worker's connections to a server group's shards: one request each, all sent, then
all replies polled.

A `Connection` is one DEALER socket to one shard, reopened on a timeout (Lazy Pirate);
`exchange` sends every shard its request at once and waits for all the replies, retrying a
shard that does not answer in time alone. minips.group.fanout's GroupClient holds one
Connection per shard and makes its requests; this module only carries them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import zmq

from minips.guard import wire_checks
from minips.guard.curve import ClientKeys
from minips.protocol import wire
from minips.protocol.wire import Limits, Message
from minips.worker.client import new_socket_if_interrupted
from minips.worker.replies import ServerUnavailable
from minips.worker.session import identified

log = logging.getLogger("minips.client")

# A DEALER with no connection to send on (e.g. its CURVE handshake was refused) blocks in
# send: give up after this long and let the reply's deadline retry, as for a lost request.
SEND_TIMEOUT_MS = 1000

Request = tuple[dict[str, Any], list[wire.WirePart]]  # header (without rid), array parts


class Connection:
    """One DEALER socket to one server, reopened on a timeout (Lazy Pirate).

    routing_id: the client's one id for its whole life, on every socket (docs/protocol.md
    15). Each request gets a new `rid`; a reply with another rid is a late one, dropped.
    """

    def __init__(
        self,
        context: zmq.Context,
        address: str,
        routing_id: bytes,
        limits: Limits,
        keys: ClientKeys | None = None,
    ) -> None:
        self.context, self.address, self.routing_id = context, address, routing_id
        self.limits, self.keys = limits, keys
        self.rid = 0
        self.socket: zmq.Socket | None = None

    def send(self, header: dict[str, Any], parts: list[wire.WirePart]) -> int:
        """Encode and send one request with a new rid; return its frames' bytes."""
        if self.socket is None:
            self.socket = self._connected_socket()
        self.rid += 1
        frames = wire.encode_parts({**identified(header), "rid": self.rid}, parts)
        try:
            with new_socket_if_interrupted(self.abandon):
                self.socket.send_multipart(frames, copy=False)
        except zmq.Again:  # lost before it left: its reply's deadline sends it again
            return 0
        return sum(len(f) if isinstance(f, bytes) else f.nbytes for f in frames)

    def _connected_socket(self) -> zmq.Socket:
        """A new DEALER with our routing id, connected; kept only once whole: an interrupt
        (each pyzmq call may raise one) while it is set up closes it, and the next request
        builds another rather than sending on a half-made one."""
        socket = self.context.socket(zmq.DEALER)
        try:
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.MAXMSGSIZE, 2 * self.limits.max_message_bytes)
            socket.setsockopt(zmq.ROUTING_ID, self.routing_id)
            socket.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
            if self.keys is not None:
                self.keys.secure(socket)
            socket.connect(self.address)
        except BaseException:
            socket.close(linger=0)
            raise
        return socket

    def take(self) -> tuple[Message | None, int]:
        """The reply to the last request if it has arrived (never waits), and the bytes of
        every frame read (late replies included)."""
        nbytes = 0
        while True:
            try:
                with new_socket_if_interrupted(self.abandon):
                    frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None, nbytes
            nbytes += sum(len(f) for f in frames)
            message = wire_checks.decode_reply(frames, self.limits)
            if message.header.get("rid") == self.rid:
                return message, nbytes

    def abandon(self) -> None:
        """No reply in time: close the socket (it may hold a half-sent request or a reply
        we no longer want); the next request opens a new one."""
        if self.socket is not None:
            self.socket.close(linger=0)
            self.socket = None


def exchange(
    connections: list[Connection],
    requests: Mapping[int, Request],
    timeout: float,
    retries: int,
    link: Any = None,
    tolerate: bool = False,
) -> dict[int, Message]:
    """Send every request (shard -> request) at once, then wait for all the replies.

    A shard whose reply does not come within `timeout` gets its request again on a new
    socket, up to `retries` times (the others' replies are kept); then ServerUnavailable
    naming it, or with `tolerate` (an operator asking shards that may have stopped) it is
    left out of the replies. Error replies are returned as they came. link: the worker's
    token buckets (--bandwidth), crossed by every request and reply.
    """
    attempts = dict.fromkeys(requests, 0)
    deadlines: dict[int, float] = {}
    for shard, (header, parts) in requests.items():
        _send(connections[shard], header, parts, link)
        deadlines[shard] = time.monotonic() + timeout
    replies: dict[int, Message] = {}
    while len(replies) < len(requests):
        waiting = [shard for shard in requests if shard not in replies]
        poller = zmq.Poller()
        for shard in waiting:
            poller.register(connections[shard].socket, zmq.POLLIN)
        wait = min(deadlines[shard] for shard in waiting) - time.monotonic()
        ready = dict(poller.poll(max(0.0, wait) * 1000))
        for shard in waiting:
            if connections[shard].socket in ready:
                message, nbytes = connections[shard].take()
                if link is not None and nbytes:
                    link.down.wait(nbytes)
                if message is not None:
                    replies[shard] = message
        now = time.monotonic()
        for shard in waiting:
            if shard in replies or now < deadlines[shard]:
                continue
            op, address = requests[shard][0]["op"], connections[shard].address
            log.warning("no reply to %s from shard %d at %s in %.1f s (attempt %d of %d)",
                        op, shard, address, timeout, attempts[shard] + 1, 1 + retries)  # fmt: skip
            connections[shard].abandon()
            attempts[shard] += 1
            if attempts[shard] > retries and tolerate:
                requests = {j: r for j, r in requests.items() if j != shard}
                continue
            if attempts[shard] > retries:
                raise ServerUnavailable(
                    f"no reply from shard {shard} of the server group at {address} "
                    f"({1 + retries} attempts of {timeout:g} s)"
                )
            _send(connections[shard], *requests[shard], link)
            deadlines[shard] = now + timeout
    return replies


def _send(connection: Connection, header: dict[str, Any], parts: list, link: Any) -> None:
    if link is not None:  # the request crosses the (emulated) link first
        link.up.wait(sum(part.array.nbytes for part in parts) + 256)
    connection.send(header, parts)
