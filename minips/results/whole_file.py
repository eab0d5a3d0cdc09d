"""Files written whole or not at all: a reader that opens one while a run stops, or after a
run was killed mid-write, finds either the previous content or the new one, never a part."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from minips.errors import RunDirError


def partial_path(path: Path) -> Path:
    """Where `path` is written before it is renamed into place: a hidden file beside it
    (same folder, so the rename is atomic; `.NAME.partial`, an output a new run clears)."""
    return path.with_name(f".{path.name}.partial")


def write_whole(path: str | Path, text: str) -> None:
    """Write `text` to `path` beside its place, then rename it there (os.replace is atomic
    on POSIX within one file system). The folder is made if it is new. OSError (a full
    disk) leaves no partial file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    with removed_on_error(partial):
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)


@contextlib.contextmanager
def removed_on_error(partial: Path) -> Iterator[None]:
    """Remove `partial` (a file being written) when the block raises OSError, then re-raise:
    a write the disk refused leaves no part of a file behind."""
    try:
        yield
    except OSError:
        partial.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def results_written(kept: Path, path: Path) -> Iterator[None]:
    """RunDirError (one line: the file and the cause) for a run's results file `path` the
    system would not write (a full disk), saying whether the model the run trained is kept
    in its checkpoint `kept` (written before the results)."""
    try:
        yield
    except OSError as exc:
        model = f"the model is kept in {kept}" if kept.exists() else "no checkpoint is kept"
        raise RunDirError(f"cannot write {path}: {exc.strerror or exc}; {model}") from None
