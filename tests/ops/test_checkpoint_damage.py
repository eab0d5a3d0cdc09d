"""Damaged checkpoints: each is refused with one line saying what is wrong, nothing served.

A checkpoint is damaged on disk (truncated by a full disk, a flipped bit, an empty file
left by a crash elsewhere) or by what it holds (NaN parameters, a negative version, a
missing key, metadata that is not JSON). minips/ops/checkpoint_file.py reads and checks
it; `minips server --resume` of any of them prints one `error:` line and exits 2, and a
server object is never built from one (so nothing is ever served from it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_server_support import make_params

from minips.cli import main
from minips.errors import DataError, ShapeError
from minips.ops.checkpoint_file import (
    MAX_COUNT,
    file_version,
    load_checkpoint,
    previous_path,
    read_checkpoint,
    restore_store,
    save_store,
)
from minips.ops.ops_options import OpsOptions
from minips.ops.server_ops import ServerOps
from minips.rules import make_rule
from minips.server.server import ParameterServer
from minips.state.store import SGD, ParameterStore


def _checkpoint(path: Path, version: int = 7) -> Path:
    """A small real checkpoint (the test model's two parameters, momentum state)."""
    params = make_params()
    store = ParameterStore(params, SGD(params, lr=0.1, momentum=0.9), in_place=True)
    store.optimizer.step({name: np.ones_like(p) for name, p in params.items()})
    store.version = version
    return save_store(store, path, {"rule": "asgd", "updates": version, "samples": 640})


def _rewrite(source: Path, target: Path, change) -> Path:
    arrays = read_checkpoint(source)
    change(arrays)
    np.savez(target, **arrays)
    return target


def _set(key, value):
    return lambda arrays: arrays.__setitem__(key, value)


def _nan(arrays):
    w = arrays["param/fc.w"].copy()
    w[1, 2] = np.nan
    arrays["param/fc.w"] = w


def _inf_velocity(arrays):
    v = arrays["optim/velocity/fc.b"].copy()
    v[0] = -np.inf
    arrays["optim/velocity/fc.b"] = v


def _nan_rule_state(arrays):
    """A rule's saved state (DANA's velocities, say) holding a NaN, listed in the meta."""
    arrays["rule/velocity/w/fc.b"] = np.array([0.0, np.nan, 0.0, 0.0], np.float32)
    meta = json.loads(str(arrays["meta"]))
    arrays["meta"] = np.array(
        json.dumps({**meta, "arrays": [*meta["arrays"], "rule/velocity/w/fc.b"]})
    )


# (name, how the file is damaged, words the error line must hold)
CONTENT_DAMAGE = [
    ("nan", _nan, "param/fc.w holds 1 NaN or Inf"),
    ("inf-velocity", _inf_velocity, "optim/velocity/fc.b holds 1 NaN or Inf"),
    ("negative-version", _set("version", np.array(-3, np.int64)), "version is -3, negative"),
    ("float-version", _set("version", np.array(2.5)), "version is not an integer"),
    ("huge-version", _set("version", np.array(2**63 - 1, np.int64)),
     f"version is {2**63 - 1}, past the highest, {2**53 - 1}"),
    ("uint64-version", _set("version", np.array(2**64 - 1, np.uint64)),
     f"version is {2**64 - 1}, past the highest"),
    ("future-param-version", _set("param_version/fc.b", np.array(99, np.int64)),
     "param_version/fc.b is past the version 7"),
    ("next-param-version", _set("param_version/fc.b", np.array(8, np.int64)),
     "param_version/fc.b is past the version 7"),
    ("nan-rule-state", _nan_rule_state, "rule/velocity/w/fc.b holds 1 NaN or Inf"),
    ("missing-param-version", lambda a: a.pop("param_version/fc.w"),
     "it has no 'param_version/fc.w'"),
    ("missing-version", lambda a: a.pop("version"), "it has no 'version'"),
    ("missing-meta", lambda a: a.pop("meta"), "it has no 'meta'"),
    ("meta-not-json", _set("meta", np.array("{rule: asgd")), "its meta is not JSON"),
    ("meta-a-list", _set("meta", np.array("[1, 2]")), "its meta is not a JSON object"),
    ("meta-format", _set("meta", np.array(json.dumps({"format": 9}))), "format 9, not 1"),
    ("meta-updates", _set("meta", np.array(json.dumps({"updates": -1}))),
     "meta updates -1 is not a count"),
    ("meta-samples", _set("meta", np.array(json.dumps({"samples": 2**63}))),
     f"meta samples {2**63} is not a count (0 to {2**53 - 1})"),
    ("unknown-array", _set("paraM/fc.w", np.zeros(2, np.float32)), "unknown array 'paraM/fc.w'"),
    ("int-param", _set("param/fc.b", np.zeros(4, np.int32)), "param/fc.b is int32"),
    ("velocity-shape", _set("optim/velocity/fc.b", np.zeros(5, np.float32)),
     "optim/velocity/fc.b does not match a parameter"),
]  # fmt: skip


def _file_damage(good: Path, tmp_path: Path) -> list[tuple[str, Path, str]]:
    raw = good.read_bytes()
    cases = []
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    cases.append(("empty", empty, "is empty (0 bytes)"))
    for cut in (len(raw) // 2, len(raw) - 10, 40):
        truncated = tmp_path / f"truncated-{cut}.npz"
        truncated.write_bytes(raw[:cut])
        cases.append((f"truncated-{cut}", truncated, "is damaged (truncated or altered)"))
    data = bytearray(raw)
    data[raw.index(b"\x93NUMPY") + 200] ^= 0x04  # a bit inside the first array's data
    flipped = tmp_path / "flipped.npz"
    flipped.write_bytes(bytes(data))
    cases.append(("bit-flip", flipped, "Bad CRC-32"))
    text = tmp_path / "text.npz"
    text.write_text("not a checkpoint\n")
    cases.append(("text", text, "is not an .npz archive (it starts with b'not a ')"))
    cases.append(("missing", tmp_path / "nowhere.npz", "does not exist"))
    return cases


def _all_damage(tmp_path: Path) -> list[tuple[str, Path, str]]:
    good = _checkpoint(tmp_path / "good.npz")
    cases = _file_damage(good, tmp_path)
    for name, change, words in CONTENT_DAMAGE:
        cases.append((name, _rewrite(good, tmp_path / f"{name}.npz", change), words))
    return cases


def test_a_good_checkpoint_reads_back_whole(tmp_path):
    checkpoint = load_checkpoint(_checkpoint(tmp_path / "good.npz"))
    assert checkpoint.version == 7 and checkpoint.meta["samples"] == 640
    assert sorted(checkpoint.param_names()) == ["fc.b", "fc.w"]
    assert set(checkpoint.section("optim/")) == {"velocity/fc.w", "velocity/fc.b"}


def test_the_highest_version_a_checkpoint_may_hold_is_read_and_one_more_is_written(tmp_path):
    """Below 2^63 by far: a server that goes on from it writes its next checkpoint."""
    at_most = _rewrite(_checkpoint(tmp_path / "good.npz"), tmp_path / "top.npz",
                       _set("version", np.array(MAX_COUNT, np.int64)))  # fmt: skip
    assert load_checkpoint(at_most).version == MAX_COUNT == 2**53 - 1
    params = make_params()
    store = ParameterStore(params, SGD(params, lr=0.1))
    restore_store(store, load_checkpoint(at_most))
    store.version += 10**6  # a long run on from it
    assert file_version(save_store(store, tmp_path / "on.npz")) == MAX_COUNT + 10**6


def test_each_damaged_checkpoint_is_one_data_error_saying_what_is_wrong(tmp_path):
    for name, path, words in _all_damage(tmp_path):
        with pytest.raises(DataError) as caught:
            load_checkpoint(path)
        line = str(caught.value)
        assert words in line and "\n" not in line, (name, line)
        assert str(path) in line, (name, line)


def test_no_server_is_built_from_a_damaged_checkpoint(tmp_path):
    for _name, path, _words in _all_damage(tmp_path):
        params = make_params()
        options = OpsOptions(resume=path, stop_grace=0.1)
        with pytest.raises(DataError, match="checkpoint"):
            ParameterServer(params, make_rule("asgd"), SGD(params, lr=0.1), options,
                            operations=ServerOps)  # fmt: skip


def test_every_flipped_byte_is_refused_or_changes_nothing(tmp_path):
    """A flipped bit anywhere in the file: refused, or (a zip timestamp, say) harmless."""
    good = _checkpoint(tmp_path / "good.npz")
    raw, expected = good.read_bytes(), read_checkpoint(good)
    damaged, refused = tmp_path / "damaged.npz", 0
    for position in range(len(raw)):
        data = bytearray(raw)
        data[position] ^= 1 << (position % 8)
        damaged.write_bytes(bytes(data))
        params = make_params()
        store = ParameterStore(params, SGD(params, lr=0.1, momentum=0.9))
        try:
            checkpoint = load_checkpoint(damaged)
            restore_store(store, checkpoint)  # what a server does: against its own parameters
        except (DataError, ShapeError):
            refused += 1
            continue
        got = checkpoint.arrays
        assert got.keys() == expected.keys(), position
        for key, array in expected.items():
            assert got[key].dtype == array.dtype and got[key].tobytes() == array.tobytes(), key
    assert refused > len(raw) // 2  # most bytes matter


def test_minips_server_resume_of_each_damaged_checkpoint_is_one_error_line(tmp_path, capsys):
    for name, path, _words in _all_damage(tmp_path):
        with pytest.raises(SystemExit) as leaving:
            main(["server", "--model", "mlp", "--rule", "asgd", "--resume", str(path)])
        lines = capsys.readouterr().err.strip().splitlines()
        assert leaving.value.code == 2, name
        assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0], name


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_a_server_process_refuses_a_damaged_checkpoint_without_a_traceback(tmp_path, damage):
    path = tmp_path / "checkpoint.npz"
    if damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(_checkpoint(tmp_path / "good.npz").read_bytes()[:300])
    argv = [sys.executable, "-m", "minips", "server", "--model", "mlp", "--resume", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith("error: checkpoint ")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_checkpoint_keeps_the_one_before_it(tmp_path):
    params = make_params()
    store = ParameterStore(params, SGD(params, lr=0.1))
    path = tmp_path / "checkpoint.npz"
    save_store(store, path, keep_previous=True)
    store.version = 3
    save_store(store, path, keep_previous=True)
    assert load_checkpoint(path).version == 3
    assert load_checkpoint(previous_path(path)).version == 0
