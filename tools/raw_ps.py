"""Reference parameter servers in raw pyzmq: the ceilings a Python server can reach.

Not minips: no msgpack, no validation of shapes or fields, no rules, no stats beyond a
counter. These are the yardsticks that tools/bench_wire.py and tools/bench_server.py put
minips beside: what the same bytes cost over the same sockets with no work, and
with only the minimal correct work of an asgd update.

Frames (DEALER -> ROUTER; the ROUTER adds and strips the routing frame). The first frame is
a header whose first byte is the kind; arrays are the 8 LeNet-5 tensors as raw float32:

    push   b"u"...   + 8 gradient frames  -> b"a" * 60 (ack)
    pull   b"p"...                        -> header + 8 parameter frames
    fused  b"f"...   + 8 gradient frames  -> header + 8 parameter frames (one round trip)
    chunk  b"c" + struct(index, lo, hi, last) + 1 gradient slice
                                          -> b"r" + same struct + the new parameter slice;
                                             after the last chunk also b"k" (commit) or b"x"
    stats  b"s"                           -> b"s" + the number of applied updates (8 bytes)
    quit   b"q"                           -> the server returns

The minimal work (`MomentumStore`) is minips's `SGD.step_one` with momentum 0.9:

    v <- mu v + g ;  w' = w - lr v          (in place on v, w' into a free buffer)

after a finiteness check of every gradient (sum of squares by one dot; all finite when it
is finite), with nothing applied when any gradient is not finite. Replies are sent with
copy=False and stay safe: each version w' is written into a buffer that no frame in flight
references (Python's reference count tells: pyzmq holds the array until libzmq has sent
it), so a reply never sees a later update and no pull copies anything.

    python tools/raw_ps.py     # the minimal work alone, in-process: median ms of `apply`
"""

from __future__ import annotations

import math
import statistics
import struct
import sys
import time

import numpy as np
import zmq

CHUNK = struct.Struct("<4I")  # tensor index, first element, end element, 1 on the last chunk
HEADER = b"h" * 200  # about minips's msgpack header for a push or a pull reply
ACK = b"a" * 60


def _is_finite(grad: np.ndarray) -> bool:
    """True when every element is finite: the sum of squares is, or (overflow) a full check."""
    with np.errstate(over="ignore", invalid="ignore"):
        sq_norm = float(np.dot(grad, grad))
    return math.isfinite(sq_norm) or bool(np.isfinite(grad).all())


def _free_buffer(buffers: list[np.ndarray]) -> np.ndarray:
    """A buffer no one else references (the list, the loop name, getrefcount's argument)."""
    for buffer in buffers:
        if sys.getrefcount(buffer) == 3:
            return buffer
    buffers.append(np.empty_like(buffers[0]))
    return buffers[-1]


