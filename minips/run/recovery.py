"""Crash recovery for `minips run`: a server that dies is restarted from its last good checkpoint.

The server checkpoints atomically every few seconds (`--checkpoint-interval`, on by default
for `minips run`) and keeps the checkpoint before the latest beside it
(minips.ops.checkpoint_file.previous_path), so a crash loses at most the updates of one
interval. When the server process dies (any exit but a clean stop), the launcher starts a
new one on the same address, at most MAX_RESTARTS times, from:

- the latest checkpoint, checked first (minips.ops.checkpoint_file.load_checkpoint);
- if that one is damaged, the one before it (the damaged file is set aside as
  checkpoint.damaged-N.npz, so the next checkpoint does not push the good one out);
- if the server died before its first checkpoint, the run's start: the initial parameters
  are known (its config's seed, or its own --resume, whose version the restart's record
  names and counts the loss from);
- if every checkpoint there is is damaged: no restart; the run ends with that line.

A shard of a server group (`--servers K`) is restarted the same way from its own files
(minips.ops.checkpoints.shard_path); under ssgd the whole group goes back to one
version with it (minips.run.group_recovery: `prepare(child, at=version)`).

The workers ride through: their requests time out and are retried (Lazy Pirate), the new
server answers `unknown_worker`, they say hello again, and a push based on a version the
server forgot is answered `bad_base`, upon which they pull again and go on
(docs/protocol.md 7).

`ServerRestarts` is the server's restart policy (minips.run.processes.RestartPolicy). Each
restart is recorded (`Restart`); the run's summary gives their number and the updates lost:
the versions the dead server had logged past the checkpoint it resumed from. A crash past
the budget is recorded too (`refused`), and ends the run. Each server generation logs its
updates to its own file (RunDir.updates_log: updates.jsonl, then updates-1.jsonl, ...),
merged at the end.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from minips.errors import DataError, MinipsError
from minips.ops.checkpoint_file import Checkpoint, load_checkpoint, previous_path
from minips.ops.checkpoints import shard_path
from minips.results.metrics import read_metrics
from minips.results.rundir import RunDir
from minips.run.processes import Child

MAX_RESTARTS = 3  # a server that keeps dying is a bug to report, not to hide


@dataclass(frozen=True)
class Restart:
    """One crash of the server: why, what it resumed from, and what it cost.

    exit_code: the dead server's (-9: SIGKILL). resumed_from: the checkpoint file the next
    server started from (the run's --resume file when it died before its first checkpoint;
    None: the seeded model of a run without one, or no next server, the budget being
    spent). checkpoint_version: that checkpoint's version (0 from the seeded model).
    last_version: the last update the dead server logged. updates_lost: last_version -
    checkpoint_version. checkpoint_age_s: seconds between the checkpoint and the crash
    being noticed (None from the run's start, --resume file or seeded model). damaged: the
    error line of each checkpoint passed over as damaged. shard: which shard of a server
    group (0: the root, or the one server). rolled_back: the shard did not crash; it was
    stopped to go back to the version a crashed peer restarted from (group_recovery).
    """

    exit_code: int | None
    resumed_from: str | None
    checkpoint_version: int
    last_version: int
    updates_lost: int
    checkpoint_age_s: float | None
    damaged: list[str] = field(default_factory=list)
    shard: int = 0
    rolled_back: bool = False

    def record(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """What the restart cost, in one line for the person running the run."""
        who = "the server" if self.shard == 0 else f"shard {self.shard}"
        start = f"its checkpoint at version {self.checkpoint_version}"
        if self.checkpoint_age_s is None:  # the run's start
            start = "the run's start" + (f", its --resume file {self.resumed_from} at version "
                                         f"{self.checkpoint_version}" if self.resumed_from
                                         else "")  # fmt: skip
        return (f"warning: {who} crashed (exit code {self.exit_code}) and was restarted from "
                f"{start}: {self.updates_lost} update(s) lost")  # fmt: skip


def last_logged_version(path: Path) -> int:
    """The version of the last update a server logged (0: none)."""
    if not path.exists():
        return 0
    records = read_metrics(path)  # a line cut by the kill is skipped: what is whole
    versions = [r["version"] for r in records if r.get("event") == "update" and "version" in r]
    return max(versions, default=0)


def latest_good(checkpoint: Path) -> tuple[Checkpoint | None, list[str]]:
    """The newest checkpoint at `checkpoint` or before it that is not damaged (None when
    there is none), and the error lines of the damaged ones passed over."""
    damaged = []
    for path in (checkpoint, previous_path(checkpoint)):
        if not path.exists():
            continue
        try:
            return load_checkpoint(path), damaged
        except DataError as exc:
            damaged.append(str(exc))
    return None, damaged


def describe_restart(
    resumed: Checkpoint | None,
    dead_log: Path,
    exit_code: int | None,
    damaged: list[str] | None = None,
    now: float | None = None,
    shard: int = 0,
    start: Checkpoint | None = None,
) -> Restart:
    """What a restart from `resumed` (None: from the run's start, `start`, its --resume
    file, or None: the seeded model at version 0) loses, the dead server having logged to
    `dead_log`. It reached at least the version of a checkpoint it wrote or started from
    (its last log lines may have died with it, or it died before it logged any)."""
    if resumed is None:
        begun = start.version if start is not None else 0
        last = max(last_logged_version(dead_log), begun)
        return Restart(exit_code, None if start is None else str(start.path), begun, last,
                       last - begun, None, damaged or [], shard)  # fmt: skip
    last = max(last_logged_version(dead_log), resumed.version)
    age = (time.time() if now is None else now) - float(resumed.meta.get("time", 0.0))
    return Restart(exit_code, str(resumed.path), resumed.version, last,
                   max(0, last - resumed.version), round(age, 3), damaged or [], shard)  # fmt: skip


class ServerRestarts:
    """The restart policy of a run's server, or of one shard of its server group (module
    docstring): a new server on the dead one's address, from its last good checkpoint, at
    most MAX_RESTARTS times. resume: what a restart from the run's start resumes from (the
    run's own --resume; None: the seeded model)."""

    def __init__(
        self, run_dir: RunDir, checkpoint: Path, shard: int = 0, servers: int = 1,
        resume: str | None = None,
    ) -> None:  # fmt: skip
        self.run_dir = run_dir
        self.shard, self.resume = shard, resume
        self.checkpoint = checkpoint if servers == 1 else shard_path(checkpoint, shard)
        self.restarts: list[Restart] = []
        self.refused: Restart | None = None  # the crash past the budget, which ends the run
        self.address: str | None = None  # the dead server's, which the next one binds
        self._resume: Path | None = None  # what the next server starts from (None: the start)

    def allows(self, child: Child) -> bool:
        if sum(not r.rolled_back for r in self.restarts) < MAX_RESTARTS:
            return True
        self.refused = describe_restart(latest_good(self.checkpoint)[0], self._dead_log(child),
                                        child.code(), shard=self.shard,
                                        start=self._start())  # fmt: skip
        return False

    def versions(self) -> set[int]:
        """The versions this server could restart from: each whole checkpoint's, and 0
        (the run's start) unless the run resumed from a file of its own."""
        found = {0} if self.resume is None else set()
        for path in (self.checkpoint, previous_path(self.checkpoint)):
            try:
                if path.exists():
                    found.add(load_checkpoint(path).version)
            except DataError:
                pass
        return found

    def reached(self, child: Child) -> int:
        """The highest version `child` (this server's current process) logged or saved."""
        return max(last_logged_version(self._dead_log(child)), *self.versions())

    def prepare(self, child: Child, at: int | None = None, rolled_back: bool = False) -> None:
        """Choose what the next server starts from and record what the restart costs; take
        the dead server's address over (the workers know only that one). MinipsError when
        every checkpoint there is is damaged: the run cannot go on from them. at: the
        version to start from (one of `versions()`; a later checkpoint is set aside, so
        the next ones follow on from `at`); rolled_back: the server was stopped, not
        crashed (Restart.rolled_back)."""
        good, damaged = latest_good(self.checkpoint) if at is None else self._at(at)
        restart = describe_restart(good, self._dead_log(child), child.code(), damaged,
                                   shard=self.shard, start=self._start())  # fmt: skip
        restart = replace(restart, rolled_back=rolled_back)
        if good is None and damaged:
            self.refused = restart
            raise MinipsError(
                f"the server crashed (exit code {child.code()}) and no checkpoint to restart "
                f"it from is whole: {damaged[0]}"
            )
        if good is not None and good.path != self.checkpoint and self.checkpoint.exists():
            self._set_aside(self.checkpoint)  # the damaged latest
        self.restarts.append(restart)
        self._resume = good.path if good is not None else None
        endpoint = self.run_dir.shard_endpoint(self.shard)
        if endpoint.exists():  # else a restarted one stopped before it listened: its bind
            self.address = endpoint.read_text().strip()
            endpoint.unlink()  # the new server writes it once it listens

    def _at(self, version: int) -> tuple[Checkpoint | None, list[str]]:
        """The checkpoint at `version` (None for 0: the run's start); every checkpoint past
        it is set aside (the versions the group goes back on)."""
        chosen = None
        for path in (self.checkpoint, previous_path(self.checkpoint)):
            try:
                found = load_checkpoint(path) if path.exists() else None
            except DataError:
                continue
            if found is not None and found.version > version:
                self._set_aside(path, "rolled-back")
            elif found is not None and found.version == version and chosen is None:
                chosen = found
        return chosen, []

    def records(self) -> list[dict[str, Any]]:
        return [restart.record() for restart in self.restarts]

    def final_crash(self) -> dict[str, Any] | None:
        """The crash no restart followed (past the budget, or nothing whole to restart
        from), as a record; None when every crash was restarted."""
        return self.refused.record() if self.refused is not None else None

    def crashed_at_the_end(self, child: Child) -> str | None:
        """A server that crashed once training was over (while it stopped: no restart
        then), recorded as the run's final crash; the line that says what the run keeps
        and lost. None when it stopped well, when the launcher stopped it, or when its
        last checkpoint holds every update it applied (it died after writing it)."""
        if not child.crashed() or child.stopped:
            return None
        good, damaged = latest_good(self.checkpoint)
        crash = describe_restart(good, self._dead_log(child), child.code(), damaged,
                                 shard=self.shard, start=self._start())  # fmt: skip
        if good is not None and crash.updates_lost == 0:
            return None
        self.refused = crash
        who = "the server" if self.shard == 0 else f"shard {self.shard}"
        kept = (f"its last checkpoint, at version {crash.checkpoint_version}"
                if crash.checkpoint_age_s is not None else "no checkpoint of it")  # fmt: skip
        return (f"{who} crashed while it stopped (exit code {crash.exit_code}): the run keeps "
                f"{kept}; {crash.updates_lost} update(s) after it were lost")  # fmt: skip

    def check_budget(self, child: Child, logs: Path) -> None:
        """MinipsError, the run's error, when the server crashed once more than it may be
        restarted: how often, and the last words of the last server's own log."""
        if self.refused is None:
            return
        what = "the server" if self.shard == 0 else f"shard {self.shard}"
        codes = [r.exit_code for r in self.restarts if not r.rolled_back] + [child.code()]
        log_file = logs / f"{child.log_name}.log"
        raise MinipsError(
            f"{what} crashed {len(codes)} times (exit codes {', '.join(map(str, codes))}),"
            f" once more than the {MAX_RESTARTS} restarts allowed; its last log, {log_file},"
            f" ends: {child.last_line(logs)}"
        )

    def resume_options(self, generation: int) -> list[str]:
        """The `minips server` options of the `generation`-th server ([] for the first; a
        restart from the run's start needs only the address: its config has the rest)."""
        if generation == 0:
            return []
        assert self.address is not None, "a restart is prepared first"
        resume = str(self._resume) if self._resume is not None else self.resume
        return (["--resume", resume] if resume else []) + ["--bind", self.address]

    def _set_aside(self, path: Path, why: str = "damaged") -> None:
        """Move a checkpoint out of the way (kept, for a look): else the next checkpoint
        would push the good one out of its place as the previous."""
        os.replace(path, path.with_name(f"{path.stem}.{why}-{len(self.restarts) + 1}.npz"))

    def _start(self) -> Checkpoint | None:
        """The run's --resume file, what a restart from the run's start resumes from (None:
        none, or it cannot be read alone, as a group checkpoint never assembled)."""
        if self.resume is None:
            return None
        try:
            return load_checkpoint(self.resume)
        except MinipsError:
            return None

    def _dead_log(self, child: Child) -> Path:
        return self.run_dir.updates_log(child.generation, self.shard)
