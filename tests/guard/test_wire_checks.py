"""The wire's checks: encode/decode round trips through the checked decoder and every
validation rule with its code (docs/protocol.md 9), without sockets."""

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minips.errors import MinipsError
from minips.guard.wire_checks import decode_checked as decode
from minips.guard.wire_checks import decode_reply, decode_request
from minips.protocol import wire
from minips.protocol.wire import Limits, ProtocolError, encode
from minips.transmission.codecs import decode_gradients


def _push_frames(arrays, **fields):
    header = {"op": "push", "worker": "w", "seq": 0, "base": 0, **fields}
    return encode(header, arrays)


def _raw(header, *frames):
    return [msgpack.packb(header), *frames]


def _code(frames, decoder=decode_request, **kw):
    with pytest.raises(ProtocolError) as info:
        decoder(frames, **kw)
    return info.value.code


# ------------------------------------------------------------------------------ round trips

wire_dtypes = st.sampled_from(["float32", "float16", "int32", "int64"])
arrays_strategy = st.dictionaries(
    st.text(min_size=1, max_size=12),
    wire_dtypes.flatmap(
        lambda name: hnp.arrays(
            np.dtype(name), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
        )
    ),
    max_size=4,
)
header_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(
    extra=st.dictionaries(
        st.text().filter(lambda k: k not in ("v", "op", "arrays", "rid")), header_values, max_size=4
    ),
    arrays=arrays_strategy,
    rid=st.integers(0, 2**64 - 1),
)
def test_round_trip_random_headers_and_arrays(extra, arrays, rid):
    codecs = {n: "fp16" for n, a in arrays.items() if a.dtype == np.float16}
    frames = encode({"op": "stats", "rid": rid, **extra}, arrays, codecs)
    # What a socket would deliver: plain bytes.
    message = decode([bytes(f) for f in frames])
    assert message.op == "stats"
    assert message.header["rid"] == rid
    assert message.header["v"] == wire.PROTOCOL_VERSION
    for key, value in extra.items():
        # Compared as packed bytes so that NaN (never equal to itself) round-trips too.
        assert msgpack.packb(message.header[key]) == msgpack.packb(value)
    assert list(message.arrays) == list(arrays)
    for name, array in arrays.items():
        got = message.arrays[name]
        assert got.dtype == array.dtype.newbyteorder("<") and got.shape == array.shape
        np.testing.assert_array_equal(got, array)  # NaN compare equal in assert_array_equal
        assert message.codecs[name] == codecs.get(name, "dense")


def test_encode_is_zero_copy_for_contiguous_float32():
    grad = np.arange(6, dtype=np.float32).reshape(2, 3)
    frames = encode({"op": "stats"}, {"g": grad})
    assert isinstance(frames[1], memoryview)
    assert np.shares_memory(np.frombuffer(frames[1], np.float32), grad)


def test_encode_converts_big_endian_and_non_contiguous():
    big = np.arange(4, dtype=">f4")
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    message = decode(encode({"op": "stats"}, {"big": big, "strided": strided}))
    np.testing.assert_array_equal(message.arrays["big"], [0, 1, 2, 3])
    np.testing.assert_array_equal(message.arrays["strided"], strided)


def test_encode_rejects_disallowed_dtype_and_codec():
    with pytest.raises(ProtocolError):
        encode({"op": "stats"}, {"x": np.zeros(2, np.float64)})
    with pytest.raises(ProtocolError):
        encode({"op": "stats"}, {"x": np.zeros(2, np.float32)}, {"x": "fp16"})


def test_push_request_round_trip_and_fp16_widening():
    grad = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    frames = encode(
        {"op": "push", "worker": "w0", "seq": 3, "base": 7, "rid": 1},
        {"fc.w": grad.astype(np.float16)},
        {"fc.w": "fp16"},
    )
    message = decode_request(frames)
    assert message.header["seq"] == 3 and message.header["base"] == 7
    widened = wire.to_float32(message.arrays["fc.w"], message.codecs["fc.w"])
    assert widened.dtype == np.float32
    np.testing.assert_allclose(widened, grad, atol=1e-3)


