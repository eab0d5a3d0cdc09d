"""A root's watch of its shards: one that joined and then went silent is gone.

A shard joins its root every JOIN_INTERVAL s while it serves (minips.group.shard.Joiner);
those joins are the root's heartbeat of its shards as its replies are theirs of it. A shard
whose joins stopped for the root's shard timeout (its process killed, crashed or stopped by
hand, its machine gone) no longer serves its slices, and no worker can train without
them: the root then ends with ShardGone, one `error:` line naming the shard, rather than
serve on with no worker. It ends at once, its checkpoint not written again (a MinipsError
ends the server loop before its final checkpoint, minips/ops/timers.py), so its own file
is never put past the lost shard's last one: under ssgd both stay at one version. A
shard that restarted in time (a launcher's recovery, a backup replica taking over)
joins again and is not gone.
"""

from __future__ import annotations

from typing import Any, Protocol

from minips.errors import MinipsError


class JoinTable(Protocol):
    """The root's record of its group's joins (minips.group.shard.RootTable)."""

    def silent(self, now: float, timeout: float) -> list[int]: ...

    def addresses(self) -> list[str | None]: ...


class ShardGone(MinipsError):
    """Shard `shard` of a root's group sent no join for `timeout` s (module docstring)."""

    def __init__(self, shard: int, address: str | None, timeout: float,
                 checkpoint: str | None) -> None:  # fmt: skip
        line = (f"shard {shard} of the server group ({address}) sent no join for "
                f"{timeout:g} s (its process ended?): its slices are no longer served, so "
                "the group's root stops")  # fmt: skip
        if checkpoint:
            line += (f"; its checkpoint {checkpoint} is kept as last written, not written "
                     f"again past shard {shard}'s")  # fmt: skip
        super().__init__(line)
        self.shard = shard


def check_joins(
    table: JoinTable, now: float, timeout: float | None, checkpoints: Any = None
) -> None:
    """ShardGone for the first shard of `table` silent for `timeout` s (None: never gone);
    `checkpoints`: the root's checkpointer, whose file the line names."""
    if timeout is None:
        return
    for shard in table.silent(now, timeout):
        path = getattr(checkpoints, "path", None)
        raise ShardGone(shard, table.addresses()[shard], timeout, str(path) if path else None)
