"""When the server writes checkpoints, what goes into their meta, and resuming from one.

A checkpoint is the store's (parameters, their versions, the optimizer's state:
checkpoint_file.save_store, written atomically), the update rule's own state (DANA's momentum per
worker, DC-ASGD's and Gap-Aware's copies of what each worker pulled: rule_state.py) and the
counters a resumed run goes on from (updates, samples). The server asks for one every
`checkpoint_every` updates (`after_update`), every `checkpoint_interval` seconds when the
version moved (`if_due`), on an operator's request and at shutdown (`save`). Each one keeps
the one before it beside it (minips.ops.checkpoint_file.previous_path), so damage to the
latest leaves an earlier good one. A server started on a path that holds a checkpoint
resumes from it or writes beside it, never an older model over it (`start`:
minips/ops/checkpoint_keep.py). The file's format and its checks:
minips/ops/checkpoint_file.py.

A shard of a server group (docs/protocol.md 16) writes its own slices to its own file and
reads its slices of a whole model's checkpoint: minips/ops/group_checkpoints.py.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minips.errors import ConfigError
from minips.ops.checkpoint_file import (
    Checkpoint,
    load_checkpoint,
    restore_store,
    save_store,
    versioned_path,
)
from minips.ops.checkpoint_keep import keep_trained
from minips.ops.group_checkpoints import (
    GROUP_SSGD_EVERY,
    assemble,
    shard_files,
    shard_path,
    slicer,
)

if TYPE_CHECKING:
    from minips.ops.rule_state import KeptRuleState
    from minips.ops.telemetry import Counters
    from minips.state.store import ParameterStore

log = logging.getLogger("minips.server")


class Checkpointer:
    """The checkpoints of one server's store (see the module docstring).

    path: where they go (None: nowhere; `save` is then a ConfigError). every: every this
    many updates (0: never). interval: every this many seconds (0: never). rule, spec:
    recorded in each checkpoint's meta (the rule's name, the model's spec). rule_state:
    the rule's own state (rule_state.py's KeptRuleState, or anything with a name, state()
    and load_state()), which goes into each checkpoint and comes back on resume. keep_all:
    each checkpoint also stays as `versioned_path(path, version)`. shard: (this shard, the
    group's size) for a shard of a server group (None: one server).
    """

    def __init__(
        self,
        store: ParameterStore,
        counters: Counters,
        path: str | Path | None,
        every: int = 0,
        interval: float = 0.0,
        rule: str = "",
        spec: Any = None,
        rule_state: KeptRuleState | None = None,
        keep_all: bool = False,
        shard: tuple[int, int] | None = None,
    ) -> None:
        self.store, self.counters, self.rule_state = store, counters, rule_state
        self.shard, self.keep_all = shard, keep_all
        self.rule, self.spec = rule, spec
        self.write_to(path, every, interval)
        self._last = (time.monotonic(), store.version)  # when, at which version
        self.said: str | None = None  # what `start` did about a checkpoint at the path

    def write_to(self, path: str | Path | None, every: int, interval: float) -> None:
        """Checkpoint to `path` (None: never) every `every` updates and `interval` seconds;
        a shard to its own file beside the group's `path`, an ssgd group's shards all at
        the same versions (group_checkpoints.py). A backup replica that took over calls
        it with the path it had none of until then (minips/ops/replication.py)."""
        if self.shard is not None and path:
            path = shard_path(path, self.shard[0])
            if self.rule == "ssgd":  # one consistent point for the group
                every, interval = every or GROUP_SSGD_EVERY, 0.0
        self.path, self.every, self.interval = path, every, interval

    def start(self, resume: str | Path | None = None) -> str | None:
        """Resume from `resume` (None: from nothing), then keep the model already at the
        checkpoint path: a lone server resumes from it or writes beside it
        (minips.ops.checkpoint_keep). Returns the line that says which (None: nothing
        was there), which `said` keeps."""
        if resume:
            self.resume(resume)
        if self.shard is None and self.path:
            kept = keep_trained(Path(self.path), resume or None, lambda: self.store.version,
                                self.resume)  # fmt: skip
            self.path, self.said = kept.path, kept.line
            if kept.line:
                log.info("%s", kept.line)
        return self.said

    def resume(self, path: str | Path) -> None:
        """Start from a checkpoint: parameters, versions, optimizer state, and the update and
        sample counts (a sample budget goes on where the checkpoint left it). A shard takes
        its slices of a whole model's (or group's) checkpoint; a group's checkpoint that
        was never assembled is assembled from its shards' files first."""
        if self.shard is not None and not Path(path).exists() and shard_files(path):
            assemble(path)
        checkpoint = load_checkpoint(path)
        if self.shard is not None:
            checkpoint = Checkpoint(checkpoint.path, slicer(self.store, self.shard)(
                checkpoint.arrays), checkpoint.meta)  # fmt: skip
        meta = restore_store(self.store, checkpoint)
        if self.rule_state is not None and meta.get("rule") == self.rule_state.name:
            self.rule_state.load_state(checkpoint.section("rule/"))
        elif checkpoint.section("rule/"):
            log.info("%s holds state of rule %s, not %s: not resumed", path, meta.get("rule"),
                     self.rule)  # fmt: skip
        self.counters.updates = meta.get("updates", 0)
        self.counters.samples = meta.get("samples", 0)
        self._last = (time.monotonic(), self.store.version)
        log.info("resumed from %s at version %d (%s)", path, self.store.version, meta)

    def save(self, periodic: bool = False) -> Path:
        """Write a checkpoint to the checkpoint path now (ConfigError without one).
        periodic: one of the every-N-updates or every-S-seconds ones, logged at debug level
        (a shard's terminal shows its start, joins, restarts and stop, not every one)."""
        if self.path is None:
            raise ConfigError("no checkpoint path configured")
        counters = self.counters
        meta = {"rule": self.rule, "updates": counters.updates, "samples": counters.samples,
                "time": time.time(), "spec": self.spec}  # fmt: skip
        if self.shard is not None:
            meta["shard"] = {"shard": self.shard[0], "servers": self.shard[1]}
        state = self.rule_state.state() if self.rule_state is not None else {}
        extra = {f"rule/{key}": array for key, array in state.items()}
        path = save_store(self.store, self.path, meta, extra, keep_previous=True)
        if self.keep_all:  # a second name for the same file: no copy, no second write
            versioned = versioned_path(path, self.store.version)
            versioned.unlink(missing_ok=True)
            os.link(path, versioned)
        level = logging.DEBUG if periodic else logging.INFO
        log.log(level, "checkpoint at version %d -> %s", self.store.version, path)
        return path

    def after_update(self, version: int) -> None:
        """The update-count checkpoint: at every `every`-th version. One that cannot be
        written (a full disk) is logged, not raised: the update it follows is applied and
        its pushes get their answers; the next one tries again."""
        if not (self.path and self.every and version % self.every == 0):
            return
        try:
            self.save(periodic=True)
        except OSError as exc:
            log.error("checkpoint at version %d not written (%s); training goes on, the next "
                      "one tries again", version, exc)  # fmt: skip

    def if_due(self, now: float) -> None:
        """The time-based checkpoint: due once `interval` seconds passed since the last one
        (or the start) and the model changed since, so an idle stretch (a restarted server
        waiting for its workers' hellos) does not put it off by another interval (written
        atomically: a crash leaves the previous one, docs/protocol.md 7)."""
        last, version = self._last
        if not (self.interval and self.path) or now - last < self.interval:
            return
        if self.store.version == version:
            return
        # Noted first, with the version of the last one written: one that fails (a full
        # disk) is tried again an interval later, not on every turn of the loop, even when
        # no update comes meanwhile (minips/server/timers.py logs and counts the failure).
        self._last = (now, version)
        self.save(periodic=True)
        self._last = (now, self.store.version)


__all__ = ["Checkpointer", "assemble", "shard_files", "shard_path", "slicer", "versioned_path"]
