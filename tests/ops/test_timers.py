"""A timer of the server that fails (a bug in a rule's on_tick, on every turn of the loop):
the server logs it once with its traceback, then only counts it, and goes on answering
ping, pull and push (minips/ops/timers.py).

The rules below have a bug on purpose (no real rule fails so).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from test_push_failures import BUG, _assert_internal, _has_bug
from test_server_support import (
    RawPeer,
    full,
    make_params,
    pull_header,
    push_header,
    raw_hello,
    running_server,
    send_then_fence,
)

from minips.errors import MinipsError
from minips.ops.checkpoints import Checkpointer
from minips.ops.telemetry import Counters
from minips.ops.timers import Timers
from minips.rules import ASGD, SSGD, Outcome, Update
from minips.state.store import SGD, ParameterStore


class TimerFailsAfterAPush(ASGD):
    """asgd whose on_tick raises on every turn once a push came; each failure counted
    (`failed`, a semaphore the test waits on: the loop turns by itself when idle)."""

    def __init__(self):
        self.pushed = False
        self.failed = threading.Semaphore(0)
        self.failures = 0

    def on_push(self, push):
        self.pushed = True
        return super().on_push(push)

    def on_tick(self, now):
        if not self.pushed:
            return super().on_tick(now)
        self.failures += 1
        self.failed.release()
        raise RuntimeError("a bug in the rule's timer")


class RoundFailsOnATimer(SSGD):
    """ssgd that holds every push and completes the round on a timer, whose after_update
    raises for a round holding BUG: the rule's decision on a timer fails half done."""

    def _try_complete(self):
        return Outcome()  # a push only joins the round: the timer completes it

    def on_tick(self, now):
        return SSGD._try_complete(self)

    def after_update(self, update: Update) -> None:
        if any(_has_bug(push) for push in update.pushes):
            raise RuntimeError("a bug in the rule")


def _ping(peer: RawPeer, worker: str, rid: int) -> None:
    reply = peer.request({"op": "ping", "worker": worker, "rid": rid})
    assert reply.op == "ping", reply.header


def test_a_timer_failing_on_every_turn_is_logged_once_and_the_server_goes_on(caplog):
    rule = TimerFailsAfterAPush()
    caplog.set_level(logging.INFO, logger="minips.server")
    with running_server(rule) as server, RawPeer(server.endpoint) as a:
        raw_hello(a, "a")
        reply = a.request(push_header("a", 0, 0, rid=1), full("fc.b", 0.5))
        assert reply.op == "push" and reply.header["applied"], reply.header
        for _ in range(12):  # the loop turned, the timer failing each time
            assert rule.failed.acquire(timeout=10), "the loop stopped turning"
        _ping(a, "a", rid=2)
        pulled = a.request(pull_header("a", rid=3))
        assert pulled.op == "pull" and pulled.header["version"] == 1, pulled.header
        reply = a.request(push_header("a", 1, 1, rid=4), full("fc.b", 0.5))
        assert reply.op == "push" and reply.header["applied"], reply.header
        assert reply.header["version"] == 2
        _ping(a, "a", rid=5)
    timer_lines = [r for r in caplog.records if "timer 'rule'" in r.getMessage()]
    assert [bool(r.exc_info) for r in timer_lines][:2] == [True, False], timer_lines
    assert sum(bool(r.exc_info) for r in caplog.records) == 1  # one traceback, not one a turn
    powers_of_ten = len(str(rule.failures))  # the 1st, then its 10th, 100th, ... failure
    assert len(timer_lines) == powers_of_ten, [r.getMessage() for r in timer_lines]


