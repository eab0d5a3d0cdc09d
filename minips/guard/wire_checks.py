"""What a message must be to be read at all: the field schemas and limits, and the checks a
hostile or buggy peer's frames must pass before anything in them is trusted.

Each check is a function named for what it checks and raises `ProtocolError` with a
one-line reason and a machine-readable `code` (docs/protocol.md 9); the server turns that
into an `{"op": "error"}` reply. `decode_request` and `decode_reply` run them, then decode
through the core's structural `wire.decode`:

    bounded_buffers(frames, limits)      frame count and sizes, before anything is parsed
    unpack_header(buf, limits)           msgpack, a map, `v`, `op`, `rid`
    check_descriptors(descs, frames, l)  each array against its frame, parts in order
    check_descriptor(desc, i, limits)    one array's name, dtype, codec, part, shape
    check_shape(shape, what, limits)     a list of few non-negative integers, none huge
    check_fields(header, schema, kind)   the op's fields and their kinds
    check_samples(header)                a push's `samples`, at most MAX_PUSH_SAMPLES
    check_finite(name, array)            a push's float arrays hold no NaN or Inf

A server always runs them (its operations' `decode_request`, minips/ops/server_ops.py), as
does the assembled client (minips/ops/client_retries.py) on each reply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from minips.errors import ProtocolError
from minips.protocol import wire
from minips.protocol.formats import (
    CODECS,
    DEFAULT_LIMITS,
    DTYPES,
    PROTOCOL_VERSION,
    PULL_ONLY_CODECS,
    REPLY_OPS,
    Limits,
    sum_of_squares,
)
from minips.protocol.wire import Message

# Field schemas: op -> {field: (kind, required)}. `v`, `op`, `rid`, `arrays` are common to
# all messages and checked separately. Unknown extra fields are ignored (forward compatible).
_WORKER = ("str", True)
REQUEST_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    "hello": {"worker": _WORKER, "info": ("map", False)},
    "pull": {"worker": _WORKER, "since": ("uint?", False)},
    "push": {
        "worker": _WORKER,
        "seq": ("uint", True),
        "base": ("uint", True),
        "last": ("bool", False),
        "samples": ("uint", False),
        "loss": ("number", False),  # the batch's training loss: the collapse watch's (5.3)
        "pull_since": ("uint?", False),  # present: a fused push + pull (protocol.md 5.3)
    },
    "ping": {"worker": _WORKER},
    "stats": {},
    "bye": {"worker": _WORKER, "finished": ("bool", False), "refused": ("str", False)},
    "stop": {},
    "checkpoint": {},
    # a shard to its group's root (protocol.md 16.3); a plain server answers `unknown_op`
    "join": {"shard": ("uint?", False), "servers": ("uint", True), "address": ("str?", False)},
}
REPLY_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    "hello": {
        "worker": _WORKER,
        "rank": ("uint", True),
        "world_size": ("uint", True),
        "config": ("map", True),
        "version": ("uint", True),
        "heartbeat_timeout": ("number", True),
    },
    "pull": {"version": ("uint", True), "param_versions": ("map", True), "stop": ("bool", True)},
    "push": {
        "version": ("uint", True),
        "seq": ("uint", True),
        "applied": ("bool", True),
        "staleness": ("uint", True),
        "stop": ("bool", True),
        "param_versions": ("map", False),  # the pull half of a fused push + pull
    },
    "ping": {"version": ("uint", True), "stop": ("bool", True)},
    "stats": {"stats": ("map", True)},
    "bye": {},
    "stop": {},
    "checkpoint": {"path": ("str", True), "version": ("uint", True)},
    "join": {"shard": ("uint", True), "servers": ("uint", True), "run": ("map", True)},
    "error": {"reason": ("str", True), "code": ("str", True)},
}

MAX_NAME_CHARS = 256
MAX_NDIM = 8
# A push's `samples` (docs/protocol.md 10): the server sums them, per worker and in all, and
# msgpack carries integers below 2^64 only; 2^32 - 1 a push keeps the sum of 2^32 pushes
# within that, so no count a client sends can make `stats` unencodable.
MAX_PUSH_SAMPLES = 2**32 - 1


# ----------------------------------------------------------------- checks of the frames


def bounded_buffers(frames: Sequence[Any], limits: Limits) -> tuple[list[memoryview], int]:
    """The frames as buffers and their total size, after the frame count and size limits."""
    if not frames:
        raise ProtocolError("empty message: expected a header frame")
    if len(frames) - 1 > limits.max_arrays:
        raise too_many_frames(len(frames), limits)
    buffers = [as_buffer(frame) for frame in frames]
    total = sum(buf.nbytes for buf in buffers)
    if total > limits.max_message_bytes:
        raise ProtocolError(
            f"message of {total} bytes exceeds the limit of {limits.max_message_bytes}", "too_large"
        )
    return buffers, total


def too_many_frames(frames: int, limits: Limits) -> ProtocolError:
    """`too_large` for a message of `frames` frames after its envelope (header included)."""
    return ProtocolError(
        f"{frames - 1} array frames exceed the limit of {limits.max_arrays}", "too_large"
    )


def as_buffer(frame: Any) -> memoryview:
    """bytes, bytearray, memoryview, ndarray or zmq.Frame -> a flat byte memoryview."""
    try:
        view = memoryview(frame)
    except TypeError as exc:
        raise ProtocolError(f"frame of type {type(frame).__name__} is not a byte buffer") from exc
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _reject_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} is not allowed in a header")


def unpack_header(buf: memoryview, limits: Limits) -> dict[str, Any]:
    """The header frame as a map, after its size, msgpack, `v`, `op` and `rid` checks."""
    if buf.nbytes > limits.max_header_bytes:
        raise ProtocolError(
            f"header of {buf.nbytes} bytes exceeds the limit of {limits.max_header_bytes}",
            "too_large",
        )
    try:
        header = msgpack.unpackb(buf, raw=False, strict_map_key=True, ext_hook=_reject_ext)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"header is not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a msgpack map, got {type(header).__name__}")
    version = header.get("v")
    if not is_uint(version):
        raise ProtocolError(
            "header field 'v' (protocol version) is missing or not an integer", "version"
        )
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version} is not supported (this end speaks {PROTOCOL_VERSION})",
            "version",
        )
    op = header.get("op")
    if not isinstance(op, str):
        raise ProtocolError("header field 'op' is missing or not a string", "bad_field")
    if op not in REPLY_OPS:
        raise ProtocolError(f"unknown op {op[:40]!r}", "unknown_op")
    if "rid" in header and not is_uint(header["rid"]):
        raise ProtocolError("header field 'rid' must be a non-negative integer", "bad_field")
    return header


def check_descriptor(
    desc: Any, index: int, limits: Limits
) -> tuple[str, np.dtype, tuple[int, ...], str]:
    """One array descriptor (arrays[index]): its (name, dtype, shape, codec), after the
    checks of each key and of the codec's part and dtype."""
    if not isinstance(desc, dict):
        raise ProtocolError(f"arrays[{index}] must be a map", "bad_field")
    missing = [key for key in ("name", "dtype", "shape", "codec") if key not in desc]
    if missing:
        raise ProtocolError(f"arrays[{index}] lacks {', '.join(missing)}", "bad_field")
    name, dtype_name, shape, codec = (desc.get(k) for k in ("name", "dtype", "shape", "codec"))
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"arrays[{index}].name must be a non-empty string", "bad_field")
    if len(name) > MAX_NAME_CHARS:
        raise ProtocolError(
            f"arrays[{index}].name exceeds the limit of {MAX_NAME_CHARS} characters", "too_large"
        )
    if not all(isinstance(v, str) or v is None for v in (dtype_name, codec, desc.get("part"))):
        raise ProtocolError(f"array {name!r}: dtype, codec and part must be strings", "bad_field")
    if dtype_name not in DTYPES:
        raise ProtocolError(
            f"array {name!r}: dtype {str(dtype_name)[:20]!r} not allowed "
            f"(allowed: {', '.join(DTYPES)})",
            "dtype",
        )
    if codec not in CODECS:
        raise ProtocolError(
            f"array {name!r}: unknown codec {str(codec)[:20]!r} (known: {', '.join(CODECS)})",
            "dtype",
        )
    part = desc.get("part")
    allowed = CODECS[codec].get(part) if isinstance(part, (str, type(None))) else None
    if allowed is None:
        parts = ", ".join(str(p) for p in CODECS[codec])
        raise ProtocolError(
            f"array {name!r}: codec {codec!r} has no part {str(part)[:20]!r} (parts: {parts})",
            "bad_field",
        )
    if dtype_name not in allowed:
        what = codec if part is None else f"{codec}/{part}"
        raise ProtocolError(f"array {name!r}: codec {what!r} cannot carry {dtype_name}", "dtype")
    check_shape(shape, f"array {name!r}: shape", limits)
    return name, DTYPES[dtype_name], tuple(shape), codec


