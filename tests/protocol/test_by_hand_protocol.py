"""The by-hand workflow at the protocol level: a rank asked for in hello's `info`, bye's
`finished`, and a server that stops once every rank's shard is finished."""

import time

import pytest
from test_server_support import running_server

from minips.worker.client import PSClient, ServerError


def _refused(endpoint: str, info: dict) -> ServerError:
    with PSClient(endpoint) as client, pytest.raises(ServerError) as caught:
        client.hello(info)
    return caught.value


def test_a_requested_rank_is_given_when_free_and_refused_with_the_reason_when_not():
    with running_server(world_size=3) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            assert a.hello({"rank": 2})["rank"] == 2  # not the lowest free one: the one asked
            assert b.hello()["rank"] == 0
            held = _refused(server.endpoint, {"rank": 2})
            assert held.code == "full" and "held by live worker" in held.reason
            outside = _refused(server.endpoint, {"rank": 3})
            assert outside.code == "full" and "ranks 0..2" in outside.reason
            bad = _refused(server.endpoint, {"rank": -1})
            assert bad.code == "bad_field" and "info.rank" in bad.reason
            a.bye()  # finished: rank 2's shard is done
            done = _refused(server.endpoint, {"rank": 2})
            assert done.code == "full" and "finished its shard" in done.reason


def test_a_worker_that_left_unfinished_frees_its_rank_for_a_restart():
    with running_server(world_size=2) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello(), b.hello()
            b.bye(finished=False)  # e.g. Ctrl-C or --max-steps: its shard is not done
            with PSClient(server.endpoint) as restarted:
                assert restarted.hello({"rank": 1})["rank"] == 1
                restarted.bye(finished=False)
            with PSClient(server.endpoint) as newcomer:
                # Without a rank asked for it gets the lowest free one: also the unfinished.
                assert newcomer.hello()["rank"] == 1
            assert not a.stats()["stopping"]


def test_the_server_stops_by_itself_once_every_rank_finished():
    with running_server(world_size=2) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello(), b.hello()
            a.bye()
            assert not b.stats()["stopping"]  # rank 1 still trains
            b.bye()
            deadline = time.monotonic() + 5
            while not server.stopping and time.monotonic() < deadline:
                time.sleep(0.02)
        assert server.stopping and server.stop.by_all_workers


def test_an_unfinished_bye_does_not_end_the_run():
    with running_server(world_size=1) as server:
        with PSClient(server.endpoint) as a:
            a.hello()
            a.bye(finished=False)
            time.sleep(0.2)
            assert not a.stats()["stopping"]
