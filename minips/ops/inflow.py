"""InflowGuard: a bound on what ZeroMQ holds for messages that have not arrived whole yet.

Why. ZeroMQ hands the server a multipart message only once its last frame has arrived, and
nothing in ZeroMQ bounds the frames of a message still arriving: MAXMSGSIZE bounds one
frame, RCVHWM counts whole messages. A client that sends a 1 GB message in 60 MB frames
makes the server hold 1 GB before it can even see, let alone refuse, the message.

How. Two counters per TCP connection, both of bytes on the wire:

    received   what the kernel received on the connection (struct tcp_info's
               tcpi_bytes_received, from getsockopt(TCP_INFO); Linux >= 4.1)
    delivered  what the server got from it in complete messages, with ZMTP's framing (each
               received frame names the fd it came from: ZMQ_SRCFD)

    held = received - delivered

is what ZeroMQ (or the kernel's receive buffer) holds for that connection: a message still
arriving, or complete ones not read yet. On every turn of the server's loop, `check` cuts
(shutdown(2)) every connection holding more than `per_connection` bytes, then the largest
ones while all together hold more than `total`. ZeroMQ sees the stream end, drops the
session and frees the half-received message; the client sees its connection closed, and no
reply (docs/protocol.md section 10). Connections are learned from a socket monitor
(EVENT_ACCEPTED carries the new fd); past `max_connections`, a new one is cut at once.

The guard never closes ZeroMQ's fd: it borrows it as a Python socket only to read TCP_INFO
and to shut the connection down, and detaches it after. The bound holds at each check; what
arrives between two comes on top. The loop checks at least every poll interval (50 ms), and
every FAST_CHECK while a connection holds more than 1/16 of its bound (`wait`);
docs/protocol.md section 10 states the overshoot as measured. Without TCP_INFO or ZMQ_SRCFD
(not Linux) the guard switches itself off and says so; ipc:// connections (local, guarded
by file permissions) and inproc are not watched.

ZeroMQ's own caps on the ROUTER socket (`cap_router`: the largest frame, the replies and
whole requests queued per connection, the listen backlog) are set before it binds.

After a message of many frames (the frames past the most a request may have are read and
let go), the freed memory is given back to the system (`give_back_freed_memory`), so an
attack leaves no peak behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import socket as pysocket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from minips.protocol.wire import Limits

log = logging.getLogger("minips.inflow")

MiB = 1 << 20
TCPI_BYTES_RECEIVED = 128  # offset of the u64 tcpi_bytes_received in Linux's struct tcp_info
CURVE_FRAME_OVERHEAD = 33  # a CURVE MESSAGE command: name 8 + nonce 8 + flags 1 + MAC 16
FAST_CHECK = 0.005  # seconds between checks while a big message is arriving
SWEEP_COST = 5e-6  # seconds to measure one connection (about 3 us measured)
MAX_SWEEP_GAP = 0.05  # seconds: the longest a sweep waits, whatever the connections
WATCHED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
RECEIVE_HWM = 16  # whole requests queued per connection (docs/protocol.md 10)
LISTEN_BACKLOG = 1024  # connections waiting to be accepted


@dataclass(frozen=True)
class InflowLimits:
    """Bounds on bytes held for messages not yet received whole (docs/protocol.md 10).

    per_connection: one connection (default: the largest honest message, 256 MiB + a 1 MiB
    header, + 1 MiB for framing). total: all connections together. max_connections: TCP
    connections at once; a new one past it is cut.
    """

    per_connection: int = 258 * MiB
    total: int = 512 * MiB
    max_connections: int = 2048

    @classmethod
    def for_limits(cls, limits: Limits) -> InflowLimits:
        """The per-connection bound that lets the largest message `limits` allow through."""
        return cls(per_connection=limits.max_message_bytes + limits.max_header_bytes + MiB)


def cap_router(socket: zmq.Socket, limits: Limits, send_hwm: int) -> None:
    """ZeroMQ's own caps on the server's ROUTER socket, set before it binds (they hold for
    the connections made after): what it buffers is bounded before anything arrives."""
    # ZeroMQ refuses (drops the connection on) a frame over the real frame limit before
    # buffering it, and queues at most send_hwm replies for a client that does not read.
    socket.setsockopt(zmq.MAXMSGSIZE, max(limits.max_frame_bytes, limits.max_header_bytes))
    socket.setsockopt(zmq.SNDHWM, send_hwm)
    # Whole requests not yet read: a client sending faster than the server reads is slowed
    # by TCP, not buffered (what is still arriving is bounded by the guard below).
    socket.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    # A class connecting at once: past ZeroMQ's default backlog of 100 the SYNs are dropped
    # and retried after 1, 3, 7 ... s; the kernel caps this at net.core.somaxconn.
    socket.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)


def wire_bytes(frame_bytes: int, curve: bool) -> int:
    """Bytes one frame of `frame_bytes` takes on the wire: ZMTP 3 puts a flags byte and a
    1-byte size (up to 255) or an 8-byte size before it; CURVE wraps it in a command."""
    if curve:
        frame_bytes += CURVE_FRAME_OVERHEAD
    return frame_bytes + (2 if frame_bytes <= 255 else 9)


def dropped_wire_bytes(frames: int, frame_bytes: int, curve: bool) -> int:
    """At least what `frames` frames of `frame_bytes` bytes in all took on the wire (each
    counted with the short size: a lower bound, so `held` is never taken below zero)."""
    return wire_bytes(0, curve) * frames + frame_bytes if frames else 0


def watch_supported() -> bool:
    """Whether this system gives what the guard needs: TCP_INFO with tcpi_bytes_received
    (Linux 4.1 or later) and ZeroMQ's ZMQ_SRCFD."""
    if not hasattr(pysocket, "TCP_INFO") or not hasattr(zmq, "SRCFD"):
        return False
    with pysocket.socket() as probe:
        try:
            info = probe.getsockopt(pysocket.IPPROTO_TCP, pysocket.TCP_INFO, 256)
        except OSError:
            return False
    return len(info) >= TCPI_BYTES_RECEIVED + 8


