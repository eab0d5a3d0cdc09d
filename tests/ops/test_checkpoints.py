"""The Checkpointer (minips/ops/checkpoints.py) on a real store and real files: when an
update-count checkpoint is written, what its meta records, what a resume takes back (the
counters, each parameter's version, the rule's own state), and a disk that refuses one;
a store's state through its file (checkpoint_file.py: the optimizer's velocity too)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from minips.errors import ShapeError
from minips.ops.checkpoint_file import (
    load_checkpoint,
    load_store,
    save_store,
    velocities,
    versioned_path,
)
from minips.ops.checkpoints import Checkpointer
from minips.ops.telemetry import Counters
from minips.state.store import SGD, ParameterStore


def new_store() -> ParameterStore:
    params = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    return ParameterStore(params, SGD(params, lr=0.5))


def step(store: ParameterStore, *names: str) -> int:
    """One update of `names` (default: every parameter), gradient 1; the new version."""
    names = names or tuple(store.params)
    return store.write([(n, np.ones_like(store.params[n]), 1.0) for n in names])


class KeptState:
    """A rule's own state as Checkpointer sees it: a name, state(), load_state()."""

    def __init__(self, name: str, state: dict[str, np.ndarray] | None = None) -> None:
        self.name, self._state, self.loaded = name, state or {}, None

    def state(self) -> dict[str, np.ndarray]:
        return self._state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self.loaded = state


def test_the_meta_records_both_counters_and_a_resume_takes_them_back(tmp_path):
    store, path = new_store(), tmp_path / "c.npz"
    step(store), step(store)
    Checkpointer(store, Counters(updates=2, samples=640), path, rule="asgd").save()
    meta = load_checkpoint(path).meta
    assert (meta["updates"], meta["samples"], meta["rule"]) == (2, 640, "asgd")
    counters = Counters()
    again = new_store()
    Checkpointer(again, counters, tmp_path / "next.npz").resume(path)
    assert (counters.updates, counters.samples, again.version) == (2, 640, 2)


def test_each_parameter_keeps_its_own_version_through_a_resume(tmp_path):
    store, path = new_store(), tmp_path / "c.npz"
    step(store, "w"), step(store, "b"), step(store, "b")
    assert store.param_versions == {"w": 1, "b": 3}
    Checkpointer(store, Counters(), path).save()
    again = new_store()
    Checkpointer(again, Counters(), tmp_path / "next.npz").resume(path)
    assert (again.version, again.param_versions) == (3, {"w": 1, "b": 3})


def test_an_update_count_checkpoint_at_each_multiple_of_every_and_none_between(tmp_path):
    store, path = new_store(), tmp_path / "c.npz"
    checkpoints = Checkpointer(store, Counters(), path, every=3)
    written = []
    for _ in range(7):
        checkpoints.after_update(step(store))
        written.append(load_checkpoint(path).version if path.exists() else None)
    assert written == [None, None, 3, 3, 3, 6, 6]


def test_keep_all_names_each_kept_file_by_its_own_version(tmp_path):
    store, path = new_store(), tmp_path / "c.npz"
    checkpoints = Checkpointer(store, Counters(), path, every=1, keep_all=True)
    weights = {}
    for _ in range(2):
        version = step(store)
        checkpoints.after_update(version)
        weights[version] = store.params["w"].copy()
    for version in (1, 2):
        kept = load_checkpoint(versioned_path(path, version))
        assert kept.version == version
        np.testing.assert_array_equal(kept.arrays["param/w"], weights[version])
    assert sorted(p.name for p in tmp_path.glob("c-v*.npz")) == ["c-v000001.npz", "c-v000002.npz"]


def test_an_update_count_checkpoint_that_cannot_be_written_is_logged_not_raised(tmp_path, caplog):
    (tmp_path / "a-file").write_text("")  # the checkpoint's folder is a file: the save fails
    store = new_store()
    checkpoints = Checkpointer(store, Counters(), tmp_path / "a-file" / "c.npz", every=1)
    with caplog.at_level(logging.ERROR, logger="minips.server"):
        checkpoints.after_update(step(store))  # no OSError out of it
    assert "checkpoint at version 1 not written" in caplog.text
    with pytest.raises(OSError):  # the operator's explicit save does say it failed
        checkpoints.save()


def test_the_rules_own_state_comes_back_to_the_same_rule_only(tmp_path):
    store, path = new_store(), tmp_path / "c.npz"
    state = {"w0/velocity/w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    Checkpointer(store, Counters(), path, rule="dana", rule_state=KeptState("dana", state)).save()
    same = KeptState("dana")
    Checkpointer(new_store(), Counters(), tmp_path / "a.npz", rule="dana", rule_state=same).resume(
        path
    )
    assert list(same.loaded) == ["w0/velocity/w"]
    np.testing.assert_array_equal(same.loaded["w0/velocity/w"], state["w0/velocity/w"])
    other = KeptState("gap")
    Checkpointer(new_store(), Counters(), tmp_path / "b.npz", rule="gap", rule_state=other).resume(
        path
    )
    assert other.loaded is None  # another rule's state is not taken


def test_a_store_restored_from_its_file_continues_the_same_trajectory(tmp_path):
    def with_momentum() -> ParameterStore:
        params = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
        return ParameterStore(params, SGD(params, lr=0.5, momentum=0.9))

    first, again = with_momentum(), with_momentum()
    step(first)
    save_store(first, tmp_path / "c.npz")
    load_store(again, tmp_path / "c.npz")
    assert again.version == first.version == 1 and again.param_versions == first.param_versions
    step(first), step(again)
    velocity = again.optimizer.velocity
    for name in first.params:
        np.testing.assert_array_equal(first.params[name], again.params[name])
        np.testing.assert_array_equal(first.optimizer.velocity[name], velocity[name])
        assert not again.params[name].flags.writeable  # published read-only, as every version


def test_a_velocity_of_the_wrong_shape_is_refused_and_one_restored_takes_its_dtype():
    store = new_store()
    with pytest.raises(ShapeError, match="shape"):
        velocities({"velocity/b": np.zeros(4, np.float32)}, store.params)
    found = velocities({"velocity/b": np.ones(3), "other": np.ones(1), "velocity/x": np.ones(1)},
                       store.params)  # fmt: skip
    assert list(found) == ["b"]
    store.restore(dict(store.params), dict(store.param_versions), 0, found)
    assert store.optimizer.velocity["b"].dtype == np.float32
