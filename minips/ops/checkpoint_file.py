"""A checkpoint file: what it holds, reading and checking it, writing it atomically.

A checkpoint is one .npz archive (NumPy's zip of .npy arrays, no pickle) of these arrays:

    meta                      0-d str: a JSON object; `format` 1, `rule`, `updates`, `samples`,
                              `time` (seconds since the epoch), `spec` (the model's), `arrays`
                              (the names of all other arrays: one lost is damage)
    version                   0-d integer: the global version t, 0 <= t <= MAX_COUNT
    param/<name>              the parameter: float32, finite
    param_version/<name>      0-d integer: the version it last changed at, 0 <= . <= version
    optim/velocity/<name>     the optimizer's momentum buffer of <name> (when it has one)
    rule/...                  the update rule's own state (minips/ops/rule_state.py)

`read_checkpoint` turns every way a file can be damaged (missing, empty, truncated, a
flipped bit, not a zip, pickled objects) into a one-line DataError (a file that is no
archive at all is named so, before NumPy would take it for a pickle); `check_checkpoint` then
checks what the arrays say (missing keys, bad metadata, a negative version or one past
MAX_COUNT, NaN or Inf),
so a damaged checkpoint is refused before anything is served from it. Neither needs the
model: a server checks names and shapes against its own parameters afterwards
(`restore_store`), and a shard of a server group takes its slices in between.

`write_checkpoint` writes to a temporary file in the same directory and renames it over
the old one, so a crash leaves either the old checkpoint or the new one; with
`keep_previous` the old one is first linked to `previous_path(path)` (a hard link: `path`
stays in place until the new file replaces it), so an earlier good checkpoint survives
damage to the latest (minips.run.recovery falls back to it). The
previous file keeps the best earlier version: the old one takes its place only when it is
of no lower version than the previous file's (`replaces_previous`; a server that resumed
from the latest and stops at its version leaves both at that version); one whose version
cannot be read never pushes out one that can.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from minips.errors import DataError, ShapeError

if TYPE_CHECKING:
    from minips.state.store import ParameterStore

CHECKPOINT_FORMAT = 1
# The highest version, param_version, updates or samples count a checkpoint may hold
# (docs/protocol.md 6.1): a server that went on from one near 2^63 would overflow the
# int64 its next checkpoint writes, at the end of the run, and lose the run's training.
MAX_COUNT = 2**53 - 1
ZIP_MAGIC = b"PK\x03\x04"  # how an .npz (a zip archive) starts
NPY_MAGIC = b"\x93NUMPY"  # how one .npy array starts (refused below, by name)
SECTIONS = ("param/", "param_version/", "optim/", "rule/")  # besides `meta` and `version`

# What a damaged zip or .npy can raise while it is read (zipfile, zlib, NumPy's header
# parser); each becomes a one-line DataError.
# (RuntimeError: zipfile's "encrypted" flag, NotImplementedError: an unknown compression.)
DAMAGED = (OSError, EOFError, ValueError, KeyError, SyntaxError, OverflowError, RuntimeError,
           UnicodeError, zipfile.BadZipFile, zlib.error)  # fmt: skip


@dataclass
class Checkpoint:
    """A checkpoint as read and checked: its arrays by key, its meta, its version."""

    path: Path
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]

    @property
    def version(self) -> int:
        return int(self.arrays["version"])

    def section(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays under `prefix` ("optim/", "rule/"), keyed without it."""
        return {k[len(prefix) :]: v for k, v in self.arrays.items() if k.startswith(prefix)}

    def param_names(self) -> list[str]:
        return [key[len("param/") :] for key in self.arrays if key.startswith("param/")]

    def check_params(self, params: dict[str, np.ndarray]) -> None:
        """ShapeError unless it holds exactly the parameters `params` (name -> array), each
        of the same shape: a checkpoint of this model, not of another."""
        names = self.param_names()
        if sorted(names) != sorted(params):
            raise ShapeError(
                f"checkpoint {self.path} holds parameters {sorted(names)}, "
                f"the model has {sorted(params)}"
            )
        for name, param in params.items():
            saved = self.arrays[f"param/{name}"]
            if saved.shape != param.shape:
                raise ShapeError(
                    f"checkpoint {self.path}: {name} has shape {saved.shape}, "
                    f"the model has {param.shape}"
                )


