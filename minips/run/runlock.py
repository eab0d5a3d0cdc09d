"""A run directory belongs to one live run: an OS file lock on RUN_DIR/run.lock.

The process that owns a run directory (`minips run`, `minips launch`'s coordinator, a
`minips server` a user started on a run's config or checkpoint) `claim`s it: an exclusive
flock(2), granted only when no live process holds the file, then held shared for the
owner's life. The servers a launcher starts there `join` it: a shared lock, granted beside
the owner's. A new claim is refused while any of them lives, with one line naming the
owner (its pid and command, which it writes into the file); the kernel drops a process's
lock when it exits or dies, so a crash never leaves a stale lock and `--force` replaces a
finished or dead run. The file itself stays: removing it would let a second run lock a new
file of the same name while the first still holds the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path
from typing import IO, Any

from minips.errors import RunDirError

LOCK_NAME = "run.lock"


class RunLock:
    """A held lock on one run directory (module docstring); `release()` or `with` drops
    it, as does the process's end (and dropping the object: its file is closed)."""

    def __init__(self, directory: Path, file: IO[str]) -> None:
        self.directory, self._file = directory, file

    @classmethod
    def claim(cls, directory: str | Path, option: str) -> RunLock:
        """Own `directory` (made if missing): RunDirError, changing nothing in it, when a
        live run holds it. option: how the user named it (`--out`), for the error."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        file = _open(directory)
        if not _try(file, fcntl.LOCK_EX) or not _try(file, fcntl.LOCK_SH):
            raise _in_use(directory, option, file)
        file.seek(0)
        file.truncate()
        file.write(f"pid {os.getpid()}: {_command()}\n")
        file.flush()
        return cls(directory, file)

    @classmethod
    def join(cls, directory: str | Path, option: str) -> RunLock:
        """Hold `directory` beside its owner (a launched server): refused only while
        another claim is being made."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        file = _open(directory)
        if not _try(file, fcntl.LOCK_SH):
            raise _in_use(directory, option, file)
        return cls(directory, file)

    def release(self) -> None:
        self._file.close()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def check_not_live(directory: str | Path, option: str) -> None:
    """RunDirError when a live run holds `directory`; creates nothing."""
    path = Path(directory) / LOCK_NAME
    if not path.is_file():
        return
    with path.open("r") as file:
        if not _try(file, fcntl.LOCK_EX):
            raise _in_use(Path(directory), option, file)


def _open(directory: Path) -> IO[str]:
    path = directory / LOCK_NAME
    try:
        return path.open("a+")
    except OSError as exc:
        raise RunDirError(f"{directory}: cannot lock it ({exc.strerror})") from None


def _try(file: IO[str], kind: int) -> bool:
    try:
        fcntl.flock(file.fileno(), kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _in_use(directory: Path, option: str, file: IO[str]) -> RunDirError:
    """The one-line refusal, naming the owner from what it wrote in the file; closes it."""
    file.seek(0)
    owner = file.read().strip().splitlines()[:1]
    file.close()
    who = f" (started as {owner[0][:160]})" if owner else ""
    return RunDirError(
        f"{option} {directory} is in use by a live run{who}; wait for it to end or "
        "choose another directory"
    )


def _command() -> str:
    """This process's command line as a user would type it: `minips run --out ...`."""
    return " ".join(["minips", *sys.argv[1:]])


def server_locks(paths: list[str | Path | None], launched: bool) -> contextlib.ExitStack:
    """The locks `minips server` holds while it serves: on each run directory (one holding
    config.json) that holds one of `paths` (its --config file, its checkpoint). Joined when
    `launched` (a launcher, which owns the directory, started it), else claimed: a server a
    user starts on a live run's files is refused. Enter the returned stack; it releases
    them."""
    stack = contextlib.ExitStack()
    take = RunLock.join if launched else RunLock.claim
    try:
        for directory in _run_directories(paths):
            stack.enter_context(take(directory, "the run directory"))
    except BaseException:
        stack.close()
        raise
    return stack


def _run_directories(paths: list[str | Path | None]) -> list[Path]:
    """The distinct run directories (holding config.json) the files `paths` lie in."""
    found: dict[Path, Path] = {}
    for path in paths:
        if path:
            directory = Path(path).parent
            if (directory / "config.json").is_file():
                found.setdefault(directory.resolve(), directory)
    return list(found.values())
