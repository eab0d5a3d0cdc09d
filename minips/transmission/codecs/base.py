"""What every codec is: a worker-side encoder with per-parameter state, a server-side decode.

    worker:  codec = make_codec({"codec": "topk", "ratio": 0.01})   # one per parameter
             parts = codec.encode("fc1.w", grad)                      # -> [WirePart, ...]
    server:  grad = CODEC_CLASSES[codec].decode(name, parts, of)      # -> float32, dense

`decode` needs nothing but the message: a multi-part tensor carries its dense shape (`of`),
so the server can decode before it looks at its parameters (docs/protocol.md section 13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from minips.errors import ConfigError
from minips.protocol.wire import CODECS, ProtocolError, WirePart, all_finite

FLOAT_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class Factors:
    """A Dense layer's weight gradient as its sufficient factors: grad = x.T @ dy.

    x: (B, in) the layer's forward input. dy: (B, out) dL/dy of the batch's MEAN loss, as
    Dense.backward receives it: the 1/B of softmax_cross_entropy is inside dy, so x.T @ dy
    is exactly the layer's weight gradient (in, out), with no further scaling.
    """

    x: np.ndarray
    dy: np.ndarray

    def dense(self) -> np.ndarray:
        """The (in, out) float32 gradient x.T @ dy."""
        return np.asarray(self.x, np.float32).T @ np.asarray(self.dy, np.float32)


Gradient = np.ndarray | Factors
"""What a worker hands to an encoder for one parameter: the dense gradient, or its factors."""


class Codec:
    """Base class. Subclasses set `name` (a key of wire.CODECS) and implement both sides.

    Options come from the plan as keyword arguments; an instance is created per parameter
    on the worker and may keep state between steps (e.g. top-k's residual).
    """

    name: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()  # the keyword options this codec accepts
    required: ClassVar[tuple[str, ...]] = ()  # those of them without a default

    def encode(self, name: str, grad: Gradient) -> list[WirePart]:
        """The wire arrays for one parameter's gradient (worker side)."""
        raise NotImplementedError

    @classmethod
    def decode(
        cls, name: str, parts: dict[str | None, np.ndarray], of: tuple[int, ...] | None
    ) -> np.ndarray:
        """The float32 dense gradient the parts stand for (server side); ProtocolError if bad."""
        raise NotImplementedError

    @classmethod
    def part_names(cls) -> tuple[str | None, ...]:
        """The parts of this codec, in wire order (None: a single-frame codec)."""
        return tuple(CODECS[cls.name])


def dense_float32(grad: Gradient) -> np.ndarray:
    """A float32 C-contiguous dense gradient (x.T @ dy for Factors; no copy when possible)."""
    if isinstance(grad, Factors):
        return grad.dense()
    return np.ascontiguousarray(grad, dtype=np.float32)


def check_float_dtype(codec: str, dtype: Any) -> str:
    """Validate a codec's `dtype` option ("float32" or "float16")."""
    if dtype not in FLOAT_DTYPES:
        raise ConfigError(f"codec {codec}: dtype must be float32 or float16, got {dtype!r}")
    return dtype


def check_seed(codec: str, seed: Any) -> int:
    """Validate a codec's `seed` option: an integer in [0, 2^63), as the wire carries it."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ConfigError(f"codec {codec}: seed must be an integer in [0, 2^63), got {seed!r}")
    return seed


def to_wire_float(array: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """Cast float32 values to the wire dtype; float16 overflow is a clear error, not an Inf."""
    if dtype == "float32":
        return np.ascontiguousarray(array, dtype=np.float32)
    with np.errstate(over="ignore"):
        narrowed = np.asarray(array, dtype=np.float16)
    if not all_finite(narrowed) and all_finite(np.asarray(array, np.float32)):
        raise ProtocolError(f"gradient {name!r} overflows float16 (|g| > 65504)", "nonfinite")
    return narrowed


def need_ndim(name: str, array: np.ndarray, ndim: int, what: str) -> None:
    """Raise ProtocolError `shape` unless a part has `ndim` dimensions."""
    if array.ndim != ndim:
        raise ProtocolError(
            f"array {name!r}: part {what} must have {ndim} dimension(s), "
            f"got shape {list(array.shape)}",
            "shape",
        )
