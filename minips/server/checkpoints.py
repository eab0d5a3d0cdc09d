"""When the server writes checkpoints, what goes into their meta, and resuming from one;
a server group's checkpoint, made of its shards' files.

A checkpoint is the store's (parameters, their versions, the optimizer's state:
ParameterStore.save, written atomically) plus the counters a resumed run goes on from
(updates, samples). The server asks for one every `checkpoint_every` updates
(`after_update`), every `checkpoint_interval` seconds when the version moved (`if_due`), on
an operator's request and at shutdown (`save`).

In a server group (docs/protocol.md 16) each shard writes its own slices to its own file,
`shard_path(checkpoint, j)` (run.npz -> run-shard1.npz). `assemble` makes the *group
checkpoint* from them: a whole-model checkpoint at `checkpoint` like a plain server's, which
any command reads, and from which every shard of a group of any size takes its slices
(`slicer`). Under ssgd every shard of a group checkpoints at the same versions (every
`checkpoint_every` updates, keeping the one before): the shards' versions never differ by
more than one round, so a version all of them saved exists and the group checkpoint is one
consistent point. Under the other rules each shard's latest is taken: consistent per shard,
the group's meta says so (`group.consistent`).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from minips.errors import ConfigError

if TYPE_CHECKING:
    from minips.server.store import ParameterStore
    from minips.server.telemetry import Counters

log = logging.getLogger("minips.server")


class Checkpointer:
    """The checkpoints of one server's store (see the module docstring).

    path: where they go (None: nowhere; `save` is then a ConfigError). every: every this
    many updates (0: never). interval: every this many seconds (0: never). rule, spec:
    recorded in each checkpoint's meta (the rule's name, the model's spec).
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
        shard: tuple[int, int] | None = None,
    ) -> None:
        self.store, self.counters = store, counters
        self.rule, self.spec, self.shard = rule, spec, shard
        self.keep_previous = False
        if shard is not None and path:
            path = shard_path(path, shard[0])
            if rule == "ssgd":  # one consistent point for the group (module docstring)
                every, interval, self.keep_previous = every or GROUP_SSGD_EVERY, 0.0, True
        self.path, self.every, self.interval = path, every, interval
        self._last = (time.monotonic(), store.version)  # when, at which version

    def resume(self, path: str | Path) -> None:
        """Start from a checkpoint: parameters, versions, optimizer state, and the update and
        sample counts (a sample budget goes on where the checkpoint left it). A shard takes
        its slices of a whole model's (or group's) checkpoint; a group's checkpoint that
        was never assembled is assembled from its shards' files first."""
        path = Path(path)
        if not path.exists() and shard_files(path):
            assemble(path)
        adapt = slicer(self.store, self.shard) if self.shard is not None else None
        meta = self.store.load(path, adapt)
        self.counters.updates = meta.get("updates", 0)
        self.counters.samples = meta.get("samples", 0)
        self._last = (time.monotonic(), self.store.version)
        log.info("resumed from %s at version %d (%s)", path, self.store.version, meta)

    def save(self) -> Path:
        """Write a checkpoint to the checkpoint path now (ConfigError without one)."""
        if self.path is None:
            raise ConfigError("no checkpoint path configured")
        counters = self.counters
        meta = {"rule": self.rule, "updates": counters.updates, "samples": counters.samples,
                "time": time.time(), "spec": self.spec}  # fmt: skip
        if self.shard is not None:
            meta["shard"] = {"shard": self.shard[0], "servers": self.shard[1]}
        if self.keep_previous and Path(self.path).exists():
            os.replace(self.path, previous_path(self.path))
        path = self.store.save(self.path, meta)
        log.info("checkpoint at version %d -> %s", self.store.version, path)
        return path

    def after_update(self, version: int) -> None:
        """The update-count checkpoint: at every `every`-th version."""
        if self.path and self.every and version % self.every == 0:
            self.save()

    def if_due(self, now: float) -> None:
        """The time-based checkpoint: every `interval` seconds, if anything changed
        (written atomically: a crash leaves the previous one, docs/protocol.md 7)."""
        last, version = self._last
        if not (self.interval and self.path) or now - last < self.interval:
            return
        if self.store.version != version:
            self.save()
        self._last = (now, self.store.version)


GROUP_SSGD_EVERY = 50  # an ssgd group's shards checkpoint every this many rounds by default