class MomentumStore:
    """Flat float32 tensors, SGD with momentum, each version written into a free buffer.

    params[i] is the current version of tensor i (never changed once published);
    `apply` checks, then updates all tensors at once; `apply_slice` + `commit` do the same
    one slice at a time (pipelined), with the velocity double-buffered so that a rejected
    request leaves nothing applied.
    """

    def __init__(self, tensors: list[np.ndarray], lr: float = 1e-6, mu: float = 0.9) -> None:
        self.params = [np.ascontiguousarray(t, np.float32).reshape(-1).copy() for t in tensors]
        self.velocity = [np.zeros_like(p) for p in self.params]
        self.velocity_next = [np.zeros_like(p) for p in self.params]
        self.buffers = [[p] for p in self.params]  # every version buffer of each tensor
        self.pending: list[np.ndarray | None] = [None] * len(self.params)
        self.rejected = False
        self.neg_lr, self.mu = np.float32(-lr), np.float32(mu)
        self.updates = 0

    def _step(self, v_in, v_out, grad, w, w_out) -> None:
        np.multiply(v_in, self.mu, out=v_out)  # v' = mu v + g
        v_out += grad
        np.multiply(v_out, self.neg_lr, out=w_out)  # w' = w - lr v', no temporary
        w_out += w

    def apply(self, grads: list[np.ndarray]) -> bool:
        """Check all gradients, then update every tensor; False (nothing applied) if any
        is not finite. Costs 1 pass over g for the check, 2 over v, 2 over w'."""
        if not all(_is_finite(g) for g in grads):
            return False
        for i, grad in enumerate(grads):
            out = _free_buffer(self.buffers[i])
            self._step(self.velocity[i], self.velocity[i], grad, self.params[i], out)
            self.params[i] = out
        self.updates += 1
        return True

    def apply_slice(self, i: int, lo: int, hi: int, grad: np.ndarray) -> np.ndarray:
        """Check and update elements lo:hi of tensor i into the pending version; returns
        the new slice (to send before the request is complete; `commit` says if it holds)."""
        if self.pending[i] is None:
            self.pending[i] = _free_buffer(self.buffers[i])
        out = self.pending[i][lo:hi]
        if not _is_finite(grad):
            self.rejected = True
            return out
        v_in, v_out = self.velocity[i][lo:hi], self.velocity_next[i][lo:hi]
        self._step(v_in, v_out, grad, self.params[i][lo:hi], out)
        return out

    def commit(self) -> bool:
        """Publish the pending versions (and velocity) if no slice was rejected."""
        ok = not self.rejected and all(p is not None for p in self.pending)
        if ok:
            self.params = list(self.pending)
            self.velocity, self.velocity_next = self.velocity_next, self.velocity
            self.updates += 1
        self.pending, self.rejected = [None] * len(self.params), False
        return ok


def _grads(frames) -> list[np.ndarray]:
    return [np.frombuffer(f, np.float32) for f in frames]


def serve(sock: zmq.Socket, store: MomentumStore | None, tensors: list[np.ndarray]) -> None:
    """Answer requests until quit. With `store` None: no work, replies are prebuilt frames."""
    fixed = [HEADER, *(np.ascontiguousarray(t).reshape(-1) for t in tensors)]
    counted = 0
    while True:
        routing, head, *arrays = sock.recv_multipart(copy=False)
        kind = head.bytes[:1]
        if kind == b"q":
            return
        if kind == b"c":
            _serve_chunk(sock, routing, head.bytes, arrays[0], store)
            continue
        if kind in (b"u", b"f"):
            counted += 1
            ok = store is None or store.apply(_grads(arrays))
            if not ok:
                sock.send_multipart([routing, b"x"])
                continue
        if kind in (b"p", b"f"):
            reply = fixed if store is None else [HEADER, *store.params]
        elif kind == b"s":
            reply = [b"s" + struct.pack("<Q", counted if store is None else store.updates)]
        else:
            reply = [ACK]
        sock.send_multipart([routing, *reply], copy=False)


def _serve_chunk(sock, routing, head: bytes, frame, store: MomentumStore | None) -> None:
    """One slice of a pipelined fused request: update it, send its new values right away;
    after the request's last slice, say whether the whole update was applied."""
    i, lo, hi, last = CHUNK.unpack_from(head, 1)
    grad = np.frombuffer(frame, np.float32)
    out = grad if store is None else store.apply_slice(i, lo, hi, grad)  # no work: echo
    sock.send_multipart([routing, b"r" + head[1:], out], copy=False)
    if last:
        ok = store is None or store.commit()
        sock.send_multipart([routing, b"k" if ok else b"x"])


def chunk_plan(sizes: list[int], chunk: int | None) -> list[tuple[int, int, int]]:
    """(tensor, lo, hi) slices of at most `chunk` elements each (None: one per tensor)."""
    plan = []
    for i, size in enumerate(sizes):
        step = size if chunk is None else chunk
        plan += [(i, lo, min(lo + step, size)) for lo in range(0, size, step)]
    return plan


