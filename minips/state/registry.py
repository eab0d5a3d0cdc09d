"""The server's worker registry: who is registered, their ranks, clocks, liveness and pushes.

The registry only keeps state; it never sends a message. The server loop reads and books
into it, and rules read it (a barrier counts `live()` workers, SSP compares clocks). A
push as the server accepted it (`Push`, what a rule decides on) is booked here too, with
the worker that sent it (its origin and held pulls: minips.state.requests); minips.rules
reads these types and this module imports no rule.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from minips.protocol.wire import ProtocolError
from minips.state.requests import HeldPull, Origin

if TYPE_CHECKING:
    from minips.protocol.wire import Message

log = logging.getLogger("minips.server")

SEQ_WINDOW = 64  # answered pushes remembered per worker, for retries (docs/protocol.md 8)
MAX_OBSERVERS = 32  # live observers at once (docs/protocol.md 10)
OBSERVER_EXPIRY = 3  # an observer silent this many heartbeat timeouts is forgotten
MAX_REGISTERED = 1024  # worker ids remembered, live or not (docs/protocol.md 10)


@dataclass(eq=False)
class Push:
    """One accepted push: float32 gradients by parameter name, plus rule-specific extras.

    `staleness` is tau = t - base: set on arrival, and refreshed when the push goes into
    an applied update (t = the global version just before it).
    """

    worker: WorkerState
    seq: int
    base: int
    last: bool  # ends the worker's step (clock)
    grads: dict[str, np.ndarray]  # name -> float32, parameter's shape
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # "extra/<key>" -> array
    staleness: int = 0
    reply_to: Any = None  # the server's routing envelope; replaced when a retry arrives
    fused: bool = False  # a push + pull: its answer carries the parameters (`pull_since`)
    pull_since: int | None = None
    codecs: dict[str, str] = field(default_factory=dict)  # name -> its codec on the wire


@dataclass(eq=False)
class WorkerState:
    """The server's view of one worker, keyed by its self-chosen `worker_id`."""

    worker_id: str
    rank: int
    info: dict[str, Any]
    last_seen: float  # time.monotonic() of its last request
    last_answered: float = 0.0  # ... and of the server's last reply to it (Outbox.reply)
    alive: bool = True
    finished: bool = False  # left with `bye` (not `finished: false`): its shard is done
    refused: str | None = None  # why it left at once: it cannot follow the run (bye `refused`)
    observer: bool = False  # read-only client (an evaluator): no rank, never waited for
    clock: int = 0  # completed steps (pushes with `last`); set forward at a rejoin
    steps: int = 0  # completed steps, counted (never set forward)
    pushes: int = 0
    samples: int = 0  # training examples its pushes reported
    dropped: int = 0  # accepted pushes the rule dropped without applying (DASGD cutoff)
    extra_bytes_in: int = 0  # bytes of its pushes' extra arrays (VSGD samples)
    pulls: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    highest_seq: int = -1  # the highest push seq accepted
    answered: OrderedDict[int, dict[str, Any]] = field(default_factory=OrderedDict)  # seq->reply
    held_pushes: dict[int, Push] = field(default_factory=dict)  # seq -> push, reply held
    held_pull: HeldPull | None = None
    partial_step: Push | None = None  # this step's `last: false` pushes, summed (assemble_step)
    origin: Origin | None = None  # who said hello: its routing id and CURVE key

    def check_owner(self, origin: Origin) -> None:
        """`not_owner` unless `origin` said this worker's hello: the same connection (its
        routing id, which a client keeps for life) and, under CURVE, the same key. Both
        together: clients may share a key (minips run's workers do), and another client
        holding it still cannot act as this worker (docs/protocol.md 15)."""
        if self.origin != origin:
            raise ProtocolError(
                f"worker id {self.worker_id!r} belongs to another live client", "not_owner"
            )

    def continue_seq(self, old: WorkerState) -> None:
        """Take over `old`'s push bookkeeping: the same client said hello again (after
        being declared dead, say), so a retry of a push it already sent is still answered
        from `answered`, never applied twice."""
        self.highest_seq, self.answered = old.highest_seq, old.answered

    def continue_totals(self, old: WorkerState) -> None:
        """Go on from `old`'s counters: the same worker id took the same rank again (a
        reloaded browser tab, a restarted worker), so its row counts the seat's whole work,
        not the work since it came back."""
        for name in ("steps", "pushes", "samples", "dropped", "extra_bytes_in", "pulls",
                     "bytes_in", "bytes_out"):  # fmt: skip
            setattr(self, name, getattr(old, name))

    def count_step(self, push: Push, samples: int) -> None:
        """Book an accepted push that can still apply: the samples it reports and, when it
        ends a step (`last`), the step (clock and steps)."""
        self.samples += samples
        self.clock += push.last
        self.steps += push.last

    def silent_for(self, now: float) -> float:
        """Seconds of silence: since its last request or the server's last reply to it,
        whichever came later (a held reply is answered late: the silence starts then)."""
        return now - max(self.last_seen, self.last_answered)

    @property
    def waiting(self) -> bool:
        """True while the server holds one of its requests (it is not silent, it waits)."""
        return bool(self.held_pushes) or self.held_pull is not None

    def seen_push(self, seq: int) -> str:
        """What `seq` is to this worker: "new" (higher than any it sent), "held" (accepted,
        not answered yet), "answered" (one of the last SEQ_WINDOW answered), "failed" (one
        of those, answered with the error its handling failed with), else "stale".

        Several pushes may be in flight at once (a sender thread pushing layer by layer),
        each held or answered on its own; a retry of any of them is recognised.
        """
        if seq in self.held_pushes:
            return "held"
        if seq in self.answered:
            return "failed" if self.answered[seq]["op"] == "error" else "answered"
        return "new" if seq > self.highest_seq else "stale"

    def accept(self, push: Push) -> None:
        """Book an accepted push: held until answered, its extra bytes counted."""
        self.held_pushes[push.seq] = push
        self.highest_seq = max(self.highest_seq, push.seq)
        self.pushes += 1
        self.extra_bytes_in += sum(array.nbytes for array in push.extra.values())

    def assemble_step(self, push: Push, version: int) -> Push | None:
        """A step sent in several pushes reaches the rule as ONE push, with its `last` one.

        A `last: false` push (a layer sent while backward still ran: wait-free sending) is
        kept (None: the caller answers it `applied: false`); the step's `last` push takes in
        the kept gradients (summed per parameter) and the oldest base, so t advances once
        per step and the step's clock staleness is that of its oldest gradient, measured at
        `version` (docs/protocol.md 5.3).
        """
        kept = self.partial_step
        if not push.last:
            if kept is None:
                own = {name: np.array(grad, np.float32) for name, grad in push.grads.items()}
                self.partial_step = replace(push, grads=own)
            else:
                _add_gradients(kept, push)
            return None
        if kept is not None:
            self.partial_step = None
            _add_gradients(kept, push)
            push.grads, push.base = kept.grads, kept.base
            push.staleness = version - push.base
        return push

    def remember_answer(self, seq: int, header: dict[str, Any]) -> None:
        """Keep a push's reply for retries (the last SEQ_WINDOW of them)."""
        self.held_pushes.pop(seq, None)
        self.answered[seq] = header
        while len(self.answered) > SEQ_WINDOW:
            self.answered.popitem(last=False)


