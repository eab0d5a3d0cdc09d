"""tools/raw_ps.py: the reference server's minimal work is a correct, atomic momentum step."""

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from raw_ps import CHUNK, MomentumStore, RawClient, chunk_plan, serve  # noqa: E402

SHAPES = [(20, 1, 5, 5), (20,), (800, 500), (10,)]
LR, MU = 0.1, 0.9


@pytest.fixture()
def server():
    """A reference server with the minimal work in a thread; yields (endpoint, store)."""
    rng = np.random.default_rng(0)
    tensors = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    store = MomentumStore(tensors, lr=LR, mu=MU)
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    thread = threading.Thread(target=serve, args=(sock, store, tensors), daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{port}", store, [t.reshape(-1).copy() for t in tensors]
    RawClient(f"tcp://127.0.0.1:{port}", []).close(stop_server=True)
    thread.join(timeout=10)
    sock.close()
    context.term()


def _expected(weights, grads, steps):
    """steps of v <- mu v + g, w <- w - lr v, in float32 (minips's SGD.step_one)."""
    velocity = [np.zeros_like(w) for w in weights]
    for _ in range(steps):
        velocity = [np.float32(MU) * v + g for v, g in zip(velocity, grads, strict=True)]
        weights = [w - np.float32(LR) * v for w, v in zip(weights, velocity, strict=True)]
    return weights


@pytest.mark.parametrize("chunk", [None, 30000])
def test_fused_and_pipelined_replies_hold_the_momentum_step(server, chunk):
    endpoint, store, weights = server
    grads = [np.random.default_rng(1).standard_normal(w.size).astype(np.float32) for w in weights]
    client = RawClient(endpoint, grads)
    plan = chunk_plan([g.size for g in grads], chunk)
    replies = [client.fused() if chunk is None else client.pipelined(plan) for _ in range(3)]
    want = _expected(weights, grads, 3)
    if chunk is None:  # the first reply still holds its own version: nothing overwrote it
        got = [np.frombuffer(f, np.float32) for f in replies[-1]]
        first = [np.frombuffer(f, np.float32) for f in replies[0]]
        np.testing.assert_array_equal(first[2], _expected(weights, grads, 1)[2])
    else:
        pairs = zip(replies[-1], plan, strict=True)
        slices = [(t, np.frombuffer(s, np.float32)) for s, (t, _, _) in pairs]
        got = [np.concatenate([s for t, s in slices if t == i]) for i in range(len(grads))]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert store.updates == 3
    client.close()


def test_a_nonfinite_gradient_applies_nothing(server):
    endpoint, store, weights = server
    grads = [np.ones(w.size, np.float32) for w in weights]
    grads[2][123] = np.nan
    client = RawClient(endpoint, grads)
    before = [p.copy() for p in store.params]
    client.sock.send_multipart([b"f", *grads])
    assert client.sock.recv_multipart() == [b"x"]
    plan = chunk_plan([g.size for g in grads], 50000)
    for n, (i, lo, hi) in enumerate(plan):
        head = b"c" + CHUNK.pack(i, lo, hi, n == len(plan) - 1)
        client.sock.send_multipart([head, grads[i][lo:hi]])
    for _ in plan:
        client.sock.recv_multipart()
    assert client.sock.recv() == b"x"
    assert store.updates == 0
    for old, new in zip(before, store.params, strict=True):
        np.testing.assert_array_equal(old, new)
    client.close()
