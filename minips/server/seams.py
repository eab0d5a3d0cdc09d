"""The named points where the operations attach to the server's path, and the group's role.

The server's path reads as the idea (decode, tau = t - base, the rule's decision, the
update, the reply); what it checks, limits, survives and records beside that idea it asks
of an `Operations` object at one named point each, in the spirit of ps-lite's
`if (resender_) ...`. The server never builds the real ones, nor imports them: whoever
builds a server hands it a factory, minips/run/build.py the usual one (ops/server_ops.py's
`ServerOps`: the checks, the overflow check, the inflow guard, failures, collapse,
telemetry, checkpoints, the timers, the sample budget), and a test may hand it others.

    bind(socket, address)        the socket bound to `address` (checked first, a bind error
                                 explained in one line); the endpoint, with a warning when
                                 it is reachable from outside without keys
    received(body, dropped)      a request counted; frames past the limit refused
    decode_request(body)         the request decoded once every check of its frames and
                                 fields passed (minips/guard/wire_checks.py), else refused
    check_hello(header, origin)  before a hello registers anyone: its connection is the
                                 client's own, its `info` small and shallow
    answering(envelope, body)    around a request: a refusal answered with its code, a
                                 failure (a bug) answered `internal`, nobody left waiting
    answer_retry(worker, envelope, header)
                                 a push whose `seq` is not new: answered from memory as
                                 its first attempt was (or will be), never applied again
    check_push(push, request)    before a push is accepted: its base and shapes against the
                                 model, clipping, the overflow check, the rule's own check
    accepted(push, request)      a push accepted: counted, its loss watched, the sample budget
    carrying_out(outcome)        around a rule's decision: a failure half done answers its
                                 pushes still held `internal`
    refuse_update(update)        an update that would write a non-finite value is not
                                 written (True): its pushes are answered `nonfinite`
    updated(update, version)     an update written: its norm bounds carried, recorded, a
                                 checkpoint when one is due
    dropped(push)                a push the rule dropped, recorded
    pulled(parts)                a worker's pull reply, counted
    timers(server)               the jobs of every turn of the loop (liveness, the inflow
                                 guard, the timed checkpoint, the assembly's end, the
                                 rule's own timers), each contained: a `Turn`
    handlers(server)             the requests beside training, added to the server's
                                 `handlers`: `stats`; an operator's `stop` and
                                 `checkpoint`; `join` (refused unless in a group)
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from minips.protocol.wire import Message, WirePart
    from minips.rules import Outcome, Update
    from minips.server.router import Counting, Envelope
    from minips.state.registry import Push, WorkerState
    from minips.state.requests import Origin


class Turn(Protocol):
    """What the loop does on each turn besides answering requests (ops/timers.py)."""

    def tick(self, now: float) -> None: ...


class Operations(Protocol):
    """What the server asks of its operations (module docstring). `attach(server)` is called
    once the server's socket, outbox and pulls exist, before the socket binds (its caps are
    the operations'); `counters` before (the outbox's)."""

    counters: Counting

    def attach(self, server: Any) -> None: ...
    def bind(self, socket: Any, address: str) -> str: ...
    def received(self, body: list[Any], dropped: int) -> None: ...
    def decode_request(self, body: list[Any]) -> Message: ...
    def answering(self, envelope: Envelope, body: list[Any]) -> AbstractContextManager[None]: ...
    def check_hello(self, header: dict[str, Any], origin: Origin) -> None: ...
    def answer_retry(
        self, worker: WorkerState, envelope: Envelope, header: dict[str, Any]
    ) -> None: ...
    def check_push(self, push: Push, request: Message) -> None: ...
    def accepted(self, push: Push, request: Message) -> None: ...
    def carrying_out(self, outcome: Outcome) -> AbstractContextManager[None]: ...
    def refuse_update(self, update: Update) -> bool: ...
    def updated(self, update: Update, version: int) -> None: ...
    def dropped(self, push: Push) -> None: ...
    def pulled(self, parts: list[WirePart]) -> None: ...
    def timers(self, server: Any) -> Turn: ...
    def handlers(self, server: Any) -> dict[str, Callable[[Envelope, Message], Outcome | None]]: ...
    def watched(self) -> list[Any]: ...
    def wait(self, poll_interval: float) -> float: ...
    def delivered(self, frames: list[Any], dropped: int, dropped_bytes: int) -> None: ...
    def checkpoint(self) -> Any: ...
    def stats(self, stop: Any) -> dict[str, Any]: ...
    def close(self) -> None: ...


class GroupRole(Protocol):
    """What a shard of a server group adds to a server (minips/group/shard.py builds it):
    its slices of the model, `group` in its replies, a root's joins, a shard's own joins."""

    shard: int
    servers: int
    slices: dict[str, Any]  # name -> its slice; .sampler(rho, min_samples): VSGD's (16.6)
    is_root: bool

    def attach(self, server: Any) -> None: ...
    def bind(self, socket: Any, address: str) -> str: ...
    def group(self) -> dict[str, Any]: ...
    def check_hello(self) -> None: ...
    def tick(self, now: float) -> None: ...
    def close(self) -> None: ...
