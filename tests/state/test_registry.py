"""The worker registry (minips.state.registry): a step sent in several pushes is as stale
as its oldest gradient, a worker waiting on the server is not silent, a worker id taken by
another client starts its own seq bookkeeping, and a finished rank is never given again
while the run lasts (docs/protocol.md 5.1, 5.3, 5.6, 7, 8)."""

from __future__ import annotations

from test_server_support import RawPeer, full, push_header, raw_hello, running_server

from minips.state.registry import WorkerRegistry
from minips.state.requests import HeldPull, Origin


def test_a_step_sent_in_several_pushes_is_as_stale_as_its_oldest_base():
    with running_server() as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            layer = a.request(push_header("a", 0, 0, rid=1, last=False), full("fc.w", 1.0))
            assert layer.op == "push" and layer.header["applied"] is False, layer.header
            other = b.request(push_header("b", 0, 0, rid=2), full("fc.b", 1.0))
            assert other.header["version"] == 1, other.header
            closing = a.request(push_header("a", 1, 1, rid=3), full("fc.b", 0.5))  # base 1
            assert closing.op == "push" and closing.header["applied"], closing.header
            assert closing.header["version"] == 2
            assert closing.header["staleness"] == 1  # its fc.w was computed at version 0


def test_a_worker_the_server_holds_a_request_of_is_never_silent():
    registry = WorkerRegistry(None, grace=1.0)
    worker = registry.register("a", {}, Origin(b"\x01a"))
    worker.last_seen, worker.last_answered = 100.0, 0.0
    assert registry.silent(110.0, 10.0) == []  # silent exactly the timeout: not past it
    assert registry.silent(110.5, 10.0) == [worker]
    worker.held_pull = HeldPull(reply_to=None, since=None)  # waiting on the server
    assert registry.silent(1e6, 10.0) == []


def test_another_client_registering_a_departed_id_starts_its_own_seqs():
    with running_server() as server:
        with RawPeer(server.endpoint) as first, RawPeer(server.endpoint) as second:
            raw_hello(first, "w")
            reply = first.request(push_header("w", 0, 0, rid=1), full("fc.b", 1.0))
            assert reply.header["applied"] and reply.header["version"] == 1, reply.header
            assert first.request({"op": "bye", "worker": "w", "finished": False}).op == "bye"
            raw_hello(second, "w")  # the id is free: another client takes it
            reply = second.request(push_header("w", 0, 1, rid=2), full("fc.b", 1.0))
            assert reply.op == "push" and reply.header["applied"], reply.header
            assert reply.header["version"] == 2  # its seq 0 is its own, not first's answer
            assert reply.header["rid"] == 2


def test_a_finished_rank_is_not_given_while_other_workers_are_live():
    with running_server(world_size=2) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            assert a.request({"op": "bye", "worker": "a"}).op == "bye"  # rank 0 finished
            reply = a.request({"op": "hello", "worker": "c", "info": {"rank": 0}})
            assert (reply.op, reply.header["code"]) == ("error", "full"), reply.header
            assert "has finished its shard" in reply.header["reason"]
