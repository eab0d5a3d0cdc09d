"""The wire format: one ZeroMQ multipart message = a msgpack header frame + raw array frames.

    frame 0      msgpack map {"v": 1, "op": "push", ..., "arrays": [{name, dtype, shape, codec}]}
    frame 1..n   the bytes of array i (C order, little-endian), nothing else

A codec that needs several arrays for one tensor (top-k: indices and values; sufficient
factors: x and dy) sends one frame per *part*: its descriptors add `part` (which one) and
`of` (the dense tensor's shape), and the parts of a tensor follow one another in the order
of `CODECS`. Turning parts back into a dense gradient is `minips.codecs`' job.

`encode` and `decode` are pure functions over lists of byte buffers, so everything here is
tested without sockets. `decode` validates everything a hostile or buggy peer can get wrong
and raises `ProtocolError` with a one-line reason and a machine-readable `code`; the server
turns that into an `{"op": "error"}` reply. docs/protocol.md is the normative description.
Arrays never go through msgpack (no copy, no size blow-up) and nothing is ever unpickled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
# are docs/protocol.md section 13; minips.codecs implements one class per entry.
CODECS: dict[str, dict[str | None, frozenset[str]]] = {
    "dense": {None: frozenset({"float32", "int32", "int64"})},
    "fp16": {None: frozenset({"float16"})},
    "topk": {"indices": frozenset({"int32"}), "values": _FLOATS},
    "sf": {"x": _FLOATS, "dy": _FLOATS},
    "lowrank": {"p": _FLOATS, "q": _FLOATS},
    "delta": {"indices": frozenset({"int32"}), "values": _FLOATS},  # pull replies only (13.7)
}

PULL_ONLY_CODECS = frozenset({"delta"})  # added to the worker's copy: never in a request

REQUEST_OPS = ("hello", "pull", "push", "ping", "stats", "bye", "stop", "checkpoint")
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
        "pull_since": ("uint?", False),  # present: a fused push + pull (protocol.md 5.3)
    },
    "ping": {"worker": _WORKER},
    "stats": {},
    "bye": {"worker": _WORKER, "finished": ("bool", False)},
    "stop": {},
    "checkpoint": {},
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
    "error": {"reason": ("str", True), "code": ("str", True)},
}

MAX_NAME_CHARS = 256
MAX_NDIM = 8


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
    buffers, total = _bounded_buffers(frames, limits)
    header = _unpack_header(buffers[0], limits)
    message = Message(header=header, nbytes=total)
    _decode_arrays(message, header.get("arrays", []), buffers[1:], limits)
    return message


def _bounded_buffers(frames: Sequence[Any], limits: Limits) -> tuple[list[memoryview], int]:
    """The frames as buffers and their total size, after the frame count and size limits."""
    if not frames:
        raise ProtocolError("empty message: expected a header frame")
    if len(frames) - 1 > limits.max_arrays:
        raise ProtocolError(
            f"{len(frames) - 1} array frames exceed the limit of {limits.max_arrays}", "too_large"
        )
    buffers = [_as_buffer(frame) for frame in frames]
    total = sum(buf.nbytes for buf in buffers)
    if total > limits.max_message_bytes:
        raise ProtocolError(
            f"message of {total} bytes exceeds the limit of {limits.max_message_bytes}", "too_large"
        )
    return buffers, total


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
        name, dtype, shape, codec = _check_descriptor(desc, index, limits)
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
    _check_fields(message.header, REQUEST_FIELDS, "request")
    if message.op == "push":
        for name in message.codecs:
            if message.codecs[name] in PULL_ONLY_CODECS:
                raise ProtocolError(f"array {name!r}: codec delta is for pull replies", "bad_field")
            for array in message.frames_of(name):
                if array.dtype.kind != "f":
                    continue
                sq_norm = sum_of_squares(array) if array.dtype == np.float32 else np.inf
                if math.isfinite(sq_norm):  # then every element is finite: one pass
                    if name in message.arrays:
                        message.sq_norms[name] = sq_norm
                elif not bool(np.isfinite(array).all()):
                    raise ProtocolError(f"array {name!r} contains NaN or Inf", "nonfinite")
    return message


def decode_reply(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """`decode`, then check the reply's fields (op is a request op or "error")."""
    message = decode(frames, limits)
    _check_fields(message.header, REPLY_FIELDS, "reply")
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
    return rid if _is_uint(rid) else None