def check_shape(shape: Any, what: str, limits: Limits) -> None:
    """A shape is a list (else `bad_field`) of at most MAX_NDIM non-negative integers (else
    `too_large` / `shape`), none above the frame limit, even with a zero elsewhere
    (`too_large`: [0, 2^63] describes no bytes but no array either)."""
    if not isinstance(shape, list):
        raise ProtocolError(f"{what} must be a list", "bad_field")
    if len(shape) > MAX_NDIM:
        raise ProtocolError(f"{what} has more than {MAX_NDIM} dimensions", "too_large")
    if not all(is_uint(d) for d in shape):
        raise ProtocolError(f"{what} must hold non-negative integers", "shape")
    if any(d > limits.max_frame_bytes for d in shape):
        raise ProtocolError(
            f"{what} has a dimension above the frame limit of {limits.max_frame_bytes}",
            "too_large",
        )


def check_fields(
    header: dict[str, Any], schema: dict[str, dict[str, tuple[str, bool]]], kind: str
) -> None:
    """The op's fields by `schema` (REQUEST_FIELDS or REPLY_FIELDS): each required one
    present, each present one of its kind; others are ignored (forward compatible)."""
    op = header["op"]
    if op not in schema:
        raise ProtocolError(f"op {op!r} is not a {kind}", "unknown_op")
    for name, (type_name, required) in schema[op].items():
        if name not in header:
            if required:
                raise ProtocolError(f"{op} {kind} lacks field {name!r}", "bad_field")
            continue
        value = header[name]
        if type_name == "str" and isinstance(value, str) and len(value) > MAX_NAME_CHARS:
            raise ProtocolError(
                f"{op} {kind} field {name!r} exceeds {MAX_NAME_CHARS} characters", "too_large"
            )
        if not _CHECKS[type_name](value):
            raise ProtocolError(
                f"{op} {kind} field {name!r} must be {_KIND_TEXT[type_name]}", "bad_field"
            )


