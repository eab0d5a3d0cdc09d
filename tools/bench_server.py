"""Server capacity: applied updates per second with 1, 2, 4 and 8 clients pushing at once.

The server (asgd, SGD with momentum, LeNet-5's 431,080 parameters) runs in its own process;
K client processes each push a LeNet-5-sized gradient (random, precomputed, so no compute
time) as fast as the server answers, and get the parameters back like a worker does: a
push then a pull (`--mode pushpull`, two round trips), one fused push with `pull_since`
(`--mode fused`, one round trip), or no pull at all (`--mode push`). The figure is the
server's applied updates per second over a fixed window, read from its own `stats`
counters. Median of --repeats windows.

    python tools/bench_server.py --clients 1,2,4,8 --seconds 3 --repeats 3 \
        [--mode pushpull|fused|push] [--transport tcp|ipc]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from minips.client import PSClient  # noqa: E402
from minips.nn import lenet5  # noqa: E402
from minips.rules import make_rule  # noqa: E402
from minips.server import ParameterServer, ServerOptions  # noqa: E402
from minips.store import SGD  # noqa: E402


def serve(endpoint_queue: mp.Queue, bind: str) -> None:
    """The server process: lenet5 parameters, asgd, momentum 0.9, no fixed world size.

    (With a world size the server would hold the first pulls until that many workers said
    hello; here clients come and go between measurements.)
    """
    params = lenet5(seed=0).params
    optimizer = SGD(params, lr=0.01, momentum=0.9)
    server = ParameterServer(params, make_rule("asgd"), optimizer, ServerOptions(bind=bind))
    endpoint_queue.put(server.endpoint)
    server.serve_forever()


def client_loop(endpoint: str, mode: str, stop_at: float, ready: mp.Barrier) -> None:
    """One client: push the same gradient (and pull, by `mode`) until `stop_at` (monotonic)."""
    with PSClient(endpoint, timeout=30) as client:
        client.hello({"role": "worker", "pid": os.getpid()})
        reply = client.pull()
        rng = np.random.default_rng(os.getpid())
        grads = {
            name: (1e-6 * rng.standard_normal(value.shape)).astype(np.float32)
            for name, value in reply.params.items()
        }
        version = reply.version
        ready.wait()
        while time.monotonic() < stop_at:
            if mode == "fused":
                version = client.push(grads, base=version, samples=64, pull_since=version).version
                continue
            pushed = client.push(grads, base=version, samples=64)
            version = client.pull(since=version).version if mode == "pushpull" else pushed.version
        client.bye()


def measure(endpoint: str, clients: int, seconds: float, mode: str) -> float:
    """Applied updates per second while `clients` processes push for `seconds`."""
    ready = mp.Barrier(clients + 1)
    warmup = 0.5
    stop_at = time.monotonic() + seconds + warmup + 2.0  # + start-up of the processes
    procs = [
        mp.Process(target=client_loop, args=(endpoint, mode, stop_at, ready))
        for _ in range(clients)
    ]
    for proc in procs:
        proc.start()
    ready.wait()
    with PSClient(endpoint, timeout=30) as operator:
        time.sleep(warmup)
        first = operator.stats()
        t_first = time.monotonic()
        time.sleep(seconds)
        last = operator.stats()
        t_last = time.monotonic()
    for proc in procs:
        proc.join()
    return (last["updates"] - first["updates"]) / (t_last - t_first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", choices=("pushpull", "fused", "push"), default="pushpull")
    parser.add_argument("--transport", choices=("tcp", "ipc"), default="tcp")
    args = parser.parse_args()

    bind = "tcp://127.0.0.1:*"
    if args.transport == "ipc":
        bind = f"ipc://{tempfile.mkdtemp(prefix='minips-bench-')}/server.sock"
    ctx_queue: mp.Queue = mp.Queue()
    server = mp.Process(target=serve, args=(ctx_queue, bind), daemon=True)
    server.start()
    endpoint = ctx_queue.get(timeout=60)
    print(f"# server capacity, lenet5 (431,080 float32), asgd, {args.mode}, {args.transport}, "
          f"{os.cpu_count()} cores")  # fmt: skip
    print("| clients | updates/s (median) | runs |")
    print("| --- | --- | --- |")
    try:
        for clients in [int(part) for part in args.clients.split(",")]:
            runs = [measure(endpoint, clients, args.seconds, args.mode)
                    for _ in range(args.repeats)]  # fmt: skip
            shown = ", ".join(f"{run:.0f}" for run in runs)
            print(f"| {clients} | {statistics.median(runs):.0f} | {shown} |", flush=True)
    finally:
        with PSClient(endpoint, timeout=10) as operator:
            operator.stop()
        server.join(timeout=30)


if __name__ == "__main__":
    main()
