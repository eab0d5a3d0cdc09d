"""`topk`: the k largest-magnitude entries of a gradient, with error feedback.

Each step the worker adds the gradient to its residual r (what earlier steps did not send),
sends the k entries of a = r + g with the largest |a_i|, and keeps the rest:

    a = r + g;   S = top-k(|a|);   send (S, a_S);   r <- a with a_S set to 0

so every step  sent + r_new == r_old + g  exactly (float32), and over T steps the server has
received sum_t g_t - r_T: nothing is lost, only delayed (Stich et al., "Sparsified SGD with
memory", NeurIPS 2018; Lin et al., "Deep Gradient Compression", ICLR 2018). With float16
values the rounding error a_i - fp16(a_i), exact in float32, stays in r too.

Warm-up (DGC section 3.3): for the first `warmup` steps the density decays exponentially
from dense towards `ratio`: step t < warmup sends ratio ** ((t + 1) / (warmup + 1)).

Momentum correction (DGC section 3.2, `momentum` m > 0): the worker keeps the velocity
u <- m u + g and accumulates u instead of g,

    u = m u + g;   a = r + u;   S = top-k(|a|);   send (S, a_S);   r <- a with a_S set to 0

and the server applies what arrives with plain SGD, without its own momentum for this
parameter (docs/protocol.md 13.8): sent dense every step this is exactly momentum SGD,
and a sparse entry reaches the weights with the momentum it gathered while it waited,
instead of starting its momentum only when it arrives. (DGC's momentum factor masking,
u zeroed where sent, is not done: measured on LeNet-5 it cost samples, docs/algorithms.md.)
"""

from __future__ import annotations

import math

import numpy as np

from minips.errors import ConfigError
from minips.protocol.wire import ProtocolError, WirePart
from minips.transmission.codecs.base import (
    Codec,
    Gradient,
    check_float_dtype,
    check_seed,
    dense_float32,
    need_ndim,
    to_wire_float,
)

# Sample size for the pre-threshold of `top_k_indices`.
_SAMPLE = 4096


