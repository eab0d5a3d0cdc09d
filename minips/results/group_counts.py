"""What a server group's kept model trained: the counts of its shard furthest behind.

Each shard counts the samples and updates it applied (its last `stats`), and the group
checkpoint a run keeps is each shard's final slices. A shard that restarted from an older
checkpoint (minips.run.recovery) lost the updates after it on its own: its slices then
trained fewer samples than the other shards'. Every slice of the kept model has the fewest
of those counts, and those are the run's `samples` and `updates` (`kept_counts`); `behind`
names the shard behind, the shard ahead and by how much, and `behind_line` says it. Without
a restart the root's counts are the run's, as with one server (a shard whose parameters a
plan pushes less often counts fewer pushes, not fewer samples in its slices).
"""

from __future__ import annotations

from typing import Any


def kept_counts(finals: list[dict[str, Any]], restarts: list[dict[str, Any]]) -> dict[str, Any]:
    """{"samples", "updates", "behind"} of the model a run keeps, from each server's last
    `stats` (`finals`, shard order) and the run's restart records: the root's counts and
    no `behind`, unless a group's shards, after a restart, ended apart; then the fewest of
    each, and `behind` = {"shard", "of", "samples", "updates"}: the shard with the fewest
    samples, the one with the most, and how many samples and updates the first lacks."""
    root = finals[0] if finals else {}
    counts = {"samples": root.get("samples"), "updates": root.get("updates"), "behind": None}
    known = all(_count(f.get("samples")) and _count(f.get("updates")) for f in finals)
    if len(finals) < 2 or not restarts or not known:
        return counts
    order = sorted(range(len(finals)), key=lambda j: (finals[j]["samples"], finals[j]["updates"]))
    low, high = finals[order[0]], finals[order[-1]]
    fewest = min(f["updates"] for f in finals)
    if low["samples"] == high["samples"] and fewest == high["updates"]:
        return counts
    behind = {"shard": order[0], "of": order[-1], "samples": high["samples"] - low["samples"],
              "updates": high["updates"] - fewest}  # fmt: skip
    return {"samples": low["samples"], "updates": fewest, "behind": behind}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def behind_line(behind: dict[str, Any] | None) -> str | None:
    """The one line a summary's `behind` makes (None: the shards agree)."""
    if not behind:
        return None
    return (f"shard {behind['shard']} is {behind['samples']} samples and {behind['updates']} "
            f"updates behind shard {behind['of']} (a restart lost them): the run's samples "
            f"and updates are the fewest, which every slice of the kept model trained")  # fmt: skip
