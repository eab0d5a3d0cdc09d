"""Server capacity: applied updates per second with 1, 2, 4 and 8 clients pushing at once.

The server (asgd, SGD with momentum, LeNet-5's 431,080 parameters) runs in its own process;
K client processes each push a LeNet-5-sized gradient (random, precomputed, so no compute
time) as fast as the server answers, and get the parameters back like a worker does: a
push then a pull (`--mode pushpull`, two round trips), one fused push with `pull_since`
(`--mode fused`, one round trip), or no pull at all (`--mode push`). The figure is the
server's applied updates per second over a fixed window, read from its own `stats`
counters. Median of --repeats windows.

    python tools/bench_server.py --clients 1,2,4,8 --seconds 3 --repeats 3 \
        [--mode pushpull|fused|push] [--transport tcp|ipc] [--server minips|raw|raw-work] \
        [--servers K]

`--servers K`: the minips server is a group of K shard processes (tools/group_bench.py),
each applying its slices of every update; an update counts once (the root's count). With
`--server raw|raw-work`, K reference servers, each over its shard's slices of the same
partition (minips/group/partition.py), and clients that send each exchange to all K
before reading a reply (raw_ps.RawGroupClient): the ceiling of a group on this machine.

`--server raw` and `--server raw-work` replace both ends by tools/raw_ps.py (the ceilings:
what the same bytes cost without minips): a bare pyzmq ROUTER answering bare DEALER clients
with the same bytes (push -> ack, pull and fused -> the 8 parameter frames), with no work
(`raw`: prebuilt frames) or with the minimal correct asgd work (`raw-work`: finiteness by a
dot, momentum 0.9 in place, each new version in a buffer no frame in flight references,
sent with copy=False).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from minips.nn import lenet5  # noqa: E402
from minips.ops.server_ops import ServerOps  # noqa: E402
from minips.ops.signals import serve_forever  # noqa: E402
from minips.rules import make_rule  # noqa: E402
from minips.server.server import ParameterServer, ServerOptions  # noqa: E402
from minips.state.store import SGD  # noqa: E402
from minips.worker.client import PSClient  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import raw_ps  # noqa: E402
from group_bench import shard_bind, start_group  # noqa: E402

from minips.group.partition import partition_of_model  # noqa: E402
from minips.group.shard import shard_params  # noqa: E402

RAW_STEPS = {"pushpull": "push_pull", "fused": "fused", "push": "push"}

# The folder of a run's ipc socket files: made for the run, inherited by the processes
# it starts, removed at its end.
SOCKETS = "MINIPS_BENCH_SOCKETS"


def serve(endpoint_queue: mp.Queue, bind: str) -> None:
    """The server process: lenet5 parameters, asgd, momentum 0.9, no fixed world size.

    (With a world size the server would hold the first pulls until that many workers said
    hello; here clients come and go between measurements.)
    """
    params = lenet5(seed=0).params
    optimizer = SGD(params, lr=0.01, momentum=0.9)
    server = ParameterServer(params, make_rule("asgd"), optimizer, ServerOptions(bind=bind),
                             operations=ServerOps)  # fmt: skip
    endpoint_queue.put(server.endpoint)
    serve_forever(server)


def shard_tensors(servers: int, shard: int) -> list[np.ndarray]:
    """Shard `shard`'s slices of the lenet5 tensors in a group of `servers` (all at 1)."""
    params = lenet5(seed=0).params
    if servers == 1:
        return list(params.values())
    return list(shard_params(params, partition_of_model(params, servers), shard).values())


