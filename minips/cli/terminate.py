"""A client process sent SIGTERM (the launcher stopping its run, `kill`, a scheduler)
leaves as on Ctrl-C: it says `bye` first. A server that is stopping waits for its clients
to leave (its grace, 5 s); a client that died without a word is waited for the whole grace.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM raises KeyboardInterrupt as SIGINT does, so the command's Ctrl-C
    path (its bye) runs; leaving by it, the process still ends by SIGTERM (its parent sees
    the same exit status as before). A second SIGTERM ends it at once. Only in the main
    thread (the only one Python delivers signals to)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    terminated = False

    def on_sigterm(_signum: int, _frame: Any) -> None:
        nonlocal terminated
        terminated = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if terminated else previous)
        if terminated:
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGTERM)
