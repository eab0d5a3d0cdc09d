"""ParameterServer: one process, one thread, one poll loop over a ZeroMQ ROUTER socket.

No locks: every request is handled to completion in arrival order, so the order of updates
is deterministic given the order of messages. A rule that must wait (a barrier, a
staleness bound) does not block: it *holds* the reply (keeps the routing envelope) and the
server sends it later. docs/protocol.md is the normative description of the behaviour.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from minips import wire
from minips.errors import ConfigError
from minips.optim import SGD
from minips.rules import Push, Rule
from minips.store import ParameterStore, UpdateRecord
from minips.wire import DEFAULT_LIMITS, Limits, Message, ProtocolError
from minips.workers import Counters, Envelope, WorkerState, WorkerTable

log = logging.getLogger("minips.server")


@dataclass(frozen=True)
class ServerOptions:
    """How a server runs (not what it trains): address, cluster size, timers, checkpoints.

    bind: the address to listen on ("tcp://127.0.0.1:*" picks a free port). world_size:
    ranks 0..world_size-1 (None: no limit). heartbeat_timeout: seconds of silence before a
    worker is declared dead. checkpoint_path / checkpoint_every: a checkpoint every N
    updates (0: only at shutdown). resume: a checkpoint to start from. max_samples: stop
    once pushes reported this many training samples in total (0: no limit). stop_grace:
    seconds a stopping server waits for clients to leave. poll_interval: seconds between
    looks at the clock when idle.
    """

    bind: str = "tcp://127.0.0.1:*"
    world_size: int | None = None
    heartbeat_timeout: float = 10.0
    checkpoint_path: str | Path | None = None
    checkpoint_every: int = 0
    resume: str | Path | None = None
    max_samples: int = 0
    limits: Limits = DEFAULT_LIMITS
    stop_grace: float = 5.0
    poll_interval: float = 0.05


class ParameterServer:
    """Holds the model, applies pushed gradients through a rule, answers pulls.

    params: name -> float32 array ("<layer>.<param>", model order), the dict `optimizer`
    was built on. `config` (msgpack-able map) is sent to every worker in `hello`, with
    `rank`, `world_size` and `rule` added. `world_size`: ranks 0..world_size-1 (None: no
    limit). `on_update(record: dict)` is called after every applied update. Checkpoints go
    to `checkpoint_path` every `checkpoint_every` updates (0: never) and at shutdown;
    `resume` restores one before serving. `max_samples` (0: no limit) stops the server once
    pushes have reported that many training samples in total.

    Use: `server = ParameterServer(...)`; `server.endpoint` is the bound address (ask for
    port 0 with "tcp://127.0.0.1:*"); `server.run()` serves until stopped (a `stop`
    request or `request_stop()`); `server.close()`. `serve_forever()` does all of this with
    SIGINT/SIGTERM handlers, for the CLI.
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
        options = options or ServerOptions()
        bind, world_size = options.bind, options.world_size
        heartbeat_timeout, limits = options.heartbeat_timeout, options.limits
        checkpoint_path, checkpoint_every = options.checkpoint_path, options.checkpoint_every
        resume, stop_grace = options.resume, options.stop_grace
        poll_interval, max_samples = options.poll_interval, options.max_samples
        self.store = ParameterStore(params, optimizer)
        self.rule = rule
        self.config = dict(config or {})
        try:
            msgpack.packb(self.config)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"server config must be msgpack-serialisable: {exc}") from None
        if world_size is not None and world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {world_size}")
        self.table = WorkerTable(world_size)
        self.heartbeat_timeout = heartbeat_timeout
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        self.checkpoint_every = checkpoint_every
        self.limits = limits
        self.on_update = on_update
        self.stop_grace = stop_grace
        self.poll_interval = poll_interval
        self.max_samples = max_samples  # stop once pushes reported this many (0: never)
        self.stopping = False
        self._stop_requested = False
        self._stop_deadline = 0.0
        self._counters = Counters()
        if resume:
            meta = self.store.load(resume)
            log.info("resumed from %s at version %d (%s)", resume, self.store.version, meta)
        rule.attach(self)

        self._context = zmq.Context()
        self.socket = self._context.socket(zmq.ROUTER)
        # ZeroMQ's own fence sits above the decoder's limits, so a merely oversized frame
        # still gets an error reply instead of a silent disconnect.
        transport_limit = 2 * max(limits.max_frame_bytes, limits.max_header_bytes)
        self.socket.setsockopt(zmq.MAXMSGSIZE, transport_limit)
        self.socket.setsockopt(zmq.LINGER, 1000)  # let final replies leave on close
        self.socket.bind(bind)
        self.endpoint: str = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("serving %d parameters on %s, rule %s", len(params), self.endpoint, rule.name)

    # ---------------------------------------------------------------------------- the loop

    def run(self) -> None:
        """Serve until a `stop` (request or `request_stop()`) has drained; then checkpoint."""
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while True:
            if self._stop_requested and not self.stopping:
                self._begin_stop()
            if poller.poll(self.poll_interval * 1000):
                for _ in range(256):  # drain a burst, then look at the clock again
                    try:
                        frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._handle(frames)
            now = time.monotonic()
            self._check_liveness(now)
            self.rule.on_tick(now)
            if not self.table.assembled:
                self._release_pulls()  # the assembly grace may have run out
            # Observers are waited for too, so an evaluator sees the final parameters.
            connected = self.live_workers() or self.table.observers()
            if self.stopping and (not connected or now > self._stop_deadline):
                break
        if self.checkpoint_path:
            self.save_checkpoint()
        log.info("stopped at version %d", self.store.version)

    def serve_forever(self) -> None:
        """`run()` with SIGINT/SIGTERM handlers (a second signal cuts the grace), then close."""

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("signal %d: stopping", signum)
            if self._stop_requested:
                self._stop_deadline = 0.0
            self.request_stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()

    def request_stop(self) -> None:
        """Ask the loop to stop (safe from a signal handler or another thread)."""
        self._stop_requested = True

    def close(self) -> None:
        """Close the socket and the ZeroMQ context."""
        self.socket.close()
        self._context.term()

    # ------------------------------------------------------------------------ the rule API

    @property
    def workers(self) -> dict[str, WorkerState]:
        """Every worker ever registered, by worker id (dead ones have alive=False)."""
        return self.table.by_id

    def live_workers(self) -> list[WorkerState]:
        return self.table.live()

    def apply_update(
        self,
        pushes: list[Push],
        steps: list[tuple[str, np.ndarray, float]],
        *,
        value_staleness: dict[str, float] | None = None,
    ) -> UpdateRecord:
        """Apply one update made of `steps`, from `pushes`; record and report telemetry."""
        for push in pushes:
            push.staleness = self.store.version - push.base
        version = self.store.apply(steps)
        scales = {name: float(scale) for name, _, scale in steps}
        distinct = set(scales.values())
        record = UpdateRecord(
            version=version,
            rule=self.rule.name,
            workers=[p.worker.rank for p in pushes],
            staleness=[p.staleness for p in pushes],
            scale=distinct.pop() if len(distinct) == 1 else scales,
            params=[name for name, _, _ in steps],
            value_staleness=value_staleness,
        )
        self._counters.record_update(record)
        self._report(record)
        if self.checkpoint_path and self.checkpoint_every and version % self.checkpoint_every == 0:
            self.save_checkpoint()
        return record

    def drop_push(self, push: Push) -> None:
        """A push the rule refuses to apply (scale 0): t and parameters unchanged; recorded
        as a `dropped` record and counter, and answered with `applied: false`."""
        record = UpdateRecord(
            version=self.store.version,
            rule=self.rule.name,
            workers=[push.worker.rank],
            staleness=[push.staleness],
            scale=0.0,
            params=[],
            dropped=True,
        )
        self._counters.dropped += 1
        push.worker.dropped += 1
        self._report(record)
        self.answer_push(push, applied=False)

    def _report(self, record: UpdateRecord) -> None:
        if self.on_update is not None:
            try:
                self.on_update(record.as_dict())
            except Exception:  # telemetry must never take the server down
                log.exception("on_update callback failed")

    def assembling(self) -> bool:
        """Still waiting for `world_size` workers to say hello (see WorkerTable.assembling)."""
        return self.table.assembling(self.heartbeat_timeout)

    def answer_push(self, push: Push, applied: bool) -> None:
        """Send (and remember, for retries) the reply to an accepted push."""
        header = {
            "op": "push",
            "version": self.store.version,
            "seq": push.seq,
            "applied": applied,
            "staleness": push.staleness if applied else self.store.version - push.base,
            "stop": self.stopping,
        }
        worker = push.worker
        if worker.last_seq == push.seq:
            worker.last_push_reply = header
            worker.pending_push = None
        self._reply(push.reply_to, header, worker=worker)

    # ---------------------------------------------------------------------- public helpers

    def save_checkpoint(self) -> Path:
        """Write a checkpoint to `checkpoint_path` now (ConfigError without a path)."""
        if self.checkpoint_path is None:
            raise ConfigError("no checkpoint path configured")
        meta = {"rule": self.rule.name, "updates": self._counters.updates, "time": time.time()}
        path = self.store.save(self.checkpoint_path, meta)
        log.info("checkpoint at version %d -> %s", self.store.version, path)
        return path

    def stats(self) -> dict[str, Any]:
        """Counters, versions, staleness and the worker table (the `stats` reply)."""
        now = time.monotonic()
        return {
            "version": self.store.version,
            "param_versions": dict(self.store.param_versions),
            "rule": self.rule.describe(),
            "world_size": self.table.current_world_size(),
            "live_workers": len(self.live_workers()),
            "stopping": self.stopping,
            **self._counters.summary(),
            "workers": [w.row(now) for w in self.workers.values()],
        }

    # ----------------------------------------------------------------- message handling

    def _handle(self, frames: list[Any]) -> None:
        # ROUTER prepends the peer's routing id; a REQ peer adds an empty delimiter frame.
        # (Only when a non-empty frame follows: a lone empty frame is a malformed header.)
        split = 1
        while split < len(frames) - 1 and len(frames[split]) == 0:
            split += 1
        envelope = Envelope(routing=frames[:split], rid=None)
        body = frames[split:]
        self._counters.messages_in += 1
        self._counters.bytes_in += sum(len(f) for f in body)
        try:
            message = wire.decode_request(body, self.limits)
            envelope.rid = message.header.get("rid")
            getattr(self, f"_op_{message.op}")(envelope, message)
        except ProtocolError as exc:
            self._error(envelope, exc.reason, exc.code, body)
        except Exception as exc:  # a bug: say so, keep serving
            log.exception("internal error handling a request")
            self._error(envelope, f"internal server error: {type(exc).__name__}", "internal", body)

    def _error(self, envelope: Envelope, reason: str, code: str, body: list[Any]) -> None:
        self._counters.errors += 1
        log.debug("error reply (%s): %s", code, reason)
        rid = envelope.rid if envelope.rid is not None else wire.peek_rid(body)
        self._send(envelope.routing, wire.error_frames(reason, code, rid))

    def _reply(
        self,
        envelope: Envelope,
        header: dict[str, Any],
        arrays: dict[str, np.ndarray] | None = None,
        worker: WorkerState | None = None,
    ) -> None:
        if envelope.rid is not None:
            header = {**header, "rid": envelope.rid}
        nbytes = self._send(envelope.routing, wire.encode(header, arrays))
        if worker is not None:
            worker.bytes_out += nbytes

    def _send(self, routing: list[Any], frames: list[Any]) -> int:
        self.socket.send_multipart([*routing, *frames], copy=False)
        nbytes = sum(len(f) if isinstance(f, bytes) else f.nbytes for f in frames)
        self._counters.bytes_out += nbytes
        return nbytes

    def _worker(self, message: Message) -> WorkerState:
        """The live worker a request comes from, its heartbeat and traffic recorded."""
        worker = self.workers.get(message.header["worker"])
        if worker is None or not worker.alive:
            raise ProtocolError(
                f"worker {message.header['worker']!r} is not registered (send hello)",
                "unknown_worker",
            )
        worker.last_seen = time.monotonic()
        worker.bytes_in += message.nbytes
        return worker

    # ---------------------------------------------------------------------------- the ops

    def _op_hello(self, envelope: Envelope, message: Message) -> None:
        if self.stopping:
            raise ProtocolError("the server is stopping", "stopping")
        worker_id = message.header["worker"]
        worker = self.table.registration(worker_id, message.header.get("info", {}))
        worker.bytes_in += message.nbytes
        old = self.workers.get(worker_id)
        if old is not None and old.alive:
            self._drop(old, "re-registered")
        self.table.add(worker)
        if not worker.observer:
            self.rule.on_hello(worker)
        rank, world_size = worker.rank, self.table.current_world_size()
        config = {**self.config, "rank": rank, "world_size": world_size}
        config["rule"] = self.config.get("rule", self.rule.describe())
        log.info("worker %s registered as rank %d", worker_id, rank)
        header = {
            "op": "hello",
            "worker": worker_id,
            "rank": rank,
            "world_size": world_size,
            "config": config,
            "version": self.store.version,
            "heartbeat_timeout": self.heartbeat_timeout,
        }
        self._reply(envelope, header, worker=worker)
        self._release_pulls()  # this hello may complete the cluster

    def _op_pull(self, envelope: Envelope, message: Message) -> None:
        worker = self._worker(message)
        worker.held_pull = (envelope, message.header.get("since"))
        if worker.observer:  # an observer never waits for a rule
            self._answer_pull(worker)
            return
        self._release_pulls()

    def _op_push(self, envelope: Envelope, message: Message) -> None:
        worker = self._worker(message)
        if worker.observer:
            raise ProtocolError("an observer cannot push", "observer")
        header = message.header
        seq = header["seq"]
        if worker.last_seq is not None and seq <= worker.last_seq:
            if seq < worker.last_seq:
                raise ProtocolError(
                    f"push seq {seq} is older than this worker's last push ({worker.last_seq})",
                    "stale_seq",
                )
            if worker.pending_push is not None:  # a retry of a held push: answer the retry
                worker.pending_push.reply_to = envelope
            else:  # a retry of an answered push: same answer, nothing applied again
                self._reply(envelope, worker.last_push_reply or {}, worker=worker)
            return
        grads, extra = self.store.check_push(header["base"], message.arrays, message.codecs)
        push = Push(worker, seq, header["base"], header.get("last", True), grads, extra)
        push.reply_to = envelope
        push.staleness = self.store.version - push.base  # refreshed if applied later
        self.rule.validate_push(push)
        # Accepted: from here on the push is answered exactly once, whatever happens.
        worker.last_seq, worker.last_push_reply = seq, None
        worker.pending_push = push
        worker.pushes += 1
        extra_bytes = sum(array.nbytes for array in extra.values())
        worker.extra_bytes_in += extra_bytes
        self._counters.extra_bytes_in += extra_bytes
        self._counters.grad_bytes_in += sum(
            array.nbytes for name, array in message.arrays.items() if name not in extra
        )
        if self.stopping:
            self.answer_push(push, applied=False)
            return
        # Counted only when the push can still be applied: a stopping server's budget is spent.
        worker.samples += header.get("samples", 0)
        self._counters.samples += header.get("samples", 0)
        if push.last:
            worker.clock += 1
        self.rule.on_push(push)
        self._release_pulls()
        if self.max_samples and self._counters.samples >= self.max_samples:
            # The sample budget is spent: this push counted, the next replies carry `stop`.
            log.info("sample budget of %d reached: stopping", self.max_samples)
            self._begin_stop()  # now, not on the loop's next turn: later messages see it

    def _op_ping(self, envelope: Envelope, message: Message) -> None:
        worker = self._worker(message)
        header = {"op": "ping", "version": self.store.version, "stop": self.stopping}
        self._reply(envelope, header, worker=worker)

    def _op_stats(self, envelope: Envelope, message: Message) -> None:
        self._reply(envelope, {"op": "stats", "stats": self.stats()})

    def _op_bye(self, envelope: Envelope, message: Message) -> None:
        worker = self._worker(message)
        worker.finished = True
        self._drop(worker, "said bye")
        self._reply(envelope, {"op": "bye"}, worker=worker)

    def _op_stop(self, envelope: Envelope, message: Message) -> None:
        self._begin_stop()
        self._reply(envelope, {"op": "stop"})

    def _op_checkpoint(self, envelope: Envelope, message: Message) -> None:
        if self.checkpoint_path is None:
            raise ProtocolError("the server has no checkpoint path", "no_checkpoint")
        path = self.save_checkpoint()
        header = {"op": "checkpoint", "path": str(path), "version": self.store.version}
        self._reply(envelope, header)

    # ---------------------------------------------------------------- workers and liveness

    def _answer_pull(self, worker: WorkerState) -> None:
        envelope, since = worker.held_pull
        worker.held_pull = None
        worker.pulls += 1
        names = self.store.changed_since(since)
        header = {
            "op": "pull",
            "version": self.store.version,
            "param_versions": self.store.param_versions,
            "stop": self.stopping,
        }
        arrays = {name: self.store.snapshot(name) for name in names}
        self._reply(envelope, header, arrays, worker=worker)
        if not worker.observer:
            self.rule.on_pulled(worker)

    def _release_pulls(self) -> None:
        """Answer every held pull the rule now allows (all of them when stopping).

        While the cluster is still assembling (fewer than world_size workers said hello, for
        at most the heartbeat timeout) every worker's pull is held, whatever the rule: a run
        starts when its workers are there, so the first one does not train alone.
        """
        if not self.stopping and self.assembling():
            return
        for worker in self.live_workers():
            if worker.held_pull and (self.stopping or self.rule.may_answer_pull(worker)):
                self._answer_pull(worker)

    def _drop(self, worker: WorkerState, why: str) -> None:
        """Take a worker out of the live set (bye, death, replaced) and tell the rule."""
        worker.alive = False
        worker.held_pull = None
        log.info("worker %s (rank %d) left: %s", worker.worker_id, worker.rank, why)
        if not worker.observer:
            self.rule.on_worker_left(worker)
            self._release_pulls()

    def _check_liveness(self, now: float) -> None:
        for worker in self.table.silent(now, self.heartbeat_timeout):
            log.warning(
                "worker %s (rank %d) silent for %.1f s: declared dead",
                worker.worker_id,
                worker.rank,
                now - worker.last_seen,
            )
            self._drop(worker, "heartbeat timeout")

    def _begin_stop(self) -> None:
        self.stopping = True
        self._stop_requested = True
        self._stop_deadline = time.monotonic() + self.stop_grace
        log.info("stopping: answering held requests, waiting for workers to leave")
        self.rule.on_stop()
        self._release_pulls()
