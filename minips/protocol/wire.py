"""The wire format: one ZeroMQ multipart message = a msgpack header frame + raw array frames.

    frame 0      msgpack map {"v": 1, "op": "push", ..., "arrays": [{name, dtype, shape, codec}]}
    frame 1..n   the bytes of array i (C order, little-endian), nothing else

A multi-part codec (top-k, sf, lowrank) sends one frame per *part*, with `part` and `of`
in its descriptor (docs/protocol.md 4); turning parts back into a dense gradient is
`minips.transmission.codecs`' job.

`encode` and `decode` are pure functions over lists of byte buffers, so everything here is
tested without sockets. `decode` checks only what keeps reading safe (each frame's size is
its descriptor's), and anything malformed is `ProtocolError("malformed")`; the checks a
hostile or buggy peer's frames must pass, with their normative codes, are
minips/guard/wire_checks.py's `decode_request` and `decode_reply`, which decode through it.
The allow-lists and limits are minips/protocol/formats.py's (re-exported here).
docs/protocol.md is the normative description. Arrays never go through msgpack (no copy,
no size blow-up) and nothing is ever unpickled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from minips.errors import ProtocolError
from minips.protocol.formats import (
    CODECS,
    DEFAULT_LIMITS,
    DTYPES,
    PROTOCOL_VERSION,
    PULL_ONLY_CODECS,
    REPLY_OPS,
    REQUEST_OPS,
    Limits,
    all_finite,
    sum_of_squares,
)

__all__ = [
    "CODECS", "DEFAULT_LIMITS", "DTYPES", "PROTOCOL_VERSION", "PULL_ONLY_CODECS", "REPLY_OPS",
    "REQUEST_OPS", "Limits", "Message", "ProtocolError", "WirePart", "all_finite", "decode",
    "encode", "encode_parts", "error_frames", "sum_of_squares", "to_float32",
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


def decode(
    frames: Sequence[Any], header: dict[str, Any] | None = None, *, checked: bool = False
) -> Message:
    """One message (any op) as its header and zero-copy array views, each view checked to
    hold exactly its frame (shape times dtype size), so none reads past it. Anything
    malformed is ProtocolError("malformed"). header: the header frame already unpacked.
    checked: the frames are byte memoryviews whose header and descriptors were checked
    against them already (minips.guard.wire_checks.decode_checked): the views are made
    without checking the same again.
    """
    try:
        buffers = frames if checked else [memoryview(frame).cast("B") for frame in frames]
        if header is None:
            header = msgpack.unpackb(buffers[0], raw=False)
        if not isinstance(header.get("op"), str):
            raise ValueError("header has no op")
        message = Message(header=header, nbytes=sum(buf.nbytes for buf in buffers))
        descriptors = header.get("arrays", [])
        if len(descriptors) != len(buffers) - 1:
            raise ValueError("array descriptors and frames differ in number")
        for desc, buf in zip(descriptors, buffers[1:], strict=True):
            _add_frame(message, desc, buf, checked)
    except Exception as exc:  # msgpack and a malformed header raise many unrelated types
        raise ProtocolError(f"malformed message ({type(exc).__name__}: {exc})"[:200]) from None
    return message


def _add_frame(message: Message, desc: dict[str, Any], buf: memoryview, checked: bool) -> None:
    """One array frame as its descriptor's view, in `message`."""
    name, codec, part, dtype = desc["name"], desc["codec"], desc.get("part"), DTYPES[desc["dtype"]]
    shape = tuple(desc["shape"])
    if not checked and not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"array {name!r}: shape {shape} is not a list of sizes")
    if not checked and math.prod(shape) * dtype.itemsize != buf.nbytes:
        raise ValueError(f"array {name!r}: its frame does not hold shape {shape}")
    array = np.frombuffer(buf, dtype=dtype).reshape(shape)
    message.codecs[name] = codec
    if part is None:
        message.arrays[name] = array
    else:
        message.parts.setdefault(name, {})[part] = array
        message.dense_shapes[name] = tuple(desc["of"])


def error_frames(reason: str, code: str, rid: int | None = None) -> list[bytes | memoryview]:
    """The frames of an error reply."""
    header: dict[str, Any] = {"op": "error", "reason": reason, "code": code}
    if rid is not None:
        header["rid"] = rid
    return encode(header)


def to_float32(array: np.ndarray, codec: str) -> np.ndarray:
    """The float32 tensor a gradient frame stands for (widens fp16; dense is returned as is)."""
    if codec == "fp16":
        return array.astype(np.float32)
    return array


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
