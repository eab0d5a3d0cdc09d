"""ParameterServer: one process, one thread, one loop over a ZeroMQ ROUTER socket.

The loop receives a request, decodes it (minips.protocol.wire), calls its handler from the
`handlers` table, and sends the reply. No locks: requests are handled to completion in
arrival order, so the order of updates is deterministic given the order of messages.

The state the loop guards lives in objects that never send anything: the parameters and
their versions (server/store.py), the worker registry (server/registry.py) and the update rule
(minips.rules), which reads both and returns an `Outcome` that the loop carries out. A
rule that must wait (a barrier, a staleness bound) leaves a push or pull *held*: the loop
keeps its routing envelope and answers later. The path of one push:

    serve -> handle_push -> rule.on_push -> carry_out -> apply (store.apply) -> answer_push

docs/protocol.md is the normative description of the behaviour.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from minips.codecs import decode_gradients
from minips.errors import ConfigError
from minips.protocol import address, auth, wire
from minips.protocol.plan import Plan
from minips.protocol.wire import DEFAULT_LIMITS, Limits, Message, ProtocolError
from minips.rules import Outcome, Push, Rule, Update
from minips.server import guard
from minips.server.control import Control
from minips.server.inflow import InflowGuard, InflowLimits
from minips.server.pulls import PullEncoder
from minips.server.registry import HeldPull, WorkerRegistry, WorkerState
from minips.server.store import SGD, ParameterStore
from minips.server.telemetry import Counters, Telemetry, UpdateRecord

log = logging.getLogger("minips.server")

RECEIVE_HWM = 16  # whole requests queued per connection (docs/protocol.md 10)


@dataclass(frozen=True)
class ServerOptions:
    """How a server runs (not what it trains): address, cluster size, timers, checkpoints.

    bind: the address to listen on ("tcp://127.0.0.1:*" picks a free port). world_size:
    ranks 0..world_size-1 (None: no limit). heartbeat_timeout: seconds of silence before a
    worker is declared dead. checkpoint_path / checkpoint_every / checkpoint_interval: a
    checkpoint every N updates and every S seconds when the version moved (0: only at
    shutdown). resume: a checkpoint to start from (its update and sample counts too).
    max_samples: stop once pushes reported this many training samples in total (0: no
    limit). stop_grace: seconds a stopping server waits for clients to leave.
    poll_interval: seconds between looks at the clock when idle.
    """

    bind: str = "tcp://127.0.0.1:*"
    world_size: int | None = None
    heartbeat_timeout: float = 30.0  # > a client's reply timeout (10 s): docs/protocol.md 7
    checkpoint_path: str | Path | None = None
    checkpoint_every: int = 0
    checkpoint_interval: float = 0.0  # also checkpoint every this many seconds (0: never)
    resume: str | Path | None = None
    max_samples: int = 0
    limits: Limits = DEFAULT_LIMITS
    stop_grace: float = 5.0
    poll_interval: float = 0.05
    keys: auth.ServerKeys | None = None  # CURVE: the server's pair, allowed and operator keys
    clip_norm: float = 0.0  # clip each push's gradients to this global L2 norm (0: never)
    send_hwm: int = 32  # replies queued per connection before ZeroMQ drops (docs/protocol.md 10)

    def __post_init__(self) -> None:
        if self.world_size is not None and self.world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {self.world_size}")


@dataclass(eq=False)
class Envelope:
    """Where a reply goes: ROUTER routing frames (+ REQ delimiters) and the request id."""

    routing: list[Any]
    rid: int | None = None
    origin: guard.Origin = guard.Origin(b"")  # who sent it: routing id, CURVE key


def split_envelope(frames: list[Any]) -> tuple[Envelope, list[Any]]:
    """ROUTER prepends the peer's routing id; a REQ peer adds empty delimiter frame(s).

    (Only when a non-empty frame follows: a lone empty frame is a malformed header.)
    """
    split = 1
    while split < len(frames) - 1 and len(frames[split]) == 0:
        split += 1
    key = auth.sender_key(frames[0]) if isinstance(frames[0], zmq.Frame) else None
    origin = guard.Origin(bytes(frames[0]), key)
    return Envelope(routing=frames[:split], origin=origin), frames[split:]


def open_router(
    context: zmq.Context, options: ServerOptions
) -> tuple[zmq.Socket, auth.ThreadAuthenticator | None]:
    """The server's ROUTER socket, its memory bounded before anything is buffered, and
    (with keys) CURVE and the thread that checks every client's key."""
    socket = context.socket(zmq.ROUTER)
    limits = options.limits
    # ZeroMQ refuses (drops the connection on) a frame over the real frame limit before
    # buffering it, and queues at most send_hwm replies for a client that does not read.
    socket.setsockopt(zmq.MAXMSGSIZE, max(limits.max_frame_bytes, limits.max_header_bytes))
    socket.setsockopt(zmq.SNDHWM, options.send_hwm)
    # Whole requests not yet read: a client sending faster than the server reads is slowed
    # by TCP, not buffered (what is still arriving is bounded by minips/server/inflow.py).
    socket.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a worker's reconnection takes its id over
    socket.setsockopt(zmq.LINGER, 1000)  # let final replies leave on close
    gatekeeper = None
    if options.keys is not None:
        gatekeeper = auth.start_gatekeeper(context, options.keys)
        auth.make_curve_server(socket, options.keys)
    return socket, gatekeeper