def test_a_round_failing_on_a_timer_answers_its_pushes_internal():
    with running_server(RoundFailsOnATimer()) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            assert send_then_fence(a, push_header("a", 0, 0, rid=1), full("fc.b", 1.0)) is None
            b_reply = b.request(push_header("b", 0, 0, rid=2), full("fc.b", BUG))
            _assert_internal(b_reply)
            _assert_internal(a.recv())  # a's push, in the same failed round
            _assert_internal(send_then_fence(a, push_header("a", 0, 0, rid=3), full("fc.b", 1.0)))
            _ping(b, "b", rid=4)
            assert send_then_fence(a, push_header("a", 1, 1, rid=5), full("fc.b", 0.5)) is None
            reply = b.request(push_header("b", 1, 1, rid=6), full("fc.b", 0.5))
            for answer in (reply, a.recv()):
                assert answer.op == "push" and answer.header["applied"], answer.header
                assert answer.header["version"] == 2  # the failed round's update stays written


def test_a_time_based_checkpoint_that_fails_is_tried_again_after_its_interval_not_each_turn(
    tmp_path,
):
    (tmp_path / "a-file").write_text("")  # the checkpoint's folder is a file: every save fails
    params = make_params()
    store = ParameterStore(params, SGD(params, lr=0.5))
    checkpoints = Checkpointer(store, Counters(), tmp_path / "a-file" / "c.npz", interval=10.0)
    store.write([("fc.b", np.ones(4, np.float32), 1.0)])  # the version moved: one is due
    start = checkpoints._last[0]
    with pytest.raises(OSError):
        checkpoints.if_due(start + 10.0)
    checkpoints.if_due(start + 10.05)  # the next turn: not tried again (no OSError)
    with pytest.raises(OSError):  # a whole interval later, tried again, with no update since
        checkpoints.if_due(start + 20.0)


class _Job:
    """A stand-in for one of the loop's jobs: records its calls, raises `fails` if set."""

    def __init__(self, fails: BaseException | None = None) -> None:
        self.fails, self.calls = fails, 0

    def __call__(self, *args):
        self.calls += 1
        if self.fails is not None:
            raise self.fails
        return []


def _timers(group_fails: BaseException | None) -> tuple[Timers, _Job]:
    from types import SimpleNamespace as Ns

    group = _Job(group_fails)
    registry = Ns(assembling=False)
    timers = Timers(
        inflow=Ns(check=_Job()),
        checkpoints=Ns(if_due=_Job()),
        membership=Ns(check_liveness=_Job()),
        pulls=Ns(registry=registry, release=_Job()),
        rule=Ns(on_tick=lambda now: Outcome()),
        carry_out=_Job(),
        after_leaving=_Job(),
        group=Ns(tick=group),
    )
    return timers, group


def test_a_minips_error_on_a_timer_stops_the_loop_a_bug_does_not():
    """The root refusing a shard (a MinipsError) goes out of tick, so the server stops; a
    bug in the same job is contained and counted."""
    timers, group = _timers(MinipsError("the group's root refused this shard"))
    with pytest.raises(MinipsError, match="refused this shard"):
        timers.tick(0.0)
    assert group.calls == 1 and timers.failures == {}
    timers, group = _timers(RuntimeError("a bug"))
    timers.tick(0.0)
    timers.tick(1.0)
    assert group.calls == 2 and timers.failures == {"group": 2}


def test_pulls_held_while_assembling_are_answered_when_the_grace_ends_on_a_timer():
    """world_size 2, one worker came: its pull is held until the grace (heartbeat
    timeout) after its hello runs out; the timer that ends the assembly answers it."""
    with running_server(world_size=2, heartbeat_timeout=2.0) as server:
        with RawPeer(server.endpoint) as a:
            raw_hello(a, "a")
            pulled = send_then_fence(a, pull_header("a", rid=1))  # held while assembling
            if pulled is None:  # (answered at once only on a machine 2 s slow between two requests)
                pulled = a.recv(timeout=30)  # no request of a's is left: a timer answers it
            assert pulled.op == "pull" and pulled.header["rid"] == 1, pulled.header
            assert set(pulled.arrays) == {"fc.w", "fc.b"}
            assert not server.registry.assembling
