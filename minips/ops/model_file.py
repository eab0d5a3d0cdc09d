"""A model's .npz file: its parameters and the spec that rebuilds it.

    save(model, "m.npz")          # every parameter, and model.spec as JSON
    load(other, "m.npz")          # into a model of the same names and shapes
    model = load_model("m.npz")   # a zoo model rebuilt from the spec, then loaded

The file is NumPy's zip of .npy arrays (no pickle): one array per parameter, named
"<layer>.<param>", and META_KEY, a 0-d string holding {"format": 1, "spec": ...}. `load`
also reads a checkpoint (a server's, `minips train --save`'s: minips/ops/checkpoint_file.py),
whose parameters are under "param/".
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from minips.errors import ConfigError, DataError, ShapeError
from minips.nn import MODEL_NAMES, Sequential, build_model

# Key of the JSON metadata entry inside a saved .npz (parameter names never start with "__").
META_KEY = "__minips__"
FILE_FORMAT = 1
# A checkpoint keeps each parameter as "param/<name>" and its JSON as "meta".
CHECKPOINT_PARAM, CHECKPOINT_META = "param/", "meta"


def save(model: Sequential, path: str | Path) -> None:
    """Write `model`'s parameters (and its spec) to an .npz file at exactly `path`."""
    meta = json.dumps({"format": FILE_FORMAT, "spec": model.spec})
    arrays = {key: np.ascontiguousarray(a) for key, a in model.params.items()}
    with open(path, "wb") as f:
        np.savez(f, **arrays, **{META_KEY: np.array(meta)})


def load(model: Sequential, path: str | Path) -> None:
    """Read parameters written by `save`, or a checkpoint's, into `model`.

    Raises DataError (unreadable file, wrong or missing names) or ShapeError (a parameter
    of the wrong shape), with a one-line message; the model is unchanged on error.
    """
    arrays = read_npz(path)
    if any(key.startswith(CHECKPOINT_PARAM) for key in arrays):
        arrays = {k[len(CHECKPOINT_PARAM) :]: v for k, v in arrays.items()
                  if k.startswith(CHECKPOINT_PARAM)}  # fmt: skip
    arrays.pop(META_KEY, None)
    params = model.params
    unknown = sorted(set(arrays) - set(params))
    missing = sorted(set(params) - set(arrays))
    if unknown or missing:
        raise DataError(
            f"model file {path} does not match this model: "
            f"missing {missing or 'nothing'}, unexpected {unknown or 'nothing'}"
        )
    try:
        model.set_params(arrays, strict=True)
    except ShapeError as err:
        raise ShapeError(f"model file {path}: {err}") from None


def load_model(path: str | Path) -> Sequential:
    """Rebuild a zoo model from a file written by `save` (or a checkpoint), with its
    parameters.

    DataError when the file is unreadable or was saved from a model without a spec (build
    that model yourself and `load` into it); ShapeError when parameters do not fit.
    """
    spec = read_spec(path)
    if not spec or spec.get("name") not in MODEL_NAMES:
        raise DataError(f"model file {path} does not name a zoo model; build it and load into it")
    try:
        model = build_model(spec["name"], spec.get("seed", 0), **spec.get("kwargs", {}))
    except ConfigError as err:
        raise DataError(f"model file {path} has a bad model spec: {err}") from None
    load(model, path)
    return model


def read_spec(path: str | Path) -> dict | None:
    """The model spec stored in a file written by `save` or in a checkpoint (None if it had
    none).

    DataError (one line) when the file is missing, unreadable or has no minips metadata.
    """
    arrays = read_npz(path)
    meta = arrays.get(META_KEY, arrays.get(CHECKPOINT_META))
    try:
        return json.loads(str(meta))["spec"]
    except (ValueError, KeyError, TypeError):
        raise DataError(f"model file {path} has no minips metadata") from None


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of an .npz file, loaded without pickle.

    DataError (one line) when the file is missing or is not a readable .npz archive.
    """
    try:
        loaded = np.load(path, allow_pickle=False)
        if not hasattr(loaded, "files"):  # a bare .npy array, not an archive of them
            raise ValueError("it holds a single array")
        with loaded as npz:
            return {key: npz[key] for key in npz.files}
    except FileNotFoundError:
        raise DataError(f"model file {path} does not exist") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"model file {path} is not a readable .npz: {reason}") from None
