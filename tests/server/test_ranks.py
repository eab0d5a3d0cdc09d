"""A worker joining, leaving, rejoining and taking over, in each form, from raw frames.

The reference worker always says hello once and leaves with `bye`; a worker in another
language, a restarted process or a reloaded browser tab does all the rest: it comes back
under the same id (from the same connection or another), leaves unfinished, asks for a rank
(`info.rank`) to take over a shard, and sends a step in parts around another worker's
update. Each test states what the server must do and reads it back from replies, `stats`
and the parameters.
"""

import numpy as np
from test_server_support import RawPeer, filled, full, push_header, running_server

ZEROS = filled(0.0)


def hello(peer: RawPeer, worker: str, **info) -> dict:
    return peer.request({"op": "hello", "worker": worker, "info": info}).header


def bye(peer: RawPeer, worker: str, finished: bool) -> None:
    assert peer.request({"op": "bye", "worker": worker, "finished": finished}).op == "bye"


def ranks(peer: RawPeer) -> dict[str, tuple[int, bool]]:
    rows = peer.request({"op": "stats"}).header["stats"]["workers"]
    return {row["worker"]: (row["rank"], row["alive"]) for row in rows}


def test_a_worker_back_after_leaving_unfinished_gets_its_own_rank_not_the_lowest_free():
    with running_server(world_size=3) as server, RawPeer(server.endpoint) as peer:
        assert [hello(peer, w)["rank"] for w in "abc"] == [0, 1, 2]
        bye(peer, "a", finished=False)
        bye(peer, "b", finished=False)
        assert hello(peer, "b")["rank"] == 1  # rank 0 is free too: b's own comes first
        assert hello(peer, "newcomer")["rank"] == 0
        refused = peer.request({"op": "hello", "worker": "a"}).header
        assert refused["code"] == "full"  # a's rank went to the newcomer; none is free


def test_a_finished_shard_is_never_given_again_but_an_unfinished_one_is():
    with running_server(world_size=2) as server, RawPeer(server.endpoint) as peer:
        hello(peer, "a")
        hello(peer, "b")
        bye(peer, "a", finished=True)
        assert peer.request({"op": "hello", "worker": "c"}).header["code"] == "full"
        bye(peer, "b", finished=False)
        assert hello(peer, "c")["rank"] == 1
        assert ranks(peer) == {"a": (0, False), "b": (1, False), "c": (1, True)}


def test_taking_over_a_rank_at_and_past_the_world_size_and_held_or_finished():
    with running_server(world_size=3) as server, RawPeer(server.endpoint) as peer:
        assert hello(peer, "last", rank=2)["rank"] == 2  # the highest rank: allowed
        past = peer.request({"op": "hello", "worker": "x", "info": {"rank": 3}}).header
        assert past["code"] == "full" and "ranks 0..2" in past["reason"]
        held = peer.request({"op": "hello", "worker": "x", "info": {"rank": 2}}).header
        assert held["code"] == "full" and "held by live worker last" in held["reason"]
        bye(peer, "last", finished=True)
        done = peer.request({"op": "hello", "worker": "x", "info": {"rank": 2}}).header
        assert done["code"] == "full" and "finished its shard" in done["reason"]
        assert hello(peer, "first")["rank"] == 0
        bye(peer, "first", finished=False)
        assert hello(peer, "restarted", rank=0)["rank"] == 0  # takes over the unfinished shard
        bad = peer.request({"op": "hello", "worker": "y", "info": {"rank": True}}).header
        assert bad["code"] == "bad_field"


