"""Dense, ReLU, max pooling, Flatten and Dropout: forward and backward of each side by side."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minips.errors import ShapeError
from minips.nn.base import Layer, check_ndim, make_weights
from minips.nn.conv import Conv2D

__all__ = ["Conv2D", "Dense", "ReLU", "MaxPool2D", "Flatten", "Dropout"]


@dataclass
class DenseCache:
    """Dense's saved tensors: the forward input, for the weight gradient x^T @ dy."""

    x: np.ndarray  # (N, in) the forward input
    dy: np.ndarray | None = None  # (N, out) the last backward's dL/dy (a reference, no copy)


class Dense(Layer):
    """Fully-connected layer y = x @ w + b; w: (in, out), b: (out,).

    forward: x (N, in) -> y (N, out); backward: dy (N, out) -> dx (N, in), with
    dw = x^T @ dy and db = sum_n dy (the input x is cached for dw).
    """

    kind = "fc"
    prefix = "fc"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        rng: np.random.Generator | None = None,
        init: str = "he",
    ) -> None:
        super().__init__()
        if min(in_features, out_features) < 1:
            raise ValueError("Dense sizes must be positive")
        self.in_features, self.out_features = in_features, out_features
        rng = rng if rng is not None else np.random.default_rng(0)
        self._new_params(
            w=make_weights(init, rng, (in_features, out_features), in_features, out_features),
            b=np.zeros(out_features, dtype=np.float32),
        )
        self.cache: DenseCache | None = None

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        """x (N, in) -> y (N, out)."""
        w = self.params["w"]
        x = np.asarray(x, dtype=w.dtype)
        check_ndim(x, 2, "(N, features)")
        if x.shape[1] != self.in_features:
            raise ShapeError(f"expected {self.in_features} input features, got shape {x.shape}")
        if train:
            self.cache = DenseCache(x=x)
        y = x @ w  # (N, out)
        y += self.params["b"]
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy (N, out) -> dx (N, in); fills grads w (in, out) and b (out,)."""
        cache = self._cached()
        cache.dy = dy
        np.matmul(cache.x.T, dy, out=self.grads["w"])  # (in, out)
        np.sum(dy, axis=0, out=self.grads["b"])
        if not self.need_input_grad:
            return None
        return dy @ self.params["w"].T  # (N, in)

    def sufficient_factors(self) -> tuple[np.ndarray, np.ndarray]:
        """(x (N, in), dy (N, out)) of the last forward/backward: grads["w"] == x.T @ dy.

        dy is the gradient of the loss this backward was given (the mean loss's 1/N is in
        it), so the `sf` codec can send both factors instead of the (in, out) gradient.
        """
        cache = self._cached()
        if cache.dy is None:
            raise RuntimeError("Dense.sufficient_factors called before backward")
        return cache.x, cache.dy


@dataclass
class ReLUCache:
    """ReLU's saved tensor."""

    output: np.ndarray  # y = max(x, 0); y > 0 exactly where x > 0, so it doubles as the mask