class RawClient:
    """A DEALER speaking the frames above: what a worker's side of each exchange costs."""

    def __init__(self, endpoint: str, grads: list[np.ndarray], context=None) -> None:
        self.grads = [np.ascontiguousarray(g, np.float32).reshape(-1) for g in grads]
        self.context = context or zmq.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def _exchange(self, frames: list) -> list:
        self.sock.send_multipart(frames, copy=False)
        return self.sock.recv_multipart(copy=False)

    def push(self) -> None:
        """Push all gradients, wait for the acknowledgement."""
        assert self._exchange([b"u" * 200, *self.grads])[0].bytes == ACK

    def pull(self) -> list:
        """Pull all parameters."""
        reply = self._exchange([b"p" * 60])
        assert len(reply) == 1 + len(self.grads)
        return reply[1:]

    def push_pull(self) -> None:
        """Two round trips, like minips's separate push and pull."""
        self.push()
        self.pull()

    def fused(self) -> list:
        """One round trip: gradients up, new parameters down."""
        reply = self._exchange([b"f" * 200, *self.grads])
        assert len(reply) == 1 + len(self.grads)
        return reply[1:]

    def pipelined(self, plan: list[tuple[int, int, int]]) -> list:
        """One round trip in slices: each slice is its own message, so the server can
        update slice k while slice k+1 is still on the wire, and reply to it right away."""
        for n, (i, lo, hi) in enumerate(plan):
            head = b"c" + CHUNK.pack(i, lo, hi, n == len(plan) - 1)
            self.sock.send_multipart([head, self.grads[i][lo:hi]], copy=False)
        slices = [self.sock.recv_multipart(copy=False)[1] for _ in plan]
        assert self.sock.recv() == b"k"
        return slices

    def updates(self) -> int:
        """The server's applied-update counter."""
        return struct.unpack("<Q", self._exchange([b"s"])[0].bytes[1:])[0]

    def close(self, stop_server: bool = False) -> None:
        if stop_server:
            self.sock.setsockopt(zmq.LINGER, 1000)  # let the quit leave before the close
            self.sock.send(b"q")
        self.sock.close()


class RawGroupClient:
    """One RawClient per shard of a raw group (each shard a `serve` over its slices): every
    exchange is sent to all shards before any reply is read, so the shards work at once
    (minips's group client does the same: send to every shard, then poll them all)."""

    def __init__(self, endpoints: list[str], grads_by_shard: list[list[np.ndarray]]) -> None:
        context = zmq.Context()
        self.shards = [
            RawClient(e, g, context) for e, g in zip(endpoints, grads_by_shard, strict=True)
        ]

    def _fan(self, frames_of) -> list[list]:
        for shard in self.shards:
            shard.sock.send_multipart(frames_of(shard), copy=False)
        return [shard.sock.recv_multipart(copy=False) for shard in self.shards]

    def push(self) -> None:
        assert all(r[0].bytes == ACK for r in self._fan(lambda c: [b"u" * 200, *c.grads]))

    def pull(self) -> None:
        self._fan(lambda c: [b"p" * 60])

    def push_pull(self) -> None:
        self.push()
        self.pull()

    def fused(self) -> None:
        self._fan(lambda c: [b"f" * 200, *c.grads])

    def updates(self) -> int:
        """Shard 0's applied-update counter (every request reaches every shard)."""
        return self.shards[0].updates()

    def close(self, stop_server: bool = False) -> None:
        for shard in self.shards:
            shard.close(stop_server)


def main() -> None:
    """Time `MomentumStore.apply` on LeNet-5-sized tensors in-process (warm, no sockets)."""
    from bench_wire import _tensors

    store = MomentumStore(list(_tensors().values()))
    grads = [g.reshape(-1) for g in _tensors(seed=1).values()]
    times = []
    for n in range(330):
        tick = time.perf_counter()
        store.apply(grads)
        if n >= 30:  # after 30 warm-up updates
            times.append((time.perf_counter() - tick) * 1e3)
    print(
        f"MomentumStore.apply, 431,080 float32: {statistics.median(times):.3f} ms (median of 300)"
    )


if __name__ == "__main__":
    main()