def check_samples(header: dict[str, Any]) -> None:
    """A push's `samples` (a uint once check_fields passed) at most MAX_PUSH_SAMPLES."""
    samples = header.get("samples", 0)
    if samples > MAX_PUSH_SAMPLES:
        raise ProtocolError(
            f"push samples {samples} exceed the limit of {MAX_PUSH_SAMPLES}", "too_large"
        )


def check_finite(name: str, array: np.ndarray) -> float | None:
    """`nonfinite` unless a push's float array holds no NaN or Inf. Returns x.x of a float32
    array (one BLAS pass decides: finite exactly when every x_i is, unless finite values
    overflow it, and then the elements are looked at), None for a float16 one."""
    sq_norm = sum_of_squares(array) if array.dtype == np.float32 else math.inf
    if math.isfinite(sq_norm):
        return sq_norm
    if not bool(np.isfinite(array).all()):
        raise ProtocolError(f"array {name!r} contains NaN or Inf", "nonfinite")
    return None


def is_uint(value: Any) -> bool:
    # bool is an int subclass in Python; msgpack keeps them apart, so must we.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_CHECKS = {
    "uint": is_uint,
    "uint?": lambda v: v is None or is_uint(v),
    "str": lambda v: isinstance(v, str) and 0 < len(v) <= MAX_NAME_CHARS,
    "str?": lambda v: v is None or (isinstance(v, str) and 0 < len(v) <= MAX_NAME_CHARS),
    "bool": lambda v: isinstance(v, bool),
    "map": lambda v: isinstance(v, dict),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}
_KIND_TEXT = {
    "uint": "a non-negative integer",
    "uint?": "a non-negative integer or nil",
    "str": f"a string of 1..{MAX_NAME_CHARS} characters",
    "str?": f"a string of 1..{MAX_NAME_CHARS} characters or nil",
    "bool": "a boolean",
    "map": "a map",
    "number": "a number",
}


# ------------------------------------------------------------------- checked decoding


