"""What the server does when it fails (a bug): nobody is left waiting, and it keeps serving.

A failure is anything a handler, a rule or a timer raises that is not a refusal the
protocol names (those are ProtocolErrors, answered with their own code: `answer_error`
sends every error reply, counted, one per request at most). The request it happened in
is answered `internal`; so is every push the failed step was deciding on and that is
still held, whoever sent it: an ssgd round's other pushes wait for that round, which
will not come. Each failed push is remembered with its error, so a retry of its
`seq` gets the same error and is never applied (docs/protocol.md 8, 9).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain
from typing import TYPE_CHECKING, Any

from minips.guard import wire_checks
from minips.protocol import wire
from minips.protocol.wire import ProtocolError

if TYPE_CHECKING:
    from minips.rules import Outcome
    from minips.server.router import Envelope, Outbox
    from minips.state.registry import Push, WorkerRegistry

log = logging.getLogger("minips.server")


def answer_error(outbox: Outbox, envelope: Envelope, error: ProtocolError, body: list[Any]) -> None:
    """Answer a request that failed with `error` through `outbox` (its rid read from `body`
    if need be), counted; nothing when it was answered already (a failure after its reply:
    logged, no second)."""
    if envelope.answered:
        return
    envelope.answered = True
    outbox.counters.errors += 1
    log.debug("error reply (%s): %s", error.code, error.reason)
    rid = envelope.rid if envelope.rid is not None else wire_checks.peek_rid(body)
    outbox.send(envelope.routing, wire.error_frames(error.reason, error.code, rid))


def internal(exc: BaseException) -> ProtocolError:
    """The `internal` error a client receives for a failure `exc` (its type, no details:
    the traceback is in the server's log)."""
    return ProtocolError(f"internal server error: {type(exc).__name__}", "internal")


class Failures:
    """Answers what a failure leaves held (module docstring), through `outbox`."""

    def __init__(self, registry: WorkerRegistry, outbox: Outbox) -> None:
        self.registry, self.outbox = registry, outbox

    def request_failed(self, envelope: Envelope, exc: Exception, body: list[Any]) -> None:
        """Handling the request at `envelope` failed with `exc`: logged with its traceback,
        what is held for the request dropped (`fail_held`), the request answered `internal`
        (unless it was answered before the failure: a request gets one reply)."""
        log.exception("internal error handling a request")
        error = internal(exc)
        self.fail_held(envelope, error)
        answer_error(self.outbox, envelope, error, body)

    def fail_held(self, reply_to: Envelope, error: ProtocolError) -> None:
        """What is held for the request whose reply goes to `reply_to`, once handling it
        failed with `error`: its push is answered `error`, remembered so a retry gets it
        again and is never applied; its pull half is dropped, the request had its one
        reply. Nothing stays held for it."""
        failure = _failure(error)
        for worker in self.registry.by_id.values():
            for push in [p for p in worker.held_pushes.values() if p.reply_to is reply_to]:
                worker.remember_answer(push.seq, failure)
            if worker.held_pull is not None and worker.held_pull.reply_to is reply_to:
                worker.held_pull = None

    @contextmanager
    def answering(self, outcome: Outcome) -> Iterator[None]:
        """Carry out a rule's `outcome` in this block; should it fail (an update may be
        written already), each of its pushes still held is answered `internal` now and
        remembered so, and the failure goes on up, to be logged where it is caught."""
        try:
            yield
        except Exception as exc:  # the round's other pushes would wait for ever
            error = internal(exc)
            for push in self.fail_pushes(_pushes_of(outcome), error):
                answer_error(self.outbox, push.reply_to, error, [])
            raise

    def fail_pushes(self, pushes: list[Push], error: ProtocolError) -> list[Push]:
        """Of `pushes`, the ones still held, each remembered as answered with `error` (a
        retry gets it again); returned, for their reply to be sent."""
        failure, failed = _failure(error), []
        for push in pushes:
            if push.worker.held_pushes.get(push.seq) is push:
                push.worker.remember_answer(push.seq, failure)
                failed.append(push)
        return failed


def _failure(error: ProtocolError) -> dict[str, Any]:
    """A failed push's remembered reply (`WorkerState.seen_push` tells it by its op)."""
    return {"op": "error", "reason": error.reason, "code": error.code}


def _pushes_of(outcome: Outcome) -> list[Push]:
    """Every push an outcome decides on: its updates', its drops and its answers."""
    applied = chain.from_iterable(update.pushes for update in outcome.updates)
    return [*applied, *outcome.drops, *(push for push, _ in outcome.answers)]
