"""The server's bookkeeping: the worker table (ranks, clocks, liveness) and traffic counters."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minips.wire import ProtocolError

if TYPE_CHECKING:
    from minips.rules import Push
    from minips.store import UpdateRecord

log = logging.getLogger("minips.server")


@dataclass(eq=False)
class Envelope:
    """Where a reply goes: ROUTER routing frames (+ REQ delimiters) and the request id."""

    routing: list[Any]
    rid: int | None


@dataclass(eq=False)
class WorkerState:
    """The server's view of one worker, keyed by its self-chosen `worker_id`."""

    worker_id: str
    rank: int
    info: dict[str, Any]
    last_seen: float  # time.monotonic() of its last request
    alive: bool = True
    finished: bool = False  # left with `bye`: its rank (and so its shard) is done, not free
    observer: bool = False  # read-only client (an evaluator): no rank, never waited for
    clock: int = 0  # completed steps (pushes with `last`)
    pushes: int = 0
    samples: int = 0  # training examples its pushes reported
    dropped: int = 0  # accepted pushes the rule dropped without applying (DASGD cutoff)
    extra_bytes_in: int = 0  # bytes of its pushes' extra arrays (VSGD samples)
    pulls: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    last_seq: int | None = None
    last_push_reply: dict[str, Any] | None = None  # header of the reply to last_seq
    pending_push: Push | None = None  # accepted, reply held by the rule
    held_pull: tuple[Envelope, int | None] | None = None  # (envelope, since)

    @property
    def waiting(self) -> bool:
        """True while the server holds one of its requests (it is not silent, it waits)."""
        return self.pending_push is not None or self.held_pull is not None

    def row(self, now: float) -> dict[str, Any]:
        """This worker's line in the `stats` reply."""
        return {
            "worker": self.worker_id,
            "rank": self.rank,
            "alive": self.alive,
            "observer": self.observer,
            "clock": self.clock,
            "pushes": self.pushes,
            "samples": self.samples,
            "dropped": self.dropped,
            "extra_bytes_in": self.extra_bytes_in,
            "pulls": self.pulls,
            "last_seen_ago": now - self.last_seen,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "info": self.info,
        }


class WorkerTable:
    """Every worker ever registered, by id; ranks 0..world_size-1 among the live ones."""

    def __init__(self, world_size: int | None) -> None:
        self.world_size = world_size  # None: no fixed size
        self.by_id: dict[str, WorkerState] = {}
        self._first_hello = 0.0  # time.monotonic() of the first worker's hello
        self._assembled = False

    def live(self) -> list[WorkerState]:
        """Live workers (observers excluded): the ones rules and barriers count."""
        return [w for w in self.by_id.values() if w.alive and not w.observer]

    def observers(self) -> list[WorkerState]:
        return [w for w in self.by_id.values() if w.alive and w.observer]

    def current_world_size(self) -> int:
        if self.world_size is not None:
            return self.world_size
        return max((w.rank + 1 for w in self.live()), default=0)

    def registration(self, worker_id: str, info: dict[str, Any]) -> WorkerState:
        """A fresh state for a worker saying hello (not yet in the table; see `add`).

        An observer (info["role"] == "observer") gets rank = world size: it holds no rank.

        Rank: its old one if no other live worker holds it, else the lowest free one. A rank
        is taken while its worker is live and stays taken after that worker said `bye`
        (its shard is trained: a newcomer must not train it again); a rank whose worker
        was declared dead is free for a replacement. ProtocolError "full" when no rank
        below world_size is free. Clock: a (re)joining worker
        starts no further behind than the slowest live one, so a newcomer does not hold
        back every ssp pull with its zero clock.
        """
        now = time.monotonic()
        if info.get("role") == "observer":
            rank = self.current_world_size()
            return WorkerState(worker_id, rank, info, last_seen=now, observer=True)
        old = self.by_id.get(worker_id)
        if old is not None and old.observer:
            old = None
        others = [w for w in self.live() if w is not old]
        taken = {w.rank for w in others}
        taken |= {w.rank for w in self.by_id.values() if w.finished and w is not old}
        if old is not None and old.rank not in taken:
            rank = old.rank
        else:
            rank = next(r for r in range(len(taken) + 1) if r not in taken)
        if self.world_size is not None and rank >= self.world_size:
            raise ProtocolError(f"all {self.world_size} worker ranks are taken", "full")
        clock = max(old.clock if old else 0, min((w.clock for w in others), default=0))
        return WorkerState(worker_id, rank, info, last_seen=now, clock=clock)

    def add(self, worker: WorkerState) -> None:
        if not worker.observer and not self._first_hello:
            self._first_hello = time.monotonic()
        self.by_id[worker.worker_id] = worker

    @property
    def assembled(self) -> bool:
        """The cluster has started: all `world_size` workers came, or the grace ran out."""
        return self._assembled or self.world_size is None

    def assembling(self, grace: float) -> bool:
        """True while fewer than `world_size` workers have ever said hello and the first
        hello is less than `grace` seconds old (a worker that never comes is waited for no
        longer than a dead one). Synchronous rules hold their first round meanwhile."""
        if self._assembled or self.world_size is None:
            return False
        registered = sum(1 for w in self.by_id.values() if not w.observer)
        if registered >= self.world_size:
            self._assembled = True
        elif registered and time.monotonic() - self._first_hello > grace:
            log.warning(
                "only %d of %d workers registered in %.1f s: starting without the others",
                registered,
                self.world_size,
                grace,
            )
            self._assembled = True
        return not self._assembled

    def silent(self, now: float, timeout: float) -> list[WorkerState]:
        """Live workers with nothing held that have sent nothing for `timeout` seconds."""
        return [w for w in self.live() if not w.waiting and now - w.last_seen > timeout]


@dataclass
class Counters:
    """Server-wide traffic and update counters for `stats`."""

    messages_in: int = 0
    samples: int = 0  # training examples reported by accepted pushes
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    updates: int = 0
    dropped: int = 0  # pushes a rule dropped (not updates)
    grad_bytes_in: int = 0  # bytes of accepted pushes' gradient arrays
    extra_bytes_in: int = 0  # bytes of accepted pushes' extra arrays (VSGD: ~rho of the above)
    staleness_sum: int = 0
    staleness_count: int = 0
    staleness_max: int = 0
    started: float = field(default_factory=time.monotonic)

    def record_update(self, record: UpdateRecord) -> None:
        self.updates += 1
        self.staleness_sum += sum(record.staleness)
        self.staleness_count += len(record.staleness)
        self.staleness_max = max([self.staleness_max, *record.staleness])

    def summary(self) -> dict[str, Any]:
        mean = self.staleness_sum / self.staleness_count if self.staleness_count else 0.0
        return {
            "updates": self.updates,
            "dropped": self.dropped,
            "samples": self.samples,
            "messages_in": self.messages_in,
            "errors": self.errors,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "grad_bytes_in": self.grad_bytes_in,
            "extra_bytes_in": self.extra_bytes_in,
            "staleness_mean": mean,
            "staleness_max": self.staleness_max,
            "uptime": time.monotonic() - self.started,
        }
