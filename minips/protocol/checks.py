"""What a message must be to be read at all: the protocol's allow-lists, limits and field
schemas, and the checks a hostile or buggy peer's frames must pass before anything in them
is trusted.

Each check is a function named for what it checks and raises `ProtocolError` with a
one-line reason and a machine-readable `code` (docs/protocol.md 9); the server turns that
into an `{"op": "error"}` reply. minips.protocol.wire decodes through them:

    bounded_buffers(frames, limits)      frame count and sizes, before anything is parsed
    unpack_header(buf, limits)           msgpack, a map, `v`, `op`, `rid`
    check_descriptor(desc, i, limits)    one array's name, dtype, codec, part, shape
    check_shape(shape, what, limits)     a list of few non-negative integers, none huge
    check_fields(header, schema, kind)   the op's fields and their kinds
    check_samples(header)                a push's `samples`, at most MAX_PUSH_SAMPLES
    check_finite(name, array)            a push's float arrays hold no NaN or Inf
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from minips.errors import MinipsError

PROTOCOL_VERSION = 1

# Wire dtype name -> NumPy dtype. Always little-endian, whatever the host.
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
}

_FLOATS = frozenset({"float32", "float16"})

# Codec -> its parts, in wire order -> the dtypes each part may carry. A single-frame codec
# has the one part None (its descriptor has no `part` key): "dense" is the array itself,
# "fp16" a float32 tensor sent as float16 (the receiver widens it). The multi-part codecs
# are docs/protocol.md section 13; minips.transmission.codecs implements one class per entry.
CODECS: dict[str, dict[str | None, frozenset[str]]] = {
    "dense": {None: frozenset({"float32", "int32", "int64"})},
    "fp16": {None: frozenset({"float16"})},
    "topk": {"indices": frozenset({"int32"}), "values": _FLOATS},
    "sf": {"x": _FLOATS, "dy": _FLOATS},
    "lowrank": {"p": _FLOATS, "q": _FLOATS},
    "delta": {"indices": frozenset({"int32"}), "values": _FLOATS},  # pull replies only (13.7)
}

PULL_ONLY_CODECS = frozenset({"delta"})  # added to the worker's copy: never in a request

REQUEST_OPS = ("hello", "pull", "push", "ping", "stats", "bye", "stop", "checkpoint", "join")
REPLY_OPS = REQUEST_OPS + ("error",)

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


class ProtocolError(MinipsError):
    """A message broke the protocol; `code` names the rule (see docs/protocol.md, "Errors")."""

    def __init__(self, reason: str, code: str = "malformed") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True)
class Limits:
    """Size limits the decoder enforces (ZeroMQ's MAXMSGSIZE is a second, coarser fence)."""

    max_header_bytes: int = 1 << 20  # 1 MiB: config and stats are small
    max_frame_bytes: int = 64 << 20  # 64 MiB per array: 16 M float32
    max_message_bytes: int = 256 << 20  # 256 MiB for all frames together
    max_arrays: int = 4096


DEFAULT_LIMITS = Limits()


def sum_of_squares(array: np.ndarray) -> float:
    """x.x of a float32 array (BLAS sdot) as a Python float: one pass, no temporary.

    Finite exactly when every x_i is, unless finite values overflow it (inf: then look at
    the elements). 0.02 ms for LeNet-5's fc1 gradient against 0.03 ms for np.isfinite().all().
    """
    flat = array.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.dot(flat, flat))


# A float16 is NaN or +-Inf exactly when its 5 exponent bits are all ones (IEEE 754).
FLOAT16_EXPONENT = 0x7C00


def all_finite(array: np.ndarray) -> bool:
    """True when no element is NaN or +-Inf (float32: `sum_of_squares` first, one pass;
    float16: its exponent bits, 0.03 ms for 200,704 values against 0.34 for np.isfinite,
    which has no vector loop for float16)."""
    if array.dtype == np.float32 and array.size and math.isfinite(sum_of_squares(array)):
        return True
    if array.dtype == np.float16:
        return not bool(np.any((array.view(np.uint16) & FLOAT16_EXPONENT) == FLOAT16_EXPONENT))
    return bool(np.isfinite(array).all())


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
