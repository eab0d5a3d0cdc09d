"""Where a machine's datasets are: the directory `load_dataset(name, data_dir)` would read
(`minips data`, `minips run`'s check of its options, the report's labels), and the check
of every file a run will train and test on, made before any process starts (`minips
run`). The look-up order itself is minips.data.datasets's (its module docstring).
"""

from __future__ import annotations

from pathlib import Path

from minips.data.datasets import candidate_dirs, check_name, check_pair, idx_paths, load_dataset
from minips.data.idx import read_idx


def find_dataset(
    name: str,
    data_dir: str | Path | None = None,
    *,
    system_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> str | None:
    """Where ``load_dataset(name, data_dir)`` would load from: a directory, or None if absent.

    ``synthetic`` needs no files and gives the string ``"generated from the seed"``.
    """
    check_name(name)
    if name == "synthetic":
        return "generated from the seed"
    for directory in candidate_dirs(name, data_dir, system_dir, cache_dir):
        if idx_paths(directory) is not None:
            return str(directory)
    return None


def check_dataset_files(name: str, data_dir: str | Path | None = None) -> None:
    """Read and check every file ``load_dataset(name, data_dir)`` would train and test on,
    without normalising: a one-line DataError naming the file by its full path when one is
    missing, truncated or corrupt (what `minips run` asks before any process starts)."""
    check_name(name)
    if name == "synthetic":
        return
    found = find_dataset(name, data_dir)
    if found is None:
        load_dataset(name, data_dir)  # it words the error: where it looked
        return
    paths = idx_paths(Path(found))
    assert paths is not None  # find_dataset found all four
    raw = {role: read_idx(path.absolute()) for role, path in paths.items()}
    check_pair(raw["train_images"], raw["train_labels"], "training", found)
    check_pair(raw["test_images"], raw["test_labels"], "test", found)
