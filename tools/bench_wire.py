"""Wire benchmark: minips push+pull round trip vs a raw pyzmq exchange of the same bytes.

    python tools/bench_wire.py [--repeats 300] [--transport tcp|ipc|both] [--torch]
                               [--servers 1,2]

Both servers run in their own process on TCP loopback, in the same run:
- minips: a ParameterServer (asgd, SGD) holding a LeNet-5-sized model (431,080 float32,
  8 tensors); one round = client.push(all gradients) + client.pull(since) of the changed
  parameters, i.e. 1.72 MB each way, decoded, validated (shapes, NaN/Inf), applied.
- raw: a ROUTER that answers a DEALER with pre-built frames of exactly the same sizes
  (one small header + 8 array frames each way, copy=False), doing no work at all; and
  the same raw exchange with minips's numpy work added (finite check, SGD step, copies),
  to tell the price of the update from the price of the protocol.
- step: minips's fused exchange, one round trip (push with `pull_since`), against the
  same raw two-round-trip exchange (push + ack, pull + data).
- tiny: minips `ping` vs a raw one-frame echo (fixed overhead per request).
The two are timed in alternating blocks of 25 round trips, so load drift on the machine
hits both alike.
- ceilings, from tools/raw_ps.py, interleaved in the same blocks: "raw fused",
  one raw round trip of the same bytes (header + 8 gradient frames up, header + 8 parameter
  frames down), no work; "raw fused + work", the same with the minimal correct asgd work
  (finiteness by a dot, momentum 0.9 in place, each version into a free buffer sent with
  copy=False); "raw push+pull + work", two round trips with that work; "raw pipelined
  fused + work", the request sent as one message per slice (per tensor, or --chunks
  elements), each slice updated as it arrives and answered at once, so the update overlaps
  the transfer.
- groups (--servers 1,2,...): for each K > 1, the same minips exchanges against a server
  group of K shard processes (tools/group_bench.py), timed in the same blocks against the
  same one-server raw reference; and the group's ceiling, "raw fused + work, group of K":
  K reference servers (tools/raw_ps.py, minimal work), each over its shard's slices of the
  same partition, one fused request sent to all K before any reply is read.
- torch (optional, --torch): torch.distributed.rpc.rpc_sync sending the same tensors to a
  server process that returns them, when torch is importable.
Prints the medians (ms) and the minips/raw ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import zmq
from group_bench import start_group
from raw_ps import MomentumStore, RawClient, RawGroupClient, chunk_plan, serve

from minips.group.partition import partition_of_model
from minips.group.shard import shard_params
from minips.ops.server_ops import ServerOps  # noqa: E402

LENET5 = {
    "conv1.w": (20, 1, 5, 5),
    "conv1.b": (20,),
    "conv2.w": (50, 20, 5, 5),
    "conv2.b": (50,),
    "fc1.w": (800, 500),
    "fc1.b": (500,),
    "fc2.w": (500, 10),
    "fc2.b": (10,),
}

# The folder of a run's ipc socket files: made for the run, inherited by the processes
# it starts, removed at its end.
SOCKETS = "MINIPS_BENCH_SOCKETS"


def _tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) * 1e-3 for n, s in LENET5.items()}


def _address(transport: str) -> str:
    if transport == "ipc":
        return f"ipc://{tempfile.mkdtemp(dir=os.environ.get(SOCKETS))}/server.sock"
    return "tcp://127.0.0.1:*"


def _minips_server(queue, transport: str = "tcp") -> None:
    from minips.rules import make_rule
    from minips.server.server import ParameterServer, ServerOptions
    from minips.state.store import SGD

    params = _tensors()
    options = ServerOptions(bind=_address(transport))
    server = ParameterServer(params, make_rule("asgd"), SGD(params, lr=1e-6), options,
                             operations=ServerOps)  # fmt: skip
    queue.put(server.endpoint)
    server.run()
    server.close()


def _raw_server(queue, work: bool = False, transport: str = "tcp") -> None:
    """A ROUTER answering with pre-built frames; with `work`, it also does minips's numpy
    work (finiteness check, SGD step on each gradient, a copy of each parameter per pull),
    which separates the cost of the update from the cost of the protocol."""
    params = _tensors()
    names, shapes = list(params), [a.shape for a in params.values()]
    big = [b"h" * 200, *(memoryview(a.reshape(-1)).cast("B") for a in params.values())]
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.bind(_address(transport))
    queue.put(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    while True:
        routing, *frames = sock.recv_multipart(copy=False)
        kind = frames[0].bytes[:1]
        if kind == b"q":
            break
        if work and kind == b"u":
            for name, shape, frame in zip(names, shapes, frames[1:], strict=True):
                grad = np.frombuffer(frame, np.float32).reshape(shape)
                assert np.isfinite(np.dot(grad.reshape(-1), grad.reshape(-1)))
                params[name] -= np.float32(1e-6) * grad
        if work and kind == b"p":
            copies = [a.copy() for a in params.values()]
            big = [b"h" * 200, *(memoryview(a.reshape(-1)).cast("B") for a in copies)]
        # A pull gets the model back; a push or a ping gets a small acknowledgement.
        reply = big if kind == b"p" else [b"a" * 60]
        sock.send_multipart([routing, *reply], copy=False)
    sock.close()
    context.term()


def _shard_tensors(seed: int, servers: int, shard: int) -> list[np.ndarray]:
    """Shard `shard`'s slices of `_tensors(seed)` in a group of `servers` (all of them at 1)."""
    tensors = _tensors(seed)
    if servers == 1:
        return list(tensors.values())
    return list(shard_params(tensors, partition_of_model(tensors, servers), shard).values())


