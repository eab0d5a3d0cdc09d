"""The core's wire.decode: well-formed messages only, no field checked, yet safe on any
input: each array view holds exactly its frame, and anything malformed is
ProtocolError("malformed"). The checks with their codes are tests/guard/test_wire_checks.py's.
"""

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minips.protocol import wire
from minips.protocol.wire import ProtocolError


def _header(**fields):
    return msgpack.packb({"v": 1, "op": "push", **fields})


def test_decode_round_trips_single_and_multi_part_tensors():
    part = wire.WirePart
    parts = [part("w", np.arange(6, dtype=np.float32).reshape(2, 3)),
             part("g", np.array([1, 4], np.int32), "topk", "indices", (2, 3)),
             part("g", np.array([0.5, -1], np.float32), "topk", "values", (2, 3))]  # fmt: skip
    message = wire.decode(wire.encode_parts({"op": "push", "worker": "a"}, parts))
    assert message.op == "push" and message.codecs == {"w": "dense", "g": "topk"}
    assert np.array_equal(message.arrays["w"], parts[0].array)
    assert np.array_equal(message.parts["g"]["values"], parts[2].array)
    assert message.dense_shapes == {"g": (2, 3)}


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"\xc1"],  # not msgpack
        [msgpack.packb([1, 2])],  # not a map
        [msgpack.packb({"v": 1})],  # no op
        [
            _header(arrays=[{"name": "x", "dtype": "float32", "shape": [3], "codec": "dense"}]),
            b"\x00" * 8,
        ],  # a frame shorter than its shape: never read past it
        [
            _header(arrays=[{"name": "x", "dtype": "float32", "shape": [-1], "codec": "dense"}]),
            b"\x00" * 8,
        ],  # a negative size (NumPy would infer it)
        [
            _header(arrays=[{"name": "x", "dtype": "object", "shape": [1], "codec": "dense"}]),
            b"\x00" * 8,
        ],  # no such wire dtype
        [_header(arrays=[{"name": "x", "shape": [1]}]), b"\x00" * 4],  # keys missing
        [_header(arrays=[]), b"\x00" * 4],  # a frame nothing describes
    ],
)
def test_malformed_input_is_a_malformed_protocol_error(frames):
    with pytest.raises(ProtocolError) as refused:
        wire.decode(frames)
    assert refused.value.code == "malformed"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_random_frames_never_raise_anything_but_protocol_error(frames):
    try:
        message = wire.decode(frames)
    except ProtocolError:
        return
    for array, frame in zip(message.arrays.values(), frames[1:], strict=False):
        assert array.nbytes <= len(frame)