class Outbox:
    """The server's sending side: replies on a request's envelope, their bytes counted."""

    def __init__(self, socket: zmq.Socket, counters: Counters) -> None:
        self.socket, self.counters = socket, counters

    def reply(
        self,
        envelope: Envelope,
        header: dict[str, Any],
        worker: WorkerState | None = None,
        parts: Sequence[wire.WirePart] = (),
    ) -> None:
        """Send a reply (with the request's rid) and count its bytes, also the worker's."""
        if envelope.rid is not None:
            header = {**header, "rid": envelope.rid}
        nbytes = self.send(envelope.routing, wire.encode_parts(header, parts))
        if worker is not None:
            worker.bytes_out += nbytes

    def error(self, envelope: Envelope, error: ProtocolError, body: list[Any]) -> None:
        """Answer a request that failed with `error` (its rid read from `body` if need be)."""
        self.counters.errors += 1
        log.debug("error reply (%s): %s", error.code, error.reason)
        rid = envelope.rid if envelope.rid is not None else wire.peek_rid(body)
        self.send(envelope.routing, wire.error_frames(error.reason, error.code, rid))

    def send(self, routing: list[Any], frames: list[Any]) -> int:
        """Send frames without copying; returns their bytes (the routing frames left out)."""
        self.socket.send_multipart([*routing, *frames], copy=False)
        nbytes = sum(len(f) if isinstance(f, bytes) else f.nbytes for f in frames)
        self.counters.bytes_out += nbytes
        return nbytes


