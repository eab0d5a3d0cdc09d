"""Codecs that send a matrix gradient as two thin factors: `sf` (exact) and `lowrank`.

`sf`, sufficient factors (Xie et al., "Distributed machine learning via sufficient factor
broadcasting", 2015; Zhang et al., Poseidon, USENIX ATC 2017): a Dense layer's weight
gradient over a batch is X^T dY, X (B, in) the layer's input and dY (B, out) the gradient
of the mean loss w.r.t. its output (the 1/B is in dY). Sending X and dY costs B*(in+out)
numbers instead of in*out: fc1 of LeNet-5 at B = 64 sends 83,200 floats instead of 400,000.

`lowrank` (Vogels et al., "PowerSGD", NeurIPS 2019, Algorithm 1, one worker's half): the
gradient reshaped to M (n, m), n = of[0], plus the residual of earlier steps, is
approximated by P Q^T with one power-iteration step from last step's Q:

    M = G + r;  P = orth(M Q);  Q = M^T P;  send P (n, rank), Q (m, rank);  r <- M - P Q^T
"""

from __future__ import annotations

import math

import numpy as np

from minips.errors import ConfigError
from minips.protocol.wire import ProtocolError, WirePart, all_finite
from minips.transmission.codecs.base import (
    Codec,
    Factors,
    Gradient,
    check_float_dtype,
    check_seed,
    dense_float32,
    need_ndim,
    to_wire_float,
)


def _float32(array: np.ndarray) -> np.ndarray:
    return array if array.dtype == np.float32 else array.astype(np.float32)


class SufficientFactors(Codec):
    """`sf`: parts `x` (B, in) and `dy` (B, out); the receiver computes x^T @ dy (in, out).

    The worker passes a `Factors(x, dy)` instead of the dense gradient. dtype: the factors'
    wire dtype ("float32", or "float16" for half the bytes).
    """

    name = "sf"
    options = ("dtype",)

    def __init__(self, dtype: str = "float32") -> None:
        self.dtype = check_float_dtype("sf", dtype)

    def encode(self, name: str, grad: Gradient) -> list[WirePart]:
        """The two factors, as given (float32 and C-contiguous: no copy)."""
        if not isinstance(grad, Factors):
            raise ConfigError(
                f"codec sf for {name!r} needs the layer's factors (x, dy), not a dense gradient"
            )
        x, dy = np.asarray(grad.x), np.asarray(grad.dy)
        if x.ndim != 2 or dy.ndim != 2 or len(x) != len(dy):
            raise ConfigError(
                f"codec sf for {name!r}: x (B, in) and dy (B, out) expected, "
                f"got {x.shape} and {dy.shape}"
            )
        of = (x.shape[1], dy.shape[1])
        return [
            WirePart(name, to_wire_float(x, self.dtype, name), "sf", "x", of),
            WirePart(name, to_wire_float(dy, self.dtype, name), "sf", "dy", of),
        ]

    @classmethod
    def decode(
        cls, name: str, parts: dict[str | None, np.ndarray], of: tuple[int, ...] | None
    ) -> np.ndarray:
        """x^T @ dy in float32 (float16 factors are widened first); `of` must be (in, out)."""
        x, dy = parts["x"], parts["dy"]
        need_ndim(name, x, 2, "x")
        need_ndim(name, dy, 2, "dy")
        if len(x) != len(dy) or of != (x.shape[1], dy.shape[1]):
            raise ProtocolError(
                f"array {name!r}: factors x {list(x.shape)} and dy {list(dy.shape)} "
                f"do not make a gradient of shape {list(of or ())}",
                "shape",
            )
        with np.errstate(over="ignore", invalid="ignore"):  # overflow: refused as nonfinite
            return finite_product(name, _float32(x).T @ _float32(dy))


class LowRank(Codec):
    """`lowrank`: parts `p` (n, rank) and `q` (m, rank); the receiver computes P Q^T.

    The gradient is viewed as n = shape[0] rows by m = the product of the other dimensions
    (a conv weight (O, C, kh, kw) as (O, C*kh*kw)). rank: the approximation's rank r,
    clipped to min(n, m). dtype: the factors' wire dtype. seed: Q's random start.
    Lossy but unbiased over time thanks to error feedback (the residual r).
    """

    name = "lowrank"
    options = ("rank", "dtype", "seed")

    def __init__(self, rank: int = 4, dtype: str = "float32", seed: int = 0) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ConfigError(f"codec lowrank: rank must be an integer >= 1, got {rank!r}")
        self.rank = rank
        self.dtype = check_float_dtype("lowrank", dtype)
        self.seed = check_seed("lowrank", seed)
        self.residual: np.ndarray | None = None  # (n, m) float32
        self.q: np.ndarray | None = None  # (m, rank), warm start of the power iteration

    def encode(self, name: str, grad: Gradient) -> list[WirePart]:
        """One power-iteration step on gradient + residual; keep what P Q^T misses."""
        grad = dense_float32(grad)
        if grad.ndim < 2:
            raise ConfigError(f"codec lowrank for {name!r} needs a matrix, got {grad.shape}")
        n, m = grad.shape[0], math.prod(grad.shape[1:])
        if self.residual is None or self.residual.shape != (n, m):
            rank = min(self.rank, n, m)
            self.residual = np.zeros((n, m), np.float32)
            self.q = np.random.default_rng(self.seed).standard_normal((m, rank)).astype(np.float32)
        matrix = self.residual
        matrix += grad.reshape(n, m)
        p, _ = np.linalg.qr(matrix @ self.q)  # (n, rank), orthonormal columns
        p = to_wire_float(p.astype(np.float32), self.dtype, name)
        q = to_wire_float(matrix.T @ _float32(p), self.dtype, name)  # (m, rank)
        self.q = _float32(q)
        matrix -= _float32(p) @ self.q.T  # the receiver rebuilds exactly this product
        return [
            WirePart(name, p, "lowrank", "p", grad.shape),
            WirePart(name, q, "lowrank", "q", grad.shape),
        ]

    @classmethod
    def decode(
        cls, name: str, parts: dict[str | None, np.ndarray], of: tuple[int, ...] | None
    ) -> np.ndarray:
        """P @ Q^T in float32, reshaped to `of`."""
        p, q = parts["p"], parts["q"]
        need_ndim(name, p, 2, "p")
        need_ndim(name, q, 2, "q")
        of = of or ()
        n, m = (of[0], math.prod(of[1:])) if len(of) >= 2 else (-1, -1)
        if p.shape[0] != n or q.shape[0] != m or p.shape[1] != q.shape[1]:
            raise ProtocolError(
                f"array {name!r}: factors p {list(p.shape)} and q {list(q.shape)} "
                f"do not make a gradient of shape {list(of)}",
                "shape",
            )
        with np.errstate(over="ignore", invalid="ignore"):  # overflow: refused as nonfinite
            return finite_product(name, (_float32(p) @ _float32(q).T).reshape(of))


def finite_product(name: str, product: np.ndarray) -> np.ndarray:
    """The factors' product, refused (`nonfinite`) when it overflowed float32: finite
    factors can make an infinite gradient, which the wire's finiteness check never saw."""
    if not all_finite(product):
        raise ProtocolError(f"array {name!r}: its factors' product overflows", "nonfinite")
    return product
