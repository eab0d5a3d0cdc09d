"""Datasets for minips: IDX reading, the dataset registry, sharding and batching (downloading
the official files is minips.provision.fetch's).

    from minips.data import load_dataset, iterate_batches
    ds = load_dataset("sample", seed=0)          # x_train (N, 1, 28, 28) float32, normalised
    shard = ds.shard(rank=0, world_size=4)       # disjoint, covering slices of the train set
    for xb, yb in iterate_batches(shard.x_train, shard.y_train, 64, np.random.default_rng(0)):
        ...

Names: ``sample`` (a class-balanced Fashion-MNIST subset shipped in the package),
``fashion-mnist``, ``mnist`` (IDX files found on disk, see ``candidate_dirs``) and
``synthetic`` (generated from the seed, for tests).
"""

from minips.data.datasets import (
    DATASET_NAMES,
    IDX_FILES,
    NORMALIZATION,
    SAMPLE_DIR,
    SYSTEM_DATA_DIR,
    Dataset,
    candidate_dirs,
    default_cache_dir,
    default_system_dir,
    iterate_batches,
    load_dataset,
    normalize,
)
from minips.data.idx import idx_bytes, parse_idx, read_idx, write_idx

__all__ = [
    "DATASET_NAMES",
    "IDX_FILES",
    "NORMALIZATION",
    "SAMPLE_DIR",
    "SYSTEM_DATA_DIR",
    "Dataset",
    "candidate_dirs",
    "default_cache_dir",
    "default_system_dir",
    "idx_bytes",
    "iterate_batches",
    "load_dataset",
    "normalize",
    "parse_idx",
    "read_idx",
    "write_idx",
]
