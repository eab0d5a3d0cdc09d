"""The wire format: one ZeroMQ multipart message = a msgpack header frame + raw array frames.

    frame 0      msgpack map {"v": 1, "op": "push", ..., "arrays": [{name, dtype, shape, codec}]}
    frame 1..n   the bytes of array i (C order, little-endian), nothing else

A multi-part codec (top-k, sf, lowrank) sends one frame per *part*, with `part` and `of`
in its descriptor (docs/protocol.md 4); turning parts back into a dense gradient is
`minips.transmission.codecs`' job.

`encode` and `decode` are pure functions over lists of byte buffers, so everything here is
tested without sockets. `decode` trusts nothing it has not checked: the checks a hostile or
buggy peer's frames must pass sit beside it, in minips/protocol/checks.py (with the
allow-lists, limits and field schemas they check against, re-exported here), and raise
`ProtocolError`. docs/protocol.md is the normative description. Arrays never go through
msgpack (no copy, no size blow-up) and nothing is ever unpickled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from minips.protocol import checks
from minips.protocol.checks import (
    CODECS,
    DEFAULT_LIMITS,
    DTYPES,
    MAX_NAME_CHARS,
    MAX_NDIM,
    PROTOCOL_VERSION,
    PULL_ONLY_CODECS,
    REPLY_FIELDS,
    REPLY_OPS,
    REQUEST_FIELDS,
    REQUEST_OPS,
    Limits,
    ProtocolError,
    all_finite,
    sum_of_squares,
)

__all__ = [
    "CODECS", "DEFAULT_LIMITS", "DTYPES", "MAX_NAME_CHARS", "MAX_NDIM", "PROTOCOL_VERSION",
    "PULL_ONLY_CODECS", "REPLY_FIELDS", "REPLY_OPS", "REQUEST_FIELDS", "REQUEST_OPS", "Limits",
    "Message", "ProtocolError", "WirePart", "all_finite", "decode", "decode_reply",
    "decode_request", "encode", "encode_parts", "error_frames", "peek_rid", "sum_of_squares",
    "to_float32",
]  # fmt: skip


@dataclass
class Message:
    """A decoded message: the header map, its arrays (read-only views) and their codecs.

    arrays: name -> array of each single-frame tensor ("dense", "fp16"), as sent.
    parts: name -> {part: array} of each multi-part tensor ("topk", "sf", ...), as sent.
    dense_shapes: name -> the `of` shape of each multi-part tensor.
    codecs: name -> codec of every tensor, in the order they were sent.
    sq_norms: name -> x.x of each finite float32 single-frame array of a push, computed by
    the finiteness check (decode_request) so the server's overflow check need not read the
    gradient again.
    """

    header: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    codecs: dict[str, str] = field(default_factory=dict)
    nbytes: int = 0  # all frames together, for traffic accounting
    parts: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    dense_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    sq_norms: dict[str, float] = field(default_factory=dict)

    @property
    def op(self) -> str:
        return self.header["op"]

    def frames_of(self, name: str) -> list[np.ndarray]:
        """Every array sent for tensor `name` (one, or one per part)."""
        if name in self.arrays:
            return [self.arrays[name]]
        return list(self.parts[name].values())


@dataclass(frozen=True)
class WirePart:
    """One array frame to send: a whole tensor (part None) or one part of a codec's tensor.

    of: the dense tensor's shape, required with a part (docs/protocol.md section 13).
    """

    name: str
    array: np.ndarray
    codec: str = "dense"
    part: str | None = None
    of: tuple[int, ...] | None = None

    def describe(self) -> tuple[dict[str, Any], np.ndarray]:
        """(descriptor, the array as sent: C-contiguous, little-endian wire dtype).

        A descriptor is {name, dtype, shape, codec}, plus {part, of} for a part of a
        multi-part codec, in that key order (docs/protocol.md 2: the order is the bytes).
        Raises ProtocolError (`dtype`, `bad_field`) for what the codec cannot carry.
        """
        dtype_name = _wire_dtype_name(self.array.dtype)
        allowed = CODECS.get(self.codec, {}).get(self.part)
        if allowed is None or dtype_name not in allowed:
            what = self.codec if self.part is None else f"{self.codec}/{self.part}"
            raise ProtocolError(
                f"array {self.name!r}: codec {what!r} cannot carry {dtype_name}", "dtype"
            )
        # np.asarray keeps 0-d shapes (np.ascontiguousarray would make them 1-d).
        array = np.asarray(self.array, dtype=DTYPES[dtype_name])
        if not array.flags.c_contiguous:
            array = array.copy(order="C")
        descriptor = {"name": self.name, "dtype": dtype_name, "shape": list(array.shape),
                      "codec": self.codec}  # fmt: skip
        if self.part is not None:
            if self.of is None:
                raise ProtocolError(f"array {self.name!r}: part without `of`", "bad_field")
            descriptor.update(part=self.part, of=[int(d) for d in self.of])
        return descriptor, array


def encode(
    header: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray] | None = None,
    codecs: Mapping[str, str] | None = None,
) -> list[bytes | memoryview]:
    """Build the frames of one message: [msgpack(header + array descriptors), array bytes...].

    `v` defaults to PROTOCOL_VERSION. Array frames are memoryviews of the (contiguous,
    little-endian) arrays themselves, so `send_multipart(frames, copy=False)` sends without
    copying: the caller must not modify those arrays until the message has left.
    `codecs` maps array name -> single-frame codec ("dense" when absent); multi-part codecs
    go through `encode_parts`. Raises ProtocolError for a dtype or codec not allowed.
    """
    codecs = codecs or {}
    parts = [WirePart(name, a, codecs.get(name, "dense")) for name, a in (arrays or {}).items()]
    return encode_parts(header, parts)


def encode_parts(header: Mapping[str, Any], parts: Sequence[WirePart]) -> list[bytes | memoryview]:
    """`encode` for any codec: the header with one descriptor per WirePart (`describe`),
    then one frame per part, in the order given. Frames are views of the arrays."""
    head = {"v": PROTOCOL_VERSION, **header}
    described = [part.describe() for part in parts]
    if described:
        head["arrays"] = [descriptor for descriptor, _ in described]
    payload = [memoryview(array.reshape(-1)).cast("B") for _, array in described]
    return [msgpack.packb(head, use_bin_type=True), *payload]


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Parse and structurally validate one message (any op); arrays are zero-copy views.

    Checks: frame count and sizes, msgpack well-formedness, `v`, `op` known, array
    descriptors (name, dtype allow-list, codec, shape) against the frames' sizes.
    Use `decode_request` / `decode_reply` to also check the op's fields.
    """
    buffers, total = checks.bounded_buffers(frames, limits)
    header = checks.unpack_header(buffers[0], limits)
    message = Message(header=header, nbytes=total)
    _decode_arrays(message, header.get("arrays", []), buffers[1:], limits)
    return message


