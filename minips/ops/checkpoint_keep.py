"""A trained model is never replaced by an older one: where a server's checkpoints go.

A server started on a checkpoint path that already holds a checkpoint (`minips server
--config RUN/config.json` after the run ended: RUN/checkpoint.npz is the trained model)
would otherwise write its own, older, model over it when it checkpoints or stops. So,
when it starts (docs/protocol.md 5.8):

- told to resume from nothing, it resumes from the checkpoint at its path, as `--resume
  PATH` would, and goes on from that version;
- when that file is damaged, it resumes from the one written before it
  (checkpoint_file.previous_path), the newest whole one, as a run's crash recovery does
  (minips/run/recovery.py), and its checkpoints go to its path: the damaged file is
  replaced by the first one (the previous file stays, a file whose version cannot be
  read never pushing out one that can);
- when that cannot be (the file is damaged, or of another model), or it resumed from
  another checkpoint of a lower version than the one at its path, its checkpoints go
  beside it, to the first free `beside_path` (run.npz -> run.2.npz), and the file at its
  path is left as it is; told to resume from nothing, it then starts untrained, at version 0.

It says which in one line (`StartCheckpoint.line`). A shard of a server group writes its
own file and is not covered here (minips/ops/group_checkpoints.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minips.errors import DataError, MinipsError
from minips.ops.checkpoint_file import file_version, previous_path


@dataclass(frozen=True)
class StartCheckpoint:
    """What a server does about the checkpoint at its path: where its checkpoints go
    (`path`) and the one line that says so (None: nothing was there to keep)."""

    path: Path
    line: str | None = None


def beside_path(path: str | Path) -> Path:
    """The first name beside `path` that neither a checkpoint nor its previous file uses:
    run.npz -> run.2.npz (then run.3.npz, ...)."""
    path = Path(path)
    number = 2
    while True:
        beside = path.with_name(f"{path.stem}.{number}{path.suffix}")
        if not beside.exists() and not previous_path(beside).exists():
            return beside
        number += 1


def keep_trained(
    path: Path, resume: str | Path | None, version: Callable[[], int], resume_from: Callable
) -> StartCheckpoint:
    """Where a lone server with checkpoint path `path` writes, after its resume (`resume`:
    what it was told to resume from, already done; None: nothing): see the module
    docstring. version(): the server's version now; resume_from(path): resume from it
    (MinipsError, changing nothing, when it cannot)."""
    held = file_version(path)
    if not path.exists() or (resume is not None and _same_file(resume, path)):
        return StartCheckpoint(path)
    if resume is None:
        try:
            resume_from(path)
        except MinipsError as exc:
            reason = str(exc)
            if isinstance(exc, DataError) and (
                line := _resume_previous(path, version, resume_from)
            ):
                return StartCheckpoint(path, line)
        else:
            return StartCheckpoint(
                path,
                f"resumed from {path} at version {version()}, the model already there (a "
                "server never writes an older model over it; --resume FILE or another "
                "--checkpoint starts elsewhere)",
            )
    elif held is not None and held <= version():
        return StartCheckpoint(
            path, f"{path} (version {held}) is replaced: this server resumed from {resume}"
            f" at version {version()}",
        )  # fmt: skip
    else:
        reason = f"it holds version {held}, this server resumed from {resume} at {version()}"
    beside = beside_path(path)
    untrained = " and it starts untrained, at version 0" if resume is None else ""
    return StartCheckpoint(
        beside,
        f"{path} is left as it is ({reason}): this server's checkpoints go to {beside}{untrained}",
    )


def _resume_previous(path: Path, version: Callable[[], int], resume_from: Callable) -> str | None:
    """Resume from the checkpoint written before the damaged one at `path`; the line that
    says so (None, changing nothing, when there is none or it is damaged too)."""
    previous = previous_path(path)
    if not previous.exists():
        return None
    try:
        resume_from(previous)
    except MinipsError:
        return None
    return (f"{path} is damaged: resumed from {previous} at version {version()}, the newest "
            f"whole checkpoint; this server's checkpoints replace the damaged file")  # fmt: skip


def _same_file(one: str | Path, other: Path) -> bool:
    return Path(one).resolve() == other.resolve()
