"""A client's retry and the connection it abandoned are never two owners of its worker id.

Lazy Pirate: a request without a reply in time is sent again on a new socket with the same
routing id; the server's ROUTER_HANDOVER gives the id to the new connection and renames
the old one (an id ZeroMQ generates: a first byte of zero). A hello still queued on the
old connection is then read from that generated id: it used to register the worker there,
and the client's own retry got `not_owner` for its own id. A hello that says its client
sets its own routing id (`own_routing_id`, docs/protocol.md 15) and arrives on a
generated one is refused, so it registers nothing.
"""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
from test_server_support import RawPeer, make_params, running_server

from minips.ops.client_retries import RetryingClient
from minips.ops.server_ops import ServerOps
from minips.protocol import wire
from minips.rules import make_rule
from minips.server.server import ParameterServer, ServerOptions
from minips.state.store import SGD
from minips.worker.client import PSClient
from minips.worker.replies import ServerError

CLIENTS = 32
PUSHES = 50
HEARTBEAT = 0.4  # shorter than the clients' timeout: lost replies get workers declared dead
CLIENT_TIMEOUT = 0.5
LOST_REPLY = 0.1  # share of hello and push replies the "network" loses
SLOW = 0.2  # share of hellos the server is slow on (a busy server: timeouts, retries)


def test_a_hello_queued_on_an_abandoned_connection_registers_nothing():
    # The server reads nothing until both attempts wait: the first attempt's hello, on the
    # connection the retry took the id from, comes first, from a generated routing id.
    params = make_params()
    server = ParameterServer(params, make_rule("asgd"), SGD(params, lr=0.1),
                             ServerOptions(stop_grace=0.2, poll_interval=0.02),
                             operations=ServerOps)  # fmt: skip
    routing_id = b"\x01" + os.urandom(15)
    hello = {"op": "hello", "worker": "w", "own_routing_id": True}
    first = RawPeer(server.endpoint, routing_id=routing_id)
    first.send(wire.encode({**hello, "rid": 1}))
    time.sleep(0.3)  # sent; then the client gives up on this socket (Lazy Pirate)
    first.close()
    retry = RawPeer(server.endpoint, routing_id=routing_id)
    retry.send(wire.encode({**hello, "rid": 2}))
    time.sleep(0.3)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        reply = retry.recv()
        assert (reply.op, reply.header["rid"]) == ("hello", 2), reply.header
        assert server.registry.by_id["w"].origin.routing_id == routing_id
        push = {"op": "push", "worker": "w", "seq": 0, "base": 0, "rid": 3}
        answer = retry.request(push, {"fc.b": np.ones(4, np.float32)})
        assert answer.op == "push" and answer.header["applied"]
    finally:
        server.request_stop()
        thread.join(timeout=10)
        server.close()
        retry.close()


def test_a_stranger_still_cannot_take_a_live_id():
    with running_server() as server:
        with PSClient(server.endpoint, timeout=5, retries=0, worker_id="victim") as victim:
            victim.hello({"role": "worker"})
            for routing_id, claim in [(None, True), (b"\x01" + os.urandom(15), True),
                                      (b"\x01" + os.urandom(15), None)]:  # fmt: skip
                with RawPeer(server.endpoint, routing_id=routing_id) as stranger:
                    hello = {"op": "hello", "worker": "victim"}
                    if claim is not None:
                        hello["own_routing_id"] = claim
                    reply = stranger.request(hello)
                    assert (reply.op, reply.header.get("code")) == ("error", "not_owner")
            assert victim.push({"fc.b": np.ones(4, np.float32)}, base=0).applied


def test_a_claim_that_is_not_a_bool_is_bad_field():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        reply = peer.request({"op": "hello", "worker": "w", "own_routing_id": "yes"})
        assert (reply.op, reply.header["code"]) == ("error", "bad_field")


def _unreliable(server, rng: random.Random, lost: list[str]) -> None:
    """A busy, lossy network: the server is sometimes slow on a hello (the hellos queued
    behind it time out and are sent again from new sockets: the race), and some hello and
    push replies are lost after the server answered them (workers declared dead: more
    hellos)."""
    serve, reply = server.serve, server.outbox.reply

    last_slow = [0.0]

    def slow_serve(frames, dropped=0):
        hello = b"\xa5hello" in frames[-1].bytes[:16]
        # now and then: busy for a moment, not for ever (a second between slow moments)
        if hello and time.monotonic() - last_slow[0] > 1.0 and rng.random() < SLOW:
            time.sleep(CLIENT_TIMEOUT * 1.05)
            last_slow[0] = time.monotonic()
        serve(frames, dropped)

    def maybe_lose(envelope, header, worker=None, parts=()):
        if header.get("op") in ("hello", "push") and rng.random() < LOST_REPLY:
            lost.append(header["op"])
            return
        reply(envelope, header, worker=worker, parts=parts)

    server.serve, server.outbox.reply = slow_serve, maybe_lose


def _client(endpoint: str, index: int, acked: list[int], errors: list[BaseException]) -> None:
    gradient = np.zeros(CLIENTS, np.float32)
    gradient[index] = -1.0
    try:
        with RetryingClient(
            endpoint, timeout=CLIENT_TIMEOUT, retries=20, worker_id=f"w{index}"
        ) as ps:
            ps.hello({"role": "worker"})
            version = ps.pull().version
            for _ in range(PUSHES):
                reply = ps.push({"count": gradient}, base=version)
                acked[index] += reply.applied
                version = reply.version
            ps.bye()
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def test_32_clients_retrying_under_drops_never_lose_their_own_id():
    params = {"count": np.zeros(CLIENTS, np.float32)}
    with running_server(params=params, lr=1.0, heartbeat_timeout=HEARTBEAT) as server:
        lost: list[str] = []
        _unreliable(server, random.Random(1), lost)
        acked, errors = [0] * CLIENTS, []
        threads = [
            threading.Thread(target=_client, args=(server.endpoint, i, acked, errors))
            for i in range(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        applied = server.store.params["count"].copy()
    not_owner = [e for e in errors if isinstance(e, ServerError) and e.code == "not_owner"]
    assert not not_owner, f"{len(not_owner)} clients lost their own id: {not_owner[0]}"
    assert not errors, errors[0]
    assert acked == [PUSHES] * CLIENTS
    assert applied.tolist() == [float(PUSHES)] * CLIENTS  # exactly once, still
    assert lost.count("hello") >= 1 and lost.count("push") >= 50
