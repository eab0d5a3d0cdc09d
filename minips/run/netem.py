"""A real, shared bottleneck at the server: its own network namespace behind a tc-shaped veth.

    sudo python -m minips.run.netem --rate 100mbit [--delay 0.2ms] \\
        --server 'minips server --bind tcp://{server_addr}:5555 ...' \\
        -- minips worker --connect tcp://{server_addr}:5555 ...
    sudo python -m minips.run.netem --rate 20mbit --measure 20MB   # check the link itself

What it builds (names unique per run, so two runs never clash):

    root namespace (workers)                       netns minips-ps-<pid>-<hex> (server)
    mpsh<hex> 169.254.A.B+1/30  <== veth pair ==>  mpsp<hex> 169.254.A.B+2/30
    egress shaped: worker -> server                egress shaped: server -> worker

Both ends shape their egress with tc (tbf: rate, a small burst, a bounded queue; with
--delay a netem qdisc in front adds the one-way delay), so uploads and downloads each get
`rate` (full duplex, as Ethernet), and every worker's traffic crosses this one link, as it
crosses a real server's NIC. The addresses are link-local (169.254/16, never routed), exist
only on this veth pair, and a subnet already in use on this machine is never picked.

`shaped_link()` is the library form (the launcher starts the server with
`netns_prefix(link.netns)` in front of its command). Everything made is removed when the
block ends, also on an exception or Ctrl-C; the CLI turns SIGTERM/SIGHUP into the same
path. Needs root (CAP_NET_ADMIN), `ip` and `tc` (iproute2).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import NamedTuple

from minips.errors import MinipsError
from minips.run.plan_measure import parse_rate  # the same rate units as --bandwidth

NETNS_PREFIX = "minips-ps-"
DEFAULT_QUEUE = "20ms"  # tbf `latency`: the longest a packet may queue before it is dropped


class NetemError(Exception):
    """The shaped link cannot be built (not root, no iproute2, a tc/ip command failed)."""


def name_prefix() -> str:
    """The namespace prefix of the links this process makes: minips-ps-, or NAME-ps- with
    MINIPS_NETEM_NAME=NAME (machines that several people share tell their links apart by
    it; the veths are then named after NAME's first 5 characters, not mps)."""
    name = os.environ.get("MINIPS_NETEM_NAME", "")
    return f"{name}-ps-" if re.fullmatch(r"[a-z][a-z0-9]{0,15}", name) else NETNS_PREFIX


class ShapedLink(NamedTuple):
    """What `shaped_link` yields; unpacks as (netns, server_addr, client_addr)."""

    netns: str  # the server's network namespace
    server_addr: str  # the server's address (bind here; workers connect here)
    client_addr: str  # the root namespace's address on the link (workers' source)

    @property
    def dev_prefix(self) -> str:
        """Its veth ends' prefix: mps, or MINIPS_NETEM_NAME's first 5 characters."""
        return "mps" if self.netns.startswith(NETNS_PREFIX) else self.netns.split("-")[0][:5]

    @property
    def host_dev(self) -> str:
        """The veth end in the root namespace (named after the namespace's random tag)."""
        return f"{self.dev_prefix}h" + self.netns.rsplit("-", 1)[1]

    @property
    def server_dev(self) -> str:
        """The veth end inside the server's namespace."""
        return f"{self.dev_prefix}p" + self.netns.rsplit("-", 1)[1]

    @property
    def prefix(self) -> list[str]:
        return netns_prefix(self.netns)


def netns_prefix(netns: str) -> list[str]:
    """The command prefix that runs a program inside `netns`: ["ip", "netns", "exec", NAME]."""
    return ["ip", "netns", "exec", netns]


def check_can_shape() -> None:
    """Raise NetemError (one line) unless we are root and have ip and tc."""
    if os.geteuid() != 0:
        raise NetemError("a shaped link needs root (network namespaces and tc): run it with sudo")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetemError(f"`{tool}` not found: install iproute2")


def _run(*args: str) -> str:
    """The stdout of `args`; NetemError "tc failed: REASON" when it fails, REASON the first
    line ip or tc said (tc adds its usage text after it)."""
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        raise NetemError(f"{args[0]} failed: {(said or [f'exit {done.returncode}'])[0]}")
    return done.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 169.254.A.B/30 that no address or route on this machine touches yet."""
    listing = _run("ip", "-4", "addr") + _run("ip", "-4", "route")
    used = [
        ipaddress.ip_network(word, strict=False)
        for word in re.findall(r"169\.254\.[0-9.]+(?:/[0-9]+)?", listing)
    ]
    for _ in range(100):
        # A in 1..254 but not 169 (169.254.169.254 is the cloud metadata address)
        third = secrets.choice([a for a in range(1, 255) if a != 169])
        subnet = ipaddress.ip_network(f"169.254.{third}.{4 * secrets.randbelow(64)}/30")
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise NetemError("no free 169.254.x.x/30 subnet found")


def _shape(netns: str | None, dev: str, rate: str, delay: str | None, queue: str) -> None:
    """Shape `dev`'s egress: [netem delay ->] tbf rate R, burst ~1 ms of R, queue <= `queue`."""
    tc = ["tc"] if netns is None else ["tc", "-n", netns]
    # tbf's burst must hold at least one full frame and what the rate earns per timer tick;
    # 32 KiB does both up to ~10 Gbit/s on a high-resolution-timer kernel and keeps the
    # link from running faster than `rate` for more than ~2.6 ms at 100 Mbit/s.
    tbf = ["tbf", "rate", rate, "burst", "32kb", "latency", queue]
    if delay is None:
        _run(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf)
        return
    try:
        _run(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", delay,
             "limit", "100000")  # fmt: skip
    except NetemError as error:
        if "unknown" in str(error).lower():
            raise NetemError(
                "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), so --delay is not "
                "available; shaping the rate alone (tbf) works"
            ) from None
        raise
    _run(*tc, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)


def _build(link: ShapedLink, subnet, rate: str, delay: str | None, queue: str) -> None:
    client, server = list(subnet.hosts())
    ns = link.netns
    _run("ip", "netns", "add", ns)
    _run("ip", "link", "add", link.host_dev, "type", "veth", "peer", "name", link.server_dev)
    _run("ip", "link", "set", link.server_dev, "netns", ns)
    _run("ip", "addr", "add", f"{client}/30", "dev", link.host_dev)
    _run("ip", "link", "set", link.host_dev, "up")
    _run("ip", "-n", ns, "addr", "add", f"{server}/30", "dev", link.server_dev)
    _run("ip", "-n", ns, "link", "set", link.server_dev, "up")
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    _shape(None, link.host_dev, rate, delay, queue)  # worker -> server
    _shape(ns, link.server_dev, rate, delay, queue)  # server -> worker


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _stop_processes_in(netns: str) -> None:
    """End the processes this run started inside its namespace (SIGTERM, then SIGKILL)."""
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    pids = [int(p) for p in done.stdout.split()]
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.05)


