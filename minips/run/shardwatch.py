"""The shard processes of a server group served by hand from one machine (`minips server
--servers K`, minips.run.servergroup), watched: one that dies is said, and the group
checkpoint is not written over it.

A shard process that dies (a crash, SIGKILL, the OOM killer) is not restarted here (`minips
run` restarts its shards: minips.run.recovery): its slices are no longer served, and its
own checkpoint file holds an older version than the others' final ones. So `ShardWatch`
says it, once, in one `warning:` line as soon as it is seen (every `EVERY` s while the
root serves), and once the group stopped, `dead_shards_error` is the group's `error:` line
naming each shard that did not stop with its root: the group checkpoint, which would put
that shard's last file beside the others' final ones, is then not written (each shard's
own file stays). A shard that stops as told (its root's stop, SIGTERM or SIGINT) exits 0,
also when the root's SIGTERM finds it already stopped on its way out (it ignores the
signals once stopped: `minips server`'s `serve`).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import click

from minips.errors import MinipsError

EVERY = 0.5  # seconds between two looks at the shard processes


class ShardWatch:
    """While inside, a thread looks at shards 1..K-1 (`shards`, in order) and says each
    one that died (exited non-zero) in one `warning:` line."""

    def __init__(self, shards: list[subprocess.Popen], every: float = EVERY) -> None:
        self.shards = shards
        self.every = every
        self.said: set[int] = set()  # the shards already said
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shard-watch", daemon=True)

    def __enter__(self) -> ShardWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._done.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._done.wait(self.every):
            self.look()

    def look(self) -> None:
        """Say each shard that died since the last look."""
        for shard, proc in enumerate(self.shards, start=1):
            code = proc.poll()
            if code not in (None, 0) and shard not in self.said:
                self.said.add(shard)
                click.echo(
                    f"warning: shard {shard} (pid {proc.pid}) exited with code {code} while "
                    "the group served; it is not restarted, so its slices are no longer "
                    "served (stop the group and resume it from its shards' checkpoints)",
                    err=True,
                )


def dead_shards_error(shards: list[subprocess.Popen], checkpoint: str | None) -> MinipsError | None:
    """Once every shard process has exited: the group's error naming each shard that did
    not stop with its root (exit code not 0), saying the group checkpoint is not written;
    None when all stopped."""
    dead = [(j, proc) for j, proc in enumerate(shards, start=1) if proc.returncode != 0]
    if not dead:
        return None
    names = ", ".join(
        f"shard {j} (pid {proc.pid}, exit code {proc.returncode})" for j, proc in dead
    )
    line = f"{names} did not stop with the group"
    if checkpoint:
        own = Path(checkpoint).with_name(f"{Path(checkpoint).stem}-shard*{Path(checkpoint).suffix}")
        line += (f": the group checkpoint {checkpoint} is not written, as it would put that "
                 f"shard's last checkpoint beside the others' final ones (each shard's own "
                 f"file is kept: {own})")  # fmt: skip
    return MinipsError(line)