def watch_events(router: zmq.Socket) -> zmq.Socket:
    """A socket that receives `router`'s connection events (ZeroMQ's socket monitor).

    Its queue is unbounded: a flood of connections must not drop the very events that tell
    the guard about them (ZeroMQ drops monitor events past a full queue)."""
    address = f"inproc://minips.ops.inflow.{id(router):x}"
    router.monitor(address, WATCHED)
    events = router.context.socket(zmq.PAIR)
    events.setsockopt(zmq.RCVHWM, 0)
    events.connect(address)
    return events


@contextlib.contextmanager
def borrowed(fd: int) -> Iterator[pysocket.socket]:
    """ZeroMQ's own fd as a Python socket, for a moment: detached after, so never closed.

    (Not a duplicate: a flood of connections may leave no fd free to duplicate into, just
    when the guard must act.)"""
    sock = pysocket.socket(pysocket.AF_INET, pysocket.SOCK_STREAM, 0, fileno=fd)
    try:
        yield sock
    finally:
        sock.detach()


def bytes_received(fd: int) -> int | None:
    """The kernel's count of bytes received on TCP socket `fd` (None: not available)."""
    try:
        with borrowed(fd) as sock:
            info = sock.getsockopt(pysocket.IPPROTO_TCP, pysocket.TCP_INFO, 256)
    except OSError:  # closed meanwhile, not TCP (ipc://), or no TCP_INFO
        return None
    if len(info) < TCPI_BYTES_RECEIVED + 8:  # a kernel older than 4.1
        return None
    return struct.unpack_from("<Q", info, TCPI_BYTES_RECEIVED)[0]


def cut(fd: int) -> str:
    """End a connection under ZeroMQ's feet: it reads end-of-stream and drops the session.

    Returns the peer's address, for the log."""
    try:
        with borrowed(fd) as sock:
            peer = sock.getpeername()
            sock.shutdown(pysocket.SHUT_RDWR)
    except OSError:  # already closed or disconnected
        return "?"
    return ":".join(str(part) for part in peer[:2])


@dataclass
class Connection:
    """One TCP connection the server accepted: its fd, bytes delivered, bytes held."""

    fd: int
    delivered: int = 0
    held: int = 0
    cut: bool = False


