"""ParameterServer: one process, one thread, one loop over a ZeroMQ ROUTER socket.

The loop receives a request, decodes it (minips.protocol.wire), calls its handler from the
`handlers` table, and sends the reply. No locks: requests are handled to completion in
arrival order, so the order of updates is deterministic given the order of messages.

The state the loop guards lives in objects that never send anything: the parameters and
their versions (state/store.py), the worker registry (state/registry.py) and the update rule
(minips.rules), which reads both and returns an `Outcome` that the loop carries out. A
rule that must wait (a barrier, a staleness bound) leaves a push or pull *held*: the loop
keeps its routing envelope and answers later. Who joins and leaves is server/membership.py;
a retried push (ops/retries.py) and the jobs of every turn (ops/timers.py) are the
operations'; they hand what the rule decided back to the loop. The path of one push:

    serve -> handle_push -> rule.on_push -> carry_out (store.write) -> answer_push

What it checks, limits, survives and records beside that path (the overflow check, the
inflow guard, failures, collapse, telemetry, checkpoints, the sample budget) the path asks
of its operations at one named point each (`self.ops`: server/seams.py), assembled outside
the core (ops/server_ops.py). A bug (in a handler, the rule, a timer) is logged, the
request and pushes it leaves waiting are answered `internal`, and the loop goes on.

docs/protocol.md is the normative description of the behaviour.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from minips.protocol.wire import Message
from minips.rules import Outcome, Rule
from minips.server.membership import Membership
from minips.server.options import ServerOptions, hello_config
from minips.server.pulls import Pulls
from minips.server.router import (
    Envelope,
    Outbox,
    open_router,
    receive,
    split_envelope,
)
from minips.server.seams import GroupRole, Operations
from minips.server.stop import Stop
from minips.state.registry import Push, WorkerRegistry, WorkerState
from minips.state.requests import HeldPull
from minips.state.store import SGD, ParameterStore
from minips.transmission.codecs import decode_gradients
from minips.transmission.plan import Plan

__all__ = ["ParameterServer", "ServerOptions"]

log = logging.getLogger("minips.server")


class ParameterServer:
    """Holds the model, applies pushed gradients through a rule, answers pulls.

    params: name -> float32 array ("<layer>.<param>", model order), the dict `optimizer` was
    built on. options: ServerOptions. config (msgpack-able map): sent to every worker in
    `hello`, with `rank`, `world_size` and `rule` added. on_update(record: dict): called after
    every applied update and dropped push. group: a shard's role in a server group.
    operations(store, registry, rule, options, config, on_update, group): builds what the
    path asks at its named points (minips/server/seams.py), given by whoever builds the
    server (the core names none): the usual ones are `ServerOps` (minips/ops/server_ops.py),
    as minips/run/build.py gives them. `endpoint` is the bound address; `run()` serves
    until `stop` or `request_stop()`, then `close()`.
    """

    def __init__(
        self,
        params: dict[str, np.ndarray],
        rule: Rule,
        optimizer: SGD,
        options: ServerOptions | None = None,
        *,
        config: dict[str, Any] | None = None,
        on_update: Callable[[dict[str, Any]], None] | None = None,
        group: GroupRole | None = None,
        operations: Callable[..., Operations],
    ) -> None:
        self.options = options = options or ServerOptions()
        config = hello_config(config)
        self.store = ParameterStore(params, optimizer, slices=group.slices if group else None)
        self.registry = WorkerRegistry(options.world_size, grace=options.heartbeat_timeout)
        self.rule = rule
        rule.attach(self.store, self.registry)
        self.ops = ops = operations(self.store, self.registry, rule, options, config,
                                    on_update, group)  # fmt: skip
        self.stop = stop = Stop()  # requested by anyone; begun by begin_stop alone
        self._context = zmq.Context()
        self.socket, self._gatekeeper = open_router(self._context, options.keys)
        self.outbox = outbox = Outbox(self.socket, ops.counters)
        # routing id, a REQ delimiter, the header, the array frames, and one to see more
        self._keep_frames = 3 + options.limits.max_arrays + 1
        self.pulls = Pulls(self.store, self.registry, rule, outbox, ops, stop)
        self.membership = members = Membership(self.registry, self.store, rule, outbox, config,
            options.heartbeat_timeout, stop, ops, options.observers_awaited)  # fmt: skip
        # op -> handler(envelope, request) -> the rule's decision on a worker who left, or None
        self.handlers: dict[str, Callable[[Envelope, Message], Outcome | None]] = {
            "push": self.handle_push, "pull": self.handle_pull,  # gradients -> updates
            "hello": members.hello, "ping": members.ping, "bye": members.bye,  # membership.py
        }  # fmt: skip
        ops.attach(self)  # the socket's caps (before it binds), the inflow guard, failures
        self.handlers.update(ops.handlers(self))  # stats; an operator's stop, checkpoint; join
        try:
            self.endpoint: str = ops.bind(self.socket, options.bind)  # checked, explained, bound
        except BaseException:
            self._close_sockets()  # no server: nothing left open for a later gc to hang on
            raise
        self.group = members.group = group  # a shard of a server group (group/shard.py)
        if group is not None:
            group.attach(self)
        self.timers = ops.timers(self)  # each turn's jobs: liveness, checkpoints, the rule's
        authenticated = ", authenticated (CURVE keys)" if options.keys is not None else ""
        log.info("serving %d parameters on %s, rule %s%s", len(params), self.endpoint, rule.name,
                 authenticated)  # fmt: skip

    # ---------------------------------------------------------------------------- the loop

    def run(self) -> None:
        """Serve until a `stop` (request or `request_stop()`) has drained; then checkpoint."""
        poller = self.poller()
        while not self.finished():
            if self.stop.due():
                self.begin_stop()
            if poller.poll(self.ops.wait(self.options.poll_interval) * 1000):
                for _ in range(256):  # drain a burst, then look at the clock again
                    try:
                        received = receive(self.socket, keep=self._keep_frames)
                    except zmq.Again:
                        break
                    self.ops.delivered(received.frames, received.dropped, received.dropped_bytes)
                    self.serve(received.frames, received.dropped)
            self.timers.tick(time.monotonic())  # the operations' timers (ops/timers.py)
        if self.options.checkpoint_path:
            self.ops.checkpoint()
        log.info("stopped at version %d", self.store.version)

    def poller(self) -> zmq.Poller:
        """What the loop waits on between turns: the clients' socket, and what the operations
        watch beside it (`ops.watched`)."""
        poller = zmq.Poller()
        for socket in (self.socket, *self.ops.watched()):
            poller.register(socket, zmq.POLLIN)
        return poller

    def serve(self, frames: list[Any], dropped: int = 0) -> None:
        """One request: decode, dispatch to its handler; a refusal or a failure is answered
        where the operations say (`answering`). dropped: frames past the most a request
        may have, which `receive` let go."""
        envelope, body = split_envelope(frames)
        with self.ops.answering(envelope, body):  # one reply: its error, or `internal`
            self.ops.received(body, dropped)  # counted; frames past the limit refused
            request = self.ops.decode_request(body)  # decoded, every check passed
            envelope.rid = request.header.get("rid")
            if (left := self.handlers[request.op](envelope, request)) is not None:
                self.after_leaving(left)
        if self.stop.due():  # asked for by this request: the next one sees it begun
            self.begin_stop()

    def request_stop(self) -> None:
        """Ask the loop to stop (safe from a signal handler or another thread)."""
        self.stop.request("asked to")

    def begin_stop(self) -> None:
        """Stop: answer everything held, flag every later reply, refuse new hellos."""
        self.stop.begin(deadline=time.monotonic() + self.options.stop_grace)
        log.info("stopping (%s): answering held requests, waiting for workers to leave",
                 self.stop.why)  # fmt: skip
        self.carry_out(self.rule.on_stop())
        self.pulls.release()

    def finished(self) -> bool:
        """True once a stopping server's clients have left, or its grace ran out. Observers
        are waited for too, so an evaluator sees the final parameters."""
        connected = self.registry.live() or self.registry.observers()
        return self.stop.stopping and (not connected or time.monotonic() > self.stop.deadline)

    @property
    def stopping(self) -> bool:
        """The server is stopping: replies carry `stop`, pushes are no longer applied."""
        return self.stop.stopping

    def close(self) -> None:
        """Close the sockets (a shard's to its root too) and the ZeroMQ context."""
        if self.group is not None:
            self.group.close()
        self._close_sockets()

    def _close_sockets(self) -> None:
        self.ops.close()
        self.socket.close()
        if self._gatekeeper is not None:
            self._gatekeeper.stop()
        self._context.term()

    # ---------------------------------------------------------------------------- handlers

    def handle_push(self, envelope: Envelope, request: Message) -> None:
        """Accept a push once (a retry is answered from memory), then let the rule decide."""
        worker = self.registry.pusher(request, envelope.origin)  # its owner, never an observer
        if worker.seen_push(request.header["seq"]) != "new":  # exactly once: from memory
            return self.ops.answer_retry(worker, envelope, request.header)
        push = push_of(worker, request, envelope, self.store.version)  # tau = t - base
        self.ops.check_push(push, request)  # base, shapes, clipping, overflow, the rule's
        worker.accept(push)  # accepted: from here on answered exactly once, whatever happens
        self.ops.accepted(push, request)  # counted; its loss watched; the sample budget
        if self.stopping:
            return self.answer_push(push, applied=False)
        worker.count_step(push, request.header.get("samples", 0))
        if (step := worker.assemble_step(push, self.store.version)) is not None:
            self.carry_out(self.rule.on_push(step))  # the rule's decision, carried out
        else:  # a layer of a step sent in several pushes: kept for its last one
            self.answer_push(push, applied=False)

    def handle_pull(self, envelope: Envelope, request: Message) -> None:
        worker = self.registry.sender(request, envelope.origin)
        self.pulls.hold(worker, HeldPull(envelope, request.header.get("since")))

    # --------------------------------------------------------------- carrying out a rule

    def carry_out(self, outcome: Outcome) -> None:
        """Apply the rule's updates (t += 1 each), record its drops, send its answers; then
        the pulls the rule now allows. A failure answers its pushes still held `internal`."""
        refused: set[Push] = set()  # an update's pushes it would overflow: answered so
        with self.ops.carrying_out(outcome):  # nobody left waiting by a bug
            for update in outcome.updates:
                if self.ops.refuse_update(update):  # it would write a non-finite value
                    refused.update(update.pushes)
                    continue
                for push in update.pushes:
                    push.staleness = self.store.version - push.base  # tau, t just before it
                version = self.store.write(update.steps)
                self.rule.after_update(update)
                self.ops.updated(update, version)  # recorded; a checkpoint when due
            for push in outcome.drops:
                self.drop(push)
            for push, applied in outcome.answers:
                if push not in refused:
                    self.answer_push(push, applied)
            if outcome.updates or outcome.answers or outcome.drops:
                self.pulls.release()

    def drop(self, push: Push) -> None:
        """A push the rule dropped (DASGD's cutoff): recorded, counted, answered unapplied."""
        self.ops.dropped(push)
        push.worker.dropped += 1
        self.answer_push(push, applied=False)

    def after_leaving(self, outcome: Outcome) -> None:
        """Carry out the rule's decision on a worker who left (or a hello that completed
        the cluster); answer the pulls that frees."""
        self.carry_out(outcome)
        self.pulls.release()

    def answer_push(self, push: Push, applied: bool) -> None:
        """Send (and remember, for retries) the reply to an accepted push; a fused push's
        waits for its pull half."""
        version = self.store.version
        header = {"op": "push", "version": version, "seq": push.seq, "applied": applied,
                  "staleness": push.staleness if applied else version - push.base,
                  "stop": self.stopping}  # fmt: skip
        push.worker.remember_answer(push.seq, header)
        if push.fused:  # the parameters go with the answer, when the rule lets them
            self.pulls.hold(push.worker, HeldPull(push.reply_to, push.pull_since, header))
        else:
            self.outbox.reply(push.reply_to, header, worker=push.worker)

    def use_plan(self, plan: Plan) -> None:
        """Serve by `plan` from now on: pulls by its encodings (minips.server.pulls), without
        momentum the parameters pushed with momentum correction (docs/protocol.md 13.9)."""
        self.store.optimizer.plain_for(plan.worker_momentum())
        self.pulls.use_plan(plan)

    def stats(self) -> dict[str, Any]:
        """`stats`: counters, versions, staleness, workers, a collapse; a shard's group (what
        its operations measured and say)."""
        return self.ops.stats(self.stop)


def push_of(worker: WorkerState, request: Message, envelope: Envelope, version: int) -> Push:
    """The push a request carries, its gradients decoded by their codecs; its staleness
    tau = t - base at arrival (refreshed when it goes into an update)."""
    header, base = request.header, request.header["base"]
    grads, extras = decode_gradients(request)
    return Push(worker, header["seq"], base, header.get("last", True), grads, extras,
                staleness=version - base, reply_to=envelope, fused="pull_since" in header,
                pull_since=header.get("pull_since"), codecs=request.codecs)  # fmt: skip