def previous_path(path: str | Path) -> Path:
    """The checkpoint written before the latest: run.npz -> run.prev.npz."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def versioned_path(path: str | Path, version: int) -> Path:
    """A kept checkpoint of version `version` (--keep-checkpoints): run.npz -> run-v000120.npz."""
    path = Path(path)
    return path.with_name(f"{path.stem}-v{version:06d}{path.suffix}")


def read_checkpoint(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of a checkpoint (or model) file; DataError saying what is wrong when the
    file is missing, empty or damaged."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"checkpoint {path} does not exist")
    if path.stat().st_size == 0:
        raise DataError(f"checkpoint {path} is empty (0 bytes)")
    with path.open("rb") as file:
        start = file.read(len(NPY_MAGIC))
    if not start.startswith((ZIP_MAGIC, NPY_MAGIC)):
        raise DataError(f"checkpoint {path} is not an .npz archive (it starts with {start!r})")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not hasattr(loaded, "files"):  # a bare .npy array, not an archive of them
            raise DataError(f"checkpoint {path} is one .npy array, not an .npz archive")
        with loaded as data:
            return {key: data[key] for key in data.files}
    except DAMAGED as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"checkpoint {path} is damaged (truncated or altered): {reason}") from None


def check_checkpoint(path: str | Path, arrays: dict[str, np.ndarray]) -> Checkpoint:
    """The checkpoint `arrays` (read from `path`) checked; DataError naming the first
    thing wrong. See the module docstring for what a checkpoint holds."""
    path = Path(path)
    for key in ("meta", "version"):
        if key not in arrays:
            raise DataError(f"checkpoint {path} is damaged: it has no '{key}'")
    unknown = [k for k in arrays if k not in ("meta", "version") and not k.startswith(SECTIONS)]
    if unknown:
        raise DataError(f"checkpoint {path} is damaged: unknown array {unknown[0]!r}")
    meta = _meta(path, arrays["meta"])
    listed = meta.get("arrays")  # written since the list was added; absent in model files
    if listed is not None:
        lost = sorted(set(listed) - set(arrays))
        if lost:
            raise DataError(
                f"checkpoint {path} is damaged: it has no {lost[0]!r} (its meta lists it)"
            )
        unlisted = sorted(set(arrays) - set(listed) - {"meta"})
        if unlisted:
            raise DataError(f"checkpoint {path} is damaged: unknown array {unlisted[0]!r}")
    version = _count(path, "version", arrays["version"])
    names = [key[len("param/") :] for key in arrays if key.startswith("param/")]
    if not names:
        raise DataError(f"checkpoint {path} is damaged: it holds no parameter")
    for name in names:
        _finite(path, f"param/{name}", arrays[f"param/{name}"])
        key = f"param_version/{name}"
        if key not in arrays:
            raise DataError(f"checkpoint {path} is damaged: it has no '{key}'")
        if _count(path, key, arrays[key]) > version:
            raise DataError(f"checkpoint {path}: {key} is past the version {version}")
    for key, array in arrays.items():
        if key.startswith("param_version/") and f"param/{key[14:]}" not in arrays:
            raise DataError(f"checkpoint {path} is damaged: {key} without its parameter")
        if key.startswith("optim/velocity/"):
            param = arrays.get(f"param/{key[len('optim/velocity/') :]}")
            if param is None or np.shape(array) != param.shape:
                raise DataError(f"checkpoint {path}: {key} does not match a parameter")
            _finite(path, key, array)
        elif key.startswith(("optim/", "rule/")) and array.dtype.kind == "f":
            _finite(path, key, array)
    return Checkpoint(path, arrays, meta)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """`read_checkpoint` then `check_checkpoint` (a model file as a checkpoint at version 0)."""
    return check_checkpoint(path, from_model_file(read_checkpoint(path)))


def write_checkpoint(
    path: str | Path, arrays: dict[str, np.ndarray], keep_previous: bool = False
) -> Path:
    """Write `arrays` to `path` atomically (module docstring); the previous file is kept as
    `previous_path(path)` when `keep_previous`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            np.savez(file, **arrays)
        if keep_previous and replaces_previous(path):
            _keep_as_previous(path)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _keep_as_previous(path: Path) -> None:
    """Make the file at `path` the previous checkpoint while it stays at `path` too, so a
    process killed before the new file is renamed in still leaves `path` (--resume's)."""
    previous = previous_path(path)
    link = previous.with_name(f"{previous.name}.tmp")
    try:
        link.unlink(missing_ok=True)
        os.link(path, link)
        os.replace(link, previous)
    except OSError:  # no hard links here (FAT): `path` is missing only until the next rename
        os.replace(path, previous)


