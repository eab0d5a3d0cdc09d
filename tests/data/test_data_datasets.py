"""Dataset loading, normalisation, the bundled sample, synthetic data, shards, batches (the
machine's look-up order: tests/provision/test_find_data.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from minips.data import (
    IDX_FILES,
    NORMALIZATION,
    SAMPLE_DIR,
    Dataset,
    iterate_batches,
    load_dataset,
)
from minips.data.synthetic import make_synthetic
from minips.errors import ConfigError, DataError, ShapeError
from minips.provision.fetch import write_idx
from minips.provision.locations import find_data, find_dataset


def write_fake_dataset(directory: Path, n_train: int = 40, n_test: int = 20, seed: int = 0):
    """Write four small, valid IDX .gz files (synthetic images) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = make_synthetic(seed, n_train, n_test)
    for stem, array in zip(IDX_FILES.values(), arrays, strict=True):
        write_idx(directory / f"{stem}.gz", array)
    return arrays


@pytest.fixture
def places(tmp_path):
    """Separate, initially empty data_dir / system / cache roots."""
    roots = {k: tmp_path / k for k in ("data_dir", "system", "cache")}
    for root in roots.values():
        root.mkdir()
    return roots


def load(name, places, seed=0, data_dir=False):
    given = places["data_dir"] if data_dir else None
    roots = {"system_dir": places["system"], "cache_dir": places["cache"]}
    return load_dataset(name, given, seed, find=lambda n, d: find_data(n, d, **roots))


def test_corrupt_file_in_dataset_dir_is_a_one_line_error(places):
    directory = places["data_dir"] / "mnist"
    write_fake_dataset(directory)
    path = directory / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz: corrupt gzip stream"):
        load("mnist", places, data_dir=True)


@pytest.mark.parametrize(
    "role, array, fragment",
    [
        ("train_images", np.zeros((40, 28, 27), np.uint8), "expected (N, 28, 28) uint8"),
        ("train_images", np.zeros((40, 784), np.uint8), "expected (N, 28, 28) uint8"),
        ("test_images", np.zeros((20, 28, 28), np.int32), "expected (N, 28, 28) uint8"),
        ("train_labels", np.zeros(39, np.uint8), "labels have shape (39,) for 40 images"),
        ("test_labels", np.zeros((20, 1), np.uint8), "labels have shape (20, 1)"),
        ("test_labels", np.full(20, 10, np.uint8), "labels outside 0..9"),
    ],
)
def test_wrong_dimensions_or_labels(places, role, array, fragment):
    directory = places["data_dir"] / "mnist"
    write_fake_dataset(directory, n_train=40, n_test=20)
    write_idx(directory / f"{IDX_FILES[role]}.gz", array)
    with pytest.raises(DataError) as exc:
        load("mnist", places, data_dir=True)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_bundled_sample_is_balanced_and_normalised(places):
    ds = load("sample", places)
    assert ds.source == str(SAMPLE_DIR)
    assert ds.x_train.shape == (5500, 1, 28, 28) and ds.x_train.dtype == np.float32
    assert ds.x_test.shape == (1000, 1, 28, 28) and ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
    assert np.bincount(ds.y_train).tolist() == [550] * 10
    assert np.bincount(ds.y_test).tolist() == [100] * 10
    assert ds.n_classes == 10 and ds.input_shape == (1, 28, 28)
    # A subset of Fashion-MNIST normalised with the full set's constants: close to N(0, 1).
    assert abs(float(ds.x_train.mean())) < 0.05 and abs(float(ds.x_train.std()) - 1) < 0.05
    mean, std = NORMALIZATION["sample"]
    assert float(ds.x_train.min()) == pytest.approx((0 - mean) / std)  # a black pixel
    assert float(ds.x_train.max()) == pytest.approx((1 - mean) / std)  # a white pixel


def test_sample_bundle_is_within_size_budget():
    files = sorted(p.name for p in SAMPLE_DIR.iterdir())
    assert [f for f in files if f.endswith(".gz")] == sorted(f"{s}.gz" for s in IDX_FILES.values())
    assert "README.txt" in files
    assert "MIT" in (SAMPLE_DIR / "README.txt").read_text()
    assert sum((SAMPLE_DIR / f).stat().st_size for f in files) <= 3_000_000


def test_training_set_shuffle_is_seeded(places):
    a, b, c = (
        load("sample", places, seed=0),
        load("sample", places, seed=0),
        load("sample", places, 1),
    )
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_train, b.y_train)
    assert not np.array_equal(a.y_train, c.y_train)
    # Same examples, other order; the test set is never shuffled.
    assert sorted(a.x_train.sum(axis=(1, 2, 3)).tolist()) == pytest.approx(
        sorted(c.x_train.sum(axis=(1, 2, 3)).tolist())
    )
    np.testing.assert_array_equal(a.y_test, c.y_test)