def decode_checked(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """`wire.decode` of a message (any op) after its structure's checks: frame count and
    sizes, msgpack well-formedness, `v`, `op` known, array descriptors (name, dtype
    allow-list, codec, parts, shape) against the frames' sizes."""
    buffers, _ = bounded_buffers(frames, limits)
    header = unpack_header(buffers[0], limits)
    check_descriptors(header.get("arrays", []), buffers[1:], limits)
    return wire.decode(buffers, header, checked=True)


def decode_request(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """`decode_checked`, then the request's fields; a push's float arrays must be finite."""
    message = decode_checked(frames, limits)
    check_fields(message.header, REQUEST_FIELDS, "request")
    if message.op == "push":
        check_samples(message.header)
        for name, codec in message.codecs.items():
            if codec in PULL_ONLY_CODECS:
                raise ProtocolError(f"array {name!r}: codec delta is for pull replies", "bad_field")
            for array in message.frames_of(name):
                if array.dtype.kind == "f":
                    sq_norm = check_finite(name, array)
                    if sq_norm is not None and name in message.arrays:
                        message.sq_norms[name] = sq_norm
    return message


def decode_reply(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """`decode_checked`, then the reply's fields (op is a request op or "error")."""
    message = decode_checked(frames, limits)
    check_fields(message.header, REPLY_FIELDS, "reply")
    return message


def peek_rid(frames: Sequence[Any]) -> int | None:
    """The `rid` of a message that failed validation, if its header can be read at all."""
    try:
        header = msgpack.unpackb(frames[0], raw=False)
        rid = header.get("rid")
    except Exception:  # anything unreadable simply has no rid
        return None
    return rid if is_uint(rid) else None


@dataclass
class _Seen:
    """The descriptors checked so far: each tensor's codec, parts and `of` shape."""

    codecs: dict[str, str] = field(default_factory=dict)
    parts: dict[str, list[str]] = field(default_factory=dict)
    dense_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def check_descriptors(descriptors: Any, frames: list[memoryview], limits: Limits) -> None:
    """Each descriptor (the header's `arrays`, a list once checked) against its frame."""
    if not isinstance(descriptors, list):
        raise ProtocolError("header field 'arrays' must be a list", "bad_field")
    if len(descriptors) != len(frames):
        raise ProtocolError(
            f"header describes {len(descriptors)} arrays but {len(frames)} array frames followed",
            "frame_count",
        )
    seen = _Seen()
    previous: tuple[str, str | None] | None = None  # (name, part) of the last descriptor
    for index, (desc, buf) in enumerate(zip(descriptors, frames, strict=True)):
        name, dtype, shape, codec = check_descriptor(desc, index, limits)
        part = _check_part(desc, name, codec, seen, previous, limits)
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
        seen.codecs[name] = codec
        if part is not None:
            seen.parts.setdefault(name, []).append(part)
    if previous is not None:
        _check_complete(seen, previous[0])


# ------------------------------------------------------- where a part stands in a tensor


def _check_part(
    desc: dict[str, Any],
    name: str,
    codec: str,
    seen: _Seen,
    previous: tuple[str, str | None] | None,
    limits: Limits,
) -> str | None:
    """Check where a descriptor stands among its tensor's parts; return its part (or None).

    The parts of a tensor are consecutive, in CODECS order, with one codec and one `of`.
    """
    part = desc.get("part")
    continuing = (
        part is not None and previous is not None and previous[0] == name and name in seen.parts
    )
    if previous is not None and previous[0] != name:
        _check_complete(seen, previous[0])  # the tensor before this one is finished
    if not continuing and name in seen.codecs:
        raise ProtocolError(f"array name {name!r} appears twice", "bad_field")
    if part is None:
        return None
    of = desc.get("of")
    check_shape(of, f"array {name!r}: `of`", limits)
    if math.prod(of) * 4 > limits.max_frame_bytes:
        raise ProtocolError(
            f"array {name!r}: dense shape {of} exceeds the frame limit of "
            f"{limits.max_frame_bytes} bytes as float32",
            "too_large",
        )
    if continuing and (seen.codecs[name], seen.dense_shapes[name]) != (codec, tuple(of)):
        raise ProtocolError(f"array {name!r}: its parts disagree on codec or `of`", "bad_field")
    order = list(CODECS[codec])
    done = len(seen.parts[name]) if continuing else 0
    if done >= len(order) or part != order[done]:
        expected = repr(order[done]) if done < len(order) else "no more parts"
        raise ProtocolError(
            f"array {name!r}: part {part!r} where codec {codec} expects {expected}", "bad_field"
        )
    seen.dense_shapes[name] = tuple(of)
    return part


def _check_complete(seen: _Seen, name: str) -> None:
    """A multi-part tensor must carry every part of its codec."""
    codec = seen.codecs[name]
    if name in seen.parts and len(seen.parts[name]) != len(CODECS[codec]):
        missing = [p for p in CODECS[codec] if p not in seen.parts[name]]
        raise ProtocolError(f"array {name!r}: codec {codec} lacks part(s) {missing}", "bad_field")