def save_store(
    store: ParameterStore,
    path: str | Path,
    meta: dict[str, Any] | None = None,
    extra: dict[str, np.ndarray] | None = None,
    keep_previous: bool = False,
) -> Path:
    """Write `store`'s parameters, versions and optimizer state to `path` (.npz), atomically
    (`write_checkpoint`). extra: more arrays by key (the rule's state, "rule/...").
    keep_previous: the checkpoint it replaces is kept beside it."""
    arrays = {**store_arrays(store), **(extra or {})}
    # The list of arrays: a file that lost some (a damaged zip directory) is refused.
    meta = {"format": CHECKPOINT_FORMAT, **(meta or {}), "arrays": sorted(arrays)}
    arrays["meta"] = np.array(json.dumps(meta))
    return write_checkpoint(path, arrays, keep_previous)


def load_store(store: ParameterStore, path: str | Path) -> dict[str, Any]:
    """Restore the checkpoint at `path` into `store`'s live arrays; its meta. DataError (one
    line) for a damaged file; see `restore_store` for the rest."""
    return restore_store(store, load_checkpoint(path))


def restore_store(store: ParameterStore, checkpoint: Checkpoint) -> dict[str, Any]:
    """`store` takes a checked checkpoint's parameters, versions and optimizer state
    (`ParameterStore.restore`); its meta. Names and shapes must match the model exactly
    (ShapeError otherwise); nothing is changed unless the whole checkpoint fits."""
    checkpoint.check_params(store.params)
    contents = checkpoint.arrays
    store.restore(
        {name: contents[f"param/{name}"] for name in store.params},
        {name: contents[f"param_version/{name}"] for name in store.params},
        checkpoint.version,
        velocities(checkpoint.section("optim/"), store.params),
    )
    return checkpoint.meta


def store_arrays(store: ParameterStore) -> dict[str, np.ndarray]:
    """A store's state by key, as a checkpoint holds it (module docstring): `version`,
    `param/<name>`, `param_version/<name>`, `optim/velocity/<name>`."""
    arrays: dict[str, np.ndarray] = {"version": np.array(store.version, dtype=np.int64)}
    for name, array in store.params.items():
        arrays[f"param/{name}"] = array
        arrays[f"param_version/{name}"] = np.array(store.param_versions[name], np.int64)
    for name, buf in store.optimizer.velocity.items():
        arrays[f"optim/velocity/{name}"] = buf
    return arrays


