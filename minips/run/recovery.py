"""Crash recovery for `minips run`: a server that dies is restarted from its last checkpoint.

The server checkpoints atomically every few seconds (`--checkpoint-interval`, on by default
for `minips run`), so a crash loses at most the updates of one interval. When the server
process dies (any exit but a clean stop), the launcher starts a new one on the same address
with `--resume RUN_DIR/checkpoint.npz`, at most MAX_RESTARTS times. The workers ride
through: their requests time out and are retried (Lazy Pirate), the new server answers
`unknown_worker`, they say hello again, and a push based on a version the server forgot is
answered `bad_base`, upon which they pull again and go on (docs/protocol.md 7).

`ServerRestarts` is the server's restart policy (minips.run.processes.RestartPolicy). Each
restart is recorded (`Restart`); the run's summary gives their number and the updates lost:
the versions the dead server had logged past its checkpoint. Each server generation logs
its updates to its own file (RunDir.updates_log: updates.jsonl, then updates-1.jsonl, ...),
merged at the end.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minips.run.metrics import read_metrics
from minips.run.processes import Child
from minips.run.rundir import RunDir
from minips.server.checkpoints import shard_path

MAX_RESTARTS = 3  # a server that keeps dying is a bug to report, not to hide


@dataclass(frozen=True)
class Restart:
    """One restart: why, from which checkpoint, and what it cost.

    exit_code: the dead server's (-9: SIGKILL). checkpoint_version: the version resumed
    from (0 and checkpoint_age_s None: a shard of a group that died before its first
    checkpoint, started again from the run's start). last_version: the last update the
    dead server logged. updates_lost: last_version - checkpoint_version. checkpoint_age_s:
    seconds between the checkpoint and the restart (at most about one checkpoint interval,
    plus the time to notice the death). shard: which shard of a server group (0: the root,
    or the one server).
    """

    exit_code: int | None
    checkpoint_version: int
    last_version: int
    updates_lost: int
    checkpoint_age_s: float | None
    shard: int = 0

    def record(self) -> dict[str, Any]:
        return asdict(self)


def checkpoint_state(path: Path) -> tuple[int, dict[str, Any]]:
    """A checkpoint's version and meta (minips.server.store.ParameterStore.save)."""
    with np.load(path, allow_pickle=False) as data:
        return int(data["version"]), json.loads(str(data["meta"]))


def last_logged_version(path: Path) -> int:
    """The version of the last update a server logged (0: none)."""
    if not path.exists():
        return 0
    try:
        records = read_metrics(path)
    except json.JSONDecodeError:  # a line cut by the kill: read what is whole
        lines = path.read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines[:-1] if line.strip()]
    versions = [r["version"] for r in records if r.get("event") == "update" and "version" in r]
    return max(versions, default=0)


def describe_restart(
    checkpoint: Path | None, dead_log: Path, exit_code: int | None, now: float | None = None,
    shard: int = 0,
) -> Restart:  # fmt: skip
    """What a restart from `checkpoint` (None: from the run's start) loses, the dead server
    having logged to `dead_log`."""
    last = last_logged_version(dead_log)
    if checkpoint is None:
        return Restart(exit_code, 0, last, last, None, shard)
    version, meta = checkpoint_state(checkpoint)
    age = (time.time() if now is None else now) - float(meta.get("time", 0.0))
    return Restart(exit_code, version, last, max(0, last - version), round(age, 3), shard)


class ServerRestarts:
    """The restart policy of a run's server, or of one shard of its server group: a new
    server on the dead one's address, resumed from its last checkpoint, at most
    MAX_RESTARTS times.

    The one server needs a checkpoint to restart from. A shard of a group (servers > 1)
    resumes from its own file (server/checkpoints.py) while the other shards keep serving;
    dead before its first checkpoint, it starts again from the run's start (its `resume`,
    the group's, or the seeded model) and the restart says all its updates were lost.
    """

    def __init__(
        self, run_dir: RunDir, checkpoint: Path, shard: int = 0, servers: int = 1,
        resume: str | None = None,
    ) -> None:  # fmt: skip
        self.run_dir = run_dir
        self.shard, self.servers, self.resume = shard, servers, resume
        self.checkpoint = checkpoint if servers == 1 else shard_path(checkpoint, shard)
        self.restarts: list[Restart] = []
        self.address: str | None = None  # the dead server's, which the next one binds

    def allows(self, child: Child) -> bool:
        from_start = self.servers > 1  # a shard may start over; the one server may not
        return len(self.restarts) < MAX_RESTARTS and (self.checkpoint.exists() or from_start)

    def prepare(self, child: Child) -> None:
        """Record what the restart costs; take the dead server's address over (the workers
        know only that one)."""
        dead_log = self.run_dir.updates_log(child.generation, self.shard)
        checkpoint = self.checkpoint if self.checkpoint.exists() else None
        restart = describe_restart(checkpoint, dead_log, child.code(), shard=self.shard)
        self.restarts.append(restart)
        endpoint = self.run_dir.shard_endpoint(self.shard)
        self.address = endpoint.read_text().strip()
        endpoint.unlink()  # the new server writes it once it listens

    def records(self) -> list[dict[str, Any]]:
        return [restart.record() for restart in self.restarts]

    def resume_options(self, generation: int) -> list[str]:
        """The `minips server` options of the `generation`-th server ([] for the first)."""
        if generation == 0:
            return []
        assert self.address is not None, "a restart is prepared first"
        resume = str(self.checkpoint) if self.checkpoint.exists() else self.resume
        return (["--resume", resume] if resume else []) + ["--bind", self.address]
