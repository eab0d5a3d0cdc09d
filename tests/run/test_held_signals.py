"""A child's start is never cut in two by the parent's stop signals (minips/held_signals.py),
with real processes: a signal that comes during the start is handled after it, and the child
gets SIGINT and SIGTERM back at their defaults."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

HELD = textwrap.dedent(
    """
    import os, signal, threading, time
    from minips.held_signals import held_during_start
    got = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
    # another thread that does not block SIGTERM: the kernel gives it the signal
    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
    with held_during_start():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        print("during", len(got), flush=True)
    time.sleep(0.1)
    print("after", len(got), flush=True)
    """
)


def test_a_signal_during_a_start_is_handled_after_it_even_when_another_thread_got_it():
    done = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.stdout.split("\n")[:2] == ["during 0", "after 1"], done.stdout + done.stderr


CHILD = "import signal; print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, signal.getsignal(signal.SIGINT) is signal.default_int_handler, sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"  # noqa: E501
STARTS = textwrap.dedent(
    f"""
    import signal, subprocess, sys
    from minips.held_signals import held_during_start, released_in_child
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a launcher's own handling
    with held_during_start():
        subprocess.run([sys.executable, "-c", {CHILD!r}], preexec_fn=released_in_child())
    """
)


def test_a_child_gets_the_stop_signals_back_at_their_defaults_and_unblocked():
    done = subprocess.run([sys.executable, "-c", STARTS], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    default, interrupt, blocked = done.stdout.split(" ", 2)
    assert (default, interrupt) == ("True", "True"), done.stdout  # SIGTERM ends it, Ctrl-C too
    assert str(int(signal.SIGTERM)) not in blocked and str(int(signal.SIGINT)) not in blocked
