"""A dataset's training labels in training order, without its images: enough to compute
every worker's label histogram under a partition (the report, the dashboard)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minips.data.datasets import N_CLASSES, idx_paths, load_dataset
from minips.data.idx import read_idx
from minips.data.sharding import owners
from minips.data.shuffle import shuffle
from minips.data.synthetic import make_synthetic
from minips.provision.locations import find_data, find_dataset


def training_labels(name: str, data_dir: str | Path | None = None) -> np.ndarray:
    """(N,) int64: the labels a worker's load_dataset(name, data_dir) trains on, in order.

    DataError / ConfigError (one line) as load_dataset when the files cannot be had.
    """
    if name == "synthetic":
        labels = make_synthetic(0)[1]
    else:
        found = find_dataset(name, data_dir)
        paths = idx_paths(Path(found)) if found is not None else None
        if paths is None:
            return load_dataset(name, data_dir, find=find_data).y_train  # it words the error
        labels = read_idx(paths["train_labels"])
    return labels[shuffle(0, len(labels))].astype(np.int64)  # docs/model.md 4.2


def worker_histograms(config: dict) -> list[list[int]] | None:
    """Each worker's examples per label, a row per rank, for a run's config.json (or hello's
    config): None under the iid partition, whose shards are all alike."""
    partition = config.get("partition") or "iid"
    if partition == "iid":
        return None
    labels = training_labels(config["dataset"], config.get("data_dir"))
    world_size = int(config.get("workers") or config["world_size"])
    return label_histograms(labels, world_size, partition, int(config.get("seed") or 0)).tolist()


def label_histograms(labels: np.ndarray, world_size: int, text: str, seed: int) -> np.ndarray:
    """Examples of each label per worker, (W, 10) int64: row w is worker w's histogram."""
    who = owners(labels, world_size, text, seed)
    hist = np.zeros((world_size, N_CLASSES), dtype=np.int64)
    np.add.at(hist, (who, labels), 1)
    return hist