def _reference_server(queue, work: bool, transport: str, servers: int = 1, shard: int = 0) -> None:
    """tools/raw_ps.py's server: no work, or the minimal asgd work (`MomentumStore`); with
    `servers` > 1, over shard `shard`'s slices only."""
    tensors = _shard_tensors(0, servers, shard)
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.bind(_address(transport))
    queue.put(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    serve(sock, MomentumStore(tensors) if work else None, tensors)
    sock.close()
    context.term()


def _start(target, *args) -> tuple[mp.Process, str]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(queue, *args), daemon=True)
    proc.start()
    return proc, queue.get(timeout=60)


def _time_ms(fn, n: int) -> list[float]:
    times = []
    for _ in range(n):
        tick = time.perf_counter()
        fn()
        times.append((time.perf_counter() - tick) * 1e3)
    return times


def _median_ms(fn, repeats: int, warmup: int = 20) -> float:
    _time_ms(fn, warmup)
    return statistics.median(_time_ms(fn, repeats))


def _interleaved(fns: dict, repeats: int, block: int = 25, warmup: int = 20) -> dict:
    """Median ms of each fn, run in alternating blocks so drift hits all of them alike."""
    for fn in fns.values():
        _time_ms(fn, warmup)
    times: dict = {name: [] for name in fns}
    while len(next(iter(times.values()))) < repeats:
        for name, fn in fns.items():
            times[name] += _time_ms(fn, block)
    return {name: statistics.median(t) for name, t in times.items()}


class MinipsPeer:
    """A worker's two exchanges through PSClient: push all gradients, pull what changed."""

    def __init__(self, endpoint: str) -> None:
        from minips.worker.client import PSClient

        self.grads = _tensors(seed=1)
        self.client = PSClient(endpoint, timeout=30.0)
        self.client.hello()
        self.version = self.client.pull().version

    def round_trip(self) -> None:
        self.client.push(self.grads, base=self.version)
        reply = self.client.pull(since=self.version)
        assert len(reply.params) == len(LENET5)
        self.version = reply.version

    def step(self) -> None:
        reply = self.client.push(self.grads, base=self.version, pull_since=self.version)
        assert len(reply.pull.params) == len(LENET5)
        self.version = reply.version

    def tiny(self) -> None:
        self.client.ping()

    def close(self) -> None:
        self.client.stop()  # every shard of a group too
        self.client.close()