def _remove(link: ShapedLink) -> None:
    """Remove what `_build` made, whatever part of it exists; never raises."""
    _stop_processes_in(link.netns)
    # Deleting one veth end deletes its peer; the namespace goes when `ip netns del` drops it.
    subprocess.run(["ip", "link", "del", link.host_dev], capture_output=True)
    subprocess.run(["ip", "netns", "del", link.netns], capture_output=True)


def leftovers(link: ShapedLink) -> list[str]:
    """What of `link` still exists on this machine (empty after a clean exit)."""
    found = []
    if link.netns in _run("ip", "netns", "list").split():
        found.append(f"netns {link.netns}")
    if subprocess.run(["ip", "link", "show", link.host_dev], capture_output=True).returncode == 0:
        found.append(f"link {link.host_dev}")
    return found


@contextlib.contextmanager
def shaped_link(
    rate: str, delay: str | None = None, queue: str = DEFAULT_QUEUE
) -> Iterator[ShapedLink]:
    """A server namespace behind a veth pair shaped to `rate` each way (tc units: "100mbit").

    Yields ShapedLink(netns, server_addr, client_addr): run the server with
    `netns_prefix(netns)` bound on server_addr; processes in the root namespace reach it at
    server_addr through the shaped link. On exit (normal, exception, Ctrl-C) the processes
    left in the namespace are ended and the namespace and veth pair removed.
    """
    check_can_shape()
    tag = secrets.token_hex(3)
    subnet = _free_subnet()
    client, server = (str(a) for a in subnet.hosts())
    link = ShapedLink(f"{name_prefix()}{os.getpid()}-{tag}", server, client)
    try:
        _build(link, subnet, rate, delay, queue)
        yield link
    finally:
        _remove(link)


@contextlib.contextmanager
def shaped_links(count: int, rate: str, delay: str | None = None,
                 queue: str = DEFAULT_QUEUE) -> Iterator[list[ShapedLink]]:  # fmt: skip
    """`count` shaped links (one per shard of a server group), each its own namespace, that
    also reach one another: each namespace routes 169.254/16 through its veth peer, and
    the root namespace forwards between these veths only (the forwarding switch of each
    host-side veth; the host's own setting is untouched, and goes with the veth)."""
    with contextlib.ExitStack() as stack:
        links = [stack.enter_context(shaped_link(rate, delay, queue)) for _ in range(count)]
        if count > 1:
            for link in links:
                _run("ip", "-n", link.netns, "route", "add", "169.254.0.0/16",
                     "via", link.client_addr)  # fmt: skip
                _run("sysctl", "-q", "-w", f"net.ipv4.conf.{link.host_dev}.forwarding=1")
        yield links


def remove_stale() -> list[str]:
    """Remove namespaces of earlier runs whose owner process is gone (killed with SIGKILL)."""
    removed = []
    for name in _run("ip", "netns", "list").split():
        match = re.fullmatch(re.escape(name_prefix()) + r"(\d+)-([0-9a-f]{6})", name)
        if match and not _alive(int(match.group(1))):
            _remove(ShapedLink(name, "", ""))
            removed.append(name)
    return removed


