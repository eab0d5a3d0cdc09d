"""The server loop's timers: what it does on every turn besides answering requests.

Connections holding too much of a message still arriving (minips/ops/inflow.py), the
time-based checkpoint, workers declared dead, the end of the assembly, the rule's own
timers (an ssgd round completing once the assembly ended) and a shard's joins.

Each job runs contained: one that fails (a bug) is logged once with its traceback, then
only counted (a line at its 10th, 100th, ... failure), and the loop goes on serving and
running the other jobs; what it was carrying out is answered by carry_out's own
containment (minips/ops/failures.py). A MinipsError is not a bug: the server cannot go
on (a group's root refused this shard), and it stops the loop as it says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from minips.errors import MinipsError

if TYPE_CHECKING:
    from minips.rules import Outcome, Rule
    from minips.server.membership import Membership
    from minips.server.pulls import Pulls

log = logging.getLogger("minips.server")


class Inflow(Protocol):
    """Cuts the connections holding too much of a message still arriving (ops/inflow.py)."""

    def check(self, now: float) -> None: ...


class DueCheckpoints(Protocol):
    """Writes the time-based checkpoint when it is due (ops/checkpoints.py)."""

    def if_due(self, now: float) -> None: ...


class GroupTurn(Protocol):
    """A shard's joins to its root, and its stop with it (group/shard.py)."""

    def tick(self, now: float) -> None: ...


class Timers:
    """The loop's jobs on each turn (`tick`), each contained (module docstring).

    carry_out(outcome) and after_leaving(outcome) are the server's: a rule's decision on
    a timer is carried out like one on a request. `failures`: each job's failures so far.
    """

    def __init__(
        self,
        inflow: Inflow,
        checkpoints: DueCheckpoints,
        membership: Membership,
        pulls: Pulls,
        rule: Rule,
        carry_out: Callable[[Outcome], None],
        after_leaving: Callable[[Outcome], None],
        group: GroupTurn | None = None,
    ) -> None:
        self.inflow, self.checkpoints, self.membership = inflow, checkpoints, membership
        self.pulls, self.registry, self.rule, self.group = pulls, pulls.registry, rule, group
        self.carry_out, self.after_leaving = carry_out, after_leaving
        self.failures: dict[str, int] = {}

    def tick(self, now: float) -> None:
        """One turn's jobs, in this order, each contained."""
        with self.contained("inflow"):
            self.inflow.check(now)
        with self.contained("checkpoint"):
            self.checkpoints.if_due(now)
        with self.contained("liveness"):
            for left in self.membership.check_liveness(now):
                self.after_leaving(left)
        with self.contained("assembly"):
            if self.registry.assembling:
                self.registry.update_assembly(now)
                self.pulls.release()
        with self.contained("rule"):
            self.carry_out(self.rule.on_tick(now))
        if self.group is not None:  # a shard's joins; it stops with its root
            with self.contained("group"):
                self.group.tick(now)

    @contextmanager
    def contained(self, job: str) -> Iterator[None]:
        """Run a job's body; a failure of it (not a MinipsError) is logged once, then
        counted, and goes no further."""
        try:
            yield
        except MinipsError:
            raise
        except Exception:
            count = self.failures[job] = self.failures.get(job, 0) + 1
            if count == 1:
                log.exception("timer %r failed; the server goes on (its next failures are "
                              "counted, not shown)", job)  # fmt: skip
            elif _is_power_of_ten(count):
                log.error("timer %r has failed %d times (the first one's traceback is above)",
                          job, count)  # fmt: skip


def _is_power_of_ten(count: int) -> bool:
    while count % 10 == 0:
        count //= 10
    return count == 1
