"""Exactly once (minips/ops/retries.py) across death: with a heartbeat timeout shorter than
the clients' reply timeout, lost replies and workers declared dead while they compute or wait for a
retry, every acknowledged push is applied exactly once. Counted with 32 concurrent clients.

How the count works: the model is one float32 vector `count` of 32 zeros, plain SGD with
lr = 1, so a push of gradient -e_i (one-hot at i) adds exactly 1 to count[i]. Client i
pushes only -e_i, so after the run count[i] is how many of client i's pushes the server
applied, which must equal how many pushes client i saw acknowledged (`applied` replies).
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
from test_server_support import (
    RawPeer,
    copied,
    full,
    make_params,
    push_header,
    raw_hello,
    running_server,
    send_then_fence,
)

from minips.ops.client_retries import RetryingClient
from minips.worker.client import PSClient

CLIENTS = 32
PUSHES = 12
HEARTBEAT = 0.3  # the server's: shorter than the clients' reply timeout below
CLIENT_TIMEOUT = 0.6
LOST_REPLY = 0.1  # share of push replies the "network" loses (remembered, never delivered)


def _losing_push_replies(server, rng: random.Random, lost: list[int]) -> None:
    """Make the server lose some push replies after answering them (as a network would):
    the push is applied and its reply remembered, but the client never sees it."""
    reply = server.outbox.reply

    def maybe_lose(envelope, header, worker=None, parts=()):
        if header.get("op") == "push" and rng.random() < LOST_REPLY:
            lost.append(header["seq"])
            return
        reply(envelope, header, worker=worker, parts=parts)

    server.outbox.reply = maybe_lose


def _client(endpoint: str, index: int, acked: list[int], errors: list[BaseException]) -> None:
    """Push -e_index PUSHES times, sometimes pausing past the heartbeat (declared dead)."""
    pause = random.Random(index)
    gradient = np.zeros(CLIENTS, np.float32)
    gradient[index] = -1.0
    try:
        with RetryingClient(
            endpoint, timeout=CLIENT_TIMEOUT, retries=6, worker_id=f"w{index}"
        ) as ps:
            ps.hello({"role": "worker"})
            version = ps.pull().version
            for _ in range(PUSHES):
                if pause.random() < 0.2:
                    time.sleep(HEARTBEAT * 2)  # computing: silent past the heartbeat
                reply = ps.push({"count": gradient}, base=version)
                acked[index] += reply.applied
                version = reply.version
            ps.bye()
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def test_every_acknowledged_push_is_applied_exactly_once_across_deaths():
    params = {"count": np.zeros(CLIENTS, np.float32)}
    deaths: list[str] = []
    with running_server(params=params, lr=1.0, heartbeat_timeout=HEARTBEAT) as server:
        lost: list[int] = []
        _losing_push_replies(server, random.Random(0), lost)
        retire = server.membership.retire

        def counting_retire(worker, why):
            deaths.append(why)
            return retire(worker, why)

        server.membership.retire = counting_retire
        acked, errors = [0] * CLIENTS, []
        threads = [
            threading.Thread(target=_client, args=(server.endpoint, i, acked, errors))
            for i in range(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        applied = server.store.params["count"].copy()
        updates = server.ops.telemetry.counters.updates
    assert not errors, errors[0]
    assert acked == [PUSHES] * CLIENTS  # every push was acknowledged in the end
    assert applied.tolist() == [float(PUSHES)] * CLIENTS  # ... and applied exactly once
    assert updates == CLIENTS * PUSHES
    # The hidden conditions really happened: replies were lost and workers declared dead.
    assert len(lost) >= 10
    assert deaths.count("heartbeat timeout") >= 10


def test_ssgd_held_push_retried_from_a_new_socket_is_answered_there():
    params = make_params()
    before = copied(params)
    with running_server("ssgd", params=params, lr=1.0) as server:
        old = RawPeer(server.endpoint, routing_id=b"\x01worker-a")
        with old, PSClient(server.endpoint) as other:
            raw_hello(old, "a")
            other.hello()
            grads_a = full("fc.b", 1.0)
            assert send_then_fence(old, push_header("a", 0, 0, rid=1), grads_a) is None  # held
            with RawPeer(server.endpoint, routing_id=b"\x01worker-a") as new:
                # The worker timed out and reconnected: same worker, same seq, new rid.
                assert send_then_fence(new, push_header("a", 0, 0, rid=2), grads_a) is None
                other_reply = other.push(full("fc.b", 3.0), base=0)  # completes the round
                reply = new.recv()
            assert not old.has_reply(0.3)  # the retry replaced the held request
    assert reply.op == "push" and reply.header["rid"] == 2
    assert reply.header["applied"] is True and reply.header["version"] == 1
    assert reply.header["seq"] == 0 and reply.header["stop"] is False
    assert other_reply.applied and other_reply.version == 1
    # a's gradient counted once: mean(1, 3) = 2, not mean(1, 1, 3).
    np.testing.assert_array_equal(params["fc.b"], before["fc.b"] - np.float32(2.0))


def test_a_retried_fused_push_gets_its_answer_again_with_the_parameters():
    """A fused push + pull whose reply was lost: the retry (same seq, new rid) is not
    applied again, and its answer carries the pull half, as the first one did."""
    params = make_params()
    before = copied(params)
    with running_server(params=params, lr=1.0) as server, RawPeer(server.endpoint) as a:
        raw_hello(a, "a")
        fused = {**push_header("a", 0, 0, rid=1), "pull_since": None}
        first = a.request(fused, full("fc.b", 1.0))
        retry = a.request({**fused, "rid": 2}, full("fc.b", 1.0))
    for reply in (first, retry):
        assert reply.op == "push" and reply.header["seq"] == 0, reply.header
        assert reply.header["applied"] is True and reply.header["version"] == 1
        assert set(reply.arrays) == {"fc.w", "fc.b"}  # the pull half, at version 1
        np.testing.assert_array_equal(reply.arrays["fc.b"], before["fc.b"] - np.float32(1.0))
    assert retry.header["rid"] == 2
    np.testing.assert_array_equal(params["fc.b"], before["fc.b"] - np.float32(1.0))  # once