class InflowGuard:
    """Watches the TCP connections of `router` and cuts those holding too much (see above).

    Use: `delivered(frames)` for every message received from the socket (with copy=False,
    so its frames know their fd), `check(now)` on every turn of the loop, `close()` before
    the socket. `cuts` counts the connections cut.
    """

    def __init__(self, router: zmq.Socket, limits: InflowLimits | None = None) -> None:
        self.limits = limits or InflowLimits()
        self.curve = bool(router.getsockopt(zmq.CURVE_SERVER))
        self.enabled = watch_supported()
        self.connections: dict[int, Connection] = {}
        self.cuts = 0
        self._next_sweep = 0.0
        self._busy = False  # a connection held over 1/16 of its bound at the last sweep
        self._router = router
        self._monitor = watch_events(router) if self.enabled else None
        if not self.enabled:
            log.warning("no TCP_INFO or ZMQ_SRCFD here: messages still arriving are unbounded")

    def delivered(self, frames: list[Any], dropped: int = 0, dropped_bytes: int = 0) -> None:
        """Count a complete message (routing id first, as ROUTER gives it) as delivered;
        dropped frames (and their bytes) past the ones kept count too."""
        if not self.enabled or not isinstance(frames[-1], zmq.Frame):
            return
        fd = frames[-1].get(zmq.SRCFD)
        if fd not in self.connections:
            self._read_events()  # accepted after the last check
        connection = self.connections.get(fd)
        if connection is not None:  # the routing id (frames[0]) was not on the wire
            wire = sum(wire_bytes(len(f), self.curve) for f in frames[1:])
            connection.delivered += wire + dropped_wire_bytes(dropped, dropped_bytes, self.curve)

    def check(self, now: float) -> None:
        """Learn new and closed connections, then measure and cut (see the module's text).

        A sweep costs a few microseconds per connection (SWEEP_COST); with many of them it
        runs less often, so that it takes at most ~10% of the loop, and at least every
        MAX_SWEEP_GAP seconds.
        """
        if not self.enabled:
            return
        self._read_events()
        if now < self._next_sweep:
            return
        self._sweep()
        self._next_sweep = now + min(10 * SWEEP_COST * len(self.connections), MAX_SWEEP_GAP)

    def watched(self) -> list[zmq.Socket]:
        """The connection events' socket, for the loop to wake on (none when switched off):
        ZeroMQ accepts connections in its own thread, and each costs ~22 KiB until cut."""
        return [self._monitor] if self._monitor is not None else []

    def wait(self, interval: float) -> float:
        """How long the loop may wait for a message before the next check: `interval`, or
        FAST_CHECK while a connection holds more than 1/16 of its bound (a big message is
        arriving: what arrives between two checks comes on top of the bound)."""
        return min(interval, FAST_CHECK) if self._busy else interval

    def close(self) -> None:
        """Stop watching (before the socket and its context are closed)."""
        if self._monitor is not None:
            self._router.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None

    def _read_events(self) -> None:
        refused = 0
        while self._monitor is not None:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            fd, endpoint = event["value"], event["endpoint"].decode(errors="replace")
            if event["event"] != zmq.EVENT_ACCEPTED:
                self.connections.pop(fd, None)
            elif endpoint.startswith("tcp://"):  # not ipc://: local, guarded by permissions
                refused += self._accepted(Connection(fd))
        if refused:
            log.warning("cut %d new connections: more than %d at once",
                        refused, self.limits.max_connections)  # fmt: skip

    def _accepted(self, connection: Connection) -> bool:
        """Watch a new connection (a reused fd is a new one); cut it past the cap."""
        self.connections[connection.fd] = connection
        if len(self.connections) <= self.limits.max_connections:
            return False
        cut(connection.fd)
        connection.cut = True
        self.cuts += 1
        return True

    def _sweep(self) -> None:
        live = []
        for connection in self.connections.values():
            received = bytes_received(connection.fd)
            if received is None or connection.cut:
                continue
            connection.held = received - connection.delivered
            if connection.held > self.limits.per_connection:
                self._cut(connection, "holds more than a message's limit")
            else:
                live.append(connection)
        total = sum(c.held for c in live)
        # `held` changes only here: the loop's wait (see `wait`) is decided once per sweep.
        self._busy = any(c.held > self.limits.per_connection // 16 for c in live)
        for connection in sorted(live, key=lambda c: c.held, reverse=True):
            if total <= self.limits.total:
                break
            total -= connection.held
            self._cut(connection, "largest while all connections hold too much")

    def _cut(self, connection: Connection, why: str) -> None:
        peer = cut(connection.fd)
        log.warning("cut the connection from %s (fd %d, %.1f MiB not received whole): %s",
                    peer, connection.fd, connection.held / MiB, why)  # fmt: skip
        connection.cut = True
        self.cuts += 1


def give_back_freed_memory() -> None:
    """Hand the memory freed by a message of many frames back to the system (glibc).

    ZeroMQ holds 64 bytes per frame until the frame is read; once read, glibc keeps the
    freed blocks for reuse and the server's resident size would stay at its peak. Nothing
    happens where malloc_trim does not exist."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