class ReLU(Layer):
    """y = max(x, 0) elementwise; dx = dy where x > 0, else 0. Any shape."""

    kind = "act"
    prefix = "relu"

    def __init__(self) -> None:
        super().__init__()
        self.cache: ReLUCache | None = None

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        """x (any shape) -> y (same shape)."""
        y = np.maximum(x, 0)
        if train:
            self.cache = ReLUCache(output=y)
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy (same shape as x) -> dx."""
        cache = self._cached()
        if not self.need_input_grad:
            return None
        # The mask as float32 0/1 straight from the comparison, then multiplied in place:
        # no bool array cast to float on the way (NumPy does that through its buffer).
        dx = np.greater(cache.output, 0, out=np.empty_like(dy))
        dx *= dy
        return dx


@dataclass
class PoolCache:
    """What MaxPool2D.backward needs: where each maximum came from."""

    argmax: np.ndarray  # (N, C, Ho, Wo) uint8: flat offset u * size + v of the max in its window
    x: np.ndarray  # the forward input (a reference): dx takes its shape and memory order


def first_max_offset(views: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    """Offset of each window's first maximum, given the window element views and the max y.

    Every element is <= the max, so "below the max" is "not the max", and the first maximum
    sits after as many offsets as lead the window below it:
        argmax = sum_{o < K-1} prod_{q <= o} [view_q < y]      (K = len(views))
    views: K arrays (N, C, Ho, Wo), y (N, C, Ho, Wo) -> uint8 (N, C, Ho, Wo), y's memory order.
    """
    below = views[0] < y  # (N, C, Ho, Wo): the offsets 0..o are all below the max
    argmax = below.astype(np.uint8)
    for view in views[1:-1]:
        below &= view < y
        argmax += below
    return argmax


class MaxPool2D(Layer):
    """Max pooling over size x size windows moved by `stride`, NCHW, no padding.

    forward: x (N, C, H, W) -> y (N, C, Ho, Wo), Ho = (H - size) // stride + 1;
    backward: dy -> dx, each dy routed to the first maximum of its window (row-major order,
    as PyTorch does). Both passes loop over the size*size window offsets, each step one
    strided view of the whole batch, so no window matrix is ever copied. y and dx keep the
    memory order of x: on a conv's batch-last output every view's innermost axis is the
    contiguous batch.

    When the windows tile x (stride == size), x may also come as its windows (N, C, Ho,
    size, Wo, size), as a Conv2D with `pool_block` hands them on (its reshape to (N, C, H, W)
    is the input); each offset's view is then one contiguous block per channel, and dx
    comes back in that shape.
    """

    kind = "pool"
    prefix = "pool"

    def __init__(self, size: int = 2, stride: int = 2) -> None:
        super().__init__()
        if size < 1 or stride < 1 or size * size > 255:
            raise ValueError("MaxPool2D needs 1 <= size <= 15 and stride >= 1")
        self.size, self.stride = size, stride
        self.cache: PoolCache | None = None

    def _offset_views(self, a: np.ndarray, ho: int, wo: int) -> list[np.ndarray]:
        """The (N, C, Ho, Wo) strided views of a, one per window offset (u, v) in row-major
        order: view[n, c, i, j] = a[n, c, s*i + u, s*j + v] (a: x, dx, or their windows)."""
        k, s = self.size, self.stride
        if a.ndim == 6:  # windows (N, C, Ho, k, Wo, k)
            return [a[:, :, :, u, :, v] for u in range(k) for v in range(k)]
        return [a[:, :, u : u + s * ho : s, v : v + s * wo : s] for u in range(k) for v in range(k)]

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        """x (N, C, H, W), or its windows when they tile it -> y (N, C, Ho, Wo)."""
        k, s = self.size, self.stride
        if x.ndim == 6 and s == k and x.shape[3] == x.shape[5] == k:
            ho, wo = x.shape[2], x.shape[4]
        else:
            check_ndim(x, 4, "(N, C, H, W)")
            h, w = x.shape[2:]
            if h < k or w < k:
                raise ShapeError(f"input {h}x{w} is smaller than the {k}x{k} pooling window")
            ho, wo = (h - k) // s + 1, (w - k) // s + 1
        views = self._offset_views(x, ho, wo)
        y = views[0].copy(order="K")  # (N, C, Ho, Wo), in x's memory order
        for view in views[1:]:
            np.maximum(y, view, out=y)
        if train:
            self.cache = PoolCache(argmax=first_max_offset(views, y), x=x)
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy (N, C, Ho, Wo) -> dx shaped like x, nonzero only at each window's argmax."""
        cache = self._cached()
        if not self.need_input_grad:
            return None
        ho, wo = dy.shape[2:]
        k, s = self.size, self.stride
        overlapping = s < k
        # Windows that tile x exactly write every element of dx once: no zeroing needed.
        tiled = s == k and (cache.x.ndim == 6 or cache.x.shape[2:] == (k * ho, k * wo))
        if tiled:
            dx = np.empty_like(cache.x, dtype=dy.dtype)
        else:
            dx = np.zeros_like(cache.x, dtype=dy.dtype)
        for offset, target in enumerate(self._offset_views(dx, ho, wo)):
            if overlapping:  # windows share inputs: contributions add up
                target += dy * (cache.argmax == offset)
            else:  # each input sits in at most one window: write straight into dx
                np.multiply(dy, cache.argmax == offset, out=target)
        return dx


@dataclass
class FlattenCache:
    """Flatten's saved input."""

    x: np.ndarray  # (N, d1, d2, ...) the forward input (a reference): dx takes its memory order


class Flatten(Layer):
    """Reshape (N, ...) -> (N, prod(...)) in C order; backward reshapes dy back.

    The reshape is a view of a C-contiguous x and a copy of any other (a conv's batch-last
    output); backward returns dx in the memory order x had, so the layers below it keep
    working on the order they chose.
    """

    kind = "flatten"
    prefix = "flatten"

    def __init__(self) -> None:
        super().__init__()
        self.cache: FlattenCache | None = None

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        """x (N, d1, d2, ...) -> (N, d1*d2*...)."""
        if x.ndim < 1:
            raise ShapeError("expected a batch, got a scalar")
        if train:
            self.cache = FlattenCache(x=x)
        return x.reshape(x.shape[0], -1)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy (N, D) -> dx (N, d1, d2, ...)."""
        cache = self._cached()
        if not self.need_input_grad:
            return None
        dx = dy.reshape(cache.x.shape)
        if cache.x.flags.c_contiguous:
            return dx
        in_x_order = np.empty_like(cache.x, dtype=dy.dtype)
        in_x_order[...] = dx
        return in_x_order


@dataclass
class DropoutCache:
    """Dropout's saved mask."""

    mask: np.ndarray  # same shape as x: 0 (dropped) or 1 / (1 - p) (kept)


class Dropout(Layer):
    """Inverted dropout: in training, zero each input with probability p and scale the rest
    by 1 / (1 - p), so evaluation (train=False) is the identity (Srivastava et al., JMLR 2014).

    Any shape in and out. Masks come from the layer's own seeded Generator.
    """

    kind = "dropout"
    prefix = "dropout"

    def __init__(self, p: float = 0.5, *, seed: int = 0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.rng = np.random.default_rng(seed)
        self.cache: DropoutCache | None = None

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        """x (any shape) -> x * mask (train) or x (eval)."""
        if not train:
            return x
        if self.p == 0.0:
            self.cache = DropoutCache(mask=np.ones((), dtype=x.dtype))
            return x
        keep = self.rng.random(x.shape) >= self.p  # (same as x) bool
        mask = keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - self.p))
        self.cache = DropoutCache(mask=mask)
        return x * mask

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy -> dy * mask (the same mask as forward)."""
        cache = self._cached()
        if not self.need_input_grad:
            return None
        return dy * cache.mask