class ParameterServer:
    """Holds the model, applies pushed gradients through a rule, answers pulls.

    params: name -> float32 array ("<layer>.<param>", model order), the dict `optimizer`
    was built on. options: ServerOptions. config (msgpack-able map): sent to every worker
    in `hello`, with `rank`, `world_size` and `rule` added. on_update(record: dict): called
    after every applied update and dropped push. `server.endpoint` is the bound address;
    `run()` serves until a `stop` request or `request_stop()`; then `close()`.
    `serve_forever()` does all of this with SIGINT/SIGTERM handlers, for the CLI.
    The worker table is `registry.by_id`.
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
    ) -> None:
        self.options = options = options or ServerOptions()
        self.config = hello_config(config)
        self.store = ParameterStore(params, optimizer)
        self.registry = WorkerRegistry(options.world_size, grace=options.heartbeat_timeout)
        self.rule = rule
        rule.attach(self.store, self.registry)
        self.telemetry = Telemetry(on_update)
        self.stopping = False  # replies carry `stop`; pushes are no longer applied
        self.finished_by_workers = False  # stopped because every rank finished its shard
        self.pulls: PullEncoder | None = None  # a plan's pulls (use_plan); None: all dense
        self.control = control = Control(self)
        if options.resume:
            control.resume(options.resume)
        self.handlers: dict[str, Callable[[Envelope, Message], None]] = {
            "push": self.handle_push, "pull": self.handle_pull,  # below: gradients -> updates
            # minips/server/control.py: membership and operator requests
            "hello": control.hello, "ping": control.ping, "stats": control.stats_request,
            "bye": control.bye, "stop": control.stop, "checkpoint": control.checkpoint,
        }  # fmt: skip
        self._context = zmq.Context()
        self.socket, self._gatekeeper = open_router(self._context, options)
        # messages still arriving: bounded per connection (minips/server/inflow.py)
        self.inflow = InflowGuard(self.socket, InflowLimits.for_limits(options.limits))
        self.outbox = Outbox(self.socket, self.telemetry.counters)
        self.endpoint: str = address.bind(self.socket, address.normalize_bind(options.bind))
        if options.keys is None and not address.is_loopback(self.endpoint):
            log.warning("UNAUTHENTICATED: anyone who can reach %s can train, read and stop "
                        "this server (give it keys: minips keys)", self.endpoint)  # fmt: skip
        log.info("serving %d parameters on %s, rule %s", len(params), self.endpoint, rule.name)

    # ---------------------------------------------------------------------------- the loop

    def run(self) -> None:
        """Serve until a `stop` (request or `request_stop()`) has drained; then checkpoint."""
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self.control.finished():
            if self.control.stop_requested and not self.stopping:
                self.control.begin_stop()
            if poller.poll(self.inflow.wait(self.options.poll_interval) * 1000):
                for _ in range(256):  # drain a burst, then look at the clock again
                    try:
                        frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self.inflow.delivered(frames)
                    self.serve(frames)
            self.on_tick(time.monotonic())
        if self.options.checkpoint_path:
            self.control.save_checkpoint()
        log.info("stopped at version %d", self.store.version)

    def serve(self, frames: list[Any]) -> None:
        """One request: decode, dispatch to its handler, or answer with an error."""
        envelope, body = split_envelope(frames)
        counters = self.telemetry.counters
        counters.messages_in += 1
        counters.bytes_in += sum(len(frame) for frame in body)
        try:
            request = wire.decode_request(body, self.options.limits)
            envelope.rid = request.header.get("rid")
            self.handlers[request.op](envelope, request)
        except ProtocolError as exc:
            self.outbox.error(envelope, exc, body)
        except Exception as exc:  # a bug: say so, keep serving
            log.exception("internal error handling a request")
            error = ProtocolError(f"internal server error: {type(exc).__name__}", "internal")
            self.outbox.error(envelope, error, body)

    def on_tick(self, now: float) -> None:
        """Timers: dead workers, the end of the assembly, the rule's own timers, checkpoints;
        connections holding too much of a message still arriving (minips/server/inflow.py)."""
        self.inflow.check(now)
        self.control.checkpoint_if_due(now)
        self.control.check_liveness(now)
        if self.registry.assembling:
            self.registry.update_assembly(now)
            self.release_pulls()
        self.carry_out(self.rule.on_tick(now))

    def serve_forever(self) -> None:
        """`run()` with SIGINT/SIGTERM handlers (a second signal cuts the grace), then close."""
        self.control.serve_forever()

    def request_stop(self) -> None:
        """Ask the loop to stop (safe from a signal handler or another thread)."""
        self.control.stop_requested = True

    def close(self) -> None:
        """Close the socket and the ZeroMQ context."""
        self.inflow.close()
        self.socket.close()
        if self._gatekeeper is not None:
            self._gatekeeper.stop()
        self._context.term()

    # ---------------------------------------------------------------------------- handlers

    def handle_push(self, envelope: Envelope, request: Message) -> None:
        """Accept a push once (a retry is answered from memory), then let the rule decide."""
        worker, header = self.registry.sender(request, envelope.origin), request.header
        if worker.observer:
            raise ProtocolError("an observer cannot push", "observer")
        seq, base = header["seq"], header["base"]
        if worker.seen_push(seq) != "new":
            self.control.answer_retry(worker, envelope, header)
            return
        grads, extras = dense_gradients(request) or decode_gradients(request)
        self.store.check_push(base, grads)
        grads = guard.clip_gradients(grads, self.options.clip_norm)
        guard.check_stays_finite(self.store, grads, request.sq_norms)  # pre-clip: an upper bound
        push = Push(worker, seq, base, header.get("last", True), grads, extras,
                    staleness=self.store.version - base, reply_to=envelope,
                    fused="pull_since" in header, pull_since=header.get("pull_since"),
                    sq_norms=request.sq_norms)  # fmt: skip
        self.rule.check_push(push)
        # Accepted: from here on the push is answered exactly once, whatever happens.
        worker.accept(push)
        self.telemetry.count_push(push, request)
        if self.stopping:
            self.answer_push(push, applied=False)
            return
        worker.samples += header.get("samples", 0)  # counted only when it can still apply
        self.telemetry.counters.samples += header.get("samples", 0)
        worker.clock += push.last
        if push.last and worker.partial_step is None:  # a step in one push (the default)
            self.carry_out(self.rule.on_push(push))
        elif (step := worker.assemble_step(push, self.store.version)) is not None:
            self.carry_out(self.rule.on_push(step))  # a step sent layer by layer, now whole
        else:  # a layer of a step sent in several pushes: kept for its last one
            self.answer_push(push, applied=False)
        self.control.stop_if_budget_spent()

    def handle_pull(self, envelope: Envelope, request: Message) -> None:
        worker = self.registry.sender(request, envelope.origin)
        self.hold_pull(worker, HeldPull(envelope, request.header.get("since")))

    def hold_pull(self, worker: WorkerState, pull: HeldPull) -> None:
        """Answer a pull now if the rule allows it (an observer's always), else hold it."""
        worker.held_pull = pull
        if worker.observer or self.stopping:
            self.answer_pull(worker)
        elif not self.registry.assembling and self.rule.may_answer_pull(worker):
            self.answer_pull(worker)

    # --------------------------------------------------------------- carrying out a rule

    def carry_out(self, outcome: Outcome) -> None:
        """Apply the rule's updates, record its drops, send its answers; then pulls."""
        for update in outcome.updates:
            self.apply(update)
        for push in outcome.drops:
            self.telemetry.update(UpdateRecord.drop(push, self.store.version, self.rule.name))
            push.worker.dropped += 1
            self.answer_push(push, applied=False)
        for push, applied in outcome.answers:
            self.answer_push(push, applied)
        if outcome.updates or outcome.answers or outcome.drops:
            self.release_pulls()

    def apply(self, update: Update) -> None:
        """One update: t += 1, every step through the optimizer; telemetry, checkpoints."""
        for push in update.pushes:
            push.staleness = self.store.version - push.base  # tau, t just before the update
        version = self.store.apply(update.steps, update.known_sq_norms())
        self.rule.after_update(update)
        self.telemetry.update(UpdateRecord.applied(update, version, self.rule.name))
        self.control.checkpoint_every_n(version)

    def answer_push(self, push: Push, applied: bool) -> None:
        """Send (and remember, for retries) the reply to an accepted push."""
        version = self.store.version
        staleness = push.staleness if applied else version - push.base
        header = {"op": "push", "version": version, "seq": push.seq, "applied": applied,
                  "staleness": staleness, "stop": self.stopping}  # fmt: skip
        push.worker.remember_answer(push.seq, header)
        if push.fused:  # the parameters go with the answer, when the rule lets them
            self.hold_pull(push.worker, HeldPull(push.reply_to, push.pull_since, header))
        else:
            self.outbox.reply(push.reply_to, header, worker=push.worker)

    # ------------------------------------------------------------------------------ pulls

    def release_pulls(self) -> None:
        """Answer every held pull the rule now allows (all of them when stopping).

        While the cluster is still assembling every worker's pull is held, whatever the
        rule: a run starts when its workers are there, so the first one does not train alone.
        """
        if not self.stopping and self.registry.assembling:
            return
        for worker in self.registry.live():
            if worker.held_pull and (self.stopping or self.rule.may_answer_pull(worker)):
                self.answer_pull(worker)

    def answer_pull(self, worker: WorkerState) -> None:
        """Send the parameters changed since the puller's `since`: the current ones, a
        rule's own values (DANA's look-ahead), or encoded by a plan (minips.server.pulls)."""
        held, worker.held_pull = worker.held_pull, None
        worker.pulls += 1
        if self.pulls is not None:
            parts = self.pulls.parts(worker, held.since)
        else:
            names = self.store.changed_since(held.since)
            values = None if worker.observer else self.rule.pull_values(worker, names)
            if values is None:  # every rule but DANA: the parameters, as they are
                values = {name: self.store.snapshot(name) for name in names}
            parts = [wire.WirePart(name, array) for name, array in values.items()]
        # A fused push + pull: the push's answer, then the pull reply's fields (one reply).
        header = {**(held.push_reply or {"op": "pull"}), "version": self.store.version,
                  "param_versions": self.store.param_versions, "stop": self.stopping}  # fmt: skip
        self.outbox.reply(held.reply_to, header, worker=worker, parts=parts)
        if not worker.observer:
            self.telemetry.count_pull(parts)
            self.rule.on_pulled(worker)

    def use_plan(self, plan: Plan) -> None:
        """Send pulls by `plan` (fp16, delta, priority order; minips.server.pulls) from now on."""
        encoder = PullEncoder(self.store, plan)
        self.pulls = None if encoder.plain else encoder

    def stats(self) -> dict[str, Any]:
        """The `stats` reply: counters, versions, staleness and the worker table."""
        return self.control.stats()


def hello_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of the config sent in `hello`; ConfigError unless msgpack can send it."""
    config = dict(config or {})
    try:
        msgpack.packb(config)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"server config must be msgpack-serialisable: {exc}") from None
    return config


def dense_gradients(request: Message) -> tuple[dict[str, np.ndarray], dict] | None:
    """A push's gradients when it holds only dense float32 gradients (the default, no
    extras): the received arrays themselves. None: minips.codecs decodes it."""
    arrays = request.arrays
    if len(arrays) != len(request.codecs) or any(
        request.codecs[name] != "dense" or array.dtype != np.float32 or name.startswith("extra/")
        for name, array in arrays.items()
    ):
        return None
    return dict(arrays), {}
