"""SIGINT and SIGTERM stop a server (minips.ops.signals): the first asks for a stop, whose
clients are then waited for within the grace; a second cuts the grace, also when it comes
before the server's loop began the first one's stop (a terminal's Ctrl-C reaches the
server and its launcher, whose SIGTERM follows at once). `serve_forever` ends cleanly on
one, with the final checkpoint written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from minips.ops.signals import stop_on_signals
from minips.server.stop import Stop
from minips.worker.client import PSClient


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


SERVE_FOREVER = """
import sys
import numpy as np
from minips.state.store import SGD
from minips.ops.server_ops import ServerOps
from minips.ops.signals import serve_forever
from minips.rules import make_rule
from minips.server.server import ParameterServer, ServerOptions
params = {"fc.b": np.zeros(4, np.float32)}
options = ServerOptions(checkpoint_path=sys.argv[1])
server = ParameterServer(params, make_rule("asgd"), SGD(params), options, operations=ServerOps)
print(server.endpoint, flush=True)
serve_forever(server)
print("clean exit", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_forever_shuts_down_cleanly_on_a_signal(tmp_path, sig):
    path = tmp_path / "final.npz"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_FOREVER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        endpoint = proc.stdout.readline().strip()
        with PSClient(endpoint) as ps:
            ps.hello()
            ps.push({"fc.b": np.ones(4, np.float32)}, base=0)
            ps.bye()
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "clean exit" in out
    with np.load(path) as saved:
        assert int(saved["version"]) == 1
        np.testing.assert_array_equal(saved["param/fc.b"], -0.01 * np.ones(4, np.float32))
