"""A group resumed from slices of different versions is said, not hidden.

A server group's shards never exchange parameters (docs/protocol.md 16.9), so shards that
stopped at different versions (one SIGKILLed mid-run, its file left behind the others')
leave files that are together a *mix*: each slice at its own shard's version. Resuming
from them goes on from each shard's own version, as the recovery in docs/running.md
("Server groups by hand") says to; what must not happen is resuming so without a word.
`mixed_shards_line` says it of the shard files a group resumes from, `mixed_checkpoint_line`
of a group checkpoint whose meta says its shards ended at different versions
(`group.consistent` false, minips.ops.group_checkpoints); each line follows `warning: `.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from minips.ops.checkpoint_file import file_version


def mix_of(versions: list[int]) -> str | None:
    """'a mix of versions 112 and 92 (shard 0 at 112, shard 1 at 92)' when `versions`
    (shard j's at j) differ; None when they agree."""
    if len(set(versions)) < 2:
        return None
    each = ", ".join(f"shard {j} at {v}" for j, v in enumerate(versions))
    distinct = sorted(set(versions), reverse=True)
    return (f"a mix of versions {', '.join(map(str, distinct[:-1]))} and {distinct[-1]} "
            f"({each})")  # fmt: skip


def mixed_shards_line(resumes: list[str | None]) -> str | None:
    """The line for a group whose shard j resumes from `resumes[j]` (None: from the start),
    when they are files of different versions; a group resuming every shard from one
    file is `mixed_checkpoint_line`'s."""
    files = {path for path in resumes if path}
    if len(files) == 1 and len(resumes) == sum(1 for path in resumes if path):
        return mixed_checkpoint_line(files.pop())
    versions = [(file_version(path) if path else 0) or 0 for path in resumes]
    mix = mix_of(versions)
    if mix is None:
        return None
    return (f"the group resumes {mix}, each shard from its own file (a shard stopped "
            "before the others: its slices lost the updates the others kept; docs/"
            "running.md, server groups by hand)")  # fmt: skip


def mixed_checkpoint_line(path: str | Path) -> str | None:
    """The line for resuming from `path` when it is a group checkpoint whose shards ended
    at different versions (its meta's `group`); None for any other file (one that cannot
    be read is refused by its load, which says why)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            group = json.loads(str(data["meta"])).get("group") or {}
    except (OSError, KeyError, ValueError, TypeError, AttributeError):
        return None
    if not isinstance(group, dict):
        return None  # a meta minips did not write: nothing to say of a mix
    if group.get("consistent", True):
        return None
    versions = group.get("versions")
    if not isinstance(versions, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in versions
    ):
        return None
    mix = mix_of(versions)
    return mix and (f"{path} is {mix}: its group's shards ended at different versions, "
                    "and every slice resumes at its own")  # fmt: skip
