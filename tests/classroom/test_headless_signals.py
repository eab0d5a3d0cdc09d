"""A stop signal at any moment of the headless launcher's Chromium start (before it, inside
`subprocess.Popen`, while the DevTools port is awaited, once the tabs are open): the
launcher exits and no Chromium outlives it (minips.classroom.web.headless, held by
minips.held_signals).

The window that matters is short: Chromium is started but Popen has not returned, so the
launcher does not know it yet. This launcher widens it to 1.5 s (it sleeps after the child
is started, inside Popen), so that signals sent at random moments land in it often, and
late in it too: a Chromium lost in its first moments often aborts by itself (its TMPDIR is
removed under it), one lost once it is up runs on.
"""

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

from minips.classroom.web.slots import find_chromium

pytestmark = pytest.mark.slow

LAUNCHER = textwrap.dedent("""
    import signal, subprocess, sys, time
    from minips.classroom.web import headless

    # Ctrl-C as a terminal's: a suite run in the background (`&`) passes SIGINT on ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)

    start_child = subprocess.Popen._execute_child

    def slow_to_return(self, *args, **kwargs):
        print("starting", flush=True)
        start_child(self, *args, **kwargs)
        time.sleep(1.5)  # Chromium runs; Popen has not returned: the window, widened

    subprocess.Popen._execute_child = slow_to_return
    headless.main(sys.argv[1:])
""")


def _chromium_pids(token: str) -> list[int]:
    """The live processes whose environment carries `token`: the launcher's Chromium (its
    helpers too, which do not all name the profile on their command line)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            marked = token.encode() in (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if marked and state != "Z":
                found.append(int(proc.name))
    return found


def _signal_during_start(tmp: Path, name: str, delay: float, signum: int) -> list[int]:
    """Start a headless launcher, send it `signum` `delay` s after it began starting
    Chromium, wait for it to exit; the Chromium processes still there 5 s later (a helper
    may take a moment to notice its browser closed; a lost browser stays)."""
    token = f"MINIPS_HEADLESS_TEST={os.getpid()}-{name}"
    env = {**os.environ, token.split("=")[0]: token.split("=")[1]}
    argv = [sys.executable, "-c", LAUNCHER, "about:blank", "--profile", str(tmp / name)]
    log = tmp / f"{name}.log"
    with open(log, "w") as stderr:
        launcher = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True
        )
    try:
        assert launcher.stdout.readline() == b"starting\n", log.read_text()[-800:]
        time.sleep(delay)
        os.kill(launcher.pid, signum)
        try:
            launcher.wait(30)  # Chromium is given 10 s to close, then killed
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher hung after {signal.Signals(signum).name}")
        deadline = time.monotonic() + 5.0
        while (left := _chromium_pids(token)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left
    finally:
        launcher.kill()  # a hung launcher: its Chromium ends with it (PR_SET_PDEATHSIG)
        launcher.wait()
        launcher.stdout.close()


# When the signal is sent, in seconds from "starting": after Popen returned (the DevTools
# port awaited, the tabs open), at the start of the window, and twice inside it.
MOMENTS = [(1.6, 4.0), (0.0, 0.2), (0.2, 1.5), (0.2, 1.5)]


def test_a_signal_at_any_moment_of_chromiums_start_leaves_no_chromium(tmp_path):
    if find_chromium() is None:
        pytest.skip("chromium not found: apt-get install chromium to run the browser tests")
    rng = random.Random(11)
    for attempt in range(12):
        low, high = MOMENTS[attempt % len(MOMENTS)]
        delay = rng.uniform(low, high)
        signum = (signal.SIGTERM, signal.SIGINT)[attempt % 2]
        left = _signal_during_start(tmp_path, f"profile-{attempt}", delay, signum)
        for pid in left:  # not this test's to leave running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not left, (
            f"attempt {attempt}: {signal.Signals(signum).name} {delay:.3f} s after the start "
            f"left Chromium running: pids {left}"
        )


def test_a_launcher_killed_outright_leaves_no_chromium(tmp_path):
    """SIGKILL gives the launcher no chance to close Chromium: the kernel stops it."""
    if find_chromium() is None:
        pytest.skip("chromium not found: apt-get install chromium to run the browser tests")
    token = f"MINIPS_HEADLESS_TEST={os.getpid()}-killed"
    env = {**os.environ, token.split("=")[0]: token.split("=")[1]}
    argv = [sys.executable, "-m", "minips.classroom.web.headless", "about:blank",
            "--profile", str(tmp_path / "profile")]  # fmt: skip
    launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, start_new_session=True)
    try:
        assert launcher.stdout.readline().startswith(b"opened 1 tab")
        assert _chromium_pids(token)
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10.0
        while (left := _chromium_pids(token)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:  # not this test's to leave running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"Chromium outlived its killed launcher: pids {left}"
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
