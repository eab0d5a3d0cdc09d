"""minips/ops/inflow.py on real sockets, with small bounds: what it counts, whom it cuts.

A ROUTER with an InflowGuard, turned by hand as the server's loop turns it; clients are
DEALERs, or raw TCP sockets speaking ZMTP (tests/server/test_memory.py) to leave a
message unfinished.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator

import pytest
import zmq
from test_memory import HANDSHAKE, frame_header, zmtp_peer
from test_server_support import running_server

from minips.ops import inflow
from minips.ops.inflow import InflowGuard, InflowLimits, watch_supported

MiB = 1 << 20

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not watch_supported(), reason="needs Linux's TCP_INFO"
)


@contextlib.contextmanager
def guarded_router(limits: InflowLimits, curve: bool = False) -> Iterator[tuple]:
    """(router, guard, port, client keys or None) on loopback."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    keys = None
    if curve:
        server_public, server_secret = zmq.curve_keypair()
        router.curve_server, router.curve_secretkey = True, server_secret
        keys = (server_public, *zmq.curve_keypair())
    guard = InflowGuard(router, limits)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield router, guard, port, keys
    finally:
        guard.close()
        context.destroy(linger=0)  # the router and any client left open


def turn(
    router: zmq.Socket, guard: InflowGuard, seconds: float = 0.5, until: int = 0
) -> list[list]:
    """The server's loop for `seconds` (or until `until` messages came): receive, count as
    delivered, check. Returns the messages."""
    received, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline and not (until and len(received) >= until):
        if router.poll(guard.wait(0.01) * 1000):
            frames = router.recv_multipart(copy=False)
            guard.delivered(frames)
            received.append(frames)
        guard.check(time.monotonic())
    return received


def is_cut(peer: socket.socket, seconds: float = 2.0) -> bool:
    """True if the server closed the connection (end-of-stream or reset) within `seconds`."""
    peer.settimeout(seconds)
    try:
        while peer.recv(65536):  # the server's greeting and READY first
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def unfinished(peer: socket.socket, nbytes: int) -> None:
    """Start a message with a frame of 64 MiB and send only `nbytes` of it."""
    peer.sendall(frame_header(64 * MiB) + bytes(nbytes))


@pytest.mark.parametrize("curve", [False, True], ids=["null", "curve"])
def test_whole_messages_are_counted_exactly_so_nothing_accumulates(curve):
    sizes = [0, 1, 222, 223, 255, 256, 70_000]  # both sides of each short/long frame size
    with guarded_router(InflowLimits(), curve) as (router, guard, port, keys):
        dealer = router.context.socket(zmq.DEALER)
        if keys:
            dealer.curve_serverkey, dealer.curve_publickey, dealer.curve_secretkey = keys
        dealer.connect(f"tcp://127.0.0.1:{port}")
        held = []
        for _ in range(2):
            for _ in range(100):
                dealer.send_multipart([bytes(size) for size in sizes])
            assert len(turn(router, guard, 20, until=100)) == 100
            guard._next_sweep = 0.0
            guard.check(time.monotonic())
            held.append([c.held for c in guard.connections.values()])
        dealer.close(linger=0)
    # 700 frames later, not one byte more: only the handshake's 107 bytes (567 with CURVE)
    assert held[0] == held[1] and len(held[0]) == 1
    assert 0 < held[0][0] < 1024 and guard.cuts == 0


def test_a_connection_holding_more_than_its_bound_is_cut_and_others_are_served():
    with guarded_router(InflowLimits(per_connection=4 * MiB)) as (router, guard, port, _):
        attacker = zmtp_peer(port)
        unfinished(attacker, 8 * MiB)
        assert turn(router, guard) == []
        assert guard.cuts == 1 and is_cut(attacker)
        honest = zmtp_peer(port)
        honest.sendall(frame_header(3) + b"hi!")
        (message,) = turn(router, guard)
        assert bytes(message[-1]) == b"hi!" and not is_cut(honest, 0.2)


def test_a_connection_is_cut_one_byte_past_its_bound_and_not_at_it():
    bound = 1 * MiB
    with guarded_router(InflowLimits(per_connection=bound)) as (router, guard, port, _):
        at, past = zmtp_peer(port), zmtp_peer(port)
        opening = len(HANDSHAKE) + len(frame_header(64 * MiB))  # held too: received whole
        unfinished(at, bound - opening)
        unfinished(past, bound - opening + 1)
        turn(router, guard)
        assert [c.held for c in guard.connections.values() if not c.cut] == [bound]  # `at`
        assert is_cut(past) and not is_cut(at, 0.2) and guard.cuts == 1


