"""A model's .npz file: saved and loaded back, a zoo model rebuilt from its spec, and
every broken or mismatched file refused in one line with the model left as it was."""

import numpy as np
import pytest

from minips.errors import DataError, ShapeError
from minips.nn import Dense, Sequential, lenet5, mlp
from minips.ops.model_file import load, load_model, save


def batch(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, n)


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "model.bin"  # saved at exactly this path, no suffix added
    source, target = lenet5(seed=1), lenet5(seed=2)
    save(source, path)
    assert path.exists()
    load(target, path)
    for key in source.params:
        np.testing.assert_array_equal(target.params[key], source.params[key])
    x, _ = batch()
    np.testing.assert_array_equal(target.forward(x), source.forward(x))


def test_load_model_rebuilds_from_the_saved_spec(tmp_path):
    source = mlp(hidden=(12,), seed=5)
    source.params["fc1.b"][:] = 0.25  # trained values, not the seed's
    save(source, tmp_path / "m.npz")
    loaded = load_model(tmp_path / "m.npz")
    assert loaded.spec == source.spec
    for key in source.params:
        np.testing.assert_array_equal(loaded.params[key], source.params[key])
    save(Sequential([Dense(3, 2)]), tmp_path / "custom.npz")
    with pytest.raises(DataError, match="zoo model"):
        load_model(tmp_path / "custom.npz")
    np.save(tmp_path / "plain.npy", np.zeros(3))
    with pytest.raises(DataError, match="not a readable .npz"):
        load_model(tmp_path / "plain.npy")
    np.savez(tmp_path / "foreign.npz", w=np.zeros(3))
    with pytest.raises(DataError, match="no minips metadata"):
        load_model(tmp_path / "foreign.npz")


def test_load_mismatched_or_broken_files(tmp_path):
    lenet_file, mlp_file = tmp_path / "lenet.npz", tmp_path / "mlp.npz"
    save(lenet5(), lenet_file)
    save(mlp(hidden=(64,)), mlp_file)
    model = mlp(hidden=(32,))
    before = {k: v.copy() for k, v in model.params.items()}
    with pytest.raises(DataError, match="does not match") as info:
        load(model, lenet_file)
    assert "\n" not in str(info.value)
    with pytest.raises(ShapeError, match="fc1.w") as info:
        load(model, mlp_file)  # same names, other widths
    assert "\n" not in str(info.value)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file at all")
    with pytest.raises(DataError, match="not a readable"):
        load(model, garbage)
    with pytest.raises(DataError, match="does not exist"):
        load(model, tmp_path / "missing.npz")
    for key, value in before.items():  # every failed load left the model as it was
        np.testing.assert_array_equal(model.params[key], value)