# --- measuring the link ---------------------------------------------------------------------

# Runs inside the server's namespace: accepts one connection; "u" = receive N bytes then
# acknowledge (upload), "d" = send N bytes (download).
_PEER = """
import socket, sys
addr, n = sys.argv[1], int(sys.argv[2])
listener = socket.create_server((addr, 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
mode, left = conn.recv(1), n
if mode == b"u":
    while left > 0:
        chunk = conn.recv(1 << 20)
        if not chunk:
            sys.exit("upload cut short")
        left -= len(chunk)
    conn.sendall(b"k")
else:
    conn.sendall(bytes(n))
conn.close()
"""


def measure_throughput(link: ShapedLink, nbytes: int, direction: str = "up") -> float:
    """Push `nbytes` of TCP payload through `link` one way; return the goodput in bytes/s.

    "up" times worker -> server (until the server acknowledged the last byte), "down"
    server -> worker (until the last byte arrived), each from the first request.
    """
    import socket

    peer = subprocess.Popen(
        [*link.prefix, sys.executable, "-c", _PEER, link.server_addr, str(nbytes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(peer.stdout.readline())
        with socket.create_connection((link.server_addr, port), timeout=120) as sock:
            start = time.monotonic()
            if direction == "up":
                sock.sendall(b"u")
                sock.sendall(bytes(nbytes))
                if sock.recv(1) != b"k":
                    raise NetemError("the receiver did not acknowledge the upload")
            else:
                sock.sendall(b"d")
                view, got = bytearray(1 << 20), 0
                while got < nbytes:
                    size = sock.recv_into(view)
                    if size == 0:
                        raise NetemError("the download was cut short")
                    got += size
            elapsed = time.monotonic() - start
        if peer.wait(timeout=30) != 0:
            raise NetemError("the peer inside the namespace failed")
        return nbytes / elapsed
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()


# --- command line ----------------------------------------------------------------------------


def _raise_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through shaped_link's finally, like Ctrl-C


def _fill(words: list[str], link: ShapedLink) -> list[str]:
    fields = {"netns": link.netns, "server_addr": link.server_addr, "client_addr": link.client_addr}
    return [word.format(**fields) for word in words]


def _run_through(link: ShapedLink, server: str | None, command: list[str]) -> int:
    """Start `server` (a shell command) inside the namespace, then `command` outside it."""
    env = {**os.environ, "MINIPS_NETEM_NETNS": link.netns,
           "MINIPS_NETEM_SERVER_ADDR": link.server_addr,
           "MINIPS_NETEM_CLIENT_ADDR": link.client_addr,
           "MINIPS_NETEM_PREFIX": " ".join(link.prefix)}  # fmt: skip
    server_process = None
    if server:
        server_cmd = [*link.prefix, "sh", "-c", _fill([server], link)[0]]
        server_process = subprocess.Popen(server_cmd, env=env)
    try:
        return subprocess.run(_fill(command, link), env=env).returncode if command else 0
    finally:
        if server_process is not None:
            server_process.terminate()
            try:
                server_process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server_process.kill()
                server_process.wait()


def _size(text: str) -> int:
    match = re.fullmatch(r"([0-9.]+)\s*([kmg]?)b?", text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: e.g. 20MB, 500kB, 1000000")
    return int(float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", required=True, help="link rate, tc units: 100mbit, 1gbit")
    parser.add_argument("--delay", help="one-way delay added each way (netem), e.g. 0.2ms")
    parser.add_argument("--queue", default=DEFAULT_QUEUE, help="tbf queue limit as a time")
    parser.add_argument("--server", help="shell command run inside the server's namespace; "
                        "{server_addr}, {client_addr}, {netns} are filled in")  # fmt: skip
    parser.add_argument(
        "--measure",
        type=_size,
        metavar="BYTES",
        help="measure the link's goodput each way instead of running a command",
    )
    parser.add_argument("command", nargs="*", help="run in the root namespace, after --")
    args = parser.parse_args(argv)
    previous = {
        sig: signal.signal(sig, _raise_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        target = parse_rate(args.rate)
        with shaped_link(args.rate, args.delay, args.queue) as link:
            print(f"netem: server netns {link.netns} at {link.server_addr}, workers at "
                  f"{link.client_addr}, {args.rate} each way", file=sys.stderr)  # fmt: skip
            if args.measure:
                for direction in ("up", "down"):
                    rate = measure_throughput(link, args.measure, direction)
                    print(f"{direction:4} {args.measure / 1e6:.1f} MB: {rate * 8 / 1e6:7.2f} Mbit/s"
                          f" goodput = {rate / target:.3f} x {args.rate}")  # fmt: skip
                return 0
            return _run_through(link, args.server, args.command)
    except (NetemError, MinipsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:  # main() may be called in a process that goes on (a test, a tool)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    raise SystemExit(main())