def test_protocol_error_is_a_minips_error():
    assert issubclass(ProtocolError, MinipsError)


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "frames, code",
    [
        ([], "malformed"),
        ([b"\xc1"], "malformed"),  # 0xc1 is never valid msgpack
        ([b"\x82\xa1v"], "malformed"),  # truncated map
        ([msgpack.packb([1, 2])], "malformed"),  # not a map
        ([msgpack.packb({"op": "stats"})], "version"),
        ([msgpack.packb({"v": 99, "op": "stats"})], "version"),
        ([msgpack.packb({"v": True, "op": "stats"})], "version"),
        ([msgpack.packb({"v": 1})], "bad_field"),
        ([msgpack.packb({"v": 1, "op": "launch_missiles"})], "unknown_op"),
        ([msgpack.packb({"v": 1, "op": "stats", "rid": -1})], "bad_field"),
        ([msgpack.packb({"v": 1, "op": "stats"}), b"\0\0\0\0"], "frame_count"),
        ([msgpack.packb({1: 2})], "malformed"),  # int map keys
        ([msgpack.packb({"v": 1, "op": "stats", "x": msgpack.ExtType(5, b"")})], "malformed"),
        ([msgpack.packb({"v": 1, "op": "stats"}) + b"\x00"], "malformed"),  # trailing bytes
    ],
)
def test_structural_errors(frames, code):
    assert _code(frames, decode) == code


def _desc(**overrides):
    return {"name": "a", "dtype": "float32", "shape": [2], "codec": "dense", **overrides}


@pytest.mark.parametrize(
    "desc, frame, code",
    [
        (_desc(dtype="float64"), b"\0" * 16, "dtype"),
        (_desc(dtype="object"), b"\0" * 8, "dtype"),
        (_desc(codec="zip"), b"\0" * 8, "dtype"),
        (_desc(codec="fp16"), b"\0" * 8, "dtype"),  # fp16 codec carries float16 only
        (_desc(shape=[3]), b"\0" * 8, "shape"),  # 12 bytes expected
        (_desc(shape=[2]), b"\0" * 7, "shape"),  # truncated frame
        (_desc(shape=[-2]), b"", "shape"),
        (_desc(shape="2"), b"\0" * 8, "bad_field"),  # not a list (docs/protocol.md 2)
        (_desc(shape=[1] * 9), b"\0" * 4, "too_large"),  # a limit of protocol.md 10
        (_desc(name=""), b"\0" * 8, "bad_field"),
        (_desc(name=5), b"\0" * 8, "bad_field"),
        ("a", b"\0" * 8, "bad_field"),
    ],
)
def test_descriptor_errors(desc, frame, code):
    frames = _raw({"v": 1, "op": "stats", "arrays": [desc]}, frame)
    assert _code(frames, decode) == code


def test_duplicate_array_names_rejected():
    frames = _raw({"v": 1, "op": "stats", "arrays": [_desc(), _desc()]}, b"\0" * 8, b"\0" * 8)
    assert _code(frames, decode) == "bad_field"


