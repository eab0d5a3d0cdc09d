"""A whole parameter server and two workers in ~60 lines: read this before minips itself.

Only pyzmq, numpy and msgpack (no minips). The server owns the weights w of a linear model
y = x . w and applies every gradient it gets (asynchronous SGD, like `--rule asgd`); each
worker pulls w, computes a least-squares gradient on its own half of the data and pushes it.
Every message is minips's format in miniature: a msgpack header frame + raw array frames.

    python examples/00_tiny_ps.py           (--fast: fewer steps, for the tests)
"""

import sys
import threading

import msgpack
import numpy as np
import zmq

STEPS = 30 if "--fast" in sys.argv else 300  # pushes per worker
LR, DIM, ADDRESS = 0.1, 8, "inproc://tiny-ps"  # inproc: threads of one process; tcp:// works too


def server(ctx: zmq.Context, n_workers: int) -> None:
    """ROUTER socket: frames arrive as [worker identity, header, array?]; reply to the same id."""
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(ADDRESS)
    w, version, done = np.zeros(DIM, np.float32), 0, 0
    while done < n_workers:
        identity, header, *arrays = sock.recv_multipart()
        op = msgpack.unpackb(header)["op"]
        if op == "push":  # the update rule: plain SGD, applied at once
            w -= LR * np.frombuffer(arrays[0], np.float32)  # a raw frame, no pickle
            version += 1  # the global version t: one per applied update
        done += op == "bye"
        sock.send_multipart([identity, msgpack.packb({"version": version}), w.tobytes()])
    print(f"server: {version} updates applied, final w[:3] = {np.round(w[:3], 3)}")
    sock.close()


def worker(ctx: zmq.Context, x: np.ndarray, y: np.ndarray, losses: list) -> None:
    """DEALER socket: send a request, wait for its reply (one at a time)."""
    sock = ctx.socket(zmq.DEALER)
    sock.connect(ADDRESS)

    def request(op: str, array: np.ndarray | None = None) -> np.ndarray:
        frames = [msgpack.packb({"op": op})] + ([array.tobytes()] if array is not None else [])
        sock.send_multipart(frames)
        _header, raw = sock.recv_multipart()
        return np.frombuffer(raw, np.float32)

    for _ in range(STEPS):
        w = request("pull")  # the current weights
        error = x @ w - y  # (N,) residuals of the linear model
        losses.append(float(np.mean(error**2)))
        request("push", (2 / len(y) * x.T @ error).astype(np.float32))  # d mean(err^2) / dw
    request("bye")
    sock.close()


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, DIM)).astype(np.float32)
    y = x @ rng.standard_normal(DIM).astype(np.float32)  # the weights to find
    ctx = zmq.Context()
    threads = [threading.Thread(target=server, args=(ctx, 2))]  # started first: it binds
    losses: list[list[float]] = [[], []]
    for rank in range(2):  # each worker trains on its own shard: rows rank, rank+2, ...
        threads.append(
            threading.Thread(target=worker, args=(ctx, x[rank::2], y[rank::2], losses[rank]))
        )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"worker 0: loss {losses[0][0]:.3g} -> {losses[0][-1]:.3g} in {STEPS} steps")
    ctx.term()
