"""The server's membership, operator requests and life cycle.

Handlers of the requests that carry no gradients (hello, ping, stats, bye, stop,
checkpoint): each takes the request's envelope and decoded message, changes the registry or
the server's run state, and replies through the server. Also: the answer to a retried push
(from memory: applied once), declaring silent workers dead, workers leaving, the sample
budget, stopping (and `serve_forever`'s signals), checkpoints and the `stats` map. The
push/pull path, where gradients become updates, is in minips/server/server.py.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minips.errors import ConfigError
from minips.protocol.wire import Message, ProtocolError
from minips.server import guard
from minips.server.registry import HeldPull

if TYPE_CHECKING:
    from minips.server.registry import WorkerState
    from minips.server.server import Envelope, ParameterServer

log = logging.getLogger("minips.server")


class Control:
    """Membership, operator requests and the life cycle of one server."""

    def __init__(self, server: ParameterServer) -> None:
        self.server = server
        self._checkpointed = (time.monotonic(), server.store.version)  # when, at which version
        self.stop_requested = False  # set from a signal handler or another thread
        self._stop_deadline = 0.0  # when a stopping server stops waiting for clients

    def answer_retry(self, worker: WorkerState, envelope: Envelope, header: dict[str, Any]) -> None:
        """A push whose `seq` is not new: a retry (after a lost reply, from a new socket) is
        answered as the first attempt was or will be, and applied once (docs/protocol.md 8);
        a push older than the worker's last one is `stale_seq`."""
        seq, seen = header["seq"], worker.seen_push(header["seq"])
        if seen == "held":  # still waiting (at a barrier, say): the answer goes to the retry
            worker.held_pushes[seq].reply_to = envelope
        elif seen == "answered" and "pull_since" in header:  # same answer, the pull afresh
            pull = HeldPull(envelope, header["pull_since"], worker.answered[seq])
            self.server.hold_pull(worker, pull)
        elif seen == "answered":
            self.server.outbox.reply(envelope, worker.answered[seq], worker=worker)
        else:
            raise ProtocolError(
                f"push seq {seq} is older than this worker's last push ({worker.highest_seq})",
                "stale_seq",
            )

    def hello(self, envelope: Envelope, request: Message) -> None:
        """Register (or re-register) a worker or observer; reply with the run's config."""
        server = self.server
        if server.stopping:
            raise ProtocolError("the server is stopping", "stopping")
        worker_id, info = request.header["worker"], request.header.get("info", {})
        guard.check_info(info)
        old = server.registry.by_id.get(worker_id)
        if old is not None and old.alive:
            guard.check_owner(old, envelope.origin)
        worker = server.registry.register(worker_id, info, envelope.origin)
        worker.bytes_in += request.nbytes
        if old is not None and old.alive:
            self.retire(old, "re-registered")
        world_size = server.registry.current_world_size()
        config = {**server.config, "rank": worker.rank, "world_size": world_size}
        config.setdefault("rule", server.rule.describe())
        log.info("%s registered", describe(worker))
        header = {
            "op": "hello",
            "worker": worker_id,
            "rank": worker.rank,
            "world_size": world_size,
            "config": config,
            "version": server.store.version,
            "heartbeat_timeout": server.options.heartbeat_timeout,
        }
        server.outbox.reply(envelope, header, worker=worker)
        server.release_pulls()  # this hello may complete the cluster

    def ping(self, envelope: Envelope, request: Message) -> None:
        server = self.server
        worker = server.registry.sender(request, envelope.origin)
        header = {"op": "ping", "version": server.store.version, "stop": server.stopping}
        server.outbox.reply(envelope, header, worker=worker)

    def stats_request(self, envelope: Envelope, request: Message) -> None:
        self.server.outbox.reply(envelope, {"op": "stats", "stats": self.stats()})

    def bye(self, envelope: Envelope, request: Message) -> None:
        server = self.server
        worker = server.registry.sender(request, envelope.origin)
        worker.finished = request.header.get("finished", True) and not worker.observer
        self.retire(worker, "said bye" if worker.finished or worker.observer else "left unfinished")
        server.outbox.reply(envelope, {"op": "bye"}, worker=worker)
        self.stop_if_all_finished()

    def stop_if_all_finished(self) -> None:
        """A run with a fixed world size ends once every rank's shard is finished (each
        worker said `bye` after its epochs): the server stops by itself (docs/protocol.md 5.6)."""
        if not self.server.stopping and self.server.registry.all_finished():
            log.info("every worker finished its epochs: stopping")
            self.server.finished_by_workers = True
            self.begin_stop()

    def stop_if_budget_spent(self) -> None:
        """With --max-samples, stop once the pushes reported that many samples in total; now,
        not on the loop's next turn, so the messages after this one see it."""
        budget = self.server.options.max_samples
        if budget and self.server.telemetry.counters.samples >= budget:
            log.info("sample budget of %d reached: stopping", budget)
            self.begin_stop()

    def stop(self, envelope: Envelope, request: Message) -> None:
        guard.require_operator(envelope.origin, self.server.options.keys)
        self.begin_stop()
        self.server.outbox.reply(envelope, {"op": "stop"})

    def checkpoint(self, envelope: Envelope, request: Message) -> None:
        server = self.server
        guard.require_operator(envelope.origin, server.options.keys)
        if server.options.checkpoint_path is None:
            raise ProtocolError("the server has no checkpoint path", "no_checkpoint")
        path = self.save_checkpoint()
        header = {"op": "checkpoint", "path": str(path), "version": server.store.version}
        server.outbox.reply(envelope, header)

    # ------------------------------------------------------------------ leaving, stopping

    def resume(self, path: str | Path) -> None:
        """Start from a checkpoint: parameters, versions, optimizer state, and the update and
        sample counts (a sample budget goes on where the checkpoint left it)."""
        meta = self.server.store.load(path)
        counters = self.server.telemetry.counters
        counters.updates, counters.samples = meta.get("updates", 0), meta.get("samples", 0)
        self._checkpointed = (time.monotonic(), self.server.store.version)
        log.info("resumed from %s at version %d (%s)", path, self.server.store.version, meta)

    def checkpoint_if_due(self, now: float) -> None:
        """The time-based checkpoint: every `checkpoint_interval` seconds, if anything changed
        (written atomically: a crash leaves the previous one, docs/protocol.md 7)."""
        interval, (last, version) = self.server.options.checkpoint_interval, self._checkpointed
        if not (interval and self.server.options.checkpoint_path) or now - last < interval:
            return
        if self.server.store.version != version:
            self.save_checkpoint()
        self._checkpointed = (now, self.server.store.version)

    def checkpoint_every_n(self, version: int) -> None:
        """The update-count checkpoint: at every `checkpoint_every`-th version."""
        every = self.server.options.checkpoint_every
        if self.server.options.checkpoint_path and every and version % every == 0:
            self.save_checkpoint()

    def check_liveness(self, now: float) -> None:
        """Declare workers dead that have sent nothing for the heartbeat timeout."""
        for worker in self.server.registry.silent(now, self.server.options.heartbeat_timeout):
            silent = now - worker.last_seen
            log.warning("%s silent for %.1f s: declared dead", describe(worker), silent)
            self.retire(worker, "heartbeat timeout")

    def retire(self, worker: WorkerState, why: str) -> None:
        """Take a worker out of the live set (bye, death, replaced) and tell the rule."""
        worker.alive = False
        worker.held_pull = None
        log.info("%s left: %s", describe(worker), why)
        if not worker.observer:
            self.server.carry_out(self.server.rule.on_worker_left(worker))
            self.server.release_pulls()

    def begin_stop(self) -> None:
        """Stop: answer everything held, flag every later reply, refuse new hellos."""
        server = self.server
        server.stopping = self.stop_requested = True
        self._stop_deadline = time.monotonic() + self.server.options.stop_grace
        log.info("stopping: answering held requests, waiting for workers to leave")
        self.server.carry_out(self.server.rule.on_stop())
        self.server.release_pulls()

    def finished(self) -> bool:
        """True once a stopping server's clients have left, or its grace ran out. Observers
        are waited for too, so an evaluator sees the final parameters."""
        connected = self.server.registry.live() or self.server.registry.observers()
        return self.server.stopping and (not connected or time.monotonic() > self._stop_deadline)

    def serve_forever(self) -> None:
        """The server's `run()` with SIGINT/SIGTERM handlers (a second signal cuts the
        grace), then `close()`."""

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("signal %d: stopping", signum)
            if self.stop_requested:
                self._stop_deadline = 0.0
            self.stop_requested = True

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.server.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.server.close()

    def save_checkpoint(self) -> Path:
        """Write a checkpoint to the checkpoint path now (ConfigError without one)."""
        if self.server.options.checkpoint_path is None:
            raise ConfigError("no checkpoint path configured")
        counters = self.server.telemetry.counters
        meta = {"rule": self.server.rule.name, "updates": counters.updates,
                "samples": counters.samples, "time": time.time(),
                "spec": self.server.config.get("model")}  # fmt: skip
        path = self.server.store.save(self.server.options.checkpoint_path, meta)
        log.info("checkpoint at version %d -> %s", self.server.store.version, path)
        return path

    def stats(self) -> dict[str, Any]:
        """Counters, versions, staleness and the worker table (the `stats` reply)."""
        now = time.monotonic()
        return {
            "version": self.server.store.version,
            "param_versions": dict(self.server.store.param_versions),
            "rule": self.server.rule.describe(),
            "world_size": self.server.registry.current_world_size(),
            "live_workers": len(self.server.registry.live()),
            "stopping": self.server.stopping,
            **self.server.telemetry.counters.summary(),
            "workers": [w.row(now) for w in self.server.registry.by_id.values()],
        }


def describe(worker: WorkerState) -> str:
    """ "worker ab12 (rank 1)" or "observer cd34" (an observer holds no rank), for logs."""
    if worker.observer:
        return f"observer {worker.worker_id}"
    return f"worker {worker.worker_id} (rank {worker.rank})"