def to_float32(array: np.ndarray, codec: str) -> np.ndarray:
    """The float32 tensor a gradient frame stands for (widens fp16; dense is returned as is)."""
    if codec == "fp16":
        return array.astype(np.float32)
    return array


def sum_of_squares(array: np.ndarray) -> float:
    """x.x of a float32 array (BLAS sdot) as a Python float: one pass, no temporary.

    Finite exactly when every x_i is, unless finite values overflow it (inf: then look at
    the elements). 0.02 ms for LeNet-5's fc1 gradient against 0.03 ms for np.isfinite().all().
    """
    flat = array.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.dot(flat, flat))


def all_finite(array: np.ndarray) -> bool:
    """True when no element is NaN or +-Inf (float32: `sum_of_squares` first, one pass)."""
    if array.dtype == np.float32 and array.size and math.isfinite(sum_of_squares(array)):
        return True
    return bool(np.isfinite(array).all())


# ---------------------------------------------------------------------------------- helpers


def _as_buffer(frame: Any) -> memoryview:
    """bytes, bytearray, memoryview, ndarray or zmq.Frame -> a flat byte memoryview."""
    try:
        view = memoryview(frame)
    except TypeError as exc:
        raise ProtocolError(f"frame of type {type(frame).__name__} is not a byte buffer") from exc
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _reject_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} is not allowed in a header")


def _unpack_header(buf: memoryview, limits: Limits) -> dict[str, Any]:
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
    if not _is_uint(version):
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
    if "rid" in header and not _is_uint(header["rid"]):
        raise ProtocolError("header field 'rid' must be a non-negative integer", "bad_field")
    return header


def _check_descriptor(
    desc: Any, index: int, limits: Limits
) -> tuple[str, np.dtype, tuple[int, ...], str]:
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
    _check_shape(shape, f"array {name!r}: shape", limits)
    return name, DTYPES[dtype_name], tuple(shape), codec


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
    _check_shape(of, f"array {name!r}: `of`", limits)
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


def _check_shape(shape: Any, what: str, limits: Limits) -> None:
    """A shape is a list (else `bad_field`) of at most MAX_NDIM non-negative integers (else
    `too_large` / `shape`), none above the frame limit, even with a zero elsewhere
    (`too_large`: [0, 2^63] describes no bytes but no array either)."""
    if not isinstance(shape, list):
        raise ProtocolError(f"{what} must be a list", "bad_field")
    if len(shape) > MAX_NDIM:
        raise ProtocolError(f"{what} has more than {MAX_NDIM} dimensions", "too_large")
    if not all(_is_uint(d) for d in shape):
        raise ProtocolError(f"{what} must hold non-negative integers", "shape")
    if any(d > limits.max_frame_bytes for d in shape):
        raise ProtocolError(
            f"{what} has a dimension above the frame limit of {limits.max_frame_bytes}",
            "too_large",
        )


def _check_fields(
    header: dict[str, Any], schema: dict[str, dict[str, tuple[str, bool]]], kind: str
) -> None:
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


def _is_uint(value: Any) -> bool:
    # bool is an int subclass in Python; msgpack keeps them apart, so must we.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_CHECKS = {
    "uint": _is_uint,
    "uint?": lambda v: v is None or _is_uint(v),
    "str": lambda v: isinstance(v, str) and 0 < len(v) <= MAX_NAME_CHARS,
    "bool": lambda v: isinstance(v, bool),
    "map": lambda v: isinstance(v, dict),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}
_KIND_TEXT = {
    "uint": "a non-negative integer",
    "uint?": "a non-negative integer or nil",
    "str": f"a string of 1..{MAX_NAME_CHARS} characters",
    "bool": "a boolean",
    "map": "a map",
    "number": "a number",
}


def _wire_dtype_name(dtype: np.dtype) -> str:
    for name, wire in DTYPES.items():
        if dtype.kind == wire.kind and dtype.itemsize == wire.itemsize:
            return name
    raise ProtocolError(f"dtype {dtype} cannot be sent (allowed: {', '.join(DTYPES)})", "dtype")