class WorkerRegistry:
    """Every worker ever registered, by id; ranks 0..world_size-1 among the live ones.

    The cluster is *assembling* until `world_size` workers have said hello, or `grace`
    seconds after the first one did (a worker that never comes is waited for no longer
    than a dead one); every rule holds pulls meanwhile, so a run starts together.
    """

    def __init__(self, world_size: int | None, grace: float) -> None:
        self.world_size = world_size  # None: no fixed size
        self.grace = grace
        self.by_id: dict[str, WorkerState] = {}
        self._first_hello = 0.0  # time.monotonic() of the first worker's hello
        self.assembling = world_size is not None

    def live(self) -> list[WorkerState]:
        """Live workers (observers excluded): the ones rules and barriers count."""
        return [w for w in self.by_id.values() if w.alive and not w.observer]

    def observers(self) -> list[WorkerState]:
        return [w for w in self.by_id.values() if w.alive and w.observer]

    def current_world_size(self) -> int:
        if self.world_size is not None:
            return self.world_size
        return max((w.rank + 1 for w in self.live()), default=0)

    def sender(self, request: Message, origin: Origin) -> WorkerState:
        """The live worker a request comes from (`not_owner` when another client registered
        it), its heartbeat and traffic recorded."""
        worker = self.live_worker(request.header["worker"])
        worker.check_owner(origin)
        worker.last_seen = time.monotonic()
        worker.bytes_in += request.nbytes
        return worker

    def pusher(self, request: Message, origin: Origin) -> WorkerState:
        """The live worker a push comes from (`sender`); an observer may not push
        (`observer`)."""
        worker = self.sender(request, origin)
        if worker.observer:
            raise ProtocolError("an observer cannot push", "observer")
        return worker

    def live_worker(self, worker_id: str) -> WorkerState:
        """The live worker with this id, or ProtocolError `unknown_worker`."""
        worker = self.by_id.get(worker_id)
        if worker is None or not worker.alive:
            raise ProtocolError(
                f"worker {worker_id!r} is not registered (send hello)", "unknown_worker"
            )
        return worker

    def register(self, worker_id: str, info: dict[str, Any], origin: Origin) -> WorkerState:
        """A fresh state for a worker saying hello, entered in the registry.

        An observer (info["role"] == "observer") gets rank = world size: it holds no rank.

        Rank: its old one if no other live worker holds it, else the lowest free one. A rank
        is taken while its worker is live and stays taken after that worker said `bye`
        (its shard is trained: a newcomer must not train it again); a rank whose worker
        was declared dead is free for a replacement. ProtocolError "full" when no rank
        below world_size is free. Clock: a (re)joining worker starts no further behind than
        the slowest live one, so a newcomer does not hold back every ssp pull with its
        zero clock. The caller retires a live previous registration of the same id.
        The same client (same routing id, same key) keeps its push `seq` bookkeeping.
        Bounded: MAX_OBSERVERS live observers, MAX_REGISTERED ids (the oldest ones that are
        neither live nor finished are forgotten first); error `full` beyond.
        """
        now = time.monotonic()
        if info.get("role") == "observer":
            if len(self.observers()) >= MAX_OBSERVERS:
                raise ProtocolError(f"{MAX_OBSERVERS} observers are connected already", "full")
            rank = self.current_world_size()
            worker = WorkerState(worker_id, rank, info, last_seen=now, observer=True)
        else:
            worker = self._new_worker(worker_id, info, now)
            if not self._first_hello:
                self._first_hello = now
        old = self.by_id.get(worker_id)
        if old is not None and old.origin == origin:
            worker.continue_seq(old)
        if old is not None and not old.observer and old.rank == worker.rank:
            worker.continue_totals(old)
        worker.origin = origin
        self._make_room(worker_id)
        self.by_id[worker_id] = worker
        self.update_assembly(now)
        return worker

    def _new_worker(self, worker_id: str, info: dict[str, Any], now: float) -> WorkerState:
        old = self.by_id.get(worker_id)
        if old is not None and old.observer:
            old = None
        others = [w for w in self.live() if w is not old]
        taken = {w.rank for w in others}
        finished = {w.rank for w in self.by_id.values() if w.finished and w is not old}
        taken |= finished
        if info.get("rank") is not None:
            rank = self.requested_rank(info["rank"], others, finished)
        elif old is not None and old.rank not in taken:
            rank = old.rank
        else:
            rank = next(r for r in range(len(taken) + 1) if r not in taken)
        if self.world_size is not None and rank >= self.world_size:
            raise ProtocolError(f"all {self.world_size} worker ranks are taken", "full")
        clock = max(old.clock if old else 0, min((w.clock for w in others), default=0))
        return WorkerState(worker_id, rank, info, last_seen=now, clock=clock)

    def _make_room(self, worker_id: str) -> None:
        """Forget the oldest forgettable ids (dead, not finished) to stay within the cap."""
        if worker_id in self.by_id or len(self.by_id) < MAX_REGISTERED:
            return
        for old_id, old in self.by_id.items():
            if not old.alive and not old.finished:
                del self.by_id[old_id]
                return
        raise ProtocolError(f"{MAX_REGISTERED} workers are registered already", "full")

    def requested_rank(self, rank: Any, others: list[WorkerState], finished: set[int]) -> int:
        """The rank a hello's `info.rank` asks for, if free (docs/protocol.md 5.1).

        A restarted worker takes over a shard this way: the rank of a worker declared dead
        or that left unfinished (`bye` with `finished: false`). ProtocolError `bad_field`
        for a rank that is not a uint, `full` for one outside 0..world_size-1, held by a
        live worker, or whose shard is finished.
        """
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ProtocolError(f"info.rank must be a uint, got {rank!r}", "bad_field")
        if self.world_size is not None and rank >= self.world_size:
            raise ProtocolError(
                f"rank {rank} requested, the run has ranks 0..{self.world_size - 1}", "full"
            )
        holder = next((w for w in others if w.rank == rank), None)
        if holder is not None:
            raise ProtocolError(
                f"rank {rank} is held by live worker {holder.worker_id} (a silent worker's "
                f"rank is freed {self.grace:g} s after its last request)",
                "full",
            )
        if rank in finished:
            raise ProtocolError(f"rank {rank} has finished its shard (its worker said bye)", "full")
        return rank

    def all_finished(self) -> bool:
        """True once every rank 0..world_size-1 was finished by a worker that said `bye`
        (with a fixed world size, and no worker live any more)."""
        if self.world_size is None or self.live():
            return False
        finished = {w.rank for w in self.by_id.values() if w.finished and not w.observer}
        return finished >= set(range(self.world_size))

    def update_assembly(self, now: float) -> None:
        """End the assembly once world_size workers came or the grace ran out."""
        if not self.assembling:
            return
        registered = sum(1 for w in self.by_id.values() if not w.observer)
        if registered >= self.world_size:
            self.assembling = False
        elif registered and now - self._first_hello > self.grace:
            log.warning(
                "only %d of %d workers registered in %.1f s: starting without the others",
                registered,
                self.world_size,
                self.grace,
            )
            self.assembling = False

    def silent(self, now: float, timeout: float) -> list[WorkerState]:
        """Live workers with nothing held that have been silent (`silent_for`) for `timeout`
        seconds, and observers silent for OBSERVER_EXPIRY heartbeat timeouts."""
        workers = [w for w in self.live() if not w.waiting and w.silent_for(now) > timeout]
        expiry = OBSERVER_EXPIRY * timeout
        return workers + [w for w in self.observers() if w.silent_for(now) > expiry]


def _add_gradients(into: Push, push: Push) -> None:
    """Sum `push`'s gradients into `into`'s (own float32 copies); keep the older base."""
    for name, grad in push.grads.items():
        if name in into.grads:
            into.grads[name] += grad
        else:
            into.grads[name] = np.array(grad, np.float32)
    into.base = min(into.base, push.base)
