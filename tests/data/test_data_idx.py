"""IDX reading and writing: round trips, a hand-built oracle, and one-line errors on bad files."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minips.data import parse_idx, read_idx
from minips.errors import DataError
from minips.provision.fetch import idx_bytes, write_idx


def assert_one_line(exc: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(exc.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28),
        np.array([3, 1, 4, 1, 5], dtype=np.uint8),
        np.array([[-1, 2], [300, -32768]], dtype=np.int16),
        np.array([-7, 2**31 - 1], dtype=np.int32),
        np.array([[1.5, -0.25, np.pi]], dtype=np.float32),
        np.array([1e-300, -2.5], dtype=np.float64),
        np.array([-128, 127], dtype=np.int8),
    ],
)
def test_round_trip_file(tmp_path, array, suffix):
    path = write_idx(tmp_path / f"data-idx{suffix}", array)
    back = read_idx(path)
    assert back.dtype == array.dtype.newbyteorder("=")
    assert back.shape == array.shape
    np.testing.assert_array_equal(back, array)


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.uint8, np.int16, np.int32, np.float32, np.float64]),
        shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5),
    )
)
def test_round_trip_bytes_property(array):
    back = parse_idx(idx_bytes(array))
    assert back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_hand_built_big_endian_file_decodes():
    # Oracle independent of the writer: magic 00 00 0B(int16) 01, dim 3, data big-endian.
    raw = bytes([0, 0, 0x0B, 1]) + (3).to_bytes(4, "big") + b"\x00\x01\xff\xff\x01\x00"
    np.testing.assert_array_equal(parse_idx(raw), [1, -1, 256])


def test_gzip_detected_by_magic_not_by_name(tmp_path):
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    gz_named_plain = tmp_path / "plain-name"
    gz_named_plain.write_bytes(gzip.compress(idx_bytes(array)))
    plain_named_gz = tmp_path / "looks-compressed.gz"
    plain_named_gz.write_bytes(idx_bytes(array))
    np.testing.assert_array_equal(read_idx(gz_named_plain), array)
    np.testing.assert_array_equal(read_idx(plain_named_gz), array)


def test_gzip_output_is_reproducible(tmp_path):
    array = np.arange(100, dtype=np.uint8)
    a = write_idx(tmp_path / "a.gz", array).read_bytes()
    b = write_idx(tmp_path / "b.gz", array).read_bytes()
    assert a == b


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_truncated_data_names_expected_and_found(tmp_path, suffix):
    raw = idx_bytes(np.zeros((10, 28, 28), dtype=np.uint8))
    path = tmp_path / f"train-images-idx3-ubyte{suffix}"
    cut = raw[: 16 + 1000]
    path.write_bytes(gzip.compress(cut) if suffix else cut)
    with pytest.raises(DataError) as exc:
        read_idx(path)
    assert_one_line(exc, path.name, "truncated IDX file: expected 7840 bytes of data, found 1000")


def test_truncated_header(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(bytes([0, 0, 0x08, 3]) + b"\x00\x00\x00\x0a")
    with pytest.raises(DataError) as exc:
        read_idx(path)
    assert_one_line(exc, "short", "truncated IDX file")


def test_trailing_garbage_is_rejected(tmp_path):
    path = tmp_path / "long"
    path.write_bytes(idx_bytes(np.zeros(5, dtype=np.uint8)) + b"xx")
    with pytest.raises(DataError) as exc:
        read_idx(path)
    assert_one_line(exc, "long", "2 bytes after the data")


@pytest.mark.parametrize(
    "header",
    [
        bytes([0x01, 0, 0x08, 1]),  # first magic byte not zero
        bytes([0, 0x02, 0x08, 1]),  # second magic byte not zero
        bytes([0, 0, 0x07, 1]),  # unknown dtype code
        b"PK\x03\x04",  # a zip file, say
    ],
)
def test_bad_magic(tmp_path, header):
    path = tmp_path / "labels.idx"
    path.write_bytes(header + (4).to_bytes(4, "big") + b"\x00" * 4)
    with pytest.raises(DataError) as exc:
        read_idx(path)
    assert_one_line(exc, "labels.idx", "bad magic number")


@pytest.mark.parametrize("ndim", [0, 9, 255])
def test_implausible_ndim(tmp_path, ndim):
    path = tmp_path / "f"
    path.write_bytes(bytes([0, 0, 0x08, ndim]) + b"\x00" * 64)
    with pytest.raises(DataError) as exc:
        read_idx(path)
    assert_one_line(exc, "dimensions")


def test_tiny_file(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"\x00\x00")
    with pytest.raises(DataError) as exc:
        read_idx(path)
    assert_one_line(exc, "not an IDX file")


def test_corrupt_gzip_stream(tmp_path):
    payload = bytearray(gzip.compress(idx_bytes(np.arange(5000, dtype=np.int32))))
    for i in range(20, 60):  # smash the deflate data, keep the gzip magic
        payload[i] ^= 0xFF
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    path.write_bytes(bytes(payload))
    with pytest.raises(DataError) as exc:
        read_idx(path)
    assert_one_line(exc, path.name, "corrupt gzip stream")


def test_truncated_gzip_stream(tmp_path):
    payload = gzip.compress(idx_bytes(np.arange(5000, dtype=np.int32)))
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(payload[: len(payload) // 2])
    with pytest.raises(DataError) as exc:
        read_idx(path)
    assert_one_line(exc, path.name, "corrupt gzip stream")


def test_missing_file(tmp_path):
    with pytest.raises(DataError) as exc:
        read_idx(tmp_path / "nope.gz")
    assert_one_line(exc, "nope.gz", "cannot read")


def test_write_rejects_unsupported_dtype(tmp_path):
    with pytest.raises(DataError):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.complex64))
