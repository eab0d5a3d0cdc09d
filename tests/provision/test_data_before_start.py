"""`minips run` checks its dataset's files before any process starts: a missing, truncated
or corrupt IDX file is one line `error: ...` naming it by its full path, exit 2, and no
run directory (nothing was started)."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minips.data.datasets import SAMPLE_DIR

TRAIN = "train-images-idx3-ubyte.gz"


def _damage(directory: Path, how: str) -> str:
    """Damage the sample's training images in `directory` by `how`; what the error names."""
    path = directory / TRAIN
    if how == "truncated gzip":
        path.write_bytes(path.read_bytes()[:3000])
    elif how == "truncated IDX":
        path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:5000]))
    elif how == "not IDX":
        path.write_bytes(gzip.compress(b"hello, not an IDX file"))
    else:  # missing
        path.unlink()
        return f"{directory} (missing train-images-idx3-ubyte[.gz])"
    return str(path)


@pytest.mark.parametrize("how", ["truncated gzip", "truncated IDX", "not IDX", "missing"])
def test_a_bad_data_file_is_named_by_its_path_before_anything_starts(tmp_path, how):
    data = tmp_path / "data"
    shutil.copytree(SAMPLE_DIR, data / "sample")
    named = _damage(data / "sample", how)
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "minips", "run", "--data-dir", str(data), "--out", str(out),
         "--workers", "2", "--epochs", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert named in lines[0], lines
    assert not out.exists(), sorted(out.rglob("*"))  # no server, evaluator or worker started