def top_k_indices(magnitude: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """The indices of the k largest entries of a flat array, ascending (exact, ties aside).

    np.argpartition over the whole of fc1's |g| (400,000 floats, k = 4,000) measured 2.7 ms
    best-of-30 on this shared 2-core machine (tools/bench_codecs.py): 13% of a 20 ms step.
    So, as DGC does, a random sample of 4,096 entries gives a threshold that about 2k entries
    exceed, and argpartition runs on those candidates only: 0.35 ms in the same run (the
    whole top-k encode, residual update included, 0.53 ms). The result is still the exact
    top k (ties aside) whenever at least k entries pass the threshold; fewer pass only if
    the sample holds twice its expected count above the true k-th value (at 1 %: 83 where
    41 +- 6 are expected), and then the full argpartition is used.

    Ties at the threshold: early in training most of fc1's gradient is exactly 0 (inputs a
    ReLU switched off for the whole batch), the sample's threshold is then 0 and every
    entry "passes"; the entries strictly above it are taken and the rest of the k filled
    with entries equal to it (any of them: ties), without the full argpartition that made
    such a pull 27 ms instead of 2 (tools/sample_cost.py's replay, the first rounds).
    """
    size = magnitude.size
    if k >= size:
        return np.arange(size)
    if 2 * k < size and size > 4 * _SAMPLE:
        sample = magnitude[rng.integers(0, size, _SAMPLE)]
        rank = min(_SAMPLE - 1, math.ceil(2 * k / size * _SAMPLE))  # ~2k/size quantile
        threshold = np.partition(sample, _SAMPLE - 1 - rank)[_SAMPLE - 1 - rank]
        above = np.flatnonzero(magnitude > threshold)
        if above.size >= k:
            return np.sort(above[np.argpartition(magnitude[above], -k)[-k:]])
        at = np.flatnonzero(magnitude == threshold)
        if above.size + at.size >= k:
            return np.sort(np.concatenate([above, at[: k - above.size]]))
    return np.sort(np.argpartition(magnitude, -k)[-k:])


class TopK(Codec):
    """Top-k sparsification with error feedback; parts `indices` (int32) and `values`.

    ratio: fraction of the entries sent (0 < ratio <= 1), k = ceil(ratio * size).
    warmup: steps of exponentially decaying density before `ratio` holds. dtype: the values'
    wire dtype, "float32" or "float16". seed: for the selection's random sample.
    momentum: 0 <= m < 1, momentum correction (the module doc; 0: none); the run's SGD
    momentum, which the server then leaves out for this parameter.
    """

    name = "topk"
    options = ("ratio", "warmup", "dtype", "seed", "momentum")
    required = ("ratio",)

    def __init__(
        self,
        ratio: float,
        warmup: int = 0,
        dtype: str = "float32",
        seed: int = 0,
        momentum: float = 0.0,
    ) -> None:
        if not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ConfigError(f"codec topk: ratio must be in (0, 1], got {ratio!r}")
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
            raise ConfigError(f"codec topk: warmup must be an integer >= 0, got {warmup!r}")
        if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ConfigError(f"codec topk: momentum must be in [0, 1), got {momentum!r}")
        self.ratio = float(ratio)
        self.warmup = warmup
        self.dtype = check_float_dtype("topk", dtype)
        self.momentum = float(momentum)
        self.residual: np.ndarray | None = None  # float32, the parameter's shape
        self.velocity: np.ndarray | None = None  # u of momentum correction (momentum > 0)
        self.steps = 0
        self._rng = np.random.default_rng(check_seed("topk", seed))

    def density(self) -> float:
        """The fraction of entries the next `encode` sends (warm-up included)."""
        if self.steps < self.warmup:
            return self.ratio ** ((self.steps + 1) / (self.warmup + 1))
        return self.ratio

    def encode(self, name: str, grad: Gradient) -> list[WirePart]:
        """Add grad (or, with momentum, the velocity) to the residual, send its top k, keep
        the rest (see the module doc)."""
        grad = dense_float32(grad)
        if self.residual is None or self.residual.shape != grad.shape:
            self.residual = np.zeros(grad.shape, np.float32)
            self.velocity = np.zeros(grad.shape, np.float32) if self.momentum else None
        if self.velocity is not None:
            self.velocity *= np.float32(self.momentum)
            self.velocity += grad
            grad = self.velocity
        flat = self.residual.reshape(-1)  # a view: updated in place
        flat += grad.reshape(-1)
        k = min(flat.size, math.ceil(self.density() * flat.size))
        indices = top_k_indices(np.abs(flat), k, self._rng)
        values = to_wire_float(flat[indices], self.dtype, name)
        # What was sent leaves the residual: exactly 0 for float32 values, the float16
        # rounding error otherwise (a - fp16(a) is exact in float32: Sterbenz's lemma).
        flat[indices] -= values.astype(np.float32)
        self.steps += 1
        of = grad.shape
        return [
            WirePart(name, indices.astype(np.int32), "topk", "indices", of),
            WirePart(name, values, "topk", "values", of),
        ]

    @classmethod
    def decode(
        cls, name: str, parts: dict[str | None, np.ndarray], of: tuple[int, ...] | None
    ) -> np.ndarray:
        """Scatter the values into zeros of shape `of`; indices must ascend strictly."""
        indices, values = parts["indices"], parts["values"]
        need_ndim(name, indices, 1, "indices")
        need_ndim(name, values, 1, "values")
        if indices.size != values.size:
            raise ProtocolError(
                f"array {name!r}: {indices.size} indices but {values.size} values", "shape"
            )
        size = math.prod(of or ())
        # Strictly ascending and inside [0, size): one O(k) pass, and duplicates are excluded.
        if indices.size and (
            indices[0] < 0 or indices[-1] >= size or not np.all(indices[1:] > indices[:-1])
        ):
            raise ProtocolError(
                f"array {name!r}: top-k indices must ascend strictly within [0, {size})",
                "bad_field",
            )
        dense = np.zeros(size, np.float32)
        dense[indices] = values
        return dense.reshape(of)
