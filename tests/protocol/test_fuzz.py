"""Fuzz: >= 10,000 generated hostile requests against a live server (tests/fuzz_messages.py).

Every request gets exactly one reply, none is `internal`, the server keeps serving, and
the parameters and optimizer state stay bit-for-bit what they were.
"""

from __future__ import annotations

import random
import time

import numpy as np
import zmq
from fuzz_messages import WORKER, changes_state, message
from test_server_support import RawPeer, running_server, snapshot

from minips.guard import wire_checks

MESSAGES = 10_000
BATCH = 4  # requests in flight at once (within the server's send high-water mark)


def generate(seed: int, count: int) -> list[list[bytes]]:
    rng = random.Random(seed)
    out: list[list[bytes]] = []
    while len(out) < count:
        frames = message(rng)
        if not changes_state(frames):
            out.append(frames)
    return out


def test_fuzzed_requests_never_break_the_server():
    started = time.monotonic()
    messages = generate(seed=20240601, count=MESSAGES)
    codes: dict[str, int] = {}
    with running_server(momentum=0.9) as server, RawPeer(server.endpoint) as peer:
        peer.request({"op": "hello", "worker": WORKER})
        peer.request({"op": "push", "worker": WORKER, "seq": 0, "base": 0},
                     {"fc.b": np.ones(4, np.float32)})  # fmt: skip
        before = snapshot(server)
        velocity = {k: v.tobytes() for k, v in server.store.optimizer.velocity.items()}
        for start in range(0, MESSAGES, BATCH):
            batch = messages[start : start + BATCH]
            for frames in batch:
                peer.socket.send_multipart(frames)
            for index in range(len(batch)):
                assert peer.socket.poll(60_000), f"no reply to message {start + index}"  # a hang
                reply = wire_checks.decode_reply(peer.socket.recv_multipart(zmq.NOBLOCK))
                code = reply.header.get("code", reply.op) if reply.op == "error" else reply.op
                codes[code] = codes.get(code, 0) + 1
                assert code != "internal", (start + index, reply.header, batch[index][:1])
        assert snapshot(server) == before
        assert {k: v.tobytes() for k, v in server.store.optimizer.velocity.items()} == velocity
        assert peer.request({"op": "stats"}).op == "stats"  # still serving, stats intact
    assert sum(codes.values()) == MESSAGES
    assert len(codes) >= 10, codes  # many different rules were exercised
    # A bound that catches a server that stalls on bad input, not a slow machine (35 s at
    # load 20 on 2 cores).
    assert time.monotonic() - started < 600
