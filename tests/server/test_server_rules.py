"""Update rules end to end over real sockets: ssgd barriers, ssp bounds, dead workers."""

import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from test_server_support import (
    SHAPES,
    RawPeer,
    copied,
    filled,
    full,
    make_params,
    pull_header,
    push_header,
    raw_hello,
    running_server,
    send_then_fence,
    snapshot,
    worker_rows,
)

from minips.rules import ASGD, SSP, Outcome
from minips.worker.client import PSClient, ServerError


def _grads(value):
    return {name: np.full(shape, value, np.float32) for name, shape in SHAPES.items()}


def _wait_until(predicate, timeout=10.0):
    """Poll a condition on the server's state (set by its thread) until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.005)


def _in_thread(fn, *args, **kwargs):
    result = {}

    def target():
        result["value"] = fn(*args, **kwargs)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def test_ssgd_applies_exactly_the_mean_as_one_update():
    params = make_params()
    before = {k: v.copy() for k, v in params.items()}
    records = []
    with running_server("ssgd", params=params, lr=0.5, on_update=records.append) as server:
        with PSClient(server.endpoint, worker_id="a") as a, PSClient(server.endpoint) as b:
            a.hello()
            b.hello()
            thread, result = _in_thread(a.push, _grads(1.0), base=0)
            _wait_until(lambda: server.registry.by_id["a"].held_pushes)
            assert server.store.version == 0  # held at the barrier, nothing applied
            reply_b = b.push(_grads(3.0), base=0)
            thread.join(timeout=10)
            reply_a = result["value"]
    for reply in (reply_a, reply_b):
        assert (reply.version, reply.applied, reply.staleness) == (1, True, 0)
    for name in SHAPES:  # mean gradient 2.0, lr 0.5
        np.testing.assert_array_equal(params[name], before[name] - np.float32(0.5 * 2.0))
    assert len(records) == 1
    assert sorted(records[0]["workers"]) == [0, 1] and records[0]["staleness"] == [0, 0]


@pytest.mark.parametrize("arrival", [("a", "b", "c"), ("a", "c", "b"), ("c", "a", "b")])
def test_ssgd_sums_a_round_in_rank_order_whatever_order_the_pushes_arrive_in(arrival):
    """float32 addition is not associative: (1e8 + 1) - 1e8 is 0, (1e8 - 1e8) + 1 is 1. The
    round's sum is taken in rank order (a, b, c said hello in that order), so the update
    is the same bits whichever push the link delivers first."""
    values = {"a": 1e8, "b": 1.0, "c": -1e8}  # ranks 0, 1, 2
    params = make_params()
    before = params["fc.b"].copy()
    with running_server("ssgd", params=params, lr=1.0) as server:
        clients = {name: PSClient(server.endpoint, worker_id=name) for name in "abc"}
        try:
            for name in "abc":
                assert clients[name].hello()["rank"] == "abc".index(name)
            threads = []
            for name in arrival[:2]:
                grads = {"fc.b": np.full(4, values[name], np.float32)}
                threads.append(_in_thread(clients[name].push, grads, base=0)[0])
                _wait_until(lambda name=name: server.registry.by_id[name].held_pushes)
            last = arrival[2]
            assert (
                clients[last].push({"fc.b": np.full(4, values[last], np.float32)}, base=0).applied
            )
            for thread in threads:
                thread.join(timeout=10)
        finally:
            for client in clients.values():
                client.close()
    in_rank_order = (np.float32(1e8) + np.float32(1.0)) + np.float32(-1e8)  # 0
    np.testing.assert_array_equal(params["fc.b"], before - in_rank_order / np.float32(3))
    assert in_rank_order != (np.float32(1e8) + np.float32(-1e8)) + np.float32(1.0)


def test_ssgd_partial_pushes_accumulate_until_the_last():
    params = make_params()
    before = {k: v.copy() for k, v in params.items()}
    with running_server("ssgd", params=params, lr=1.0) as server:
        with PSClient(server.endpoint, worker_id="a") as a, PSClient(server.endpoint) as b:
            a.hello()
            b.hello()
            queued = a.push({"fc.w": np.full((3, 4), 2.0, np.float32)}, base=0, last=False)
            assert not queued.applied and queued.version == 0
            thread, _ = _in_thread(a.push, {"fc.b": np.full(4, 4.0, np.float32)}, base=0)
            _wait_until(lambda: server.registry.by_id["a"].held_pushes)
            b.push({"fc.w": np.full((3, 4), 4.0, np.float32)}, base=0)  # b sends no fc.b
            thread.join(timeout=10)
    np.testing.assert_array_equal(params["fc.w"], before["fc.w"] - 3.0)  # mean of 2 and 4
    np.testing.assert_array_equal(params["fc.b"], before["fc.b"] - 4.0)  # only a sent it


def test_ssgd_barrier_completes_when_a_worker_leaves():
    params = make_params()
    before = {k: v.copy() for k, v in params.items()}
    with running_server("ssgd", params=params, lr=1.0) as server:
        with PSClient(server.endpoint, worker_id="a") as a, PSClient(server.endpoint) as b:
            a.hello()
            b.hello()
            thread, result = _in_thread(a.push, _grads(1.0), base=0)
            _wait_until(lambda: server.registry.by_id["a"].held_pushes)
            b.bye()
            thread.join(timeout=10)
            assert result["value"].applied and result["value"].version == 1
    np.testing.assert_array_equal(params["fc.b"], before["fc.b"] - 1.0)


def test_ssp_holds_a_pull_until_the_slowest_catches_up():
    with running_server("ssp", rule_options={"staleness": 1}) as server:
        with PSClient(server.endpoint, worker_id="fast") as fast, PSClient(server.endpoint) as slow:
            fast.hello()
            slow.hello()
            fast.push(_grads(0.1), base=0)
            assert fast.pull().version == 1  # 1 clock ahead of the slowest: allowed
            fast.push(_grads(0.1), base=1)
            thread, result = _in_thread(fast.pull)  # 2 clocks ahead: held
            _wait_until(lambda: server.registry.by_id["fast"].held_pull is not None)
            assert "value" not in result
            slow.push(_grads(0.1), base=0)  # the slowest advances, the pull is released
            thread.join(timeout=10)
            assert result["value"].version == 3


class RecordingSSP(SSP):
    """SSP that records, at every answered pull, how far the puller is ahead."""

    def __init__(self, staleness):
        super().__init__(staleness)
        self.leads = []

    def on_pulled(self, worker):
        slowest = min(w.clock for w in self.registry.live())
        self.leads.append(worker.clock - slowest)


def test_ssp_never_lets_a_worker_run_more_than_s_clocks_ahead():
    bound, steps = 2, 25
    rule = RecordingSSP(bound)

    def train(client, pause):
        client.hello()
        version = client.pull().version
        for _ in range(steps):
            client.push(_grads(0.01), base=version)
            time.sleep(pause)  # the slow worker is slow; the bound must hold anyway
            version = client.pull().version
        client.bye()

    with running_server(rule) as server:
        with PSClient(server.endpoint) as fast, PSClient(server.endpoint) as slow:
            threads = [
                threading.Thread(target=train, args=(fast, 0.0)),
                threading.Thread(target=train, args=(slow, 0.01)),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            assert server.store.version == 2 * steps
    assert max(rule.leads) <= bound
    assert max(rule.leads) == bound  # the fast worker did run ahead and was held there


VICTIM = """
import sys
import numpy as np
from minips.worker.client import PSClient, ServerError
ps = PSClient(sys.argv[1], worker_id="victim")
ps.hello()
reply = ps.push({"fc.b": np.full(4, 3.0, np.float32)}, base=0)
print("pushed", reply.version, flush=True)
sys.stdin.read()  # wait to be killed
"""


def test_a_killed_worker_does_not_stall_the_ssgd_barrier():
    params = make_params()
    before = params["fc.b"].copy()
    with running_server("ssgd", params=params, lr=1.0, heartbeat_timeout=1.0) as server:
        with PSClient(server.endpoint, worker_id="a", timeout=5.0) as a:
            # "a" registers before the victim starts, so round 1 has both as members, and
            # pings while the victim's process starts (under load that can take longer than
            # the heartbeat timeout, and a silent "a" would be declared dead).
            a.hello()
            victim = subprocess.Popen(
                [sys.executable, "-c", VICTIM, server.endpoint],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                _wait_until(lambda: a.ping() is False and "victim" in server.registry.by_id)
                first = a.push({"fc.b": np.full(4, 1.0, np.float32)}, base=0)
                assert victim.stdout.readline().split() == ["pushed", "1"]
                assert first.version == 1
                victim.send_signal(signal.SIGKILL)
                victim.wait(timeout=10)
                # The victim never pushes round 2; after the heartbeat timeout it is dead
                # and the barrier completes with "a" alone.
                second = a.push({"fc.b": np.full(4, 1.0, np.float32)}, base=1)
                assert second.applied and second.version == 2
                stats = {w["worker"]: w for w in a.stats()["workers"]}
                assert stats["victim"]["alive"] is False and stats["a"]["alive"] is True
            finally:
                victim.kill()
                victim.wait(timeout=10)
    # round 1: mean(1, 3) = 2; round 2: a alone, 1.
    np.testing.assert_array_equal(params["fc.b"], before - 2.0 - 1.0)


def test_an_observer_is_never_waited_for_and_never_held():
    with running_server("ssgd", stop_grace=10.0) as server:
        with PSClient(server.endpoint) as worker, PSClient(server.endpoint) as observer:
            assert worker.hello()["rank"] == 0
            seen = observer.hello({"role": "observer"})
            assert seen["world_size"] == 1 and seen["rank"] == 1  # no rank of its own
            # The barrier has one member: the worker's push is applied at once.
            assert worker.push(_grads(1.0), base=0).applied
            assert observer.pull().version == 1
            with pytest.raises(ServerError) as info:
                observer.push(_grads(1.0), base=0)
            assert info.value.code == "observer"
            worker.bye()
            observer.stop()  # operator op: any client may send it
            # Stopping waits for the observer too, so it sees the final parameters.
            final = observer.pull(since=0)
            assert final.stop and final.version == 1 and set(final.params) == set(SHAPES)
            observer.bye()


def test_ssp_does_not_hold_an_observer():
    with running_server("ssp", rule_options={"staleness": 0}) as server:
        with PSClient(server.endpoint) as fast, PSClient(server.endpoint) as slow:
            fast.hello()
            slow.hello()
            fast.push(_grads(0.1), base=0)
            with PSClient(server.endpoint) as observer:
                observer.hello({"role": "observer"})
                assert observer.pull().version == 1


class InverseStaleness(ASGD):
    """A DASGD-style rule written as a test of the plug-in point: scale = 1 / max(1, tau)."""

    name = "inverse_test"

    def on_push(self, push):
        return Outcome.update_now(push, scale=1.0 / max(1, push.staleness))


def test_a_rule_plugs_in_with_one_on_push_method():
    params = make_params()
    before = params["fc.b"].copy()
    records = []
    with running_server(InverseStaleness(), params=params, lr=1.0, on_update=records.append) as s:
        with PSClient(s.endpoint) as ps:
            ps.hello()
            one = {"fc.b": np.ones(4, np.float32)}
            ps.push(one, base=0)  # tau 0: full step
            ps.push(one, base=1)  # tau 0
            reply = ps.push(one, base=0)  # tau 2: half a step
    assert reply.staleness == 2
    assert [r["scale"] for r in records] == [1.0, 1.0, 0.5]
    expected = before.copy()
    for step in (1.0, 1.0, 0.5):  # same float32 operations as the server's
        expected -= np.float32(step) * np.ones(4, np.float32)
    np.testing.assert_array_equal(params["fc.b"], expected)


def test_ssgd_waits_for_world_size_workers_before_the_first_round():
    params = make_params()
    before = params["fc.b"].copy()
    with running_server("ssgd", params=params, lr=1.0, world_size=2) as server:
        with PSClient(server.endpoint, worker_id="early") as early:
            early.hello()
            thread, result = _in_thread(early.push, {"fc.b": np.full(4, 1.0, np.float32)}, base=0)
            _wait_until(lambda: server.registry.by_id["early"].held_pushes)
            with PSClient(server.endpoint) as late:
                late.hello()  # the first round now waits for this worker's push too
                assert server.store.version == 0
                late.push({"fc.b": np.full(4, 3.0, np.float32)}, base=0)
            thread.join(timeout=10)
            assert result["value"].version == 1
    np.testing.assert_array_equal(params["fc.b"], before - 2.0)  # mean of 1 and 3


def test_ssgd_starts_without_a_worker_that_never_comes():
    with running_server("ssgd", world_size=2, heartbeat_timeout=0.3) as server:
        with PSClient(server.endpoint) as alone:
            alone.hello()
            reply = alone.push(_grads(1.0), base=0)  # released after the assembly grace
            assert reply.applied and reply.version == 1
            assert server.stats()["live_workers"] == 1


def test_a_pull_is_held_while_the_cluster_assembles_even_by_asgd():
    with running_server("asgd", world_size=2, heartbeat_timeout=30.0) as server:
        with RawPeer(server.endpoint) as early:
            raw_hello(early, "early")
            assert send_then_fence(early, pull_header("early", rid=41)) is None  # held
            with PSClient(server.endpoint) as late:
                late.hello()  # the cluster is whole: the held pull is answered
                released = early.recv()
                assert late.pull().version == 0  # not held: assembled
            assert early.request({"op": "bye", "worker": "early"}).op == "bye"
    assert released.op == "pull" and released.header["rid"] == 41


def test_an_observer_does_not_count_towards_the_assembly():
    with running_server("asgd", world_size=2, heartbeat_timeout=30.0) as server:
        with RawPeer(server.endpoint) as evaluator, RawPeer(server.endpoint) as early:
            hello = {"op": "hello", "worker": "eval", "info": {"role": "observer"}}
            assert evaluator.request(hello).op == "hello"
            raw_hello(early, "early")
            # one worker and an observer: the cluster of two is still assembling
            assert send_then_fence(early, pull_header("early", rid=61)) is None  # held
            with PSClient(server.endpoint) as late:
                late.hello()
                assert early.recv().header["rid"] == 61  # whole now: answered
            assert early.request({"op": "bye", "worker": "early"}).op == "bye"


def test_a_pull_arriving_while_stopping_is_answered_though_the_rule_would_hold_it():
    with running_server("ssp", rule_options={"staleness": 0}, stop_grace=30.0) as server:
        with (
            RawPeer(server.endpoint) as fast,
            PSClient(server.endpoint) as slow,
            PSClient(server.endpoint) as operator,
        ):
            raw_hello(fast, "fast")
            slow.hello()
            assert fast.request(push_header("fast", 0, 0, rid=51), filled(0.01)).op == "push"
            assert send_then_fence(fast, pull_header("fast", rid=52)) is None  # a clock ahead
            operator.stop()
            assert fast.recv().header["rid"] == 52  # held ones are answered at the stop
            late = send_then_fence(fast, pull_header("fast", rid=53))  # still a clock ahead
            assert late is not None and late.header["rid"] == 53 and late.header["stop"]
            assert fast.request({"op": "bye", "worker": "fast"}).op == "bye"
            slow.bye()


def test_stop_answers_every_push_held_at_the_barrier_at_once():
    with running_server("ssgd", stop_grace=30.0) as server:
        with (
            RawPeer(server.endpoint) as a,
            RawPeer(server.endpoint) as b,
            PSClient(server.endpoint) as idle,
            PSClient(server.endpoint) as operator,
        ):
            raw_hello(a, "a")
            raw_hello(b, "b")
            idle.hello()  # never pushes: the round cannot complete
            before = snapshot(server)
            assert send_then_fence(a, push_header("a", 0, 0, rid=11), filled(1.0)) is None
            assert send_then_fence(b, push_header("b", 0, 0, rid=12), filled(2.0)) is None
            operator.stop()
            # Answered now, not when the 30 s grace ends (recv gives up after 5 s).
            replies = {"a": a.recv(), "b": b.recv()}
            assert snapshot(server) == before
            for peer, worker in ((a, "a"), (b, "b")):
                assert peer.request({"op": "bye", "worker": worker}).op == "bye"
            idle.bye()  # the last worker left: the loop ends without the grace
    for worker, rid in (("a", 11), ("b", 12)):
        header = replies[worker].header
        assert replies[worker].op == "push" and header["rid"] == rid, header
        assert header["applied"] is False and header["stop"] is True
        assert header["version"] == 0


def test_ssp_late_joiner_starts_at_the_slowest_clock_and_a_rejoiner_keeps_a_higher_one():
    with running_server("ssp", rule_options={"staleness": 1}) as server:
        endpoint = server.endpoint
        with (
            PSClient(endpoint, worker_id="a") as a,
            PSClient(endpoint, worker_id="b") as b,
            RawPeer(endpoint) as a_raw,
            PSClient(endpoint) as operator,
        ):
            a.hello()
            b.hello()
            for _ in range(5):
                a.push(filled(0.01), base=0)  # ssp holds pulls, never pushes
            for _ in range(3):
                b.push(filled(0.01), base=0)
            assert {w: r["clock"] for w, r in worker_rows(operator).items()} == {"a": 5, "b": 3}
            with RawPeer(endpoint) as late:
                raw_hello(late, "late")
                assert worker_rows(operator)["late"]["clock"] == 3  # the slowest live, not 0
                # So it holds nobody back: b (clock 3) and itself may pull at once.
                assert b.pull().version == 8  # not held (a held pull would time out)
                assert send_then_fence(late, pull_header("late", rid=22)) is not None
                assert late.request({"op": "bye", "worker": "late"}).op == "bye"
            # a leaves at clock 5 and comes back: it keeps 5 (higher than the slowest, 3)...
            a.bye()
            raw_hello(a_raw, "a")  # the raw peer is "a" now (a live id answers to who said hello)
            assert worker_rows(operator)["a"]["clock"] == 5
            # ...so it is still 2 > 1 clocks ahead of b: its pull is held until b steps.
            assert send_then_fence(a_raw, pull_header("a", rid=23)) is None
            b.push(filled(0.01), base=0)
            released = a_raw.recv()
    assert released.op == "pull" and released.header["rid"] == 23


def test_ssgd_bye_after_the_last_push_keeps_that_gradient_in_the_round():
    params = make_params()
    before = copied(params)
    with running_server("ssgd", params=params, lr=1.0) as server:
        with RawPeer(server.endpoint) as leaver, PSClient(server.endpoint) as stayer:
            raw_hello(leaver, "leaver")
            stayer.hello()
            pushed = send_then_fence(leaver, push_header("leaver", 0, 0, rid=31), full("fc.b", 1.0))
            assert pushed is None  # held at the barrier
            assert leaver.request({"op": "bye", "worker": "leaver"}).op == "bye"
            reply = stayer.push(full("fc.b", 3.0), base=0)  # completes the round
            answered = leaver.recv()  # the leaver's push is answered too
    assert reply.applied and reply.version == 1
    assert answered.header["rid"] == 31 and answered.header["applied"] is True
    np.testing.assert_array_equal(params["fc.b"], before["fc.b"] - np.float32(2.0))  # mean(1,3)


@pytest.mark.parametrize("leave", ["bye", "hello again"])
def test_ssgd_partial_push_of_a_worker_that_leaves_is_discarded_also_when_it_rejoins(leave):
    params = make_params()
    before = copied(params)
    with running_server("ssgd", params=params, lr=1.0) as server:
        with RawPeer(server.endpoint) as leaver, PSClient(server.endpoint) as stayer:
            raw_hello(leaver, "leaver")
            stayer.hello()
            partial = leaver.request(
                push_header("leaver", 0, 0, rid=41, last=False), full("fc.w", 5.0)
            )
            assert partial.header["applied"] is False
            version = 0
            if leave == "bye":
                assert leaver.request({"op": "bye", "worker": "leaver"}).op == "bye"
                # Round 1 without it: its partial is not in the mean.
                assert stayer.push(full("fc.w", 1.0), base=0).version == 1
                version = 1
            raw_hello(leaver, "leaver")  # rejoins (or re-registers) under the same id
            # The next round: only what it sends now counts for it.
            mine = push_header("leaver", 1, version, rid=42)
            assert send_then_fence(leaver, mine, full("fc.w", 2.0)) is None
            reply = stayer.push(full("fc.w", 4.0), base=version)
            assert leaver.recv().header["applied"] is True
    assert reply.applied and reply.version == version + 1
    expected = before["fc.w"]
    if leave == "bye":
        expected = expected - np.float32(1.0)
    expected = expected - np.float32(3.0)  # mean(2, 4); with the partial it would be 5.5
    np.testing.assert_array_equal(params["fc.w"], expected)


def test_a_clock_advances_on_last_pushes_only():
    with running_server("ssp", rule_options={"staleness": 0}) as server:
        with (
            PSClient(server.endpoint, worker_id="a") as a,
            PSClient(server.endpoint, worker_id="b") as b,
            RawPeer(server.endpoint) as a_raw,
        ):
            a.hello()
            b.hello()
            a.push(full("fc.w", 0.1), base=0, last=False)  # one step in two pushes
            a.push(full("fc.b", 0.1), base=0, last=True)
            rows = worker_rows(a)
            assert rows["a"]["clock"] == 1 and rows["a"]["pushes"] == 2
            b.push(filled(0.1), base=0)  # b's step: both at clock 1
            # Bound 0: a may pull only because its two pushes made one clock.
            assert send_then_fence(a_raw, pull_header("a", rid=51)) is not None
            a.push(full("fc.w", 0.1), base=0, last=False)
            assert worker_rows(a)["a"]["clock"] == 1  # a partial push alone: no step
            a.push(full("fc.b", 0.1), base=0)
            assert worker_rows(a)["a"]["clock"] == 2
