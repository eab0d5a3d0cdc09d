"""The server's parameter store: arrays, versions, the optimizer, snapshots and checkpoints.

Versions: a global counter `t` (one per applied update) and, per parameter, the version at
which it last changed, so a pull can send only what changed since the puller's version.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from minips.errors import ConfigError, DataError, ShapeError
from minips.optim import SGD
from minips.wire import ProtocolError, sum_of_squares

CHECKPOINT_FORMAT = 1


class ParameterStore:
    """Named float32 parameters updated in place by an SGD optimizer, with versions.

    params: name -> array (float32, C-contiguous), in model order; the very dict the
    optimizer was built on (`SGD(params, ...)`). On the server (`in_place` False) every
    version of a parameter is a new read-only array that replaces the old one in `params`:
    a pull reply can send it without a copy. `in_place` True keeps the caller's arrays and
    changes them in place: the single-process trainer, whose model computes with them,
    uses the store only for its checkpoint format.
    """

    def __init__(
        self, params: dict[str, np.ndarray], optimizer: SGD, in_place: bool = False
    ) -> None:
        if not params:
            raise ConfigError("the parameter server needs at least one parameter")
        for name, array in params.items():
            if "/" in name or not name:
                raise ConfigError(f"parameter name {name!r} must be non-empty without '/'")
            if array.dtype != np.float32 or not array.flags.c_contiguous:
                raise ShapeError(f"parameter {name!r} must be a C-contiguous float32 array")
        if optimizer.params is not params:
            raise ConfigError("the optimizer must be built on the same params dict")
        self.params = params
        self.optimizer = optimizer
        self.in_place = in_place
        self.version = 0
        self.param_versions = dict.fromkeys(params, 0)
        # ||w||^2 and ||v||^2 (momentum) of each current version, for the server's overflow
        # check (minips.guard): computed right after the version is written, while in cache.
        self._sq_norms: dict[str, tuple[np.ndarray, float, float]] = {}  # (version, w.w, v.v)
        # Pull replies are sent with copy=False, so a sent array must never change: every
        # version of a parameter is a new array, published read-only (see `apply`).
        if not in_place:
            for name, array in params.items():
                params[name] = _published(array.copy())

    def check_push(self, base: int, grads: dict[str, np.ndarray]) -> None:
        """Check a push's `base` and decoded gradients against the parameters.

        Raises ProtocolError (`bad_base`, `unknown_param`, `shape`, `dtype`) and changes
        nothing: every check runs before any parameter is touched.
        """
        if base > self.version:
            raise ProtocolError(
                f"base {base} is newer than the server's version {self.version}", "bad_base"
            )
        if not grads:
            raise ProtocolError("a push must carry at least one gradient", "unknown_param")
        for name, grad in grads.items():
            param = self.params.get(name)
            if param is None:
                raise ProtocolError(f"gradient for unknown parameter {name!r}", "unknown_param")
            if grad.shape != param.shape:
                raise ProtocolError(
                    f"gradient {name!r} has shape {list(grad.shape)}, "
                    f"the parameter has {list(param.shape)}",
                    "shape",
                )
            if grad.dtype != np.float32:
                raise ProtocolError(
                    f"gradient {name!r} must be float32 (dense) or float16 (fp16), "
                    f"got {grad.dtype}",
                    "dtype",
                )

    def apply(self, steps: list[tuple[str, np.ndarray, float]]) -> int:
        """Apply one update: `optimizer.step_one(name, grad, scale)` for each step; t += 1.
        Returns the new version t.

        Callers validate everything first: this is the only place parameters change. Each
        new version is written into a new array that replaces the old one in `params`, so
        an array once handed to a pull reply is never modified (no copy per pull).
        """
        self.version += 1
        for name, grad, scale in steps:
            if self.in_place:
                self.optimizer.step_one(name, grad, scale)
            else:
                fresh = np.empty_like(self.params[name])
                self.optimizer.step_one(name, grad, scale, out=fresh)
                self.params[name] = _published(fresh)
                velocity = self.optimizer.velocity.get(name)
                sq_v = 0.0 if velocity is None else sum_of_squares(velocity)
                self._sq_norms[name] = (fresh, sum_of_squares(fresh), sq_v)
            self.param_versions[name] = self.version
        return self.version

    def changed_since(self, since: int | None) -> list[str]:
        """Names changed after version `since` (all for None or a `since` from the future)."""
        if since is None or since > self.version:
            return list(self.params)
        return [name for name, v in self.param_versions.items() if v > since]

    def sq_norms(self, name: str) -> tuple[float, float]:
        """(||w||^2, ||v||^2) of parameter `name` and its momentum buffer at the current
        version (inf when one overflows; v is 0 without momentum)."""
        array, cached = self.params[name], self._sq_norms.get(name)
        if self.in_place or cached is None or cached[0] is not array:  # in place: may change
            velocity = self.optimizer.velocity.get(name)
            sq_v = 0.0 if velocity is None else sum_of_squares(velocity)
            return sum_of_squares(array), sq_v
        return cached[1], cached[2]

    def snapshot(self, name: str) -> np.ndarray:
        """The parameter at the current version: a read-only array that never changes."""
        return self.params[name]

    # -------------------------------------------------------------------------- checkpoints

    def save(self, path: str | Path, meta: dict[str, Any] | None = None) -> Path:
        """Write params, versions and optimizer state to `path` (.npz), atomically.

        Written to a temporary file in the same directory, then `os.replace`d, so a crash
        leaves either the old checkpoint or the new one, never half of one.
        """
        path = Path(path)
        arrays: dict[str, np.ndarray] = {
            "meta": np.array(json.dumps({"format": CHECKPOINT_FORMAT, **(meta or {})})),
            "version": np.array(self.version, dtype=np.int64),
        }
        for name, array in self.params.items():
            arrays[f"param/{name}"] = array
            arrays[f"param_version/{name}"] = np.array(self.param_versions[name], np.int64)
        for key, array in self.optimizer.state_dict().items():
            arrays[f"optim/{key}"] = array
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                np.savez(file, **arrays)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore a checkpoint written by `save` into the live arrays; return its meta.

        Names and shapes must match the model exactly (DataError / ShapeError otherwise);
        nothing is changed unless the whole checkpoint is valid.
        """
        try:
            with np.load(path, allow_pickle=False) as data:
                contents = {key: data[key] for key in data.files}
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read checkpoint {path}: {exc}") from None
        contents = _from_model_file(contents)
        names = [key[len("param/") :] for key in contents if key.startswith("param/")]
        if sorted(names) != sorted(self.params):
            raise ShapeError(
                f"checkpoint {path} holds parameters {sorted(names)}, "
                f"the model has {sorted(self.params)}"
            )
        for name, param in self.params.items():
            if contents[f"param/{name}"].shape != param.shape:
                raise ShapeError(
                    f"checkpoint {path}: {name} has shape {contents[f'param/{name}'].shape}, "
                    f"the model has {param.shape}"
                )
        for name, param in self.params.items():
            saved = contents[f"param/{name}"]
            if self.in_place:
                param[...] = saved
            else:
                self.params[name] = _published(saved.astype(param.dtype))
            self.param_versions[name] = int(contents[f"param_version/{name}"])
        self.version = int(contents["version"])
        self.optimizer.load_state_dict(
            {k[len("optim/") :]: v for k, v in contents.items() if k.startswith("optim/")}
        )
        return json.loads(str(contents["meta"]))


def _published(array: np.ndarray) -> np.ndarray:
    """Mark a parameter version read-only: it may be in flight in a pull reply."""
    array.flags.writeable = False
    return array


def _from_model_file(contents: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A file of `Sequential.save` (parameters by bare name, "__minips__" metadata) as the
    arrays of a checkpoint at version 0 without optimizer state; a checkpoint unchanged.

    So an older model file can start a distributed run; `minips train --save` itself now
    writes checkpoints (docs/architecture.md).
    """
    if any(key.startswith("param/") for key in contents) or "version" in contents:
        return contents
    meta = contents.pop("__minips__", np.array("{}"))
    converted: dict[str, np.ndarray] = {"meta": meta, "version": np.array(0, np.int64)}
    for name, array in contents.items():
        converted[f"param/{name}"] = array
        converted[f"param_version/{name}"] = np.array(0, np.int64)
    return converted
