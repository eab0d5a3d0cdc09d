"""A server group's checkpoints: each shard's own file, and the group's, made of them.

In a server group (docs/protocol.md 16) each shard writes its own slices (and its rule's
state over them) to its own file, `shard_path(checkpoint, j)` (run.npz -> run-shard1.npz).
`assemble` makes the *group checkpoint* from them: a whole-model checkpoint at `checkpoint`
like a plain server's, which any command reads, and from which every shard of a group of
any size takes its slices (`slicer`). Under ssgd every shard of a group checkpoints at the
same versions (every `checkpoint_every` updates, keeping the one before): the shards'
versions never differ by more than one round, so a version all of them saved exists and
the group checkpoint of a group stopped midway (a crash) is one consistent point. Under the
other rules each shard's latest is taken: consistent per shard, the group's meta says so
(`group.consistent`). At the end of a run (`final`) every shard wrote its last file at
shutdown and those are taken, whatever their versions: the group checkpoint is the model
the run ended with; shards at different versions (a restarted shard resumed from an older
checkpoint than its peers kept) are said in the meta and in one line (`GroupCheckpoint
.torn_line`), never hidden behind an older common version. The group checkpoint holds no
rule state (the rules' state is per shard's slices); a group resumed from it starts its
rules afresh.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from minips.errors import DataError
from minips.ops.checkpoint_file import load_checkpoint, previous_path, write_checkpoint

if TYPE_CHECKING:
    from minips.state.store import ParameterStore


GROUP_SSGD_EVERY = 50  # an ssgd group's shards checkpoint every this many rounds by default


def shard_path(path: str | Path, shard: int) -> Path:
    """Shard `shard`'s own checkpoint file beside the group's: run.npz -> run-shard1.npz."""
    path = Path(path)
    return path.with_name(f"{path.stem}-shard{shard}{path.suffix}")


def shard_files(path: str | Path) -> list[Path]:
    """The shard files of the group checkpoint `path`, shard 0 first ([] when none is there)."""
    found = []
    while shard_path(path, len(found)).exists():
        found.append(shard_path(path, len(found)))
    return found


def slicer(store: ParameterStore, shard: tuple[int, int]) -> Any:
    """How a shard reads a checkpoint (before `restore_store`): its own file as it
    is; a whole model's (or an assembled group's) by taking the parameters it holds and its
    slices' rows of them (and of their velocities, and of the rule's state per parameter,
    `rule/.../PARAM`: minips/ops/rule_state.py), at its own version when the file is of a
    group of this size."""
    index, servers = shard

    def adapt(contents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        model = {key[len("param/") :] for key in contents if key.startswith("param/")}
        prefixes = ("param/", "param_version/", "optim/velocity/")
        others = [
            k for k in contents if k.startswith((*prefixes, "rule/"))
            and k.split("/")[-1] in model - set(store.slices)
        ]  # fmt: skip
        adapted = {key: value for key, value in contents.items() if key not in others}
        for key in adapted:
            name = key.split("/")[-1]
            piece = store.slices.get(name)
            if piece is None or piece.whole or not key.startswith(("param/", "optim/", "rule/")):
                continue
            if adapted[key].shape == piece.full_shape:  # the whole one: this shard's rows
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


@dataclass(frozen=True)
class GroupCheckpoint:
    """A group checkpoint written by `assemble`: its file and each shard's version in it."""

    path: Path
    versions: list[int]

    @property
    def consistent(self) -> bool:
        return len(set(self.versions)) == 1

    def torn_line(self) -> str | None:
        """One line when the shards are at different versions (None when they agree)."""
        if self.consistent:
            return None
        each = ", ".join(f"shard {j} at {v}" for j, v in enumerate(self.versions))
        spread = max(self.versions) - min(self.versions)
        return (f"the server group's shards ended at different versions ({each}: "
                f"{spread} apart); {self.path} holds each one's final slices")  # fmt: skip

    def record(self) -> dict[str, object]:
        """What a run's summary keeps of it (`group`)."""
        return {"checkpoint": str(self.path), "versions": self.versions,
                "consistent": self.consistent, "torn": self.torn_line()}  # fmt: skip


def assemble(path: str | Path, final: bool = False) -> GroupCheckpoint | None:
    """Write the group checkpoint `path` from its shards' files (module docstring): the
    last version every shard saved, or with `final` each shard's last file. None when some
    shard's file is missing. Its meta: the root's, plus `group` = {servers, versions (each
    shard's), consistent (every shard at one version)}; at different versions its samples
    and updates are the fewest of the shards' (a restart left one behind: results.group_counts)."""
    from minips.group.partition import partition_of_model
    from minips.nn import build_model

    files = shard_files(path)
    if not files:
        return None
    shards = [_candidates(f) for f in files]
    meta = json.loads(str(shards[0][0]["meta"]))
    servers = meta.get("shard", {}).get("servers", len(files))
    if len(files) < servers:
        return None
    common = set() if final else set.intersection(*({int(c["version"]) for c in cands}
                                                    for cands in shards))  # fmt: skip
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
    if not meta["group"]["consistent"]:  # what every slice trained: the shard behind's
        metas = [json.loads(str(c["meta"])) for c in chosen]
        for key in ("samples", "updates"):
            meta[key] = min(m.get(key, 0) for m in metas)
    meta.pop("shard", None)
    arrays["version"] = np.array(versions[0], np.int64)
    meta["arrays"] = sorted(arrays)  # the shards' rule state stays in their own files
    arrays["meta"] = np.array(json.dumps(meta))
    return GroupCheckpoint(write_checkpoint(path, arrays), versions)


def _candidates(path: Path) -> list[dict[str, np.ndarray]]:
    """A shard's latest checkpoint and the one before it (if kept and whole), newest first;
    DataError when neither is whole."""
    found, damaged = [], []
    for candidate in (path, previous_path(path)):
        if candidate.exists():
            try:
                found.append(load_checkpoint(candidate).arrays)
            except DataError as exc:
                damaged.append(exc)
    if not found:
        raise damaged[0] if damaged else DataError(f"checkpoint {path} does not exist")
    return found
