"""A server group on real sockets in this process: each shard a ParameterServer built the
way `minips server` builds it (make_server; shards 1..K-1 ask the root with join_root),
serving from its own thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from minips.run.build import join_root, make_server
from minips.run.config import RunConfig
from minips.server.server import ParameterServer

FAST = {"model": "mlp", "dataset": "synthetic", "heartbeat_timeout": 5.0,
        "checkpoint_interval": 0.0}  # fmt: skip


class Shards:
    """The shards of a running group (index 0: the root), their threads, and a way to kill
    one (stop its loop and close its socket) and start it again on its address."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.servers: list[ParameterServer] = []
        self.threads: list[threading.Thread] = []

    @property
    def root(self) -> ParameterServer:
        return self.servers[0]

    def start(self, shard: int, bind: str = "tcp://127.0.0.1:*", resume: str | None = None) -> None:
        if shard == 0:
            config = replace(self.config, shard=0, bind=bind)
            server = make_server(config)
        else:
            own = replace(self.config, shard=shard, root=self.root.endpoint, bind=bind,
                          checkpoint=None, resume=resume)  # fmt: skip
            config, joiner = join_root(own)
            server = make_server(config, joiner=joiner)
        server.options = replace(server.options, stop_grace=0.3)  # clients here say no bye
        thread = threading.Thread(target=server.run, name=f"shard-{shard}", daemon=True)
        thread.start()
        deadline = time.monotonic() + 60  # only catches a hang: a loaded machine joins late
        while shard and self.root.group.table.addresses()[shard] is None:  # its address joined
            assert time.monotonic() < deadline, f"shard {shard} did not join"
            time.sleep(0.02)
        if shard < len(self.servers):
            self.servers[shard], self.threads[shard] = server, thread
        else:
            self.servers.append(server)
            self.threads.append(thread)

    def kill(self, shard: int) -> str:
        """Stop shard `shard` at once, as a crash would (nothing drained); its address."""
        server, endpoint = self.servers[shard], self.servers[shard].endpoint
        server.stop.request("killed")
        server.stop.deadline = 0.0
        server.begin_stop()
        self.threads[shard].join(timeout=10)
        server.close()
        return endpoint

    def stop_all(self) -> None:
        for server in self.servers:
            server.request_stop()
        for server, thread in zip(self.servers, self.threads, strict=True):
            thread.join(timeout=15)
            with contextlib.suppress(Exception):
                server.close()


@contextlib.contextmanager
def running_group(
    servers: int, tmp_path: Path | None = None, started: int | None = None, **fields
) -> Iterator[Shards]:
    """A group of `servers` shards over the RunConfig `fields` (FAST's by default), the
    first `started` of them (all by default) joined before it is yielded; stopped at the
    end."""
    checkpoint = str(tmp_path / "group.npz") if tmp_path is not None else None
    config = RunConfig(**{**FAST, "servers": servers, "checkpoint": checkpoint, **fields})
    shards = Shards(config)
    try:
        for shard in range(servers if started is None else started):
            shards.start(shard)
        yield shards
    finally:
        shards.stop_all()