def _decode_arrays(
    message: Message, descriptors: Any, frames: list[memoryview], limits: Limits
) -> None:
    """Check each descriptor (the header's `arrays`, a list once checked) against its
    frame; add the frames to `message` as arrays."""
    if not isinstance(descriptors, list):
        raise ProtocolError("header field 'arrays' must be a list", "bad_field")
    if len(descriptors) != len(frames):
        raise ProtocolError(
            f"header describes {len(descriptors)} arrays but {len(frames)} array frames followed",
            "frame_count",
        )
    previous: tuple[str, str | None] | None = None  # (name, part) of the last descriptor
    for index, (desc, buf) in enumerate(zip(descriptors, frames, strict=True)):
        name, dtype, shape, codec = checks.check_descriptor(desc, index, limits)
        part = _check_part(desc, name, codec, message, previous, limits)
        previous = (name, part)
        if buf.nbytes > limits.max_frame_bytes:
            raise ProtocolError(
                f"array {name!r}: frame of {buf.nbytes} bytes "
                f"exceeds the limit of {limits.max_frame_bytes}",
                "too_large",
            )
        expected = math.prod(shape) * dtype.itemsize
        if buf.nbytes != expected:
            raise ProtocolError(
                f"array {name!r}: shape {list(shape)} of {desc['dtype']} "
                f"needs {expected} bytes, frame has {buf.nbytes}",
                "shape",
            )
        array = np.frombuffer(buf, dtype=dtype).reshape(shape)
        message.codecs[name] = codec
        if part is None:
            message.arrays[name] = array
        else:
            message.parts.setdefault(name, {})[part] = array
    if previous is not None:
        _check_complete(message, previous[0])


