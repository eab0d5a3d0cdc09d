"""SIGINT and SIGTERM stop a server (minips.server.stop.stop_on_signals): the first asks
for a stop, whose clients are then waited for within the grace; a second cuts the grace,
also when it comes before the server's loop began the first one's stop (a terminal's
Ctrl-C reaches the server and its launcher, whose SIGTERM follows at once)."""

from __future__ import annotations

import os
import signal

from minips.server.stop import Stop, stop_on_signals


def _signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)  # the handler runs before os.kill returns (main thread)


def test_one_signal_asks_for_a_stop_within_the_grace():
    stop = Stop()
    with stop_on_signals(stop):
        _signal_self(signal.SIGTERM)
    assert stop.due() and stop.why == f"signal {int(signal.SIGTERM)}"
    stop.begin(deadline=123.0)
    assert stop.deadline == 123.0


def test_a_second_signal_before_the_stop_began_still_cuts_the_grace():
    stop = Stop()
    with stop_on_signals(stop):
        _signal_self(signal.SIGINT)
        _signal_self(signal.SIGTERM)
    stop.begin(deadline=123.0)  # the loop begins the stop only now
    assert stop.deadline == 0.0 and stop.why == f"signal {int(signal.SIGINT)}"


def test_a_second_signal_after_the_stop_began_cuts_the_grace():
    stop = Stop()
    with stop_on_signals(stop):
        _signal_self(signal.SIGTERM)
        stop.begin(deadline=123.0)
        _signal_self(signal.SIGTERM)
    assert stop.deadline == 0.0


def test_the_previous_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals(Stop()):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
