"""IDX files: the MNIST container format, read with NumPy (written by minips.provision.fetch).

Format (http://yann.lecun.com/exdb/mnist/, "FILE FORMATS"): a 4-byte magic number
``0x00 0x00 <dtype code> <ndim>``, then ``ndim`` big-endian uint32 dimension sizes, then the
data in C order, big-endian. Files are often gzipped; gzip is detected by its own magic bytes
(``1f 8b``), not by the file name, so a renamed file still reads.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from minips.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"

# IDX dtype code -> big-endian NumPy dtype (the codes are fixed by the format).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

# No real IDX file has more axes than this; a larger count means the header is garbage.
MAX_NDIM = 8


def read_idx_bytes(path: str | Path) -> bytes:
    """Return the raw IDX bytes of ``path``, decompressing it when it is gzipped.

    A corrupt or truncated gzip stream becomes a one-line DataError naming the file,
    never a zlib traceback.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        # gzip raises BadGzipFile (an OSError) for bad headers, EOFError for a stream that
        # stops early and zlib.error for damaged deflate data: all mean "corrupt download".
        raise DataError(f"{path}: corrupt gzip stream: {exc}") from None


def parse_idx(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """Decode IDX bytes into an array of native byte order, validating every header field.

    Raises DataError (one line, prefixed with ``name``) on a bad magic number, an unknown
    dtype code, an implausible number of dimensions, or a data size that does not match the
    dimensions (truncated file or trailing garbage).
    """
    if len(data) < 4:
        raise DataError(f"{name}: not an IDX file: only {len(data)} bytes")
    zero1, zero2, code, ndim = data[0], data[1], data[2], data[3]
    if zero1 != 0 or zero2 != 0 or code not in IDX_DTYPES:
        raise DataError(f"{name}: not an IDX file: bad magic number 0x{data[:4].hex()}")
    if not 1 <= ndim <= MAX_NDIM:
        raise DataError(f"{name}: bad IDX header: {ndim} dimensions (expected 1..{MAX_NDIM})")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DataError(f"{name}: truncated IDX file: header needs {header_len} bytes")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    found = len(data) - header_len
    if found < expected:
        raise DataError(
            f"{name}: truncated IDX file: expected {expected} bytes of data, found {found}"
        )
    if found > expected:
        raise DataError(
            f"{name}: corrupt IDX file: {found - expected} bytes after the data "
            f"(shape {shape} needs {expected})"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(shape)
    # Native byte order so downstream arithmetic is not slowed by byte swapping.
    return array.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (gzipped or raw) into an array of shape ``dims`` and native byte order.

    Every problem (missing file, corrupt gzip, bad magic, wrong size) is a one-line DataError
    that starts with the file's path as given, e.g. ``data/train-images-idx3-ubyte.gz:
    truncated IDX file: expected 47040000 bytes of data, found 1000``.
    """
    path = Path(path)
    return parse_idx(read_idx_bytes(path), name=str(path))
