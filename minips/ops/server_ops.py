"""The usual operations of a server, assembled: what each named point of its path does.

The server (minips/server/server.py) asks its `Operations` (minips/server/seams.py) at one
named point each; `ServerOps` answers from the modules beside the path, each with its own
tests: the guard's wire_checks.py (a request's frames and fields), request_checks.py (who
sent a request, clipping), retries.py (exactly once), overflow.py, inflow.py, failures.py,
collapse.py, telemetry.py, checkpoints.py, timers.py (the jobs of every turn), and the
sample budget here. Built before the server's socket (a resume happens first, as the
checkpoints say), attached once the socket, the outbox and the pulls exist.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from minips.guard import addresses
from minips.guard.wire_checks import decode_request, too_many_frames
from minips.ops.checkpoints import Checkpointer
from minips.ops.collapse import CollapseWatch, output_classes
from minips.ops.failures import Failures, answer_error
from minips.ops.inflow import InflowGuard, InflowLimits, cap_router, give_back_freed_memory
from minips.ops.operator_requests import Handler, OperatorRequests
from minips.ops.ops_options import OpsOptions
from minips.ops.overflow import OverflowCheck, refusal
from minips.ops.request_checks import (
    check_hello_connection,
    check_info,
    check_push_fits,
    clip_gradients,
    require_operator,
)
from minips.ops.retries import answer_retry
from minips.ops.rule_state import KeptRuleState
from minips.ops.telemetry import Telemetry, UpdateRecord, stop_record
from minips.ops.timers import Timers
from minips.protocol.wire import ProtocolError

if TYPE_CHECKING:
    from minips.protocol.wire import Message, WirePart
    from minips.rules import Outcome, Rule, Update
    from minips.server.options import ServerOptions
    from minips.server.router import Envelope
    from minips.server.seams import GroupRole
    from minips.server.stop import Stop
    from minips.state.registry import Push, WorkerRegistry, WorkerState
    from minips.state.requests import Origin
    from minips.state.store import ParameterStore

log = logging.getLogger("minips.server")

# What `stats` says of the run's data (docs/protocol.md 5.5): enough to recompute each
# worker's examples per label under a skewing --partition (docs/model.md 4.2).
DATA_KEYS = ("dataset", "partition", "seed")


class ServerOps:
    """A server's operations (module docstring). The parts are attributes of their own:
    `telemetry`, `collapse`, `checkpoints`, `overflow`; `inflow` and `failures` once attached.
    """

    def __init__(
        self,
        store: ParameterStore,
        registry: WorkerRegistry,
        rule: Rule,
        options: ServerOptions,
        config: dict[str, Any],
        on_update: Callable[[dict[str, Any]], None] | None = None,
        group: GroupRole | None = None,
    ) -> None:
        self.options = options = OpsOptions.of(options)  # the operations' settings too
        self.store, self.registry, self.rule = store, registry, rule
        self.config, self.group = config, group
        self.telemetry = Telemetry(on_update)
        self.counters = self.telemetry.counters
        self.collapse = CollapseWatch(  # has the model collapsed? (logged, in stats)
            output_classes(store.params), options.world_size, store.optimizer.lr, rule.name,
            log.warning,
        )  # fmt: skip
        self.checkpoints = Checkpointer(
            store, self.counters, options.checkpoint_path, options.checkpoint_every,
            options.checkpoint_interval, rule.name, config.get("model"),
            rule_state=KeptRuleState(rule), keep_all=options.keep_checkpoints,
            shard=None if group is None else (group.shard, group.servers),
        )  # fmt: skip
        self.checkpoints.start(options.resume)  # resumes; keeps a trained model at the path
        self.overflow = OverflowCheck(store, rule.max_move)
        # the request's frames and fields, every check with its code (docs/protocol.md 9)
        self.decode_request = partial(decode_request, limits=options.limits)
        rule.finite = self.overflow  # what the rule keeps of a push is checked too

    def attach(self, server: Any) -> None:
        """The server's socket exists and is not bound yet: ZeroMQ's caps are set on it
        (inflow.py) and the inflow guard watches it; failures are answered through its
        outbox; the sample budget asks its stop."""
        self.stop: Stop = server.stop
        self.outbox, self.pulls = server.outbox, server.pulls
        cap_router(server.socket, self.options.limits, self.options.send_hwm)
        self.inflow = InflowGuard(server.socket, InflowLimits.for_limits(self.options.limits))
        self.failures = Failures(self.registry, server.outbox)

    def bind(self, socket: zmq.Socket, address: str) -> str:
        """Bind the server's socket to `address` (--bind, checked and resolved first; a bind
        error is one AddressError line with the fix) and return the bound endpoint. Without
        keys, an endpoint reachable from outside this machine is worth a warning. An ipc
        path a live server accepts on is refused: binding it would take its address over."""
        address = addresses.normalize_bind(address)
        if addresses.still_listening(address):
            raise addresses.in_use(address)
        endpoint = addresses.bind(socket, address)
        if self.options.keys is None and not addresses.is_loopback(endpoint):
            log.warning("UNAUTHENTICATED: anyone who can reach %s can train, read and stop "
                        "this server (give it keys: minips keys)", endpoint)  # fmt: skip
        return endpoint

    # ------------------------------------------------------------------- a request

    def received(self, body: list[Any], dropped: int) -> None:
        """Count a request; refuse one with frames past the most a request may have."""
        self.counters.messages_in += 1
        self.counters.bytes_in += sum(len(frame) for frame in body)
        if dropped:
            raise too_many_frames(len(body) + dropped, self.options.limits)

    @contextmanager
    def answering(self, envelope: Envelope, body: list[Any]) -> Iterator[None]:
        """A refusal is answered with its code (a non-finite push told to the collapse
        watch); a failure (a bug) is logged and answered `internal`, with what it left
        held (failures.py): a retry gets the same."""
        try:
            yield
        except ProtocolError as exc:
            answer_error(self.outbox, envelope, exc, body)
            if exc.code == "nonfinite":  # the model may have diverged (collapse.py)
                self.collapse.on_nonfinite(envelope.origin.routing_id.hex())
        except Exception as exc:  # a bug: say so, answer `internal`, keep serving
            self.failures.request_failed(envelope, exc, body)

    def check_hello(self, header: dict[str, Any], origin: Origin) -> None:
        """Refuse a hello before it registers anyone: its `info` small and shallow, its
        connection not one its client abandoned (request_checks.py)."""
        check_info(header.get("info", {}))
        check_hello_connection(header, origin)

    def handlers(self, server: Any) -> dict[str, Handler]:
        """The requests beside training (operator_requests.py): `stats`, an operator's
        `stop` and `checkpoint` (`check_operator`), `join` refused outside a group."""
        return OperatorRequests(server, self.check_operator).handlers()

    def check_operator(self, origin: Origin) -> None:
        """Refuse a `stop` or a `checkpoint` without an operator key (under CURVE)."""
        require_operator(origin, self.options.keys)

    # ---------------------------------------------------------------------- a push

    def answer_retry(self, worker: WorkerState, envelope: Envelope, header: dict[str, Any]) -> None:
        """A retried push answered from memory (retries.py), never applied again."""
        answer_retry(worker, envelope, header, self.pulls, self.outbox)

    def check_push(self, push: Push, request: Message) -> None:
        """Refuse a push before it is accepted (nothing booked): its base and gradients
        against the model (`check_push_fits`), then clipped (--clip-norm), the overflow
        check (on the norms before clipping: upper bounds), the rule's own check."""
        closes_step = push.worker.partial_step is not None or self.stop.stopping
        check_push_fits(self.store, push.base, push.grads, closes_step)
        push.grads = clip_gradients(push.grads, self.options.clip_norm)
        self.overflow.check(push.grads, request.sq_norms)
        self.rule.check_push(push)

    def accepted(self, push: Push, request: Message) -> None:
        """Count an accepted push; one that can still apply: its training loss watched
        for a collapse, its samples counted, a stop asked once they reach the budget."""
        self.telemetry.count_push(push, request)
        if self.stop.stopping:
            return
        header = request.header
        if "loss" in header:
            self.collapse.on_train_loss(float(header["loss"]))
        self.counters.samples += header.get("samples", 0)
        if (budget := self.options.max_samples) and self.counters.samples >= budget:
            self.stop.request(f"sample budget of {budget} reached", planned=True)

    # ----------------------------------------------------------- a rule's decision

    def carrying_out(self, outcome: Outcome) -> AbstractContextManager[None]:
        """A failure while carrying out `outcome` answers its pushes still held (failures.py)."""
        return self.failures.answering(outcome)

    def refuse_update(self, update: Update) -> bool:
        """True for an update that would write a non-finite value (overflow.py): not
        written, its pushes still held answered `nonfinite`, remembered so (a retry gets it
        again), each told to the collapse watch."""
        name = self.overflow.refused(update.steps)
        if name is None:
            return False
        for push in self.failures.fail_pushes(update.pushes, error := refusal(name)):
            answer_error(self.outbox, push.reply_to, error, [])
            self.collapse.on_nonfinite(push.reply_to.origin.routing_id.hex())
        return True

    def updated(self, update: Update, version: int) -> None:
        """An update written as `version`: its norm bounds carried to the versions written,
        counted, recorded, and the update-count checkpoint when it is due."""
        self.overflow.carry(update.steps)
        self.collapse.on_applied()
        self.telemetry.update(UpdateRecord.applied(update, version, self.rule.name))
        self.checkpoints.after_update(version)

    def dropped(self, push: Push) -> None:
        """A push the rule dropped: recorded (t did not advance)."""
        self.telemetry.update(UpdateRecord.drop(push, self.store.version, self.rule.name))

    def pulled(self, parts: list[WirePart]) -> None:
        """A worker's pull reply, counted per parameter."""
        self.telemetry.count_pull(parts)

    # --------------------------------------------------------------------- the loop

    def timers(self, server: Any) -> Timers:
        """The jobs of each turn of `server`'s loop (timers.py), once it is built."""
        return Timers(self.inflow, self.checkpoints, server.membership, server.pulls,
                      self.rule, server.carry_out, server.after_leaving, server.group)  # fmt: skip

    def watched(self) -> list[Any]:
        """Sockets the loop also wakes for: the inflow guard's connection events, so that a
        flood of connections is cut as it arrives rather than at the next poll interval."""
        return self.inflow.watched()

    def wait(self, poll_interval: float) -> float:
        """How long the loop may wait for a request: shorter while a big message arrives."""
        return self.inflow.wait(poll_interval)

    def delivered(self, frames: list[Any], dropped: int, dropped_bytes: int) -> None:
        """A whole message read off a connection (the inflow guard's count); the memory
        freed by the frames past the limit, which `receive` read and let go, given back."""
        self.inflow.delivered(frames, dropped, dropped_bytes)
        if dropped:
            give_back_freed_memory()  # an attack leaves no peak behind

    def checkpoint(self) -> Path:
        """A checkpoint now (an operator's, or at shutdown): `no_checkpoint` without a path."""
        if self.options.checkpoint_path is None:
            raise ProtocolError("the server has no checkpoint path", "no_checkpoint")
        return self.checkpoints.save()

    def stats(self, stop: Stop) -> dict[str, Any]:
        """`stats`: counters, versions, staleness, workers; why it stops; a collapse; the
        run's data (a dashboard shows each worker's labels from it); a shard's group."""
        stats = self.telemetry.stats(self.store, self.registry, self.rule, stop.stopping)
        stats.update(stop_record(stop))
        stats["collapse"] = self.collapse.collapse and self.collapse.collapse.record()
        stats["data"] = {key: self.config[key] for key in DATA_KEYS if key in self.config}
        if self.group is not None:
            stats["group"] = self.group.group()
        return stats

    def close(self) -> None:
        self.inflow.close()