class RawPeer:
    """The same frames over a bare DEALER: a push then a pull, no header parsing at all."""

    def __init__(self, endpoint: str) -> None:
        arrays = _tensors(seed=1)
        self.push = [b"u" * 200, *(memoryview(a.reshape(-1)).cast("B") for a in arrays.values())]
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def _exchange(self, frames) -> list:
        self.sock.send_multipart(frames, copy=False)
        return self.sock.recv_multipart(copy=False)

    def round_trip(self) -> None:
        self._exchange(self.push)
        assert len(self._exchange([b"p" * 60])) == 1 + len(LENET5)

    def tiny(self) -> None:
        self._exchange([b"t" * 60])

    def close(self) -> None:
        self.sock.send_multipart([b"q"])
        self.sock.close()
        self.context.term()


def _torch_echo(tensors):
    return tensors


def _torch_server(port: int) -> None:
    import torch.distributed.rpc as rpc

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rpc.init_rpc("server", rank=0, world_size=2)
    rpc.shutdown()


def bench_torch(repeats: int) -> float | None:
    try:
        import torch
        import torch.distributed.rpc as rpc
    except ImportError:
        return None
    port = 29500 + os.getpid() % 1000
    proc = mp.get_context("spawn").Process(target=_torch_server, args=(port,), daemon=True)
    proc.start()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rpc.init_rpc("client", rank=1, world_size=2)
    tensors = [torch.from_numpy(a) for a in _tensors(seed=1).values()]
    # push (send all tensors, get them acknowledged) + pull (get all tensors back).
    median = _median_ms(lambda: rpc.rpc_sync("server", _torch_echo, args=(tensors,)), repeats)
    rpc.shutdown()
    proc.join(timeout=30)
    return median


def _ceiling_fns(bare: RawClient, minimal: RawClient, chunks: list[int | None]) -> dict:
    """The reference exchanges: fused with and without work, push+pull and pipelined
    fused with the minimal work (one entry per slice size; None: one slice per tensor)."""
    sizes = [g.size for g in minimal.grads]
    fns = {"raw_fused": bare.fused, "raw_fused_work": minimal.fused,
           "raw_pushpull_work": minimal.push_pull}  # fmt: skip
    for chunk in chunks:
        plan = chunk_plan(sizes, chunk)
        fns[f"pipe_{chunk}"] = lambda plan=plan: minimal.pipelined(plan)
    return fns


def bench_transport(
    transport: str, repeats: int, chunks: list[int | None], groups: list[int] | None = None
) -> dict[str, float]:
    """Median ms of every exchange over one transport, all interleaved in one run; with
    `groups`, the minips exchanges against a group of each of those sizes too."""
    started = [_start(_raw_server, False, transport), _start(_raw_server, True, transport),
               _start(_minips_server, transport), _start(_reference_server, False, transport),
               _start(_reference_server, True, transport)]  # fmt: skip
    raw, work, ps = (RawPeer(started[0][1]), RawPeer(started[1][1]), MinipsPeer(started[2][1]))
    grads = list(_tensors(seed=1).values())
    bare, minimal = RawClient(started[3][1], grads), RawClient(started[4][1], grads)
    fns = {"step": ps.step, "minips": ps.round_trip, "raw": raw.round_trip, "work": work.round_trip}
    group_runs = [(k, *start_group(k, _address(transport), lr=1e-6)) for k in groups or []]
    group_peers = [(k, MinipsPeer(root)) for k, _, root in group_runs]
    for k, peer in group_peers:
        fns[f"step_k{k}"], fns[f"minips_k{k}"] = peer.step, peer.round_trip
    raw_groups = []
    for k in groups or []:
        shards = [_start(_reference_server, True, transport, k, j) for j in range(k)]
        grads = [_shard_tensors(1, k, j) for j in range(k)]
        raw_groups.append((shards, RawGroupClient([e for _, e in shards], grads)))
        fns[f"raw_fused_work_k{k}"] = raw_groups[-1][1].fused
    full = _interleaved({**fns, **_ceiling_fns(bare, minimal, chunks)}, repeats)
    tiny = _interleaved({"minips_tiny": ps.tiny, "raw_tiny": raw.tiny}, repeats * 3)
    for peer in (ps, raw, work, *(p for _, p in group_peers)):
        peer.close()
    for client in (bare, minimal, *(c for _, c in raw_groups)):
        client.close(stop_server=True)
    started += [shard for shards, _ in raw_groups for shard in shards]
    for proc, _ in started:
        proc.join(timeout=30)
    for _, procs, _ in group_runs:
        for proc in procs:
            proc.join(timeout=30)
    return {**full, **tiny}


