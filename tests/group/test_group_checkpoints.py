"""A server group's checkpoints (minips.ops.group_checkpoints): which of the shards'
files the group checkpoint is assembled from, the version it records for the group and
for each parameter, and the version a shard resumed from it takes (docs/protocol.md 16)."""

from __future__ import annotations

import json

import numpy as np

from minips.group.partition import partition_of_model
from minips.group.shard import shard_params
from minips.nn import build_model
from minips.ops.checkpoint_file import load_checkpoint, save_store
from minips.ops.checkpoints import Checkpointer
from minips.ops.group_checkpoints import assemble, slicer
from minips.ops.rule_state import StateReader
from minips.ops.telemetry import Counters
from minips.state.store import SGD, ParameterStore

MODEL = build_model("mlp")  # fc1.w is split over 2 shards (rows 0:392, 392:784)
PART = partition_of_model(MODEL.params, 2)
PART_SLICES = [PART.shard_slices(j) for j in range(2)]


def shard_store(shard: int, version: int, params_at: int | None = None) -> ParameterStore:
    """Shard `shard`'s store at `version`, every parameter of it written at `params_at`
    (default: `version`) and filled with that number."""
    at = version if params_at is None else params_at
    params = {n: np.full_like(a, at) for n, a in shard_params(MODEL.params, PART, shard).items()}
    store = ParameterStore(params, SGD(params, lr=0.1), slices=PART_SLICES[shard])
    store.version = version
    store.param_versions = dict.fromkeys(params, at)
    return store


def save(tmp_path, shard: int, version: int, params_at: int | None = None) -> None:
    """What shard `shard`'s Checkpointer writes at `version` (the one before kept beside),
    having counted `version` updates of 100 samples each."""
    store = shard_store(shard, version, params_at)
    counters = Counters()
    counters.updates, counters.samples = version, 100 * version
    Checkpointer(store, counters, tmp_path / "run.npz", rule="asgd", spec=MODEL.spec,
                 shard=(shard, 2)).save()  # fmt: skip


def read(path) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(path) as data:
        return json.loads(str(data["meta"])), {key: data[key] for key in data.files}


def test_a_group_checkpoint_waits_for_every_shards_file(tmp_path):
    save(tmp_path, 0, 40)
    assert assemble(tmp_path / "run.npz") is None  # shard 1 of 2 has written nothing yet
    assert not (tmp_path / "run.npz").exists()
    save(tmp_path, 1, 40)
    made = assemble(tmp_path / "run.npz")
    assert made is not None and made.versions == [40, 40] and made.consistent


def test_the_newest_version_every_shard_saved_is_taken_not_an_older_common_one(tmp_path):
    for version in (50, 100):  # each shard keeps the one before: both hold 50 and 100
        save(tmp_path, 0, version)
        save(tmp_path, 1, version)
    made = assemble(tmp_path / "run.npz")
    assert made.versions == [100, 100]
    _, arrays = read(tmp_path / "run.npz")
    assert int(arrays["version"]) == 100
    assert (arrays["param/fc1.w"] == 100).all()


def test_a_torn_group_checkpoint_is_at_the_roots_version_each_parameter_at_its_newest(tmp_path):
    save(tmp_path, 0, 70, params_at=66)
    save(tmp_path, 1, 68)
    made = assemble(tmp_path / "run.npz", final=True)
    assert made.versions == [70, 68] and not made.consistent
    meta, arrays = read(tmp_path / "run.npz")
    assert int(arrays["version"]) == 70  # the root's
    assert meta["group"] == {"servers": 2, "versions": [70, 68], "consistent": False}
    # what the whole model trained: the shard behind's counts, not the root's 7,000 samples
    assert (meta["samples"], meta["updates"]) == (6800, 68)
    # fc1.w: its rows on shard 0 written at 66, on shard 1 at 68: the newest of its slices
    assert int(arrays["param_version/fc1.w"]) == 68
    assert int(arrays["param_version/fc1.b"]) == 66  # whole on shard 0
    assert int(arrays["param_version/fc2.b"]) == 68  # whole on shard 1


def test_a_shard_resumed_from_a_group_checkpoint_takes_its_own_version(tmp_path):
    save(tmp_path, 0, 70)
    save(tmp_path, 1, 68)
    assemble(tmp_path / "run.npz", final=True)
    for shard, version in ((0, 70), (1, 68)):
        store = shard_store(shard, 0, params_at=0)
        Checkpointer(store, Counters(), tmp_path / "again.npz", shard=(shard, 2)).resume(
            tmp_path / "run.npz"
        )
        assert store.version == version, shard
        assert max(store.param_versions.values()) <= version
        assert (store.params["fc1.w"] == version).all()  # its own rows of fc1.w


def test_a_shard_takes_its_rows_of_a_whole_models_rule_state_and_none_of_anothers(tmp_path):
    """A one-server dana-gap or gap run's checkpoint resumed by a group: the rule's state
    per parameter (rule/WHAT/PARAM, rule/WHAT/i/PARAM) is sliced as the parameters are,
    so each shard's rule reads state of its own slices' shapes."""
    params = dict(MODEL.params)
    whole = ParameterStore(params, SGD(params, lr=0.1))
    whole.version = 9
    rule = {"rule/workers": np.array(["w0"])}
    for name, array in MODEL.params.items():
        rule[f"rule/velocity_sum/{name}"] = np.arange(array.size, dtype=np.float32).reshape(
            array.shape
        )
        rule[f"rule/velocity/0/{name}"] = np.ones_like(array)
        rule[f"rule/step/{name}"] = np.array(0.5)
    save_store(whole, tmp_path / "one.npz", {"rule": "dana-gap"}, rule)
    for shard in range(2):
        store = shard_store(shard, 0, params_at=0)
        adapted = slicer(store, (shard, 2))(load_checkpoint(tmp_path / "one.npz").arrays)
        state = {k[len("rule/") :]: v for k, v in adapted.items() if k.startswith("rule/")}
        reader = StateReader(state, store.params)
        sums = reader.shared_arrays("velocity_sum")
        assert sorted(sums) == sorted(store.params), shard
        piece = store.slices["fc1.w"]
        assert (sums["fc1.w"] == piece.of(rule["rule/velocity_sum/fc1.w"])).all()
        assert reader.worker_arrays("velocity")["w0"].keys() == store.params.keys()
        assert reader.shared_numbers("step") == dict.fromkeys(store.params, 0.5)
