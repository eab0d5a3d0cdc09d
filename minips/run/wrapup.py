"""A stop signal once training is over cuts the run's wrap-up short, not the run.

Ctrl-C or SIGTERM to the launcher is KeyboardInterrupt (minips.run.processes.
signals_stop_the_run). Before training is over it ends the run: every child stopped, no
summary. Once it is over (the servers stopping, the final test, the results being
written), what was trained is kept: the waits are cut short (the children are stopped:
each server keeps its model as on `stop`), the launcher's own final test is skipped, and
the group checkpoint and the summary are still written. The summary says `"interrupted":
INTERRUPTED`; `ended` is "finished" when the final model had been tested, else
"finished_untested_final" with `untested_why` UNTESTED_WHY (minips.results.versions).
The launcher ignores every signal after the first, so this wrap-up is not cut again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from minips.results.rundir import RunDir, final_stats, latest_eval
from minips.results.versions import run_version, same_version

INTERRUPTED = "during the wrap-up, once training was over"
UNTESTED_WHY = "the run was interrupted during its wrap-up, before its final test"

T = TypeVar("T")


class WrapUp:
    """Whether a stop signal came once `trained()` (training was over)."""

    def __init__(self, trained: Callable[[], bool]) -> None:
        self.trained = trained
        self.interrupted = False

    @contextlib.contextmanager
    def cut_short(self) -> Iterator[None]:
        """A step the signal may end: KeyboardInterrupt ends the block and is noted once
        training is over, goes on before."""
        try:
            yield
        except KeyboardInterrupt:
            if not self.trained():
                raise
            self.interrupted = True

    def finish(self, step: Callable[[], T]) -> T:
        """A step whose result the run keeps: interrupted once training is over, it is done
        again whole (the signals that could cut it are ignored by then)."""
        try:
            return step()
        except KeyboardInterrupt:
            if not self.trained():
                raise
            self.interrupted = True
            return step()

    @property
    def note(self) -> str | None:
        """The summary's `interrupted` (None: not interrupted)."""
        return INTERRUPTED if self.interrupted else None


def untested_after_interrupt(run_dir: RunDir, servers: int) -> str | None:
    """`untested_why` of a run whose wrap-up was cut before the launcher's final test:
    None when the evaluator had tested the version the run ended with."""
    final = run_version(final_stats(run_dir, servers))
    tested = latest_eval(run_dir.eval_log).get("version")
    return None if final is not None and same_version(tested, final) else UNTESTED_WHY