def velocities(
    optim: dict[str, np.ndarray], params: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The momentum buffers among a checkpoint's `optim/` arrays (keyed `velocity/<name>`), by
    parameter name; other keys and unknown parameters ignored. ShapeError, before anything
    is restored, unless each fits its parameter."""
    found = {}
    for key, buf in optim.items():
        name = key.removeprefix("velocity/")
        weight = params.get(name)
        if name == key or weight is None:
            continue
        if np.shape(buf) != weight.shape:
            raise ShapeError(f"velocity/{name} has shape {np.shape(buf)}, not {weight.shape}")
        found[name] = buf
    return found


def file_version(path: str | Path) -> int | None:
    """The version of the checkpoint at `path`, read alone (cheap: one small array of the
    archive); None when there is no file or its version cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return int(data["version"]) if data["version"].shape == () else None
    except (*DAMAGED, AttributeError, TypeError):  # AttributeError: a bare .npy array
        return None


def replaces_previous(path: Path) -> bool:
    """Whether the checkpoint at `path`, about to be replaced, becomes the previous one
    (module docstring): it is of no lower version than the previous file's (a file whose
    version cannot be read counts as the lowest, and pushes out only another such)."""
    if not path.exists():
        return False
    old = file_version(path)
    before = file_version(previous_path(path))
    if old is None:
        return before is None
    return before is None or old >= before


def from_model_file(contents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A file of `Sequential.save` (parameters by bare name, "__minips__" metadata) as the
    arrays of a checkpoint at version 0 without optimizer state; a checkpoint unchanged.

    So a model file can start a distributed run (`minips train --save` itself writes
    checkpoints).
    """
    if any(key.startswith("param/") for key in contents) or "version" in contents:
        return contents
    if "meta" in contents and "__minips__" not in contents:
        return contents  # a damaged checkpoint (no version): check_checkpoint says so
    meta = contents.pop("__minips__", np.array("{}"))
    converted: dict[str, np.ndarray] = {"meta": meta, "version": np.array(0, np.int64)}
    for name, array in contents.items():
        converted[f"param/{name}"] = array
        converted[f"param_version/{name}"] = np.array(0, np.int64)
    return converted


def _meta(path: Path, array: np.ndarray) -> dict[str, Any]:
    if array.shape != () or array.dtype.kind != "U":
        raise DataError(f"checkpoint {path}: its meta is not a JSON text")
    try:
        meta = json.loads(str(array))
    except ValueError as exc:
        raise DataError(f"checkpoint {path}: its meta is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise DataError(f"checkpoint {path}: its meta is not a JSON object")
    if meta.get("format", CHECKPOINT_FORMAT) != CHECKPOINT_FORMAT:
        raise DataError(f"checkpoint {path}: format {meta['format']!r}, not {CHECKPOINT_FORMAT}")
    for key in ("updates", "samples"):
        if key in meta and not _is_count(meta[key]):
            raise DataError(
                f"checkpoint {path}: meta {key} {meta[key]!r} is not a count (0 to {MAX_COUNT})"
            )
    listed = meta.get("arrays")
    if listed is not None and not (
        isinstance(listed, list) and all(isinstance(k, str) for k in listed)
    ):
        raise DataError(f"checkpoint {path}: meta arrays is not a list of names")
    if "time" in meta and not (_is_number(meta["time"]) and np.isfinite(meta["time"])):
        raise DataError(f"checkpoint {path}: meta time {meta['time']!r} is not a number")
    return meta


def _count(path: Path, key: str, array: np.ndarray) -> int:
    """A 0-d integer, 0 <= . <= MAX_COUNT."""
    if array.shape != () or array.dtype.kind not in "iu":
        raise DataError(f"checkpoint {path}: {key} is not an integer")
    value = int(array)
    if value < 0:
        raise DataError(f"checkpoint {path}: {key} is {value}, negative")
    if value > MAX_COUNT:
        raise DataError(f"checkpoint {path}: {key} is {value}, past the highest, {MAX_COUNT}")
    return value


def _finite(path: Path, key: str, array: np.ndarray) -> None:
    if array.dtype.kind != "f":
        raise DataError(f"checkpoint {path}: {key} is {array.dtype}, not floating point")
    bad = array.size - int(np.count_nonzero(np.isfinite(array)))
    if bad:
        raise DataError(f"checkpoint {path}: {key} holds {bad} NaN or Inf of {array.size} values")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
