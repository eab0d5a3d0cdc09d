"""Datasets: how they are loaded, normalised, sharded and batched.

A dataset called NAME is read from the first directory holding its four IDX files:
``data_dir/NAME`` then ``data_dir`` itself (``--data-dir DIR``), or without a data_dir, for
``sample`` only, the Fashion-MNIST subset bundled in ``minips/sample/`` (`local_dirs`).
A loader may be given another way to find them (`find`): minips.provision.locations's
`find_data` adds the machine's system and cache directories and words what to install.
``synthetic`` has no files: it is generated from the seed (see minips.data.synthetic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minips.data.idx import read_idx
from minips.data.sharding import shard_positions
from minips.data.shuffle import EpochShuffle, shuffle
from minips.data.synthetic import SYNTHETIC_MEAN, SYNTHETIC_STD, make_synthetic
from minips.errors import ConfigError, DataError, ShapeError

DATASET_NAMES: tuple[str, ...] = ("sample", "fashion-mnist", "mnist", "synthetic")
FILE_DATASETS: tuple[str, ...] = ("sample", "fashion-mnist", "mnist")

# The four standard IDX file names (each may also end in .gz), by role.
IDX_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

SAMPLE_DIR = Path(__file__).resolve().parent.parent / "sample"
IMAGE_SHAPE = (28, 28)
FindData = Callable[[str, str | Path | None], Path]  # (name, data_dir) -> its files' directory
N_CLASSES = 10

# Normalisation: x = (pixel / 255 - mean) / std, with the mean and std of pixel / 255 over the
# dataset's 60,000 training images (Fashion-MNIST measured here from the official files:
# 0.28604, 0.35302; MNIST: the widely used 0.1307, 0.3081). The sample uses Fashion-MNIST's
# constants so a model trained on it sees inputs on the same scale as on the full set.
NORMALIZATION: dict[str, tuple[float, float]] = {
    "fashion-mnist": (0.2860, 0.3530),
    "sample": (0.2860, 0.3530),
    "mnist": (0.1307, 0.3081),
    "synthetic": (SYNTHETIC_MEAN, SYNTHETIC_STD),
}


@dataclass(eq=False)
class Dataset:
    """A labelled image set, ready for training.

    ``x_train`` (N, 1, 28, 28) float32, normalised; ``y_train`` (N,) int64 in [0, 10);
    ``x_test`` / ``y_test`` the same for the held-out set; ``source`` says where it came from.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if x.ndim != 4 or y.ndim != 1 or len(x) != len(y):
                raise ShapeError(
                    f"dataset {self.name!r}: {split} images {x.shape} and labels {y.shape} "
                    "do not match (expected (N, C, H, W) and (N,))"
                )

    @property
    def n_classes(self) -> int:
        """Number of classes (labels are 0 .. n_classes - 1)."""
        return N_CLASSES

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, (C, H, W): (1, 28, 28)."""
        return tuple(self.x_train.shape[1:])

    def shard(self, rank: int, world_size: int, partition: str = "iid", seed: int = 0) -> Dataset:
        """Worker `rank`'s training examples under `partition` (docs/model.md 4.2).

        "iid": the contiguous slice ``[rank*N//W, (rank+1)*N//W)`` (views); the shards cover
        the training set and differ in size by at most one, and the training set was
        shuffled at load time, so each is a class-mixed random subset. "dirichlet:ALPHA" and
        "shards:K" skew the labels (minips.data.sharding; copies, in training order), drawn
        from the run's `seed`. The test set is shared unchanged.
        """
        n = len(self.y_train)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"bad shard: rank {rank} of world size {world_size}")
        if world_size > n:
            raise ConfigError(f"cannot split {n} training examples into {world_size} shards")
        if partition == "iid":
            picked: slice | np.ndarray = slice(rank * n // world_size, (rank + 1) * n // world_size)
        else:
            picked = shard_positions(self.y_train, rank, world_size, partition, seed)
            if not len(picked):
                raise ConfigError(
                    f"--partition {partition} (seed {seed}) gives rank {rank} of {world_size} "
                    "no training example; a larger ALPHA or another seed gives it some"
                )
        return Dataset(
            name=self.name,
            x_train=self.x_train[picked],  # (n_shard, 1, 28, 28)
            y_train=self.y_train[picked],  # (n_shard,)
            x_test=self.x_test,
            y_test=self.y_test,
            source=self.source,
        )

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, train={len(self.y_train)}, test={len(self.y_test)}, "
            f"input_shape={self.input_shape}, source={self.source!r})"
        )


def check_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is one of DATASET_NAMES."""
    if name not in DATASET_NAMES:
        raise ConfigError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")


def idx_paths(directory: Path) -> dict[str, Path] | None:
    """The four IDX files of ``directory`` by role (raw preferred over .gz), or None."""
    found = {}
    for role, stem in IDX_FILES.items():
        for candidate in (directory / stem, directory / f"{stem}.gz"):
            if candidate.is_file():
                found[role] = candidate
                break
        else:
            return None
    return found


def local_dirs(name: str, data_dir: str | Path | None = None) -> list[Path]:
    """The directories looked in for ``name``'s files, in order (see the module docstring)."""
    if data_dir is None:
        return [SAMPLE_DIR] if name == "sample" else []
    # A bare --data-dir full of Fashion-MNIST files must not pass for "sample".
    return [Path(data_dir) / name] + ([Path(data_dir)] if name != "sample" else [])


def find_files(name: str, data_dir: str | Path | None = None) -> Path:
    """The first of `local_dirs` holding ``name``'s four IDX files; DataError if none does."""
    dirs = local_dirs(name, data_dir)
    for directory in dirs:
        if idx_paths(directory) is not None:
            return directory
    looked = ", ".join(str(d) for d in dirs) or "nowhere: no data_dir given"
    raise DataError(f"dataset {name!r} not found (looked in {looked})")


def normalize(images: np.ndarray, name: str) -> np.ndarray:
    """uint8 images (N, 28, 28) -> float32 (N, 1, 28, 28): (pixel / 255 - mean) / std."""
    mean, std = NORMALIZATION[name]
    x = images.astype(np.float32)[:, None, :, :]  # (N, 1, 28, 28)
    # One multiply and one subtract, in place: avoids two extra 188 MB temporaries on the
    # full 60,000-image training set.
    x *= np.float32(1.0 / (255.0 * std))
    x -= np.float32(mean / std)
    return x


def check_pair(images: np.ndarray, labels: np.ndarray, split: str, source: str) -> None:
    """Validate one split's raw arrays: (N, 28, 28) uint8 images and (N,) labels < 10,
    N >= 1 (no run can train on, or test on, no example)."""
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE or images.dtype != np.uint8:
        raise DataError(
            f"{source}: {split} images have shape {images.shape} and dtype {images.dtype}; "
            "expected (N, 28, 28) uint8"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(
            f"{source}: {split} labels have shape {labels.shape} for {len(images)} images"
        )
    if not len(labels):
        raise DataError(f"{source}: the {split} set is empty (0 images)")
    if labels.min() < 0 or labels.max() >= N_CLASSES:
        raise DataError(f"{source}: {split} labels outside 0..{N_CLASSES - 1}")


def _assemble(name: str, raw: tuple, seed: int, source: str) -> Dataset:
    """Validate, normalise and seed-shuffle raw uint8 arrays into a Dataset."""
    x_train, y_train, x_test, y_test = raw
    check_pair(x_train, y_train, "training", source)
    check_pair(x_test, y_test, "test", source)
    # Shuffling the training set once, by seed, makes the contiguous shards random subsets
    # (the bundled sample and synthetic labels would otherwise have structure in their order);
    # the portable shuffle, so a worker in any language can cut the same shards (model.md 4.2).
    order = shuffle(seed, len(y_train))  # (N,)
    return Dataset(
        name=name,
        x_train=normalize(x_train[order], name),  # (N, 1, 28, 28)
        y_train=y_train[order].astype(np.int64),  # (N,)
        x_test=normalize(x_test, name),
        y_test=y_test.astype(np.int64),
        source=source,
    )


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    seed: int = 0,
    *,
    find: FindData | None = None,
) -> Dataset:
    """Load dataset ``name`` (one of DATASET_NAMES), normalised, its training set shuffled by seed.

    find(name, data_dir): the directory holding the four IDX files, or a DataError saying
    where it looked (default: `find_files`, data_dir and the bundled sample only).
    ConfigError for an unknown name; DataError for missing, truncated or corrupt files.
    """
    check_name(name)
    if name == "synthetic":
        raw = make_synthetic(seed)
        return _assemble(name, raw, seed, source=f"synthetic (seed {seed})")
    directory = Path((find or find_files)(name, data_dir))
    paths = idx_paths(directory)
    if paths is None:  # a find that returned a directory without the files
        raise DataError(f"dataset {name!r}: {directory} lacks its IDX files")
    raw = tuple(read_idx(paths[role]) for role in IDX_FILES)
    return _assemble(name, raw, seed, source=str(directory))


def iterate_batches(
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    rng: np.random.Generator | EpochShuffle | None,
    shuffle: bool = True,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(xb, yb)`` mini-batches covering ``x`` (N, ...) and ``y`` (N,) once.

    With ``shuffle`` the order is ``rng.permutation(N)`` (a worker's EpochShuffle, docs/model.md
    4.3, or a NumPy generator; copies via fancy indexing);
    without, batches are consecutive views. The last batch is shorter when ``batch_size``
    does not divide N.
    """
    n = len(x)
    if len(y) != n:
        raise ShapeError(f"iterate_batches: {n} inputs but {len(y)} labels")
    if batch_size < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch_size}")
    if not shuffle:
        for start in range(0, n, batch_size):
            yield x[start : start + batch_size], y[start : start + batch_size]
        return
    if rng is None:
        raise ConfigError("iterate_batches: shuffle=True needs an rng")
    order = rng.permutation(n)  # (N,)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]  # (B,)
        yield x[idx], y[idx]
