"""What the gateway serves of a dataset: a worker's shard and the test set, as IDX bytes.

A browser could cut its shard from the dataset's files itself (the training order is the
portable shuffle of docs/model.md §4.2), but would download the whole set for it, and
cannot generate `synthetic`; so the gateway loads the dataset exactly as `minips worker`
does and serves each shard's examples in shard order as IDX files: uint8 pixels
(N, 28, 28) and uint8 labels (N,). The worker normalises the pixels itself (docs/model.md
§4.1), which gives back the very float32 values NumPy has.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minips.data import NORMALIZATION, Dataset, load_dataset
from minips.data.sharding import owners
from minips.errors import ConfigError
from minips.provision.fetch import idx_bytes
from minips.provision.locations import find_data

MAX_PARTITIONS = 8  # partitions remembered per dataset (a gateway serves one run at a time)


def to_pixels(x: np.ndarray, name: str) -> np.ndarray:
    """Normalised images (N, 1, 28, 28) float32 -> the uint8 pixels (N, 28, 28) they came from.

    Inverts x = pixel / (255 std) - mean / std in float64 and rounds: the float32 error is
    far below half a grey level, so the pixels are exact (tests check the round trip).
    """
    mean, std = NORMALIZATION[name]
    pixels = np.rint((x[:, 0].astype(np.float64) * std + mean) * 255.0)
    return np.clip(pixels, 0, 255).astype(np.uint8)


@dataclass
class ServedDataset:
    """One dataset as uint8 pixels and labels, ready to cut into shards."""

    name: str
    train_pixels: np.ndarray  # (N, 28, 28) uint8, in the training order of docs/model.md §4.2
    train_labels: np.ndarray  # (N,) uint8
    test_pixels: np.ndarray  # (M, 28, 28) uint8
    test_labels: np.ndarray  # (M,) uint8
    # the owner of every training example per (world size, partition, seed): a class's
    # browsers all ask for the same one, which takes a Python loop over N to draw
    owners: dict[tuple[int, str, int], np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_dataset(cls, data: Dataset) -> ServedDataset:
        return cls(
            data.name,
            to_pixels(data.x_train, data.name),
            data.y_train.astype(np.uint8),
            to_pixels(data.x_test, data.name),
            data.y_test.astype(np.uint8),
        )

    def info(self) -> dict:
        """What a worker needs to know before it downloads anything."""
        mean, std = NORMALIZATION[self.name]
        return {
            "name": self.name,
            "mean": mean,
            "std": std,
            "train": len(self.train_labels),
            "test": len(self.test_labels),
            "shape": [1, 28, 28],
            "classes": 10,
        }

    def train_shard(
        self, rank: int, world_size: int, part: str, partition: str = "iid", seed: int = 0
    ) -> bytes:
        """IDX bytes of shard `rank` of `world_size`: part "images" or "labels".

        Dataset.shard's examples: under "iid" the slice [rank*N//W, (rank+1)*N//W), else
        those the partition gives the rank under the run's `seed` (docs/model.md 4.2), in
        training order; ConfigError for a bad rank or partition.
        """
        if partition != "iid":
            return self._parted_shard(rank, world_size, part, partition, seed)
        shard = Dataset(  # reuse Dataset.shard's checks and arithmetic on the uint8 arrays
            self.name,
            self.train_pixels[:, None],
            self.train_labels,
            self.test_pixels[:, None],
            self.test_labels,
            "gateway",
        ).shard(rank, world_size)
        return idx_bytes(shard.x_train[:, 0] if part == "images" else shard.y_train)

    def _parted_shard(
        self, rank: int, world_size: int, part: str, partition: str, seed: int
    ) -> bytes:
        """train_shard under a label-skewing partition, its owners drawn once per run."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"bad shard: rank {rank} of world size {world_size}")
        key = (world_size, partition, seed)
        who = self.owners.get(key)  # two requests at once may both draw it: the same result
        if who is None:
            who = owners(self.train_labels, world_size, partition, seed)
            if len(self.owners) >= MAX_PARTITIONS:
                self.owners.clear()
            self.owners[key] = who
        picked = np.flatnonzero(who == rank)  # (n_shard,) in training order
        if not len(picked):
            raise ConfigError(f"--partition {partition} (seed {seed}) gives rank {rank} no example")
        return idx_bytes(
            self.train_pixels[picked] if part == "images" else self.train_labels[picked]
        )

    def test_set(self, part: str) -> bytes:
        """IDX bytes of the whole test set, unshuffled: part "images" or "labels"."""
        return idx_bytes(self.test_pixels if part == "images" else self.test_labels)


class DatasetCache:
    """Datasets loaded on first use (like `minips worker`: load_dataset(name, data_dir))."""

    def __init__(self, data_dir: str | Path | None = None) -> None:
        self.data_dir = data_dir
        self._loaded: dict[str, ServedDataset] = {}
        self._lock = threading.Lock()  # two browsers asking at once load it once

    def get(self, name: str) -> ServedDataset:
        """The dataset `name`; ConfigError / DataError (one line) when it cannot be had."""
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = ServedDataset.from_dataset(
                    load_dataset(name, self.data_dir, find=find_data)
                )
            return self._loaded[name]
