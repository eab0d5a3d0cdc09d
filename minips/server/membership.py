"""Who takes part in a run: hello, ping, bye, and workers declared dead after a silence.

`Membership` changes the registry and answers these requests; what a departure means for
the update rule (a barrier completing without the worker, say) it returns as the rule's
`Outcome`, for the server loop to carry out like any other rule decision. It never
applies an update; when the last rank's worker said bye it asks for a stop (minips.server.stop),
which the loop begins.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from minips.protocol.wire import ProtocolError
from minips.rules import Outcome, Rule

if TYPE_CHECKING:
    from minips.protocol.wire import Message
    from minips.server.router import Envelope, Outbox
    from minips.server.seams import GroupRole, Operations
    from minips.server.stop import Stop
    from minips.state.registry import WorkerRegistry, WorkerState
    from minips.state.store import ParameterStore

log = logging.getLogger("minips.server")
MAX_REASON_CHARS = 256  # of a bye's `refused` reason kept for stats


class Membership:
    """hello, ping and bye over `registry`, replies through `outbox` (module docstring).

    config: the run's config map, sent in every hello reply with the worker's rank, the
    world size and the rule added. heartbeat_timeout: seconds of silence before a worker
    is declared dead (also in the hello reply). stop: the server's stop state (hellos are
    refused once it began; replies carry it). checks: the server's operations, asked
    `check_hello` before a hello registers anyone. observers_awaited: the stop by the workers'
    byes waits until this many observers have said hello (an evaluator started beside a
    launched job, which the workers need not wait for, still tests the final model).
    """

    def __init__(
        self,
        registry: WorkerRegistry,
        store: ParameterStore,
        rule: Rule,
        outbox: Outbox,
        config: dict[str, Any],
        heartbeat_timeout: float,
        stop: Stop,
        checks: Operations,
        observers_awaited: int = 0,
    ) -> None:
        self.registry, self.store, self.rule, self.outbox = registry, store, rule, outbox
        self.config, self.heartbeat_timeout, self.stop = config, heartbeat_timeout, stop
        self.checks = checks
        self.observers_awaited, self.observers_seen = observers_awaited, 0
        self.group: GroupRole | None = None  # set on a shard of a server group

    def hello(self, envelope: Envelope, request: Message) -> Outcome:
        """Register (or re-register) a worker or observer; reply with the run's config.
        Returns the rule's decision on the registration it replaced, if one was live."""
        if self.stop.stopping:
            raise ProtocolError("the server is stopping", "stopping")
        if self.group is not None:
            self.group.check_hello()  # a root answers once every shard joined (16.3)
        worker_id, info = request.header["worker"], request.header.get("info", {})
        self.checks.check_hello(request.header, envelope.origin)  # its info, its connection
        old = self.registry.by_id.get(worker_id)
        if old is not None and old.alive:
            old.check_owner(envelope.origin)
        worker = self.registry.register(worker_id, info, envelope.origin)
        worker.bytes_in += request.nbytes
        replaced = Outcome()
        if old is not None and old.alive:
            replaced = self.retire(old, "re-registered")
        world_size = self.registry.current_world_size()
        config = {**self.config, "rank": worker.rank, "world_size": world_size}
        config.setdefault("rule", self.rule.describe())
        log.info("%s registered", describe(worker))
        header = {
            "op": "hello",
            "worker": worker_id,
            "rank": worker.rank,
            "world_size": world_size,
            "config": config,
            "version": self.store.version,
            "heartbeat_timeout": self.heartbeat_timeout,
        }
        if self.group is not None:  # a shard of a group: where the others are (16.4)
            header["group"] = self.group.group()
        if worker.observer:
            self.observers_seen += 1
            self.stop_if_every_rank_finished()  # the last one awaited: its next reply says stop
        self.outbox.reply(envelope, header, worker=worker)
        return replaced

    def ping(self, envelope: Envelope, request: Message) -> None:
        """A heartbeat: the worker is alive (`sender` notes it); the reply says whether to stop."""
        worker = self.registry.sender(request, envelope.origin)
        header = {"op": "ping", "version": self.store.version, "stop": self.stop.stopping}
        self.outbox.reply(envelope, header, worker=worker)

    def bye(self, envelope: Envelope, request: Message) -> Outcome:
        """A worker leaves (finished its shard unless it says `finished: false`); the
        rule's decision on its departure."""
        worker = self.registry.sender(request, envelope.origin)
        refused = request.header.get("refused")
        worker.finished = request.header.get("finished", True) and not worker.observer
        worker.finished = worker.finished and refused is None
        why = "said bye" if worker.finished or worker.observer else "left unfinished"
        if refused is not None:
            worker.refused = refused[:MAX_REASON_CHARS]
            log.warning("%s cannot follow this run: %s", describe(worker), worker.refused)
            why = "refused the run"
        left = self.retire(worker, why)
        # Asked for before the reply goes, so whoever reads the reply finds it.
        self.stop_if_every_rank_finished()
        self.outbox.reply(envelope, {"op": "bye"}, worker=worker)
        return left

    def stop_if_every_rank_finished(self) -> None:
        """With a fixed world size a run ends once every rank's shard is finished (each
        worker said `bye` after its epochs) and the observers awaited have come: the server
        stops by itself (protocol.md 5.6)."""
        if self.stop.stopping or self.observers_seen < self.observers_awaited:
            return
        if self.registry.all_finished():
            self.stop.request("every worker finished its epochs", by_workers=True)

    def check_liveness(self, now: float) -> Iterator[Outcome]:
        """Declare workers dead that have sent nothing for the heartbeat timeout: the
        rule's decision on each, one at a time (each carried out before the next)."""
        for worker in self.registry.silent(now, self.heartbeat_timeout):
            silent = worker.silent_for(now)
            log.warning("%s silent for %.1f s: declared dead", describe(worker), silent)
            yield self.retire(worker, "heartbeat timeout")

    def retire(self, worker: WorkerState, why: str) -> Outcome:
        """Take a worker out of the live set (bye, death, replaced); the rule's decision."""
        worker.alive = False
        worker.held_pull = None
        log.info("%s left: %s", describe(worker), why)
        return Outcome() if worker.observer else self.rule.on_worker_left(worker)


def describe(worker: WorkerState) -> str:
    """ "rank 1 (lab-pc-3, numpy)" (its host and agent, as its hello's info says) or
    "observer cd34" (an observer holds no rank), for logs a person reads."""
    if worker.observer:
        return f"observer {worker.worker_id}"
    host = worker.info.get("host") or "host unknown"
    return f"rank {worker.rank} ({host}, {worker.info.get('agent', 'numpy')})"