def serve_raw(endpoint_queue: mp.Queue, bind: str, work: bool, servers: int, shard: int) -> None:
    """A reference server process (tools/raw_ps.py) over its shard's lenet5 tensors."""
    import zmq

    tensors = shard_tensors(servers, shard)
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.bind(bind)
    endpoint_queue.put(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    raw_ps.serve(sock, raw_ps.MomentumStore(tensors, lr=0.01, mu=0.9) if work else None, tensors)


def raw_client_loop(
    endpoints: str, mode: str, run_for: float, ready: mp.Barrier, joining: mp.Lock
) -> None:
    """A reference client: the same gradient bytes, as fast as the reference servers answer
    (`endpoints`: the shards' endpoints, comma-separated)."""
    rng = np.random.default_rng(os.getpid())
    addresses = endpoints.split(",")
    grads = [[(1e-6 * rng.standard_normal(t.shape)).astype(np.float32)
              for t in shard_tensors(len(addresses), shard)]
             for shard in range(len(addresses))]  # fmt: skip
    client = raw_ps.RawGroupClient(addresses, grads)
    step = getattr(client, RAW_STEPS[mode])
    ready.wait()
    stop_at = time.monotonic() + run_for
    while time.monotonic() < stop_at:
        step()
    client.close()


def client_loop(
    endpoint: str, mode: str, run_for: float, ready: mp.Barrier, joining: mp.Lock
) -> None:
    """One client: push the same gradient (and pull, by `mode`) for `run_for` seconds
    from the moment every client is ready.

    The hellos go one at a time (`joining`): with no fixed world size a server's hello reply
    carries the workers it has seen so far, and a group's client checks that every shard
    gave the root's rank and world size, which two clients saying hello at once can break.
    """
    with PSClient(endpoint, timeout=30) as client:
        with joining:
            client.hello({"role": "worker", "pid": os.getpid()})
        reply = client.pull()
        rng = np.random.default_rng(os.getpid())
        grads = {
            name: (1e-6 * rng.standard_normal(value.shape)).astype(np.float32)
            for name, value in reply.params.items()
        }
        version = reply.version
        ready.wait()
        stop_at = time.monotonic() + run_for
        while time.monotonic() < stop_at:
            if mode == "fused":
                version = client.push(grads, base=version, samples=64, pull_since=version).version
                continue
            pushed = client.push(grads, base=version, samples=64)
            version = client.pull(since=version).version if mode == "pushpull" else pushed.version
        client.bye()


def _updates_counter(endpoint: str, raw: bool):
    """(read the server's applied-update count, close) for a minips or reference server."""
    if raw:
        client = raw_ps.RawClient(endpoint.split(",")[0], [])  # shard 0 counts every update
        return client.updates, client.close
    operator = PSClient(endpoint, timeout=30)
    return (lambda: operator.stats()["updates"]), operator.close


def measure(endpoint: str, clients: int, seconds: float, mode: str, raw: bool = False) -> float:
    """Applied updates per second while `clients` processes push for `seconds`."""
    ready = mp.Barrier(clients + 1, timeout=120)  # a client that died breaks it, no hang
    joining = mp.Lock()
    warmup = 0.5
    run_for = warmup + seconds + 0.5  # counted from `ready`: start-up never eats the window
    loop = raw_client_loop if raw else client_loop
    procs = [
        mp.Process(target=loop, args=(endpoint, mode, run_for, ready, joining))
        for _ in range(clients)
    ]
    for proc in procs:
        proc.start()
    ready.wait()
    updates, close = _updates_counter(endpoint, raw)
    time.sleep(warmup)
    first, t_first = updates(), time.monotonic()
    time.sleep(seconds)
    last, t_last = updates(), time.monotonic()
    close()
    for proc in procs:
        proc.join()
    return (last - first) / (t_last - t_first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", choices=("pushpull", "fused", "push"), default="pushpull")
    parser.add_argument("--transport", choices=("tcp", "ipc"), default="tcp")
    parser.add_argument("--server", choices=("minips", "raw", "raw-work"), default="minips")
    parser.add_argument("--servers", type=int, default=1, help="shards of the group")
    args = parser.parse_args()
    raw = args.server != "minips"

    bind = "tcp://127.0.0.1:*"
    if args.transport == "ipc":
        bind = f"ipc://{tempfile.mkdtemp(dir=os.environ.get(SOCKETS))}/server.sock"
    ctx_queue: mp.Queue = mp.Queue()
    if args.servers > 1 and not raw:
        shards, endpoint = start_group(args.servers, bind, lr=0.01, momentum=0.9)
        server = shards[0]
    elif raw:  # K reference shards; their endpoints, comma-separated, are "the endpoint"
        shards, endpoints = [], []
        for shard in range(args.servers):
            shard_args = (ctx_queue, shard_bind(bind, shard), args.server == "raw-work",
                          args.servers, shard)  # fmt: skip
            shards.append(mp.Process(target=serve_raw, args=shard_args, daemon=True))
            shards[-1].start()
            endpoints.append(ctx_queue.get(timeout=60))
        endpoint = ",".join(endpoints)
    else:
        server = mp.Process(target=serve, args=(ctx_queue, bind), daemon=True)
        server.start()
        endpoint = ctx_queue.get(timeout=60)
        shards = [server]
    print(f"# server capacity, lenet5 (431,080 float32), asgd, {args.mode}, {args.transport}, "
          f"server {args.server} x {args.servers}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print("| clients | updates/s (median) | runs |")
    print("| --- | --- | --- |")
    try:
        for clients in [int(part) for part in args.clients.split(",")]:
            runs = [measure(endpoint, clients, args.seconds, args.mode, raw)
                    for _ in range(args.repeats)]  # fmt: skip
            shown = ", ".join(f"{run:.0f}" for run in runs)
            print(f"| {clients} | {statistics.median(runs):.0f} | {shown} |", flush=True)
    finally:
        _stop(endpoint, raw)
        for shard in shards:
            shard.join(timeout=30)


def _stop(endpoint: str, raw: bool) -> None:
    if raw:
        for address in endpoint.split(","):
            raw_ps.RawClient(address, []).close(stop_server=True)
        return
    with PSClient(endpoint, timeout=10) as operator:
        operator.stats()  # a group's root says where the others are: stop reaches them all
        operator.stop()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="minips-bench-") as sockets:
        os.environ[SOCKETS] = sockets  # the processes it starts inherit it
        main()
