"""The server's membership and operator requests: hello, ping, stats, bye, stop, checkpoint.

Each handler takes the request's envelope and decoded message, changes the registry or the
server's run state, and replies through the server. The push/pull path, where gradients
become updates, is in minips/server.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from minips.wire import Message, ProtocolError

if TYPE_CHECKING:
    from minips.server import Envelope, ParameterServer

log = logging.getLogger("minips.server")


class ControlHandlers:
    """Handlers of the requests that do not carry gradients, for one server."""

    def __init__(self, server: ParameterServer) -> None:
        self.server = server

    def hello(self, envelope: Envelope, request: Message) -> None:
        """Register (or re-register) a worker or observer; reply with the run's config."""
        server = self.server
        if server.stopping:
            raise ProtocolError("the server is stopping", "stopping")
        worker_id = request.header["worker"]
        old = server.registry.by_id.get(worker_id)
        worker = server.registry.register(worker_id, request.header.get("info", {}))
        worker.bytes_in += request.nbytes
        if old is not None and old.alive:
            server.retire(old, "re-registered")
        world_size = server.registry.current_world_size()
        config = {**server.config, "rank": worker.rank, "world_size": world_size}
        config.setdefault("rule", server.rule.describe())
        role = "observer" if worker.observer else f"worker (rank {worker.rank})"
        log.info("%s registered as %s", worker_id, role)
        header = {
            "op": "hello",
            "worker": worker_id,
            "rank": worker.rank,
            "world_size": world_size,
            "config": config,
            "version": server.store.version,
            "heartbeat_timeout": server.options.heartbeat_timeout,
        }
        server.reply(envelope, header, worker=worker)
        server.release_pulls()  # this hello may complete the cluster

    def ping(self, envelope: Envelope, request: Message) -> None:
        server = self.server
        worker = server.sender(request)
        header = {"op": "ping", "version": server.store.version, "stop": server.stopping}
        server.reply(envelope, header, worker=worker)

    def stats(self, envelope: Envelope, request: Message) -> None:
        self.server.reply(envelope, {"op": "stats", "stats": self.server.stats()})

    def bye(self, envelope: Envelope, request: Message) -> None:
        server = self.server
        worker = server.sender(request)
        worker.finished = True
        server.retire(worker, "said bye")
        server.reply(envelope, {"op": "bye"}, worker=worker)

    def stop(self, envelope: Envelope, request: Message) -> None:
        self.server.begin_stop()
        self.server.reply(envelope, {"op": "stop"})

    def checkpoint(self, envelope: Envelope, request: Message) -> None:
        server = self.server
        if server.options.checkpoint_path is None:
            raise ProtocolError("the server has no checkpoint path", "no_checkpoint")
        path = server.save_checkpoint()
        header = {"op": "checkpoint", "path": str(path), "version": server.store.version}
        server.reply(envelope, header)
