"""Server memory under hostile clients: resident set (RSS) and its peak, from /proc.

The server (LeNet-5's 431,080 parameters, asgd) runs in its own process; each scenario
starts a fresh one, measures its RSS when idle, runs the attack, and reports the peak
(VmHWM) and the RSS after. Scenarios:

    noread   one client pushes fc1's gradient and pulls everything, N times, and never reads
             a reply (each pull reply holds a fresh 1.7 MB snapshot)
    big      one client sends a single message of --big-mb MB (in frames of 60 MB, each
             under the default frame limit)
    conns    --conns DEALER connections, each saying hello (as an observer) once

    python tools/bench_memory.py --scenario noread,big,conns --big-mb 1024 --conns 1000

It also checks the server still answers an honest client afterwards. The fd limit is raised
to the hard limit for the connections (1,000 ZeroMQ sockets by default: a few thousand in
one process run out of descriptors; tests/server/test_memory.py makes 10,000 raw TCP connections).
docs/protocol.md section 10 states the bounds these stay under (minips/ops/inflow.py cuts a
connection holding too much of a message still arriving; tests/server/test_memory.py checks them).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from minips.nn import lenet5  # noqa: E402
from minips.ops.server_ops import ServerOps  # noqa: E402
from minips.ops.signals import serve_forever  # noqa: E402
from minips.protocol import wire  # noqa: E402
from minips.rules import make_rule  # noqa: E402
from minips.server.server import ParameterServer, ServerOptions  # noqa: E402
from minips.state.store import SGD  # noqa: E402
from minips.worker.client import PSClient  # noqa: E402

MB = 1 << 20


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(endpoint_queue: mp.Queue) -> None:
    raise_fd_limit()
    params = lenet5(seed=0).params
    server = ParameterServer(params, make_rule("asgd"), SGD(params, lr=0.01), ServerOptions(),
                             operations=ServerOps)  # fmt: skip
    endpoint_queue.put(server.endpoint)
    serve_forever(server)


def memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def still_serves(endpoint: str) -> bool:
    try:
        with PSClient(endpoint, timeout=10, retries=0) as client:
            return client.stats()["version"] >= 0
    except Exception:
        return False


def no_reader(endpoint: str, count: int) -> None:
    """Push fc1's gradient and pull everything `count` times; never read a reply."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send_multipart(wire.encode({"op": "hello", "worker": "noread"}))
    grad = np.full((800, 500), 1e-9, np.float32)
    for seq in range(count):
        push = {"op": "push", "worker": "noread", "seq": seq, "base": 0}
        sock.send_multipart(wire.encode(push, {"fc1.w": grad}), copy=False)
        sock.send_multipart(wire.encode({"op": "pull", "worker": "noread", "since": None}))
    time.sleep(5)  # let the server work through the queue
    sock.close()
    context.term()


def big_message(endpoint: str, megabytes: int) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    frame = bytearray(60 * MB)
    count = max(1, megabytes // 60)
    desc = {"name": "fc1.w", "dtype": "float32", "shape": [len(frame) // 4], "codec": "dense"}
    descs = [{**desc, "name": f"p{i}"} for i in range(count)]
    head = {"op": "push", "worker": "big", "seq": 0, "base": 0, "arrays": descs}
    sock.send(wire.encode(head)[0], zmq.SNDMORE)
    for index in range(count):
        sock.send(frame, zmq.SNDMORE if index < count - 1 else 0, copy=False)
    time.sleep(5)
    sock.close()
    context.term()


def connections(endpoint: str, count: int) -> None:
    raise_fd_limit()
    context = zmq.Context()
    context.setsockopt(zmq.MAX_SOCKETS, count + 16)
    sockets = []
    for index in range(count):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        hello = {"op": "hello", "worker": f"c{index}", "info": {"role": "observer"}}
        sock.send_multipart(wire.encode(hello))
        sockets.append(sock)
    time.sleep(10)
    for sock in sockets:
        sock.close()
    context.term()


def run_scenario(name: str, args: argparse.Namespace) -> None:
    queue: mp.Queue = mp.Queue()
    server = mp.Process(target=serve, args=(queue,), daemon=True)
    server.start()
    endpoint = queue.get(timeout=60)
    time.sleep(0.5)
    idle, _ = memory(server.pid)
    target, extra = {
        "noread": (no_reader, args.noread),
        "big": (big_message, args.big_mb),
        "conns": (connections, args.conns),
    }[name]
    attacker = mp.Process(target=target, args=(endpoint, extra))
    started = time.monotonic()
    attacker.start()
    attacker.join()
    rss, peak = memory(server.pid)
    ok = still_serves(endpoint)
    print(f"{name:7s} idle {idle:7.1f} MB  peak {peak:7.1f} MB  after {rss:7.1f} MB  "
          f"({time.monotonic() - started:.1f} s, serves after: {ok})", flush=True)  # fmt: skip
    server.terminate()
    server.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="noread,big,conns")
    parser.add_argument("--noread", type=int, default=1000, help="pulls never read")
    parser.add_argument("--big-mb", type=int, default=1024)
    parser.add_argument("--conns", type=int, default=1_000)
    args = parser.parse_args()
    print(f"minips server memory; {os.cpu_count()} cores; pid {os.getpid()}")
    for name in args.scenario.split(","):
        run_scenario(name, args)


if __name__ == "__main__":
    main()
