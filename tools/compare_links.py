"""The two bandwidth emulations side by side: a token bucket per worker vs one tc-shaped link.

    python tools/compare_links.py [--rate 100mbit] [--rounds 100] [--clients 4]   # root

The same transfer through each: `--rounds` request/replies of a LeNet-5 gradient's size
(1.72 MB up, 1.72 MB back, 8 array frames + a header) over pyzmq DEALER -> ROUTER echo:
- loopback:  no limit (the reference);
- bucket:    minips.run.netlimit.Link(rate) per client on loopback (up.wait before the request,
             down.wait after the reply), as `--bandwidth` does;
- tc:        the echo server in its own namespace behind minips.run.netem's shaped veth.
Each first with one client, then with `--clients` clients at once splitting the same rounds
(the per-worker vs shared-bottleneck difference), and a small-message ping (64 B) alone
and while the other clients stream (queueing behind big messages). Prints medians and p90
in ms and the aggregate goodput per direction.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import subprocess
import sys
import threading
import time

import zmq

from minips.protocol.wire import frames_nbytes
from minips.run import netem
from minips.run.netlimit import Link
from minips.run.plan_measure import parse_rate

# LeNet-5's tensors (float32 element counts): 431,080 in all = 1.72 MB
LENET5_SIZES = [500, 20, 25_000, 50, 400_000, 500, 5_000, 10]

# The echo server: a ROUTER that returns every request as it came (same frames, copy=False).
_ECHO = """
import sys, zmq
sock = zmq.Context().socket(zmq.ROUTER)
port = sock.bind_to_random_port("tcp://" + sys.argv[1])
print(port, flush=True)
while True:
    sock.send_multipart(sock.recv_multipart(copy=False), copy=False)
"""


@contextlib.contextmanager
def echo_server(prefix: list[str], addr: str):
    """Run the echo ROUTER (under `prefix`, e.g. ip netns exec); yield its endpoint."""
    process = subprocess.Popen([*prefix, sys.executable, "-c", _ECHO, addr],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield f"tcp://{addr}:{int(process.stdout.readline())}"
    finally:
        process.kill()
        process.wait()


def _client(endpoint: str, frames: list, rounds: int, link: Link | None, out: list) -> None:
    """`rounds` round trips of `frames`; appends each one's seconds to `out`."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    nbytes = frames_nbytes(frames)
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            if link is not None:
                link.up.wait(nbytes)
            sock.send_multipart(frames, copy=False)
            reply = sock.recv_multipart(copy=False)
            if link is not None:
                link.down.wait(frames_nbytes(reply))
            out.append(time.perf_counter() - start)
    finally:
        sock.close()


def _run_clients(endpoint, frames, rounds_each, clients, per_client_link, rate, ping=False):
    """`clients` threads at once (each its own socket, and its own Link when bucketed)."""
    results = [[] for _ in range(clients)]
    links = [Link(rate) if per_client_link else None for _ in range(clients)]
    threads = [
        threading.Thread(target=_client, args=(endpoint, frames, rounds_each, links[i], results[i]))
        for i in range(clients)
    ]
    pings: list[float] = []
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    if ping:  # a 64-byte message on its own link/socket while the others stream
        time.sleep(0.5)
        _client(endpoint, [b"p" * 64], 20, Link(rate) if per_client_link else None, pings)
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    return [t for r in results for t in r], wall, pings


def _ms(values: list[float]) -> str:
    if not values:
        return "      -       -"
    p90 = statistics.quantiles(values, n=10)[-1] if len(values) >= 10 else max(values)
    return f"{statistics.median(values) * 1e3:7.1f} {p90 * 1e3:7.1f}"


def _measure(name, endpoint, frames, args, bucket: bool) -> None:
    nbytes = frames_nbytes(frames)
    idle_pings: list[float] = []
    _client(endpoint, [b"p" * 64], 20, Link(args.rate) if bucket else None, idle_pings)
    for clients in (1, args.clients):
        times, wall, pings = _run_clients(endpoint, frames, args.rounds // clients, clients,
                                          bucket, args.rate, ping=clients > 1)  # fmt: skip
        goodput = len(times) * nbytes / wall * 8 / 1e6
        ping_ms = _ms(pings if clients > 1 else idle_pings)
        print(f"{name:9} {clients:2d} client(s)  round trip {_ms(times)}   "
              f"{goodput:7.1f} Mbit/s each way   64 B ping {ping_ms}", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--queue", default=netem.DEFAULT_QUEUE, help="tbf queue, as a time")
    parser.add_argument("--skip-loopback", action="store_true")
    args = parser.parse_args()
    parse_rate(args.rate)
    frames = [b"h" * 200] + [bytes(4 * n) for n in LENET5_SIZES]
    print(f"{args.rounds} round trips of {frames_nbytes(frames) / 1e6:.2f} MB each way, "
          f"rate {args.rate}; times in ms: median p90")  # fmt: skip
    if not args.skip_loopback:
        with echo_server([], "127.0.0.1") as endpoint:
            _measure("loopback", endpoint, frames, args, bucket=False)
    with echo_server([], "127.0.0.1") as endpoint:
        _measure("bucket", endpoint, frames, args, bucket=True)
    try:
        netem.check_can_shape()
    except netem.NetemError as error:
        print(f"tc: skipped: {error}")
        return 0
    with netem.shaped_link(args.rate, queue=args.queue) as link:
        with echo_server(link.prefix, link.server_addr) as endpoint:
            _measure("tc", endpoint, frames, args, bucket=False)
        print(f"tc drops: up {_drops([], link.host_dev)}, "
              f"down {_drops(['-n', link.netns], link.server_dev)} packets")  # fmt: skip
    return 0


def _drops(where: list[str], dev: str) -> str:
    """The packets the tbf queue on `dev` dropped (tail drops when a burst overflows it)."""
    stats = subprocess.run(["tc", *where, "-s", "qdisc", "show", "dev", dev],
                           capture_output=True, text=True).stdout  # fmt: skip
    found = re.search(r"dropped (\d+)", stats)
    return found.group(1) if found else "?"


if __name__ == "__main__":
    raise SystemExit(main())
