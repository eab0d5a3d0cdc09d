"""The Layer protocol every minips.nn layer follows, and the seeded weight initialisers."""

from __future__ import annotations

import numpy as np

from minips.errors import ShapeError


class Layer:
    """One differentiable step of a network: `forward` then `backward` on the same batch.

    Attributes
    ----------
    kind : "conv", "fc", "pool", "act", "flatten" or "dropout" (transmission plans key on it).
    prefix : how `Sequential` names an unnamed layer ("conv" -> conv1, conv2, ...).
    params : name -> array ("w", "b"); empty for parameterless layers.
    grads : name -> array of the same shapes, overwritten in place by each `backward`.
    need_input_grad : when False, `backward` skips dx and returns None (set by `Sequential`
        on the layers before the first parameter, where dx would be thrown away).
    """

    kind: str = ""
    prefix: str = ""

    def __init__(self) -> None:
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.need_input_grad = True

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        """Compute the output for a batch, caching what `backward` needs when `train`."""
        raise NotImplementedError

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """Fill `grads` from dL/dy and return dL/dx (None when `need_input_grad` is False)."""
        raise NotImplementedError

    def cast(self, dtype: np.dtype) -> None:
        """Convert params and grads to `dtype` in place (new arrays), dropping any cache."""
        for name in self.params:
            self.params[name] = self.params[name].astype(dtype)
            self.grads[name] = np.zeros_like(self.params[name])
        self.clear_cache()

    def clear_cache(self) -> None:
        """Forget the activations saved by the last training forward."""
        if hasattr(self, "cache"):
            self.cache = None

    def _new_params(self, **arrays: np.ndarray) -> None:
        """Register parameters (made C-contiguous) and zeroed gradient buffers beside them."""
        for name, array in arrays.items():
            self.params[name] = np.ascontiguousarray(array)
            self.grads[name] = np.zeros_like(self.params[name])

    def _cached(self):
        """The cache of the last training forward, or a clear error when there is none."""
        cache = getattr(self, "cache", None)
        if cache is None:
            raise RuntimeError(f"{type(self).__name__}.backward called without forward(train=True)")
        return cache

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self.params.items())
        return f"{type(self).__name__}({shapes})"


def he_normal(
    rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, dtype=np.float32
) -> np.ndarray:
    """N(0, 2 / fan_in) weights, for layers followed by a ReLU (He et al., ICCV 2015)."""
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)


def glorot_uniform(
    rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int, dtype=np.float32
) -> np.ndarray:
    """U(-a, a) with a = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, AISTATS 2010)."""
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(dtype)


def make_weights(
    init: str, rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int
) -> np.ndarray:
    """Dispatch on the init name ("he" or "glorot"); float32 like everything on the hot path."""
    if init == "he":
        return he_normal(rng, shape, fan_in)
    if init == "glorot":
        return glorot_uniform(rng, shape, fan_in, fan_out)
    raise ValueError(f"unknown init {init!r}; use 'he' or 'glorot'")


def reuse_or_empty(
    buffer: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype
) -> np.ndarray:
    """`buffer` when it has this shape and dtype (its old contents are dead), else a new
    uninitialised array: how a layer keeps its work buffers from one training step to the next.
    """
    if buffer is not None and buffer.shape == tuple(shape) and buffer.dtype == dtype:
        return buffer
    return np.empty(shape, dtype=dtype)


def check_ndim(x: np.ndarray, ndim: int, what: str) -> None:
    """Raise ShapeError unless x has `ndim` dimensions (`what` names the expected layout)."""
    if x.ndim != ndim:
        raise ShapeError(f"expected a {ndim}-d {what} batch, got shape {tuple(x.shape)}")
