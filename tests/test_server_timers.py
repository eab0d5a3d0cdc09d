"""A timer of the server that fails (a bug in a rule's on_tick, on every turn of the loop):
the server logs it once with its traceback, then only counts it, and goes on answering
ping, pull and push (minips/server/timers.py).

The rules below have a bug on purpose (no real rule fails so).
"""

from __future__ import annotations

import logging
import threading

from test_server_support import (
    RawPeer,
    full,
    pull_header,
    push_header,
    raw_hello,
    running_server,
)

from minips.rules import ASGD


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