def test_the_same_client_back_keeps_its_pushes_answered_another_client_starts_afresh():
    params = {"fc.b": np.zeros(4, np.float32), "fc.w": np.zeros((3, 4), np.float32)}
    with running_server(params=params, lr=1.0) as server:
        with (
            RawPeer(server.endpoint, routing_id=b"\x01same") as first,
            RawPeer(server.endpoint, routing_id=b"\x01other") as other,
        ):
            hello(first, "w")
            applied = first.request(push_header("w", 0, 0, rid=1), full("fc.b", 1.0)).header
            assert applied["applied"] and applied["version"] == 1
            bye(first, "w", finished=False)
            hello(first, "w")  # the same connection: a retry of seq 0 is the old answer
            retry = first.request(push_header("w", 0, 0, rid=2), full("fc.b", 1.0)).header
            assert {**retry, "rid": 1} == applied and server.store.version == 1
            bye(first, "w", finished=False)
            hello(other, "w")  # another client under that id: its seq 0 is a new push
            new = other.request(push_header("w", 0, 1, rid=3), full("fc.b", 2.0)).header
            assert new["applied"] and new["version"] == 2
    np.testing.assert_array_equal(params["fc.b"], np.full(4, -3.0, np.float32))


def test_a_push_older_than_the_window_stays_stale_after_the_same_client_comes_back():
    with running_server(lr=1.0) as server, RawPeer(server.endpoint, routing_id=b"\x01w") as peer:
        hello(peer, "w")
        for seq in range(65):  # seq 0 falls out of the 64 answers remembered
            peer.request(push_header("w", seq, seq, rid=seq + 1), ZEROS)
        bye(peer, "w", finished=False)
        hello(peer, "w")
        old = peer.request(push_header("w", 0, 65, rid=99), full("fc.b", 1.0)).header
        assert old["code"] == "stale_seq" and server.store.version == 65


def test_a_step_sent_in_parts_is_as_stale_as_its_oldest_part():
    params = {"fc.b": np.zeros(4, np.float32), "fc.w": np.zeros((3, 4), np.float32)}
    with running_server(params=params, lr=1.0) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            hello(a, "a")
            hello(b, "b")
            part = a.request(push_header("a", 0, 0, rid=1, last=False), full("fc.w", 1.0))
            assert part.header["applied"] is False
            assert (
                b.request(push_header("b", 0, 0, rid=2), full("fc.b", 1.0)).header["version"] == 1
            )
            # a's second part was computed on version 1, its first on version 0.
            last = a.request(push_header("a", 1, 1, rid=3), full("fc.b", 1.0)).header
            assert last["applied"] and last["version"] == 2 and last["staleness"] == 1
            stats = a.request({"op": "stats"}).header["stats"]
    np.testing.assert_array_equal(params["fc.w"], np.full((3, 4), -1.0, np.float32))
    np.testing.assert_array_equal(params["fc.b"], np.full(4, -2.0, np.float32))
    assert stats["staleness_max"] == 1


def test_the_server_stops_by_itself_once_every_rank_said_bye_finished_and_not_before():
    with running_server(world_size=2) as server, RawPeer(server.endpoint) as peer:
        hello(peer, "a")
        hello(peer, "b")
        bye(peer, "a", finished=True)
        bye(peer, "b", finished=False)  # rank 1's shard is not done: the run goes on
        assert not server.stop.requested
        assert hello(peer, "c")["rank"] == 1
        bye(peer, "c", finished=True)
        assert server.stop.requested and server.stop.by_workers
        assert server.stop.why == "every worker finished its epochs"


def test_a_server_awaiting_an_observer_stops_only_after_its_hello_and_it_reads_the_end():
    params = {"fc.b": np.zeros(4, np.float32), "fc.w": np.zeros((3, 4), np.float32)}
    with (
        running_server(params=params, lr=1.0, world_size=1, observers_awaited=1) as server,
        RawPeer(server.endpoint) as peer,
        RawPeer(server.endpoint) as evaluator,
    ):
        hello(peer, "a")
        assert peer.request(push_header("a", 0, 0, rid=1), full("fc.b", 1.0)).header["applied"]
        bye(peer, "a", finished=True)  # the last rank finished before the evaluator came
        assert not server.stop.requested
        assert peer.request({"op": "stats"}).header["stats"]["version"] == 1  # still serving
        hello(evaluator, "eval", role="observer")
        assert server.stop.requested and server.stop.by_workers
        final = evaluator.request({"op": "pull", "worker": "eval"})
        assert final.header["stop"] is True and final.header["version"] == 1
        np.testing.assert_array_equal(final.arrays["fc.b"], np.full(4, -1.0, np.float32))