def shard_path(path: str | Path, shard: int) -> Path:
    """Shard `shard`'s own checkpoint file beside the group's: run.npz -> run-shard1.npz."""
    path = Path(path)
    return path.with_name(f"{path.stem}-shard{shard}{path.suffix}")


def previous_path(path: str | Path) -> Path:
    """The checkpoint a shard wrote before its latest: run-shard1.npz -> run-shard1.prev.npz."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def shard_files(path: str | Path) -> list[Path]:
    """The shard files of the group checkpoint `path`, shard 0 first ([] when none is there)."""
    found = []
    while shard_path(path, len(found)).exists():
        found.append(shard_path(path, len(found)))
    return found


def slicer(store: ParameterStore, shard: tuple[int, int]) -> Any:
    """How a shard reads a checkpoint (ParameterStore.load's `adapt`): its own file as it
    is; a whole model's (or an assembled group's) by taking the parameters it holds and its
    slices' rows of them (and of their velocities), at its own version when the file is of
    a group of this size."""
    index, servers = shard

    def adapt(contents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prefixes = ("param/", "param_version/", "optim/velocity/")
        others = [
            k for k in contents if k.startswith(prefixes) and k.split("/")[-1] not in store.slices
        ]
        adapted = {key: value for key, value in contents.items() if key not in others}
        for name, piece in store.slices.items():
            if piece.whole:
                continue
            for key in (f"param/{name}", f"optim/velocity/{name}"):
                if key in adapted and adapted[key].shape == piece.full_shape:  # the whole one
                    adapted[key] = np.ascontiguousarray(piece.of(adapted[key]))
        group = json.loads(str(contents["meta"])).get("group") or {}
        if len(group.get("versions") or []) == servers:
            version = group["versions"][index]
            adapted["version"] = np.array(version, np.int64)
            for name in store.slices:
                key = f"param_version/{name}"
                adapted[key] = np.minimum(adapted[key], version)
        return adapted

    return adapt


def assemble(path: str | Path) -> Path | None:
    """Write the group checkpoint `path` from its shards' files (module docstring); None
    when some shard's file is missing. Its meta: the root's, plus `group` = {servers,
    versions (each shard's), consistent (every shard at one version)}."""
    from minips.nn import build_model
    from minips.protocol.partition import partition_of_model

    files = shard_files(path)
    if not files:
        return None
    shards = [_candidates(f) for f in files]
    meta = json.loads(str(shards[0][0]["meta"]))
    servers = meta.get("shard", {}).get("servers", len(files))
    if len(files) < servers:
        return None
    common = set.intersection(*({int(c["version"]) for c in cands} for cands in shards))
    chosen = [
        next(c for c in cands if int(c["version"]) == max(common)) if common else cands[0]
        for cands in shards
    ]
    spec = meta.get("spec") or {}
    model = build_model(spec["name"], seed=0, **spec.get("kwargs", {}))
    part = partition_of_model(model.params, servers)
    versions = [int(c["version"]) for c in chosen]
    arrays: dict[str, np.ndarray] = {}
    for kind in ("param", "optim/velocity"):
        for name in part.shapes:
            pieces = {j: chosen[j][f"{kind}/{name}"] for j in range(servers)
                      if f"{kind}/{name}" in chosen[j]}  # fmt: skip
            if pieces:
                arrays[f"{kind}/{name}"] = part.assemble(name, pieces)
    for name in part.shapes:
        arrays[f"param_version/{name}"] = np.array(
            max(int(chosen[s.shard][f"param_version/{name}"]) for s in part.slices(name)), np.int64
        )
    meta["group"] = {"servers": servers, "versions": versions,
                     "consistent": len(set(versions)) == 1}  # fmt: skip
    meta.pop("shard", None)
    arrays["meta"] = np.array(json.dumps(meta))
    arrays["version"] = np.array(versions[0], np.int64)
    return _write_atomically(Path(path), arrays)


def _candidates(path: Path) -> list[dict[str, np.ndarray]]:
    """A shard's latest checkpoint and the one before it (if kept), newest first."""
    from minips.server.store import read_checkpoint

    found = [read_checkpoint(path)]
    if previous_path(path).exists():
        found.append(read_checkpoint(previous_path(path)))
    return found


def _write_atomically(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            np.savez(file, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