def decode_request(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """`decode`, then check the request's fields; a push's float arrays must be finite."""
    message = decode(frames, limits)
    checks.check_fields(message.header, REQUEST_FIELDS, "request")
    if message.op == "push":
        checks.check_samples(message.header)
        for name, codec in message.codecs.items():
            if codec in PULL_ONLY_CODECS:
                raise ProtocolError(f"array {name!r}: codec delta is for pull replies", "bad_field")
            for array in message.frames_of(name):
                if array.dtype.kind == "f":
                    sq_norm = checks.check_finite(name, array)
                    if sq_norm is not None and name in message.arrays:
                        message.sq_norms[name] = sq_norm
    return message


def decode_reply(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """`decode`, then check the reply's fields (op is a request op or "error")."""
    message = decode(frames, limits)
    checks.check_fields(message.header, REPLY_FIELDS, "reply")
    return message


def error_frames(reason: str, code: str, rid: int | None = None) -> list[bytes | memoryview]:
    """The frames of an error reply."""
    header: dict[str, Any] = {"op": "error", "reason": reason, "code": code}
    if rid is not None:
        header["rid"] = rid
    return encode(header)


def peek_rid(frames: Sequence[Any]) -> int | None:
    """The `rid` of a message that failed validation, if its header can be read at all."""
    try:
        header = msgpack.unpackb(frames[0], raw=False)
        rid = header.get("rid")
    except Exception:  # anything unreadable simply has no rid
        return None
    return rid if checks.is_uint(rid) else None


def to_float32(array: np.ndarray, codec: str) -> np.ndarray:
    """The float32 tensor a gradient frame stands for (widens fp16; dense is returned as is)."""
    if codec == "fp16":
        return array.astype(np.float32)
    return array


# ------------------------------------------------------- where a part stands in a tensor


def _check_part(
    desc: dict[str, Any],
    name: str,
    codec: str,
    message: Message,
    previous: tuple[str, str | None] | None,
    limits: Limits,
) -> str | None:
    """Check where a descriptor stands among its tensor's parts; return its part (or None).

    The parts of a tensor are consecutive, in CODECS order, with one codec and one `of`.
    """
    part = desc.get("part")
    continuing = (
        part is not None and previous is not None and previous[0] == name and name in message.parts
    )
    if previous is not None and previous[0] != name:
        _check_complete(message, previous[0])  # the tensor before this one is finished
    if not continuing and name in message.codecs:
        raise ProtocolError(f"array name {name!r} appears twice", "bad_field")
    if part is None:
        return None
    of = desc.get("of")
    checks.check_shape(of, f"array {name!r}: `of`", limits)
    if math.prod(of) * 4 > limits.max_frame_bytes:
        raise ProtocolError(
            f"array {name!r}: dense shape {of} exceeds the frame limit of "
            f"{limits.max_frame_bytes} bytes as float32",
            "too_large",
        )
    if continuing and (message.codecs[name], message.dense_shapes[name]) != (codec, tuple(of)):
        raise ProtocolError(f"array {name!r}: its parts disagree on codec or `of`", "bad_field")
    order = list(CODECS[codec])
    done = len(message.parts[name]) if continuing else 0
    if done >= len(order) or part != order[done]:
        expected = repr(order[done]) if done < len(order) else "no more parts"
        raise ProtocolError(
            f"array {name!r}: part {part!r} where codec {codec} expects {expected}", "bad_field"
        )
    message.dense_shapes[name] = tuple(of)
    return part


def _check_complete(message: Message, name: str) -> None:
    """A multi-part tensor must carry every part of its codec."""
    codec = message.codecs[name]
    if name in message.parts and len(message.parts[name]) != len(CODECS[codec]):
        missing = [p for p in CODECS[codec] if p not in message.parts[name]]
        raise ProtocolError(f"array {name!r}: codec {codec} lacks part(s) {missing}", "bad_field")


def _wire_dtype_name(dtype: np.dtype) -> str:
    for name, wire in DTYPES.items():
        if dtype.kind == wire.kind and dtype.itemsize == wire.itemsize:
            return name
    raise ProtocolError(f"dtype {dtype} cannot be sent (allowed: {', '.join(DTYPES)})", "dtype")


def frames_nbytes(frames: Iterable[Any]) -> int:
    """Bytes in a multipart message: bytes, memoryviews, NumPy arrays or zmq.Frame objects.

    (`len()` of a memoryview counts items, not bytes, hence `.nbytes` first.)
    """
    total = 0
    for frame in frames:
        if hasattr(frame, "nbytes"):
            total += frame.nbytes
        elif hasattr(frame, "buffer"):  # zmq.Frame
            total += frame.buffer.nbytes
        else:
            total += len(frame)
    return total
