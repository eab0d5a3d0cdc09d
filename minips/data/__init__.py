"""Datasets for minips: IDX reading, the dataset registry, sharding and batching (finding,
downloading and writing the files is minips.provision's).

    from minips.data import load_dataset, iterate_batches
    ds = load_dataset("sample", seed=0)          # x_train (N, 1, 28, 28) float32, normalised
    shard = ds.shard(rank=0, world_size=4)       # disjoint, covering slices of the train set
    for xb, yb in iterate_batches(shard.x_train, shard.y_train, 64, np.random.default_rng(0)):
        ...

Names: ``sample`` (a class-balanced Fashion-MNIST subset shipped in the package),
``fashion-mnist``, ``mnist`` (IDX files found on disk, see ``local_dirs``; the machine's
system and cache directories are minips.provision.locations's ``find_data``) and
``synthetic`` (generated from the seed, for tests).
"""

from minips.data.datasets import (
    DATASET_NAMES,
    IDX_FILES,
    NORMALIZATION,
    SAMPLE_DIR,
    Dataset,
    iterate_batches,
    load_dataset,
    normalize,
)
from minips.data.idx import parse_idx, read_idx

__all__ = [
    "DATASET_NAMES",
    "IDX_FILES",
    "NORMALIZATION",
    "SAMPLE_DIR",
    "Dataset",
    "iterate_batches",
    "load_dataset",
    "normalize",
    "parse_idx",
    "read_idx",
]
