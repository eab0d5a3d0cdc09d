"""A stop signal that reaches `minips` before its command has handlers of its own: while
Python loads the command line (click, then the command's module and numpy) nothing has
started yet (no child process, no socket, no training), so nothing is lost, and the
process says so in one line, never with a KeyboardInterrupt traceback or in silence.

    with signals_while_loading():   # around loading the command line (minips.cli.main)
    with sigterm_said():            # around the command (minips.cli.command_line.main)

Ctrl-C (SIGINT): `interrupted`, exit status 130, as a later Ctrl-C (from there on Ctrl-C
is KeyboardInterrupt, which command_line.main turns into that line). SIGTERM:
`terminated`, then the process ends by SIGTERM itself (status 143 in a shell, -15 to a
parent process): the status it always ended with, which a launcher records for the
children it stops, and the one `minips worker` and `evaluate` end with after their bye
(minips.cli.terminate). A command that handles SIGTERM itself replaces this handler while
it runs (`minips run`: as Ctrl-C; the server: a stop). What runs before this module
(Python's start and `import minips`) keeps Python's own handling.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

INTERRUPTED_STATUS = 130  # 128 + SIGINT, a shell's status for a Ctrl-C


def say(line: str) -> None:
    """`line` on stderr, written at once (a signal handler may interrupt a buffered write)."""
    os.write(2, f"{line}\n".encode())


def _interrupted(_signum: int, _frame: Any) -> None:
    say("interrupted")
    raise SystemExit(INTERRUPTED_STATUS)  # out of any import under way, with no traceback


def _terminated(_signum: int, _frame: Any) -> None:
    say("terminated")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def _handled(handlers: dict[signal.Signals, Any]) -> Iterator[None]:
    """`handlers` inside the block, the previous ones after; a signal its parent left
    ignored (a script's `&` ignores SIGINT) stays ignored. Only in the main thread (the
    only one Python runs handlers in, and may set them from)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        signum: signal.signal(signum, handler)
        for signum, handler in handlers.items()
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def signals_while_loading() -> Any:
    """Inside: Ctrl-C says `interrupted` and exits 130, SIGTERM says `terminated` and ends
    the process by SIGTERM (imports cannot catch KeyboardInterrupt)."""
    return _handled({signal.SIGINT: _interrupted, signal.SIGTERM: _terminated})


def sigterm_said() -> Any:
    """Inside: SIGTERM says `terminated` and ends the process by SIGTERM (Ctrl-C stays
    KeyboardInterrupt, which the command or minips.cli.command_line.main handles)."""
    return _handled({signal.SIGTERM: _terminated})
