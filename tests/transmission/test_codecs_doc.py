"""docs/protocol.md section 13's codec examples, built by hand and by the reference encoder.

Each example is checked three ways: the hex in the document equals bytes built with msgpack
and struct alone (what a program written from the document would send), the reference
encoder produces the same bytes, and decoding the document's frames gives the gradient the
document states.
"""

import struct

import msgpack
import numpy as np
import pytest
from test_server_protocol_doc import _doc_frame

from minips.guard import wire_checks
from minips.protocol import wire
from minips.protocol.wire import WirePart
from minips.transmission import codecs

HEADER = {"v": 1, "op": "push", "rid": 2, "worker": "w0", "seq": 0, "base": 0}


def _desc(dtype, shape, codec, part=None, of=None, name="fc.w"):
    desc = {"name": name, "dtype": dtype, "shape": shape, "codec": codec}
    if part is not None:
        desc.update(part=part, of=of)
    return desc


def _f16(*values):
    return np.array(values, np.float16).tobytes()  # IEEE half, little-endian on every host


# codec -> (descriptors, raw frames by hand, WireParts for the encoder, documented gradient)
EXAMPLES = {
    "fp16": (
        [_desc("float16", [2], "fp16", name="fc.b")],
        [_f16(0.5, -1.0)],
        [WirePart("fc.b", np.array([0.5, -1.0], np.float16), "fp16")],
        ("fc.b", [0.5, -1.0]),
    ),
    "topk": (
        [
            _desc("int32", [2], "topk", "indices", [2, 3]),
            _desc("float32", [2], "topk", "values", [2, 3]),
        ],
        [struct.pack("<2i", 1, 5), struct.pack("<2f", 3.0, -1.5)],
        codecs.TopK(ratio=2 / 6).encode("fc.w", np.array([[0, 3, 0], [0, 0, -1.5]], np.float32)),
        ("fc.w", [[0, 3, 0], [0, 0, -1.5]]),
    ),
    "sf": (
        [
            _desc("float32", [2, 2], "sf", "x", [2, 3]),
            _desc("float16", [2, 3], "sf", "dy", [2, 3]),
        ],
        [struct.pack("<4f", 1, 0, 0, 2), _f16(0.5, 0, -1, 0.25, 1, 0)],
        [
            WirePart("fc.w", np.array([[1, 0], [0, 2]], np.float32), "sf", "x", (2, 3)),
            WirePart(
                "fc.w", np.array([[0.5, 0, -1], [0.25, 1, 0]], np.float16), "sf", "dy", (2, 3)
            ),
        ],
        ("fc.w", [[0.5, 0, -1], [0.5, 2, 0]]),
    ),
    "lowrank": (
        [
            _desc("float32", [2, 1], "lowrank", "p", [2, 3]),
            _desc("float32", [3, 1], "lowrank", "q", [2, 3]),
        ],
        [struct.pack("<2f", 1, 0.5), struct.pack("<3f", 2, 0, -1)],
        [
            WirePart("fc.w", np.array([[1], [0.5]], np.float32), "lowrank", "p", (2, 3)),
            WirePart("fc.w", np.array([[2], [0], [-1]], np.float32), "lowrank", "q", (2, 3)),
        ],
        ("fc.w", [[2, 0, -1], [1, 0, -0.5]]),
    ),
}


@pytest.mark.parametrize("codec", sorted(EXAMPLES))
def test_codec_example_matches_the_document(codec):
    descriptors, raw, parts, (name, gradient) = EXAMPLES[codec]
    by_hand = [msgpack.packb({**HEADER, "arrays": descriptors}), *raw]
    documented = [_doc_frame(f"codec-{codec}-frame-{i}") for i in range(len(by_hand))]
    assert documented == by_hand

    header = {k: v for k, v in HEADER.items() if k != "v"}
    assert [bytes(f) for f in wire.encode_parts(header, parts)] == documented

    grads, extras = codecs.decode_gradients(wire_checks.decode_request(documented))
    assert extras == {} and list(grads) == [name]
    assert grads[name].dtype == np.float32
    np.testing.assert_array_equal(grads[name], np.array(gradient, np.float32))


def test_the_sf_example_is_x_transposed_times_dy():
    _, _, parts, (_, gradient) = EXAMPLES["sf"]
    x, dy = (part.array.astype(np.float32) for part in parts)
    np.testing.assert_array_equal(x.T @ dy, gradient)
