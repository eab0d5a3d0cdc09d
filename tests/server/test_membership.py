"""hello, bye and stop as minips.server.membership answers them, over real sockets: a live
worker id answers only to its client, a worker that refused the run has not finished its
shard, a stopping server registers nobody, and the stop by the workers' byes waits for
exactly the observers awaited (docs/protocol.md 5.1, 5.6, 5.7, 15)."""

from __future__ import annotations

from test_server_support import RawPeer, full, push_header, raw_hello, running_server


def _stats(peer: RawPeer) -> dict:
    reply = peer.request({"op": "stats"})
    assert reply.op == "stats", reply.header
    return reply.header["stats"]


def _row(stats: dict, worker: str) -> dict:
    return next(row for row in stats["workers"] if row["worker"] == worker)


def test_a_hello_with_a_live_workers_id_from_another_client_is_not_owner():
    with running_server() as server:
        with RawPeer(server.endpoint) as owner, RawPeer(server.endpoint) as stranger:
            raw_hello(owner, "w")
            reply = stranger.request({"op": "hello", "worker": "w"})
            assert (reply.op, reply.header["code"]) == ("error", "not_owner")
            reply = owner.request(push_header("w", 0, 0, rid=1), full("fc.b", 0.5))
            assert reply.op == "push" and reply.header["applied"], reply.header
            assert owner.request({"op": "ping", "worker": "w"}).op == "ping"  # still its own


def test_a_worker_that_refused_the_run_has_not_finished_its_shard():
    with running_server(world_size=1) as server, RawPeer(server.endpoint) as peer:
        raw_hello(peer, "a")
        bye = {"op": "bye", "worker": "a", "finished": True, "refused": "cannot encode topk"}
        assert peer.request(bye).op == "bye"
        stats = _stats(peer)
        assert not stats["stopping"]  # its rank is not finished: the run goes on
        assert _row(stats, "a")["finished"] is False
        assert _row(stats, "a")["refused"] == "cannot encode topk"
        reply = peer.request({"op": "hello", "worker": "b"})
        assert reply.op == "hello" and reply.header["rank"] == 0, reply.header  # rank 0 free


def test_a_stopping_server_refuses_a_new_hello():
    with running_server(stop_grace=30.0) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")  # live: the stop waits for it
            assert a.request({"op": "stop"}).op == "stop"
            reply = b.request({"op": "hello", "worker": "b"})
            assert (reply.op, reply.header["code"]) == ("error", "stopping")
            assert [row["worker"] for row in _stats(a)["workers"]] == ["a"]
            assert a.request({"op": "bye", "worker": "a"}).op == "bye"


def test_the_stop_by_the_workers_byes_waits_for_exactly_the_observers_awaited():
    with running_server(world_size=1, observers_awaited=2, stop_grace=30.0) as server:
        with RawPeer(server.endpoint) as peer:
            raw_hello(peer, "a")
            assert peer.request({"op": "bye", "worker": "a"}).op == "bye"
            assert not _stats(peer)["stopping"]  # every rank finished, no observer yet
            observer = {"op": "hello", "info": {"role": "observer"}}
            assert peer.request({**observer, "worker": "eval1"}).op == "hello"
            assert not _stats(peer)["stopping"]  # one of two
            assert peer.request({**observer, "worker": "eval2"}).op == "hello"
            assert _stats(peer)["stopping"]
            for worker in ("eval1", "eval2"):
                assert peer.request({"op": "bye", "worker": worker}).op == "bye"