def _print_ceilings(transport: str, t: dict, chunks: list[int | None]) -> None:
    raw = t["raw"]
    rows = [("raw fused (one round trip, no work)", "raw_fused"),
            ("raw fused + minimal work", "raw_fused_work"),
            ("raw push+pull + minimal work", "raw_pushpull_work")]  # fmt: skip
    for chunk in chunks:
        size = "per tensor" if chunk is None else f"{chunk * 4 // 1024} KB slices"
        rows.append((f"raw pipelined fused + work, {size}", f"pipe_{chunk}"))
    for label, key in rows:
        print(f"[{transport}] {label:<45} {t[key]:7.3f} ms   ratio {t[key] / raw:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--transport", choices=("tcp", "ipc", "both"), default="both")
    parser.add_argument("--torch", action="store_true", help="also time torch.distributed.rpc")
    parser.add_argument("--servers", default="1",
                        help="group sizes to time minips against, e.g. 1,2")  # fmt: skip
    parser.add_argument(
        "--chunks",
        default="tensor,200000,100000,50000",
        help="slice sizes (elements, or 'tensor') of the pipelined reference",
    )
    args = parser.parse_args()

    n_params = sum(int(np.prod(s)) for s in LENET5.values())
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}, pyzmq {zmq.__version__}, "
          f"libzmq {zmq.zmq_version()}")  # fmt: skip
    print(f"payload: {n_params} float32 = {n_params * 4 / 1e6:.2f} MB each way, "
          f"{args.repeats} round trips, median")  # fmt: skip
    transports = ("tcp", "ipc") if args.transport == "both" else (args.transport,)
    chunks = [None if c == "tensor" else int(c) for c in args.chunks.split(",")]
    for transport in transports:
        print(f"[{transport}] load average before: {os.getloadavg()[0]:.2f}", flush=True)
        groups = [int(k) for k in args.servers.split(",") if int(k) > 1]
        t = bench_transport(transport, args.repeats, chunks, groups)
        raw = t["raw"]
        print(f"[{transport}] raw push+ack, pull+data (no work)      {raw:7.3f} ms")
        print(f"[{transport}] raw + minips's numpy work                {t['work']:7.3f} ms"
              f"   ratio {t['work'] / raw:.2f}")  # fmt: skip
        print(f"[{transport}] minips step (fused, one round trip)      {t['step']:7.3f} ms"
              f"   ratio {t['step'] / raw:.2f}")  # fmt: skip
        print(f"[{transport}] minips push + pull (two round trips)     {t['minips']:7.3f} ms"
              f"   ratio {t['minips'] / raw:.2f}")  # fmt: skip
        print(f"[{transport}] tiny: minips ping {t['minips_tiny']:7.3f} ms, raw echo "
              f"{t['raw_tiny']:7.3f} ms, ratio {t['minips_tiny'] / t['raw_tiny']:.2f}")  # fmt: skip
        for k in groups:
            step, pushpull = t[f"step_k{k}"], t[f"minips_k{k}"]
            print(f"[{transport}] minips step, group of {k} shards        {step:7.3f} ms"
                  f"   ratio {step / raw:.2f}")  # fmt: skip
            print(f"[{transport}] minips push + pull, group of {k}       {pushpull:7.3f} ms"
                  f"   ratio {pushpull / raw:.2f}")  # fmt: skip
            ceiling = t[f"raw_fused_work_k{k}"]
            print(f"[{transport}] raw fused + work, group of {k}         {ceiling:7.3f} ms"
                  f"   ratio {ceiling / raw:.2f}")  # fmt: skip
        _print_ceilings(transport, t, chunks)
    if args.torch:
        torch_ms = bench_torch(args.repeats)
        if torch_ms is None:
            print("torch: not importable")
        else:
            print(f"torch.distributed.rpc echo of the same tensors: {torch_ms:7.3f} ms")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="minips-bench-") as sockets:
        os.environ[SOCKETS] = sockets  # the processes it starts inherit it
        main()
