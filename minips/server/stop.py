"""Whether the server is stopping: one record, which anyone may ask to set and the loop sets.

A stop is *requested* by a signal handler or another thread (`ParameterServer.request_stop`),
an operator's `stop`, the sample budget or the last worker's `bye`; the server loop alone
*begins* it (`ParameterServer.begin_stop`: answer everything held, flag every later reply),
right after the request that asked, so the messages after that one see it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stop:
    """The stop state of one server (module docstring). Membership and the pulls read it."""

    requested: bool = False  # asked for; safe to set from a signal handler or another thread
    why: str = ""
    stopping: bool = False  # begun: replies carry `stop`, pushes no longer apply, no hellos
    by_workers: bool = False  # asked for because every rank finished its shard
    planned: bool = False  # the run's own end: its sample budget spent or every rank finished
    deadline: float = 0.0  # when a stopping server stops waiting for its clients to leave
    cut: bool = False  # a second signal: the clients are not waited for at all
    signalled: bool = False  # a signal asked (not a request, a budget or a primary's event)

    def request(self, why: str, by_workers: bool = False, planned: bool = False) -> None:
        """Ask for a stop (the first reason asked is the one logged). planned: the run's
        own end (by_workers is one), not a signal, an operator or a root cutting it short."""
        if not self.requested:
            self.why, self.by_workers = why, by_workers
            self.planned = planned or by_workers
        self.requested = True

    def begin(self, deadline: float) -> None:
        """The loop begins the stop: clients are waited for until `deadline` (not at all
        once cut: a second signal may come before the loop began the first one's stop)."""
        self.requested = self.stopping = True
        self.deadline = 0.0 if self.cut else deadline

    @property
    def by_all_workers(self) -> bool:
        """It stopped because every rank finished its shard (each worker said `bye`)."""
        return self.stopping and self.by_workers

    def due(self) -> bool:
        """A stop was asked for and not begun yet."""
        return self.requested and not self.stopping