def test_size_limits():
    small = Limits(max_header_bytes=128, max_frame_bytes=16, max_message_bytes=100, max_arrays=2)
    ok = _push_frames({"a": np.zeros(4, np.float32)})
    decode_request(ok, small)
    assert _code(_push_frames({"a": np.zeros(5, np.float32)}), limits=small) == "too_large"
    three = {n: np.zeros(1, np.float32) for n in "abc"}
    assert _code(_push_frames(three), limits=small) == "too_large"
    assert _code(encode({"op": "stats", "pad": "x" * 200}), limits=small) == "too_large"
    total = Limits(max_message_bytes=60)
    assert (
        _code(
            _push_frames({"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)}), limits=total
        )
        == "too_large"
    )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_nonfinite_push_rejected(bad, dtype):
    grad = np.zeros(10, dtype)
    grad[7] = bad
    codecs = {"g": "fp16"} if dtype == np.float16 else None
    frames = encode({"op": "push", "worker": "w", "seq": 0, "base": 0}, {"g": grad}, codecs)
    assert _code(frames) == "nonfinite"


def test_large_finite_values_pass_although_their_sum_overflows():
    grad = np.full(4, np.finfo(np.float32).max, np.float32)
    message = decode_request(_push_frames({"g": grad}))
    assert "g" not in message.sq_norms  # inf is no norm to reuse: the server computes its own
    assert wire.all_finite(np.full(10, 6e4, np.float16))


def test_float16_finiteness_by_exponent_bits_agrees_with_isfinite_on_every_value():
    every_float16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    for value in every_float16:
        one = np.array([0, value, 1], np.float16)
        assert wire.all_finite(one) == bool(np.isfinite(one).all()), value
    strided = every_float16.reshape(256, 256)[:, ::2]  # not contiguous
    assert not wire.all_finite(strided)
    assert wire.all_finite(np.linspace(-65504, 65504, 1001).astype(np.float16)[::3])


def test_a_push_records_each_float32_gradients_squared_norm_for_the_server():
    grad = np.arange(-3, 5, dtype=np.float32)
    message = decode_request(_push_frames({"g": grad, "h": np.ones(3, np.float32)}))
    assert message.sq_norms == {"g": float(grad @ grad), "h": 3.0}


@pytest.mark.parametrize(
    "header, code",
    [
        ({"op": "push", "worker": "w", "seq": 0}, "bad_field"),  # no base
        ({"op": "push", "worker": "w", "seq": -1, "base": 0}, "bad_field"),
        ({"op": "push", "worker": "w", "seq": 0, "base": 1.5}, "bad_field"),
        ({"op": "push", "worker": "w", "seq": True, "base": 0}, "bad_field"),
        ({"op": "push", "worker": "w", "seq": 0, "base": 0, "last": 1}, "bad_field"),
        ({"op": "push", "worker": "", "seq": 0, "base": 0}, "bad_field"),
        ({"op": "pull", "worker": "w", "since": "3"}, "bad_field"),
        ({"op": "pull"}, "bad_field"),
        ({"op": "hello", "worker": "w", "info": [1]}, "bad_field"),
        ({"op": "error", "reason": "x", "code": "y"}, "unknown_op"),  # not a request
    ],
)
def test_request_field_errors(header, code):
    assert _code(encode(header)) == code


def test_valid_requests_pass():
    decode_request(encode({"op": "pull", "worker": "w", "since": None}))
    decode_request(encode({"op": "pull", "worker": "w"}))
    decode_request(encode({"op": "hello", "worker": "w", "info": {"host": "h"}}))
    decode_request(encode({"op": "stats", "future_field": 1}))  # unknown fields are ignored


def test_replies_validate():
    decode_reply(wire.error_frames("bad", "shape", rid=4))
    frames = encode({"op": "push", "version": 1, "seq": 0, "applied": True, "staleness": 0})
    with pytest.raises(ProtocolError):
        decode_reply(frames)  # lacks "stop"


# ------------------------------------------------------------------------------ fuzzing


def _decodes_or_protocol_error(frames):
    try:
        decode_request(frames)
    except ProtocolError as exc:
        assert exc.reason and exc.code
    # Anything else (TypeError, ValueError, ...) fails the test: the server would have to
    # answer "internal" instead of naming the problem.


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_random_frames_never_raise_anything_but_protocol_error(frames):
    _decodes_or_protocol_error(frames)


_VALID_PUSH = [
    bytes(f)
    for f in encode(
        {"op": "push", "worker": "w", "seq": 1, "base": 2, "rid": 3},
        {"fc.w": np.ones((2, 3), np.float32), "fc.b": np.ones(3, np.float16)},
        {"fc.b": "fp16"},
    )
]


@settings(max_examples=400, deadline=None)
@given(
    frame=st.integers(0, len(_VALID_PUSH) - 1),
    position=st.integers(0, 200),
    byte=st.integers(0, 255),
    cut=st.booleans(),
)
def test_corrupted_push_never_raises_anything_but_protocol_error(frame, position, byte, cut):
    frames = list(_VALID_PUSH)
    data = bytearray(frames[frame])
    if cut:
        del data[position % (len(data) + 1) :]
    elif data:
        data[position % len(data)] = byte
    frames[frame] = bytes(data)
    _decodes_or_protocol_error(frames)


# ------------------------------------------------------------------- multi-part codecs


def _part(part, dtype="float32", codec="topk", of=(2, 3), name="w", shape=(2,)):
    return {
        "name": name,
        "dtype": dtype,
        "shape": list(shape),
        "codec": codec,
        "part": part,
        "of": list(of),
    }


_IDX = _part("indices", "int32")
_VAL = _part("values")


def test_multi_part_tensor_decodes_into_parts():
    frames = _raw({"v": 1, "op": "stats", "arrays": [_IDX, _VAL]}, b"\0" * 8, b"\0" * 8)
    message = decode(frames)
    assert message.arrays == {} and message.codecs == {"w": "topk"}
    assert list(message.parts["w"]) == ["indices", "values"]
    assert message.parts["w"]["indices"].dtype == np.int32
    assert message.dense_shapes == {"w": (2, 3)}


@pytest.mark.parametrize(
    "descriptors, code",
    [
        ([_VAL, _IDX], "bad_field"),  # wrong order
        ([_IDX], "bad_field"),  # a part missing at the end
        ([_IDX, _desc(name="x"), _VAL], "bad_field"),  # parts not consecutive / one missing
        ([_IDX, _VAL, _VAL], "bad_field"),  # a part repeated
        ([_IDX, _part("values", of=(3, 2))], "bad_field"),  # `of` differs
        ([_IDX, _part("x", codec="sf")], "bad_field"),  # codec differs
        ([_IDX, _part("weights")], "bad_field"),  # unknown part
        ([_desc(part="values")], "bad_field"),  # dense has no parts
        ([_part(None), _VAL], "bad_field"),  # topk needs parts
        ([_part("indices", "float32"), _VAL], "dtype"),
        ([_IDX, _part("values", "int32")], "dtype"),
        ([_part("indices", "int32", of="23"), _VAL], "shape"),
        ([_part("indices", "int32", of=(1 << 40,)), _VAL], "too_large"),
        ([_IDX, {**_VAL, "shape": [3]}], "shape"),  # frame size vs shape, as ever
    ],
)
def test_multi_part_structure_errors(descriptors, code):
    frames = _raw({"v": 1, "op": "stats", "arrays": descriptors}, *[b"\0" * 8] * len(descriptors))
    assert _code(frames, decode) == code


def test_nonfinite_part_rejected():
    frames = _raw(
        {"v": 1, "op": "push", "worker": "w", "seq": 0, "base": 0, "arrays": [_IDX, _VAL]},
        b"\0" * 8,
        np.array([1.0, np.nan], np.float32).tobytes(),
    )
    assert _code(frames) == "nonfinite"


def test_encode_parts_rejects_a_part_the_codec_lacks():
    with pytest.raises(ProtocolError):
        wire.encode_parts({"op": "stats"}, [wire.WirePart("w", np.zeros(2, np.int32), "topk")])
    with pytest.raises(ProtocolError):
        wire.encode_parts(
            {"op": "stats"}, [wire.WirePart("w", np.zeros(2, np.float32), "topk", "indices", (2,))]
        )


_VALID_MULTI = [
    bytes(f)
    for f in wire.encode_parts(
        {"op": "push", "worker": "w", "seq": 1, "base": 2, "rid": 3},
        [
            wire.WirePart("a", np.array([0, 4], np.int32), "topk", "indices", (2, 3)),
            wire.WirePart("a", np.ones(2, np.float16), "topk", "values", (2, 3)),
            wire.WirePart("b", np.ones((2, 2), np.float32), "sf", "x", (2, 3)),
            wire.WirePart("b", np.ones((2, 3), np.float32), "sf", "dy", (2, 3)),
        ],
    )
]


@settings(max_examples=400, deadline=None)
@given(
    frame=st.integers(0, len(_VALID_MULTI) - 1),
    position=st.integers(0, 400),
    byte=st.integers(0, 255),
)
def test_corrupted_multi_part_push_never_raises_anything_but_protocol_error(frame, position, byte):
    frames = list(_VALID_MULTI)
    data = bytearray(frames[frame])
    data[position % len(data)] = byte
    frames[frame] = bytes(data)
    try:
        decode_gradients(decode_request(frames))
    except ProtocolError as exc:
        assert exc.reason and exc.code


def test_a_gradient_sent_in_parts_records_no_norm_for_the_server():
    # sf's gradient is x.T @ dy: neither part's norm bounds it (x = dy = [[1e19]] gives a
    # gradient of 1e38 from parts of norm 1e19), so the overflow check measures the decoded
    # gradient itself; only a dense float32 array's norm is recorded.
    message = decode_request(_VALID_MULTI)
    assert set(message.parts) == {"a", "b"} and message.sq_norms == {}
