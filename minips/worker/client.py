"""PSClient: the Python API of a minips worker (hello, pull, push, ...) over a DEALER socket.

Every call sends one request, waits `timeout` s for its reply and sends it again on a new
socket up to `retries` times (Lazy Pirate, docs/protocol.md 8; a late reply is known by
its `rid`), then raises ServerUnavailable. Gradients travel by per-parameter codec specs
(`push`'s `codecs`; docs/protocol.md 13), the client keeping each one's codec state.

Threads: one request is on the wire at a time; a lock serialises the calls, so a sender
thread may push while the main thread pulls. A call waits for the reply of the one before
it, held replies included (an ssgd push at its barrier blocks the other thread meanwhile).

    with PSClient("tcp://127.0.0.1:5555") as ps:
        cfg = ps.hello({"host": "pc1"})           # rank, world_size, config
        params, since = {}, None
        while True:
            reply = ps.pull(since)                 # only what changed since `since`
            params.update(reply.params); since = reply.version
            if reply.stop: break
            grads = compute_gradients(params)      # name -> float32 array, param's shape
            if ps.push(grads, base=reply.version).stop: break
        ps.bye()

The wire format is docs/protocol.md; this class is one implementation of it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import zmq

from minips.protocol import auth, wire
from minips.protocol.wire import DEFAULT_LIMITS, Limits, Message, frames_nbytes
from minips.transmission.codecs import Encoder, Gradient, Spec
from minips.worker.hooks import LinkLimit
from minips.worker.replies import PullReply, PushReply, ServerError, ServerUnavailable
from minips.worker.session import (
    NO_PULL,
    GroupSide,
    OneServer,
    OneServerOnly,
    Session,
    identified,
)

log = logging.getLogger("minips.client")

ASSEMBLE_TIMEOUT = 60.0  # s the first hello waits for a server group to assemble (16.3)


class PSClient:
    """A worker's connection to a ParameterServer.

    address: the server endpoint ("tcp://host:port" or "ipc:///path"), taken as given (its
    builder checks a user's: minips.PSClient, minips/guard/addresses.py). timeout: seconds to
    wait for each reply. retries: how many times a request is re-sent after a timeout (so at
    most 1 + retries attempts). worker_id: this worker's name for the whole run (a random
    one by default); the server gives the same rank back to the same id. assemble_timeout:
    how long hello waits for a server group whose shards have not all joined. keys: CURVE
    keys that secure its socket (minips/guard/curve.py's ClientKeys; None: plain).
    A server group (docs/protocol.md 16), found at hello, is used through the same calls:
    hello chooses the `session` they go to (minips.worker.session), a `OneServer` or the
    group's, through `groups` (minips.group.root.GROUPS; None: OneServerOnly, which
    refuses a group).
    Thread-safe: calls are serialised by a lock. A request that needs registration goes
    through `_worker_request`, and each attempt's count, wait and failure through `_attempts`,
    `_send_wait` and `_no_reply`: the hooks minips.ops.client_retries's RetryingClient fills.
    """

    def __init__(
        self,
        address: str,
        timeout: float = 5.0,
        retries: int = 3,
        worker_id: str | None = None,
        limits: Limits = DEFAULT_LIMITS,
        keys: auth.ClientSocketKeys | None = None,
        assemble_timeout: float = ASSEMBLE_TIMEOUT,
        groups: GroupSide | None = None,
    ) -> None:
        if timeout <= 0 or retries < 0:
            raise ValueError("timeout must be > 0 and retries >= 0")
        self.address = address
        self.keys = keys
        self.timeout = timeout
        self.retries = retries
        self.worker_id = worker_id or uuid.uuid4().hex
        self.limits = limits
        self.rank: int | None = None
        self.config: dict[str, Any] | None = None
        self.hello_sent = False  # the server may know this client: a bye is due on the way out
        self._rid = 0
        self._seq = 0
        self._context = zmq.Context()
        self._socket: zmq.Socket | None = None
        # One routing id for the client's lifetime, kept across Lazy Pirate reconnections:
        # without CURVE it is what binds this worker id to us (docs/protocol.md 15).
        self.routing_id = b"\x01" + os.urandom(15)
        # Re-entrant: a push may say hello again (re-registration) while holding it.
        self._lock = threading.RLock()
        self.encoder = Encoder()  # one server's codec state; bytes_sent per parameter
        # --bandwidth: a token bucket per direction (the worker's conditions), None = unlimited.
        self.link: LinkLimit | None = None
        self.session: Session = OneServer(self)  # what the worker calls go to (hello chooses)
        self.group: Session | None = None  # the group's session, once hello found a group
        self.groups = groups or OneServerOnly()  # hello and operators' requests go through it
        self._shards: Any = None  # the group's shards an operator's requests reached
        self.assemble_timeout = assemble_timeout
        self._answered = False  # any reply at all from the server yet

    # ------------------------------------------------------------------------ worker calls

    def hello(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Register; return {"rank", "world_size", "config", "version", "heartbeat_timeout"}.

        info: a msgpack-able map shown in the server's stats (host, pid, ...). The reply
        chooses the session: a server group's root names the group (16.4), and the group's
        side says hello to the other shards too.
        """
        header: dict[str, Any] = {"op": "hello", "worker": self.worker_id}
        if info is not None:
            header["info"] = info
        self.hello_sent = True
        reply = self.groups.hello(self, identified(header), dict(info or {}))
        self.rank, self.config = reply["rank"], reply["config"]
        keys = ("rank", "world_size", "config", "version", "heartbeat_timeout")
        return {key: reply[key] for key in keys}

    def pull(self, since: int | None = None) -> PullReply:
        """Fetch the parameters changed since version `since` (all when None).

        Under ssp the server may hold the reply until the bound allows it; make `timeout`
        long enough for that, or rely on the retries.
        """
        with self._lock:
            return self.session.pull(since)

    def push(
        self,
        grads: Mapping[str, Gradient],
        base: int,
        extra: dict[str, np.ndarray] | None = None,
        last: bool = True,
        codecs: Mapping[str, Spec] | None = None,
        samples: int | None = None,
        pull_since: Any = NO_PULL,
        loss: float | None = None,
    ) -> PushReply:
        """Send gradients computed at parameters of version `base` (a pull's `version`).

        grads: name -> array of the parameter's shape (cast to float32), or `Factors(x, dy)`
        for a parameter sent with codec sf; any non-empty subset of the parameters. extra:
        arrays a rule needs (e.g. VSGD's samples), sent dense as "extra/<key>". last: False
        when more pushes of the same step follow (only the last one advances the worker's
        clock). codecs: name -> codec spec ("dense" when absent; docs/protocol.md 13).
        samples: training examples behind this push (summed in the server's stats).
        loss: their mean training loss (the server watches it for a collapse).
        Encoding happens once: retries resend the same bytes, and codec state (top-k's
        residual) counts the push as sent even if it finally fails (ServerUnavailable).
        pull_since: also pull, in the same round trip, the parameters changed since this
        version (None: all); the reply's `pull` holds them (one round trip per step).
        Do not modify the arrays while the call runs (they are sent without copying).
        Under ssgd the reply comes when the barrier completes.
        """
        with self._lock:
            return self.session.push(grads, base, extra, last, codecs, samples, pull_since, loss)

    def next_seq(self) -> int:
        """A new push's `seq` (one counter for every shard of a group: each sees it ascend)."""
        seq, self._seq = self._seq, self._seq + 1
        return seq

    @property
    def bytes_sent(self) -> dict[str, int]:
        """Array bytes pushed so far per parameter (and per "extra/<key>"), retries not counted."""
        return self.session.bytes_sent()

    def ping(self) -> bool:
        """Heartbeat for long computations; returns the `stop` flag."""
        with self._lock:
            return self.session.ping()

    def bye(self, finished: bool = True) -> None:
        """Leave the run (barriers stop waiting for this worker). finished: False when
        leaving before the shard's epochs are done, so another worker may take over the
        rank (docs/protocol.md 5.6)."""
        header: dict[str, Any] = {"op": "bye", "worker": self.worker_id}
        if not finished:
            header["finished"] = False
        try:
            with self._lock:
                self.session.bye(header)
        except ServerError as exc:  # unknown_worker: declared dead, or a retried bye's reply lost
            if exc.code != "unknown_worker":
                raise

    # ----------------------------------------------------------------------- anyone's calls

    def stats(self) -> dict[str, Any]:
        """The server's counters and worker table (docs/protocol.md, `stats`); a group's: the
        root's, with `shards`: every shard's own, by index (None for one not joined yet)."""
        stats, replies = self.groups.operator(self, {"op": "stats"}, lambda h: h["stats"])
        if replies:  # None for a shard that has not joined yet
            servers = stats["group"]["servers"]
            shards = [replies[j].header["stats"] if j in replies else None for j in range(servers)]
            stats = {**stats, "shards": shards}
        return stats

    def stop(self) -> None:
        """Operator: ask the server (every shard of a group) to stop; workers see `stop`."""
        self.groups.operator(self, {"op": "stop"}, lambda h: h)

    def checkpoint(self) -> str:
        """Operator: make the server (every shard of a group) write a checkpoint now;
        returns its path (the root's)."""
        return self.groups.operator(self, {"op": "checkpoint"}, lambda h: h)[0]["path"]

    def _close_socket(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def close(self) -> None:
        """Close the sockets without waiting for unsent messages."""
        with self._lock:
            self._close_socket()
            self.session.close()
            if self._shards is not None:
                self._shards.close()
            end_context(self._context)

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -------------------------------------------------------------------------- machinery

    def _worker_request(
        self, header: dict[str, Any], parts: list[wire.WirePart] | None = None
    ) -> Message:
        """A request that needs registration (pull, push, ping): here one `_request`."""
        return self._request(header, parts)

    def _connect(self) -> zmq.Socket:
        if self._socket is None:
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.limits.max_message_bytes)
            sock.setsockopt(zmq.ROUTING_ID, self.routing_id)
            # A DEALER with no connection to send on (e.g. its CURVE handshake was refused)
            # blocks in send: bounded like the wait for a reply.
            sock.setsockopt(zmq.SNDTIMEO, max(1, int(1000 * self._send_wait())))
            if self.keys is not None:
                self.keys.secure(sock)  # CURVE, before it connects
            sock.connect(self.address)
            self._socket = sock
        return self._socket

    def _request(self, header: dict[str, Any], parts: list[wire.WirePart] | None = None) -> Message:
        """Send, wait, retry (Lazy Pirate); return the decoded reply or raise. Holds the lock."""
        with self._lock:
            return self._request_locked(header, parts or [])

    def _attempts(self) -> tuple[int, float]:
        """The next request's number of attempts and each one's wait for its reply, in s."""
        return 1 + self.retries, self.timeout

    def _send_wait(self) -> float:
        """How long, in s, a send may wait for a connection to take it."""
        return self.timeout

    def _no_reply(self, op: str, attempt: int) -> None:
        """No reply in time: the socket may hold a half-sent request or an unwanted late
        reply, so close it; the next attempt starts on a new one (Lazy Pirate)."""
        log.warning("no reply to %s from %s in %.1f s (attempt %d of %d)", op, self.address,
                    self.timeout, attempt + 1, 1 + self.retries)  # fmt: skip
        self._close_socket()

    def _request_locked(self, header: dict[str, Any], parts: list[wire.WirePart]) -> Message:
        """One request and its reply: sent, awaited by its `rid`, sent again on a new socket
        when no reply comes in time (Lazy Pirate, docs/protocol.md 8)."""
        attempts, wait = self._attempts()
        for attempt in range(attempts):
            rid = self._rid = self._rid + 1
            sock = self._connect()
            sent = self._send(sock, wire.encode_parts({**header, "rid": rid}, parts))
            reply = self._await_reply(sock, rid, wait) if sent else None
            if reply is not None:
                return reply
            self._no_reply(header["op"], attempt)
        raise ServerUnavailable(
            f"no reply from the parameter server at {self.address} "
            f"({1 + self.retries} attempts of {self.timeout:g} s)"
        )

    def _send(self, sock: zmq.Socket, frames: list[Any]) -> bool:
        """False when no connection took the request within the socket's send timeout."""
        if self.link is not None:  # the request crosses the (emulated) link first
            self.link.up.wait(frames_nbytes(frames))
        try:
            with new_socket_if_interrupted(self._close_socket):
                sock.send_multipart(frames, copy=False)
        except zmq.Again:
            return False
        return True

    def _read_reply(self, frames: list[Any]) -> Message:
        """A reply's frames as a message, merely well-formed (wire.decode); the assembled
        client checks every field too."""
        return wire.decode(frames)

    def _await_reply(self, sock: zmq.Socket, rid: int, wait: float) -> Message | None:
        """The reply to request `rid` within `wait` s (a ServerError if it is an error);
        None when none comes."""
        deadline = time.monotonic() + wait
        while (remaining := deadline - time.monotonic()) > 0:
            # A receive timeout instead of a poll: one system call less per request.
            sock.setsockopt(zmq.RCVTIMEO, max(1, int(remaining * 1000)))
            try:
                with new_socket_if_interrupted(self._close_socket):
                    frames = sock.recv_multipart(copy=False)
            except zmq.Again:
                break
            if self.link is not None:  # the reply arrived as fast as the link allows
                self.link.down.wait(frames_nbytes(frames))
            message = self._read_reply(frames)
            self._answered = True
            if message.header.get("rid") != rid:
                continue  # a late reply to an attempt we gave up on
            if message.op == "error":
                raise ServerError(message.header["reason"], message.header["code"])
            return message
        return None


@contextmanager
def new_socket_if_interrupted(close_socket: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C or SIGTERM between two of pyzmq's per-frame sends leaves half a message on
    the socket, which the next request (the bye on the way out) would complete into
    garbage; one during a receive can lose a reply's first frame (pyzmq checks for
    signals after each frame it took), leaving the rest to be read as the next reply:
    `close_socket()` closes it, as Lazy Pirate does, so the next request starts on a new
    one (the server hands the routing id over to it). Used by PSClient and by a group's
    shard connections, around every send and receive."""
    try:
        yield
    except KeyboardInterrupt:
        close_socket()
        raise


def end_context(context: zmq.Context, wait: float = 1.0) -> None:
    """Destroy `context` (its sockets closed at linger 0), waiting at most `wait` s.

    A Ctrl-C that lands inside pyzmq's `Context.socket`, after the socket is made and before
    the context records it, leaves a socket no one can close, and `term` waits for every
    socket: the launcher stopping its run would hang there. So the context ends in a thread
    of its own; what it cannot free, the process's exit does."""
    ender = threading.Thread(
        target=context.destroy, kwargs={"linger": 0}, name="minips-context-end", daemon=True
    )
    ender.start()
    ender.join(wait)
