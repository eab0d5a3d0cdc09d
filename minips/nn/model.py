"""Sequential: a named chain of layers with named parameters and gradient hooks (its .npz
files: minips/ops/model_file.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from minips.errors import ShapeError
from minips.nn.base import Layer
from minips.nn.conv import Conv2D
from minips.nn.layers import MaxPool2D, ReLU


@dataclass(frozen=True)
class LayerInfo:
    """One parameterised layer as transmission planners see it."""

    name: str  # e.g. "conv1"
    kind: str  # "conv", "fc", ...
    n_params: int
    shapes: dict[str, tuple[int, ...]]  # param name ("w", "b") -> shape


class Sequential:
    """Layers applied in order; parameters named "<layer>.<param>" in forward order.

    layers: Layer objects or (name, Layer) pairs; unnamed layers are named by their prefix
    and a per-prefix counter (conv1, conv2, fc1, relu1, pool1, flatten1, dropout1).
    input_shape: per-example shape, e.g. (1, 28, 28), checked by `forward` when given.
    spec: {"name": ..., "kwargs": {...}} that rebuilds the model with `build_model`, or None.

    `forward` runs a ReLU that is directly followed by a MaxPool2D after the pool instead
    (see `run_order`): the same outputs and gradients, the ReLU's work on fewer values. A
    Conv2D whose output a tiling max pool takes hands it on as that pool's windows (see
    `pool_blocks`).
    """

    def __init__(
        self,
        layers: Iterable[Layer | tuple[str, Layer]],
        input_shape: tuple[int, ...] | None = None,
        spec: dict | None = None,
    ) -> None:
        self.layers: dict[str, Layer] = {}
        counters: dict[str, int] = {}
        for item in layers:
            name, layer = item if isinstance(item, tuple) else (None, item)
            if name is None:
                prefix = layer.prefix or type(layer).__name__.lower()
                counters[prefix] = counters.get(prefix, 0) + 1
                name = f"{prefix}{counters[prefix]}"
            if name in self.layers or "." in name or name.startswith("__"):
                raise ValueError(f"layer name {name!r} is duplicated or not allowed")
            self.layers[name] = layer
        self.input_shape = tuple(input_shape) if input_shape is not None else None
        self.spec = spec
        self._hooks: list[Callable[[str], None]] = []
        self._run_order = run_order(self.layers)  # names; backward runs it reversed
        # dx of the layers up to the first one with parameters is never used: skip computing it
        # (for LeNet's conv1 that is the whole col2im).
        for layer in self.layers.values():
            layer.need_input_grad = False
            if layer.params:
                break
        for name, block in pool_blocks(self.layers).items():
            self.layers[name].pool_block = block

    # ----------------------------------------------------------------- compute
    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        """x (N, *input_shape) -> logits (N, K); caches activations for backward when train."""
        x = np.asarray(x)
        if not np.issubdtype(x.dtype, np.number):
            raise ShapeError(f"input batch must be numeric, got dtype {x.dtype}")
        if self.input_shape is not None and (x.ndim < 1 or x.shape[1:] != self.input_shape):
            expected = ", ".join(str(d) for d in ("N", *self.input_shape))
            raise ShapeError(f"input batch has shape {x.shape}, model expects ({expected})")
        x = np.ascontiguousarray(x, dtype=self.dtype)  # no copy when already right
        for name in self._run_order:
            try:
                x = self.layers[name].forward(x, train=train)
            except ShapeError as err:  # say which layer could not take its input
                raise ShapeError(f"layer {name}: {err}") from None
        return x

    def backward(self, dlogits: np.ndarray) -> None:
        """Backpropagate dL/dlogits (N, K), filling every layer's grads.

        Each hook is called as hook(layer_name) as soon as that layer's grads are ready, so in
        reverse layer order, only for layers with parameters (wait-free backprop sends them).
        """
        grad: np.ndarray | None = np.asarray(dlogits, dtype=self.dtype)
        for name in reversed(self._run_order):
            layer = self.layers[name]
            grad = layer.backward(grad)
            if layer.params:
                for hook in self._hooks:
                    hook(name)
            if grad is None:  # nothing below needs dx (see need_input_grad)
                break

    def add_grad_hook(self, fn: Callable[[str], None]) -> None:
        """Register fn(layer_name), called during backward when that layer's grads are ready."""
        self._hooks.append(fn)

    # -------------------------------------------------------------- parameters
    @property
    def params(self) -> dict[str, np.ndarray]:
        """The live parameter arrays, keyed "<layer>.<param>", in forward order."""
        return {
            f"{name}.{key}": array
            for name, layer in self.layers.items()
            for key, array in layer.params.items()
        }

    @property
    def grads(self) -> dict[str, np.ndarray]:
        """The live gradient arrays, keyed "<layer>.<param>" (overwritten by each backward)."""
        return {
            f"{name}.{key}": array
            for name, layer in self.layers.items()
            for key, array in layer.grads.items()
        }

    @property
    def n_params(self) -> int:
        """Total number of scalar parameters."""
        return sum(array.size for array in self.params.values())

    @property
    def dtype(self) -> np.dtype:
        """The parameters' dtype (float32 unless `astype` was used); float32 if none."""
        for array in self.params.values():
            return array.dtype
        return np.dtype(np.float32)

    def layer_info(self) -> list[LayerInfo]:
        """Name, kind, size and parameter shapes of each layer that has parameters."""
        return [
            LayerInfo(
                name=name,
                kind=layer.kind,
                n_params=sum(a.size for a in layer.params.values()),
                shapes={key: tuple(a.shape) for key, a in layer.params.items()},
            )
            for name, layer in self.layers.items()
            if layer.params
        ]

    def set_params(self, values: dict[str, np.ndarray], strict: bool = False) -> None:
        """Copy arrays into the live parameters (cast to the model's dtype).

        `values` may hold a subset (a pull returns only the layers that changed) unless
        `strict`. Unknown names, wrong shapes and (when strict) missing names raise ShapeError
        before anything is written, so a bad dict leaves the model untouched.
        """
        params = self.params
        unknown = sorted(set(values) - set(params))
        if unknown:
            raise ShapeError(f"unknown parameter(s) {', '.join(unknown)}")
        missing = sorted(set(params) - set(values))
        if strict and missing:
            raise ShapeError(f"missing parameter(s) {', '.join(missing)}")
        for key, value in values.items():
            if np.shape(value) != params[key].shape:
                raise ShapeError(
                    f"parameter {key} has shape {np.shape(value)}, expected {params[key].shape}"
                )
        for key, value in values.items():
            np.copyto(params[key], value, casting="unsafe")

    def astype(self, dtype) -> Sequential:
        """A deep copy with parameters and grads in `dtype` (float64 for gradient checks).

        The copy has no grad hooks and no cached activations.
        """
        clone = copy.copy(self)
        clone.spec = copy.deepcopy(self.spec)
        clone.layers = {}
        for name, layer in self.layers.items():
            layer_copy = copy.deepcopy(layer)
            layer_copy.cast(np.dtype(dtype))
            clone.layers[name] = layer_copy
        clone._hooks = []
        return clone

    def __repr__(self) -> str:
        lines = [f"  {name}: {layer!r}" for name, layer in self.layers.items()]
        return "Sequential(\n" + "\n".join(lines) + f"\n)  # {self.n_params:,} parameters"