def test_the_largest_is_cut_while_all_connections_hold_too_much():
    limits = InflowLimits(per_connection=8 * MiB, total=6 * MiB)
    with guarded_router(limits) as (router, guard, port, _):
        small, medium, large = (zmtp_peer(port) for _ in range(3))
        unfinished(small, 1 * MiB)
        unfinished(medium, 2 * MiB)
        turn(router, guard, 0.2)
        unfinished(large, 4 * MiB)
        turn(router, guard)
        assert guard.cuts == 1 and is_cut(large)
        assert not is_cut(small, 0.2) and not is_cut(medium, 0.2)


def test_connections_past_the_cap_are_cut_as_they_come():
    with guarded_router(InflowLimits(max_connections=3)) as (router, guard, port, _):
        peers = []
        for _ in range(5):
            peers.append(socket.create_connection(("127.0.0.1", port)))
            peers[-1].sendall(HANDSHAKE)
            turn(router, guard, 0.1)
        assert [is_cut(peer, 0.5) for peer in peers] == [False] * 3 + [True] * 2
        assert guard.cuts == 2


def test_ipc_connections_are_not_watched(tmp_path):
    with guarded_router(InflowLimits()) as (router, guard, _, _):
        router.bind(f"ipc://{tmp_path}/ps.ipc")
        dealer = router.context.socket(zmq.DEALER)
        dealer.connect(f"ipc://{tmp_path}/ps.ipc")
        dealer.send(b"hello")
        assert len(turn(router, guard, 0.3)) == 1
        assert guard.connections == {}
        dealer.close(linger=0)


def test_a_serving_loop_cuts_a_connection_past_the_cap_before_its_poll_interval_ends():
    # ZeroMQ accepts connections in its own thread, each costing memory until cut: the loop
    # wakes for the connection event rather than sleeping out its poll interval.
    with running_server(poll_interval=3.0) as server:
        server.ops.inflow.limits = InflowLimits(max_connections=2)
        port = int(server.endpoint.rsplit(":", 1)[1])
        peers = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        try:
            for peer in peers:
                peer.sendall(HANDSHAKE)
            assert is_cut(peers[2], 1.5)  # before the loop's 3 s wait ends
            assert not is_cut(peers[0], 0.2) and not is_cut(peers[1], 0.2)
        finally:
            for peer in peers:
                peer.close()


def test_closed_connections_no_longer_count_toward_the_cap():
    # The freed fds are taken by other files first, so the new connections get new fds:
    # a guard that kept the closed ones would count 6 and cut the 3 new ones.
    with guarded_router(InflowLimits(max_connections=3)) as (router, guard, port, _):
        first = [zmtp_peer(port) for _ in range(3)]
        turn(router, guard, 0.2)
        for peer in first:
            peer.close()
        deadline = time.monotonic() + 10
        while guard.connections and time.monotonic() < deadline:  # ZeroMQ saw them close
            turn(router, guard, 0.05)
        taken = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]
        try:
            again = [zmtp_peer(port) for _ in range(3)]
            turn(router, guard, 0.2)
            assert [is_cut(peer, 0.3) for peer in again] == [False] * 3 and guard.cuts == 0
            for peer in again:
                peer.close()
        finally:
            for fd in taken:
                os.close(fd)


def test_a_connection_cut_is_cut_and_counted_once(monkeypatch):
    """Between a cut and ZeroMQ's closing of the connection the guard may sweep again: it
    does not cut (nor count, nor log) the same connection twice."""
    cuts = []
    monkeypatch.setattr(inflow, "cut", lambda fd: cuts.append(fd) or "peer")  # stays open
    with guarded_router(InflowLimits(per_connection=1 * MiB)) as (router, guard, port, _):
        attacker = zmtp_peer(port)
        unfinished(attacker, 2 * MiB)
        for _ in range(5):
            turn(router, guard, 0.1)
            guard._next_sweep = 0.0
        assert len(cuts) == 1 and guard.cuts == 1
        attacker.close()
