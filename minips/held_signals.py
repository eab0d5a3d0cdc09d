"""A child's start is never cut in two by its parent's own stop signals.

`minips run` and `minips launch` turn SIGINT and SIGTERM into KeyboardInterrupt wherever
the launcher is (minips.run.processes.signals_stop_the_run); the headless Chromium of
browser slots (minips.classroom.web.headless) turns SIGTERM into SystemExit. Inside
`subprocess.Popen` that is too early or too late: raised after the fork but before Popen
returns, the child runs on unknown to its parent (nobody stops it); raised in an at-fork
handler (logging has some), Python prints "Exception ignored" and drops it, and a launcher,
which ignores every signal after the first, runs on and cannot be stopped. So while a
child starts the two signals are held (`held_during_start`) and handled once the child is
known; the child gets them back, at their defaults, before its program starts
(`released_in_child`), and it ends when its launcher dies, even by SIGKILL
(`end_with_the_launcher`). A leaf beside errors.py: run/ and classroom/ both start children,
and classroom/ may not import run/ (run/ imports classroom/).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

STOPPING = (signal.SIGINT, signal.SIGTERM)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal a process gets when its parent dies


@contextlib.contextmanager
def held_during_start() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the end of the block, then are handled as usual.

    Two holds, as Python handles a signal in two steps: the calling thread's signal mask
    blocks them (the kernel keeps one sent to it pending), and the Python handlers are
    swapped for one that only notes them (one the kernel gave another thread of the
    process: a dashboard's, a gateway's). At the end the handlers come back, the mask is
    restored (a pending signal is handled there) and each noted one is raised again.
    Only in the main thread: elsewhere Python runs no handler, so nothing can cut a start."""
    noted: set[signal.Signals] = set()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    previous = {signum: signal.getsignal(signum) for signum in STOPPING}
    swap = all(handler is not None for handler in previous.values())  # None: set from C
    try:
        if swap:
            for signum in STOPPING:
                signal.signal(signum, lambda signum, _frame: noted.add(signum))
        yield
    finally:
        if swap:
            for signum, handler in previous.items():
                signal.signal(signum, handler)  # type: ignore[arg-type]
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for signum in sorted(noted):
            signal.raise_signal(signum)


def released_in_child(then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A `preexec_fn`: `then` (if any), then SIGINT and SIGTERM at their defaults and
    unblocked, as a new program expects them (a mask blocking them would outlive its exec).
    One sent to the child meanwhile ends it, as it would a moment later."""

    def in_the_child() -> None:
        if then is not None:
            then()
        for signum in STOPPING:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)

    return in_the_child


def end_with_the_launcher() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel send a child SIGTERM when the launcher dies, even
    by SIGKILL (Linux's PR_SET_PDEATHSIG), so that no server, worker or browser trains on
    with nobody to stop it; SIGTERM is each child's usual stop (a server keeps its model).
    None where prctl does not exist: there a killed launcher still leaves its children."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in it
    launcher = os.getpid()

    def in_the_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != launcher:  # the launcher died before the line above: no signal
            os._exit(1)

    return in_the_child
