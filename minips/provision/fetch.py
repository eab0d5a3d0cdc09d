"""Download the official IDX files of a dataset into the user cache, checksum-verified.

Each file is streamed to a hidden temporary file next to its destination and renamed into
place only after its MD5 matches a known value, so an interrupted or corrupted download never
leaves a file that ``load_dataset`` would pick up. MD5 is what the publishers list; it guards
against corruption here, not against an attacker.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import click
import numpy as np

from minips.data.datasets import IDX_FILES, check_name
from minips.data.idx import GZIP_MAGIC, IDX_DTYPES, MAX_NDIM, read_idx_bytes
from minips.errors import ConfigError, DataError
from minips.provision.locations import default_cache_dir

# Official locations: Zalando's S3 bucket (as in the Fashion-MNIST README) and the MNIST mirror
# that torchvision uses since yann.lecun.com started refusing downloads.
BASE_URLS: dict[str, str] = {
    "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/",
}

# Accepted MD5 digests per file. A file passes when the MD5 of its bytes, or of its
# decompressed IDX content, is listed. The first value is the publisher's MD5 of the .gz
# (Zalando's README; torchvision for MNIST). For Fashion-MNIST the second is the MD5 of the
# decompressed data, measured from Debian's dataset-fashion-mnist: Debian re-gzipped the same
# data, so a re-compressed mirror still verifies by content.
CHECKSUMS: dict[str, dict[str, tuple[str, ...]]] = {
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": (
            "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        ),
        "train-labels-idx1-ubyte.gz": (
            "25c81989df183df01b3e8a0aad5dffbe",
            "9018921c3c673c538a1fc5bad174d6f9",
        ),
        "t10k-images-idx3-ubyte.gz": (
            "bef4ecab320f06d8554ea6380940ec79",
            "8181f5470baa50b63fa0f6fddb340f0a",
        ),
        "t10k-labels-idx1-ubyte.gz": (
            "bb300cfdad3c16e7a12a480ee83cd310",
            "15d484375f8d13e6eb1aabb0c3f46965",
        ),
    },
    "mnist": {
        "train-images-idx3-ubyte.gz": ("f68b3c2dcbeaaa9fbdd348bbdeb94873",),
        "train-labels-idx1-ubyte.gz": ("d53e105ee54ea40749a09fcbcd1e9432",),
        "t10k-images-idx3-ubyte.gz": ("9fb629c4189551a2d022fa330f9573f3",),
        "t10k-labels-idx1-ubyte.gz": ("ec29112dd5afa0611ce80d1b7f02629c",),
    },
}

CHUNK_BYTES = 1 << 16
DEFAULT_TIMEOUT_S = 30.0


def md5_of(path: Path) -> str:
    """Hex MD5 of a file's bytes, read in chunks."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: Path, accepted: Sequence[str], label: str) -> None:
    """Raise DataError unless ``path``'s MD5 (as stored, or decompressed) is in ``accepted``."""
    file_md5 = md5_of(path)
    if file_md5 in accepted:
        return
    with open(path, "rb") as f:
        is_gzip = f.read(2) == GZIP_MAGIC
    if is_gzip:
        try:
            content_md5 = hashlib.md5(read_idx_bytes(path), usedforsecurity=False).hexdigest()
        except DataError:
            content_md5 = None  # corrupt gzip: certainly not the file we want
        if content_md5 in accepted:
            return
    raise DataError(
        f"{label}: checksum mismatch (md5 {file_md5}, expected {accepted[0]}); "
        "the download is corrupt or the mirror changed, so it was not saved"
    )


def _copy(response: BinaryIO, out: BinaryIO, on_chunk: Callable[[int], object]) -> None:
    """Copy the HTTP body to ``out`` chunk by chunk, reporting each chunk's size."""
    for chunk in iter(lambda: response.read(CHUNK_BYTES), b""):
        out.write(chunk)
        on_chunk(len(chunk))


def _fetch(url: str, dest: Path, timeout: float, progress: bool) -> None:
    """Stream ``url`` into ``dest``, with a click progress bar on stderr when asked."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            if not progress:
                _copy(response, out, lambda n: None)
                return
            with click.progressbar(length=total, label=Path(url).name, file=sys.stderr) as bar:
                _copy(response, out, bar.update)
    except urllib.error.HTTPError as exc:
        raise DataError(f"could not download {url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise DataError(f"could not download {url}: {exc.reason}") from None
    except ValueError as exc:  # urllib's answer to a malformed URL or unknown scheme
        raise DataError(f"could not download {url}: {exc}") from None
    except (OSError, http.client.HTTPException) as exc:
        # Timeouts, resets and short reads mid-stream: the network, not the user, failed.
        raise DataError(f"could not download {url}: {exc or type(exc).__name__}") from None


def download(
    name: str,
    cache_dir: str | Path | None = None,
    base_url: str | None = None,
    progress: bool = True,
    *,
    checksums: Mapping[str, Sequence[str]] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Path:
    """Fetch the four IDX .gz files of ``name`` into ``cache_dir/name`` and return that folder.

    ``cache_dir`` defaults to ``$MINIPS_DATA`` or ``~/.cache/minips``; ``base_url`` to the
    official location (BASE_URLS); ``checksums`` (file name -> accepted MD5s) to CHECKSUMS —
    tests inject their own. Files already present and valid are kept. A checksum mismatch or
    a network failure raises a one-line DataError and leaves no partial file behind.
    """
    check_name(name)
    if name not in BASE_URLS:
        raise ConfigError(
            f"nothing to download for {name!r}: "
            + ("it ships with minips" if name == "sample" else "it is generated from the seed")
        )
    base_url = base_url or BASE_URLS[name]
    checksums = checksums if checksums is not None else CHECKSUMS[name]
    target_dir = Path(cache_dir if cache_dir is not None else default_cache_dir()) / name
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create cache directory {target_dir}: {exc.strerror}") from None
    for stem in IDX_FILES.values():
        filename = f"{stem}.gz"
        accepted = tuple(checksums[filename])
        dest = target_dir / filename
        if dest.is_file():
            try:
                verify_file(dest, accepted, filename)
                continue  # already downloaded and intact
            except DataError:
                pass  # stale or damaged: fetch it again
        url = base_url.rstrip("/") + "/" + filename
        fd, tmp_name = tempfile.mkstemp(dir=target_dir, prefix=f".{filename}.", suffix=".part")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            _fetch(url, tmp, timeout, progress)
            verify_file(tmp, accepted, filename)
            os.replace(tmp, dest)  # atomic: the cache only ever holds verified files
        finally:
            tmp.unlink(missing_ok=True)
    return target_dir


_CODE_FOR_KIND = {(dt.kind, dt.itemsize): code for code, dt in IDX_DTYPES.items()}


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode ``array`` as IDX bytes (header + big-endian data); the inverse of parse_idx."""
    array = np.asarray(array)
    code = _CODE_FOR_KIND.get((array.dtype.kind, array.dtype.itemsize))
    if code is None or array.ndim == 0 or array.ndim > MAX_NDIM:
        raise DataError(f"cannot store dtype {array.dtype} with {array.ndim} dims in IDX")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=IDX_DTYPES[code]).tobytes()


def write_idx(path: str | Path, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file, gzipped when ``path`` ends in ``.gz``.

    The gzip header carries no timestamp (mtime=0) so the same array always gives the same
    bytes: the bundled sample is reproducible and its checksums stable.
    """
    path = Path(path)
    payload = idx_bytes(array)
    if path.suffix == ".gz":
        payload = gzip.compress(payload, compresslevel=9, mtime=0)
    path.write_bytes(payload)
    return path