def run_order(layers: dict[str, Layer]) -> tuple[str, ...]:
    """The layer names in the order `Sequential.forward` runs them: as given, except that a
    ReLU directly followed by a MaxPool2D runs after it (relu, pool -> pool, relu).

    Max pooling commutes with ReLU, which is monotone: max_w relu(x_w) = relu(max_w x_w).
    The gradients agree too: either way dy reaches the window's first maximum when that
    maximum is > 0, and nothing when it is <= 0 (pool-then-ReLU masks dy first; ReLU-then-pool
    routes it to a ReLU zero, then masks it). After the pool the ReLU touches size*size
    times fewer values, in forward and backward (4x for LeNet's 2x2 pools).
    """
    names = list(layers)
    order: list[str] = []
    i = 0
    while i < len(names):
        pair = names[i : i + 2]
        if len(pair) == 2 and type(layers[pair[0]]) is ReLU and type(layers[pair[1]]) is MaxPool2D:
            order += [pair[1], pair[0]]
            i += 2
        else:
            order.append(names[i])
            i += 1
    return tuple(order)


def pool_blocks(layers: dict[str, Layer]) -> dict[str, int]:
    """Conv2D name -> the size b of the max pool its output goes to, for each Conv2D that
    computes no input gradient (need_input_grad False: the first layer) and is followed,
    directly or through one ReLU, by a b x b MaxPool2D of stride b.

    Such a conv orders its GEMM's output columns by window offset (`Conv2D.pool_block`), so
    the pool reads each offset as one contiguous block instead of runs of N floats; the
    numbers are the same, and a ReLU between the two takes the windows as any array.
    A conv that computes dx is left alone: its col2im wants dY in plain order (one more
    copy), and its im2col copies shorter runs; on LeNet's conv2 that costs more than pool2
    saves, while on conv1 pool1 saves about 0.8 ms of a 20 ms step (BENCHMARKS.md).
    """
    names = list(layers)
    blocks: dict[str, int] = {}
    for i, name in enumerate(names):
        conv = layers[name]
        if type(conv) is not Conv2D or conv.need_input_grad:
            continue
        after = [layers[other] for other in names[i + 1 : i + 3]]
        if after and type(after[0]) is ReLU:
            after = after[1:]
        pool = after[0] if after else None
        if type(pool) is MaxPool2D and pool.size == pool.stride:
            blocks[name] = pool.size
    return blocks