def test_synthetic_is_deterministic_balanced_and_normalised():
    a, b, c = (load_dataset("synthetic", seed=s) for s in (3, 3, 4))
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x_train, c.x_train)
    assert a.x_train.shape == (2000, 1, 28, 28) and a.x_test.shape == (500, 1, 28, 28)
    assert np.bincount(a.y_train).tolist() == [200] * 10
    assert abs(float(a.x_train.mean())) < 0.1 and abs(float(a.x_train.std()) - 1) < 0.1
    assert a.source == "synthetic (seed 3)"
    assert find_dataset("synthetic") == "generated from the seed"


def test_synthetic_is_learnable_by_a_small_model():
    """Softmax regression (plain NumPy SGD) reaches > 90% test accuracy in 3 epochs."""
    ds = load_dataset("synthetic", seed=0)
    x_train = ds.x_train.reshape(len(ds.x_train), -1)  # (N, 784)
    x_test = ds.x_test.reshape(len(ds.x_test), -1)
    w = np.zeros((784, 10), np.float32)
    rng = np.random.default_rng(0)
    for _ in range(3):
        for xb, yb in iterate_batches(x_train, ds.y_train, 32, rng):
            logits = xb @ w  # (B, 10)
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(yb)), yb] -= 1  # d(cross-entropy)/d(logits)
            w -= 0.01 * xb.T @ p / len(yb)
    accuracy = float(((x_test @ w).argmax(axis=1) == ds.y_test).mean())
    assert accuracy > 0.9


@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_shards_are_disjoint_and_cover_the_training_set(world_size):
    ds = load_dataset("synthetic", seed=0)
    shards = [ds.shard(rank, world_size) for rank in range(world_size)]
    sizes = [len(s.y_train) for s in shards]
    assert sum(sizes) == len(ds.y_train) and max(sizes) - min(sizes) <= 1
    # Contiguous slices of one array: concatenating them in rank order gives it back exactly.
    np.testing.assert_array_equal(np.concatenate([s.x_train for s in shards]), ds.x_train)
    np.testing.assert_array_equal(np.concatenate([s.y_train for s in shards]), ds.y_train)
    for s in shards:
        assert s.x_test is ds.x_test and s.name == ds.name


def test_shards_of_an_odd_split_keep_every_example_once():
    x = np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1)
    ds = Dataset("toy", x, np.arange(10), x[:2], np.arange(2), "toy")
    ids = [ds.shard(r, 3).y_train.tolist() for r in range(3)]
    assert ids == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]


@pytest.mark.parametrize("rank, world_size", [(-1, 2), (2, 2), (0, 0), (0, 5000)])
def test_bad_shard_arguments(rank, world_size):
    ds = load_dataset("synthetic", seed=0)
    with pytest.raises(ConfigError):
        ds.shard(rank, world_size)


def test_dataset_checks_its_arrays():
    x = np.zeros((3, 1, 28, 28), np.float32)
    with pytest.raises(ShapeError):
        Dataset("bad", x, np.zeros(2, np.int64), x, np.zeros(3, np.int64), "test")


@pytest.mark.parametrize("n, batch_size", [(10, 3), (10, 5), (10, 20), (1, 1)])
def test_batches_cover_everything_once(n, batch_size):
    x = np.arange(n, dtype=np.float32)[:, None]  # (n, 1): each row is its own index
    y = np.arange(n)
    batches = list(iterate_batches(x, y, batch_size, np.random.default_rng(0)))
    assert [len(yb) for _, yb in batches][:-1] == [batch_size] * (len(batches) - 1)
    assert len(batches) == -(-n // batch_size)  # the last short batch is included
    seen = np.concatenate([yb for _, yb in batches])
    assert sorted(seen.tolist()) == list(range(n))
    for xb, yb in batches:
        np.testing.assert_array_equal(xb[:, 0], yb)  # inputs stay paired with labels


def test_batches_shuffle_by_rng_and_keep_order_without():
    x, y = np.zeros((100, 2), np.float32), np.arange(100)
    first = [yb for _, yb in iterate_batches(x, y, 10, np.random.default_rng(5))]
    again = [yb for _, yb in iterate_batches(x, y, 10, np.random.default_rng(5))]
    np.testing.assert_array_equal(np.concatenate(first), np.concatenate(again))
    assert np.concatenate(first).tolist() != list(range(100))
    ordered = [yb for _, yb in iterate_batches(x, y, 30, None, shuffle=False)]
    assert np.concatenate(ordered).tolist() == list(range(100))
    assert [len(b) for b in ordered] == [30, 30, 30, 10]


def test_batches_reject_bad_arguments():
    x, y = np.zeros((4, 2)), np.zeros(4)
    with pytest.raises(ConfigError):
        list(iterate_batches(x, y, 0, np.random.default_rng(0)))
    with pytest.raises(ShapeError):
        list(iterate_batches(x, y[:3], 2, np.random.default_rng(0)))
