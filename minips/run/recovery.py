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

MAX_RESTARTS = 3  # a server that keeps dying is a bug to report, not to hide


@dataclass(frozen=True)
class Restart:
    """One restart: why, from which checkpoint, and what it cost.

    exit_code: the dead server's (-9: SIGKILL). checkpoint_version: the version resumed
    from. last_version: the last update the dead server logged. updates_lost: last_version -
    checkpoint_version. checkpoint_age_s: seconds between the checkpoint and the restart
    (at most about one checkpoint interval, plus the time to notice the death).
    """

    exit_code: int | None
    checkpoint_version: int
    last_version: int
    updates_lost: int
    checkpoint_age_s: float

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
    checkpoint: Path, dead_log: Path, exit_code: int | None, now: float | None = None
) -> Restart:
    """What a restart from `checkpoint` loses, the dead server having logged to `dead_log`."""
    version, meta = checkpoint_state(checkpoint)
    last = last_logged_version(dead_log)
    age = (time.time() if now is None else now) - float(meta.get("time", 0.0))
    return Restart(exit_code, version, last, max(0, last - version), round(age, 3))


class ServerRestarts:
    """The restart policy of a run's server: a new server on the dead one's address, resumed
    from the run's last checkpoint, at most MAX_RESTARTS times."""

    def __init__(self, run_dir: RunDir, checkpoint: Path) -> None:
        self.run_dir = run_dir
        self.checkpoint = checkpoint
        self.restarts: list[Restart] = []
        self.address: str | None = None  # the dead server's, which the next one binds

    def allows(self, child: Child) -> bool:
        return len(self.restarts) < MAX_RESTARTS and self.checkpoint.exists()

    def prepare(self, child: Child) -> None:
        """Record what the restart costs; take the dead server's address over (the workers
        know only that one)."""
        dead_log = self.run_dir.updates_log(child.generation)
        self.restarts.append(describe_restart(self.checkpoint, dead_log, child.code()))
        self.address = self.run_dir.endpoint.read_text().strip()
        self.run_dir.endpoint.unlink()  # the new server writes it once it listens

    def records(self) -> list[dict[str, Any]]:
        return [restart.record() for restart in self.restarts]

    def resume_options(self, generation: int) -> list[str]:
        """The `minips server` options of the `generation`-th server ([] for the first)."""
        if generation == 0:
            return []
        assert self.address is not None, "a restart is prepared first"
        return ["--resume", str(self.checkpoint), "--bind", self.address]
