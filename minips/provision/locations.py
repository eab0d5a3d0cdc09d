"""Where a machine's datasets are: the look-up that `minips worker`, `minips run` and the
trainer give `load_dataset` (`find_data`), the directory it would read (`minips data`,
`minips run`'s check of its options, the report's labels), and the check of every file a
run will train and test on, made before any process starts (`minips run`).

Look-up order for the IDX files of a dataset called NAME (first complete set wins):

1. ``data_dir/NAME`` then ``data_dir`` itself (``--data-dir DIR``): when given, only there;
2. the system directory ``/usr/share/datasets/NAME`` (Debian's ``dataset-fashion-mnist``
   installs ``/usr/share/datasets/fashion-mnist``); override with ``$MINIPS_SYSTEM_DATA``;
3. the user cache ``$MINIPS_DATA/NAME`` or ``~/.cache/minips/NAME`` (``minips data download``);
4. for ``sample`` only, the Fashion-MNIST subset bundled in ``minips/sample/``.
"""

from __future__ import annotations

import os
from pathlib import Path

from minips.data.datasets import IDX_FILES, check_name, check_pair, idx_paths, local_dirs
from minips.data.idx import read_idx
from minips.errors import DataError

SYSTEM_DATA_DIR = Path("/usr/share/datasets")

_INSTALL_HINTS: dict[str, str] = {
    "fashion-mnist": "run `minips data download fashion-mnist`, "
    "or `apt-get install dataset-fashion-mnist`, or pass --data-dir DIR",
    "mnist": "run `minips data download mnist` or pass --data-dir DIR",
    "sample": "the bundled sample is missing from this installation; reinstall minips "
    "or pass --data-dir DIR",
}


def default_system_dir() -> Path:
    """The system dataset directory: ``$MINIPS_SYSTEM_DATA`` or /usr/share/datasets."""
    return Path(os.environ.get("MINIPS_SYSTEM_DATA") or SYSTEM_DATA_DIR)


def default_cache_dir() -> Path:
    """The user cache root: ``$MINIPS_DATA`` or ``~/.cache/minips`` (one folder per dataset)."""
    env = os.environ.get("MINIPS_DATA")
    return Path(env) if env else Path.home() / ".cache" / "minips"


def candidate_dirs(
    name: str,
    data_dir: str | Path | None = None,
    system_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> list[Path]:
    """The directories searched for ``name``'s files, in look-up order (see module doc)."""
    if data_dir is not None:
        # An explicit directory is the only place looked in: data found elsewhere would be
        # trained on without the user knowing.
        return local_dirs(name, data_dir)
    system = Path(system_dir if system_dir is not None else default_system_dir())
    cache = Path(cache_dir if cache_dir is not None else default_cache_dir())
    return [system / name, cache / name, *local_dirs(name)]


def find_data(
    name: str,
    data_dir: str | Path | None = None,
    *,
    system_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """The first of `candidate_dirs` holding ``name``'s four IDX files (`load_dataset`'s
    `find`); else a one-line DataError saying where it looked and what to do."""
    dirs = candidate_dirs(name, data_dir, system_dir, cache_dir)
    for directory in dirs:
        if idx_paths(directory) is not None:
            return directory
    looked = ", ".join(_describe(d) for d in dirs)
    hint = _INSTALL_HINTS[name]
    if data_dir is not None:
        hint = f"--data-dir {data_dir} is the only place looked in; fix it or leave it out"
    raise DataError(f"dataset {name!r} not found (looked in {looked}); {hint}")


def _describe(directory: Path) -> str:
    """``directory`` for an error message, noting what is missing if it exists."""
    if not directory.is_dir():
        return str(directory)
    missing = [
        f"{stem}[.gz]"
        for stem in IDX_FILES.values()
        if not (directory / stem).is_file() and not (directory / f"{stem}.gz").is_file()
    ]
    if len(missing) == len(IDX_FILES):
        return f"{directory} (no IDX files)"
    return f"{directory} (missing {', '.join(missing)})"


def find_dataset(
    name: str,
    data_dir: str | Path | None = None,
    *,
    system_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> str | None:
    """Where ``load_dataset(name, data_dir, find=find_data)`` would load from: a directory,
    or None if absent.

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
    """Read and check every file `load_dataset` (with `find_data`) would train and test on,
    without normalising: a one-line DataError naming the file by its full path when one is
    missing, truncated or corrupt (what `minips run` asks before any process starts)."""
    check_name(name)
    if name == "synthetic":
        return
    found = str(find_data(name, data_dir))  # it words the error: where it looked
    paths = idx_paths(Path(found))
    assert paths is not None  # find_data found all four
    raw = {role: read_idx(path.absolute()) for role, path in paths.items()}
    check_pair(raw["train_images"], raw["train_labels"], "training", found)
    check_pair(raw["test_images"], raw["test_labels"], "test", found)
