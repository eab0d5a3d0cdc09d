"""Helpers shared by the server/client tests: a server running in a thread, raw sockets."""

from __future__ import annotations

import contextlib
import threading

import msgpack
import numpy as np
import zmq

from minips.guard import wire_checks
from minips.ops.ops_options import OpsOptions
from minips.ops.server_ops import ServerOps
from minips.protocol import wire
from minips.rules import make_rule
from minips.server.server import ParameterServer
from minips.state.store import SGD

SHAPES = {"fc.w": (3, 4), "fc.b": (4,)}


def make_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}


def snapshot(server: ParameterServer) -> dict[str, bytes]:
    """Bytes of every parameter, for bit-for-bit comparisons."""
    return {name: array.tobytes() for name, array in server.store.params.items()}


@contextlib.contextmanager
def running_server(
    rule="asgd",
    params=None,
    lr=0.5,
    momentum=0.0,
    rule_options=None,
    weight_decay=0.0,
    config=None,
    **kw,
):
    """A ParameterServer serving in a background thread; stopped and joined on exit.
    config: hello's config ({"model": "test"} by default)."""
    params = make_params() if params is None else params
    optimizer = SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    rule = make_rule(rule, **(rule_options or {})) if isinstance(rule, str) else rule
    kw.setdefault("stop_grace", 0.2)
    kw.setdefault("poll_interval", 0.02)
    on_update = kw.pop("on_update", None)
    options = OpsOptions(**kw)
    server = ParameterServer(params, rule, optimizer, options, config=config or {"model": "test"},
                             on_update=on_update, operations=ServerOps)  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.request_stop()
        thread.join(timeout=10)
        assert not thread.is_alive(), "server loop did not stop"
        server.close()


class RawPeer:
    """A bare DEALER socket speaking frames directly (for malformed and hand-built input)."""

    def __init__(self, address: str, req: bool = False, routing_id: bytes | None = None) -> None:
        """routing_id: a fixed one (a reconnecting worker keeps its own: the server binds a
        live worker id to it, docs/protocol.md 15)."""
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.REQ if req else zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if routing_id is not None:
            self.socket.setsockopt(zmq.ROUTING_ID, routing_id)
        self.socket.connect(address)

    def send(self, frames) -> None:
        self.socket.send_multipart(frames)

    def recv(self, timeout: float = 5.0) -> wire.Message:
        assert self.socket.poll(timeout * 1000), "no reply from the server"
        return wire_checks.decode_reply(self.socket.recv_multipart())

    def has_reply(self, timeout: float) -> bool:
        return bool(self.socket.poll(timeout * 1000))

    def request(self, header, arrays=None, codecs=None) -> wire.Message:
        self.send(wire.encode(header, arrays, codecs))
        return self.recv()

    def close(self) -> None:
        self.socket.close()
        self.context.term()

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def packb(header) -> bytes:
    return msgpack.packb(header)


FENCE_RID = 999_999  # the rid of the `stats` request `send_then_fence` sends after a request


def send_then_fence(peer: RawPeer, header, arrays=None) -> wire.Message | None:
    """Send a request, then a `stats` request on the same socket; return the request's
    reply if the server answered it before the stats (None: the server holds it).

    The server reads one socket's messages in order and handles each to completion, so
    this tells "answered at once" from "held" without looking at the server's internals
    and without timing.
    """
    peer.send(wire.encode(header, arrays))
    peer.send(wire.encode({"op": "stats", "rid": FENCE_RID}))
    first = peer.recv()
    if first.op == "stats" and first.header.get("rid") == FENCE_RID:
        return None
    fence = peer.recv()
    assert fence.op == "stats" and fence.header.get("rid") == FENCE_RID, fence.header
    return first


def worker_rows(client) -> dict[str, dict]:
    """The `stats` reply's per-worker rows, by worker id (client: a PSClient)."""
    return {row["worker"]: row for row in client.stats()["workers"]}


def train_two_workers(spec):
    """A server built from the RunConfig `spec` (in a thread) and two real `Worker` loops
    over sockets, the second slowed 1.5x, run until both finished. Returns the final
    (parameters, update records, worker reports, stats)."""
    from minips.run.build import make_server
    from minips.worker.client import PSClient
    from minips.worker.worker import Worker

    records = []
    server = make_server(spec, on_update=records.append)
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    reports = []

    def work(slowdown):
        with PSClient(server.endpoint, timeout=30) as client:
            reports.append(Worker(client, slowdown=slowdown).run())
            client.bye()

    try:
        workers = [threading.Thread(target=work, args=(factor,)) for factor in (None, 1.5)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join(timeout=120)
        stats = server.stats()
    finally:
        server.request_stop()
        loop.join(timeout=10)
        server.close()
    return server.store.params, records, reports, stats


# Hand-built requests for RawPeer (the fields a worker in another language would send).


def full(name: str, value: float) -> dict[str, np.ndarray]:
    """One gradient of parameter `name` (SHAPES) filled with `value`."""
    return {name: np.full(SHAPES[name], value, np.float32)}


def filled(value: float) -> dict[str, np.ndarray]:
    """A gradient of every parameter (SHAPES) filled with `value`."""
    return {name: np.full(shape, value, np.float32) for name, shape in SHAPES.items()}


def copied(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: np.array(array) for name, array in arrays.items()}


def raw_hello(peer: RawPeer, worker: str) -> None:
    reply = peer.request({"op": "hello", "worker": worker})
    assert reply.op == "hello", reply.header


def push_header(worker: str, seq: int, base: int, rid: int, last: bool = True) -> dict:
    return {"op": "push", "worker": worker, "seq": seq, "base": base, "last": last, "rid": rid}


def pull_header(worker: str, rid: int) -> dict:
    return {"op": "pull", "worker": worker, "rid": rid}


class InterruptedAfterFirstFrame:
    """A DEALER stand-in that sends a request's first frame, then is interrupted (Ctrl-C or
    SIGTERM landing between two of pyzmq's per-frame sends), once; otherwise the real socket."""

    def __init__(self, sock) -> None:
        self.sock, self.armed = sock, True

    def send_multipart(self, frames, **kw):
        if not self.armed:
            return self.sock.send_multipart(frames, **kw)
        self.armed = False
        self.sock.send(frames[0], zmq.SNDMORE, **kw)
        raise KeyboardInterrupt

    def __getattr__(self, name):
        return getattr(self.sock, name)


class InterruptedAfterFirstReplyFrame:
    """A DEALER stand-in that takes a reply's first frame, then is interrupted (pyzmq
    checks for signals after each frame it received: Ctrl-C or SIGTERM landing then loses
    that frame), once; otherwise the real socket."""

    def __init__(self, sock) -> None:
        self.sock, self.armed = sock, True

    def recv_multipart(self, *args, **kw):
        if not self.armed:
            return self.sock.recv_multipart(*args, **kw)
        self.armed = False
        self.sock.recv(*args, **kw)
        raise KeyboardInterrupt

    def __getattr__(self, name):
        return getattr(self.sock, name)
