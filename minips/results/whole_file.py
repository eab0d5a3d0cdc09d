"""Files written whole or not at all: a reader that opens one while a run stops, or after a
run was killed mid-write, finds either the previous content or the new one, never a part."""

from __future__ import annotations

import os
from pathlib import Path


def partial_path(path: Path) -> Path:
    """Where `path` is written before it is renamed into place: a hidden file beside it
    (same folder, so the rename is atomic; `.NAME.partial`, an output a new run clears)."""
    return path.with_name(f".{path.name}.partial")


def write_whole(path: str | Path, text: str) -> None:
    """Write `text` to `path` beside its place, then rename it there (os.replace is atomic
    on POSIX within one file system). The folder is made if it is new."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
