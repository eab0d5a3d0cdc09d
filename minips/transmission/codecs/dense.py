"""The single-frame codecs: `dense` (the identity: float32 as is) and `fp16` (float32
narrowed to float16)."""

from __future__ import annotations

import numpy as np

from minips.protocol.wire import ProtocolError, WirePart
from minips.transmission.codecs.base import Codec, Gradient, dense_float32


class Identity(Codec):
    """Codec `dense`, the identity: the gradient itself, float32, 4 bytes per element, exact.

    Both ends pass the array through untouched: the worker sends a view of its gradient
    array, the server applies a view of the received frame (no copy on either side).
    """

    name = "dense"

    def encode(self, name: str, grad: Gradient) -> list[WirePart]:
        """One float32 frame of the parameter's shape (no copy when already float32)."""
        return [WirePart(name, dense_float32(grad), "dense")]

    @classmethod
    def decode(
        cls, name: str, parts: dict[str | None, np.ndarray], of: tuple[int, ...] | None
    ) -> np.ndarray:
        """The frame itself (a read-only view); a gradient must be float32."""
        array = parts[None]
        if array.dtype != np.float32:
            raise ProtocolError(
                f"gradient {name!r} must be float32 with codec dense, got {array.dtype}", "dtype"
            )
        return array


class Fp16(Codec):
    """The gradient rounded to float16: 2 bytes per element, relative error <= 2^-11.

    Values beyond float16's range (|g| > 65504) become Inf, which the server refuses
    (`nonfinite`); the reference client does not check (the server's refusal is the check
    every client, in any language, meets alike).
    """

    name = "fp16"

    def encode(self, name: str, grad: Gradient) -> list[WirePart]:
        """One float16 frame of the parameter's shape."""
        return [WirePart(name, np.asarray(dense_float32(grad), dtype=np.float16), "fp16")]

    @classmethod
    def decode(
        cls, name: str, parts: dict[str | None, np.ndarray], of: tuple[int, ...] | None
    ) -> np.ndarray:
        """The frame widened to float32."""
        return parts[None].astype(np.float32)
