"""A signal that comes while the launcher is starting a child (inside `subprocess.Popen`,
its fork and its at-fork handlers): the launcher still stops, and stops that child too.
Real processes: a launcher that starts children in a loop under `signals_stop_the_run`,
as `minips run` and `minips launch` do, signalled at many moments; its children ignore
SIGTERM, so one the launcher lost would outlive it (its death signal is SIGTERM)."""

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LAUNCHER = textwrap.dedent("""
    import logging, signal, sys
    from pathlib import Path
    from minips.run.processes import ProcessGroup, signals_stop_the_run

    logs, token = Path(sys.argv[1]), sys.argv[2]
    child = [sys.executable, "-c",
             "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "time.sleep(60)", token]
    logging.getLogger("minips").warning("logging's at-fork handlers are in place")
    with signals_stop_the_run():
        group = ProcessGroup(logs, env={})
        try:
            for n in range(100000):
                group.start(f"c{n}", child)
                if n == 0:
                    print("started", flush=True)
                if n >= 3:  # a few alive at a time
                    group[f"c{n - 3}"].kill()
        finally:
            group.stop_all(grace=0.2)
""")


def _marked(token: str) -> list[int]:
    """The live processes whose command line carries `token`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if token.encode() in cmdline.read_bytes().split(b"\0"):
                state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(cmdline.parent.name))
    return found


def test_a_signal_at_any_moment_of_a_childs_start_stops_the_launcher_and_the_child(tmp_path):
    rng = random.Random(7)
    for attempt in range(40):
        token = f"minips-start-test-{os.getpid()}-{attempt}"
        logs = tmp_path / str(attempt)
        logs.mkdir()
        launcher = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(logs), token],
            stdout=subprocess.PIPE, stderr=open(logs / "stderr", "w"), start_new_session=True,
        )  # fmt: skip
        try:
            assert launcher.stdout.readline() == b"started\n"
            time.sleep(rng.uniform(0.0, 0.05))  # the loop is in Popen most of the time
            signum = (signal.SIGTERM, signal.SIGINT)[attempt % 2]
            os.kill(launcher.pid, signum)
            try:
                launcher.wait(15)  # its stop takes 0.2 s of grace, then kills
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"attempt {attempt}: the launcher hung after {signum.name}; "
                    + (logs / "stderr").read_text()[-800:]
                )
            time.sleep(0.3)  # a child's death signal, were it lost, had time to come
            left = _marked(token)
            assert not left, f"attempt {attempt}: {signum.name} left children {left} behind"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, signal.SIGKILL)
            for pid in _marked(token):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            launcher.wait(10)
