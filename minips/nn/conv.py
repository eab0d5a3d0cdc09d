"""2-D convolution as one matrix product over an im2col matrix (forward and backward together).

For an input x (N, C, H, W), a kernel w (O, C, kh, kw) and stride s, padding p:

    Ho = (H + 2p - kh) // s + 1,   Wo = (W + 2p - kw) // s + 1
    y[n, o, i, j] = b[o] + sum_{c, u, v} w[o, c, u, v] * xp[n, c, s*i + u, s*j + v]

(xp is x zero-padded by p; cross-correlation, as in PyTorch and Caffe). Rearranging the
windows of xp into columns turns this into a GEMM (Chellapilla et al. 2006, "High
Performance Convolutional Neural Networks for Document Processing"); the backward pass is
two more GEMMs, dW = dY · cols^T and dcols = W^T · dY, and col2im scatters dcols back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from minips.errors import ShapeError
from minips.nn.base import Layer, check_ndim, make_weights


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length along one axis: (size + 2 * padding - kernel) // stride + 1."""
    return (size + 2 * padding - kernel) // stride + 1


def pad_hw(x: np.ndarray, padding: int) -> np.ndarray:
    """Zero-pad the two spatial axes of (N, C, H, W) by `padding` on each side."""
    if padding == 0:
        return x
    return np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))


def windows(xp: np.ndarray, kh: int, kw: int, stride: int) -> np.ndarray:
    """View of every kh x kw window of xp: (N, C, Ho, Wo, kh, kw), no copy."""
    return sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]


def col2im_add(
    dcols: np.ndarray, padded_shape: tuple[int, ...], stride: int, layout: str
) -> np.ndarray:
    """Scatter-add window gradients back onto the padded input grid.

    dcols is (N, C, kh, kw, Ho, Wo) for layout "nchw" or (C, kh, kw, Ho, Wo, N) for "chwn";
    returns dxp of padded_shape (N, C, Hp, Wp) resp. (C, Hp, Wp, N). One strided-slice add
    per kernel offset (kh * kw adds of a whole batch) instead of np.add.at's per-element work.
    """
    dxp = np.zeros(padded_shape, dtype=dcols.dtype)
    if layout == "nchw":
        kh, kw, ho, wo = dcols.shape[2:]
        for u in range(kh):
            for v in range(kw):
                dxp[:, :, u : u + stride * ho : stride, v : v + stride * wo : stride] += dcols[
                    :, :, u, v
                ]
    else:
        kh, kw, ho, wo = dcols.shape[1:5]
        for u in range(kh):
            for v in range(kw):
                dxp[:, u : u + stride * ho : stride, v : v + stride * wo : stride] += dcols[:, u, v]
    return dxp


@dataclass
class ConvCache:
    """What Conv2D.backward needs from its forward pass."""

    layout: str  # "nchw" or "chwn" (see Conv2D)
    cols: np.ndarray  # im2col matrix: (N, C*kh*kw, Ho*Wo) or (C*kh*kw, Ho*Wo*N)
    input_shape: tuple[int, ...]  # (N, C, H, W) before padding
    output_hw: tuple[int, int]  # (Ho, Wo)


class Conv2D(Layer):
    """2-D convolution, NCHW. w: (out, in, kh, kw) (PyTorch's layout), b: (out,).

    forward: x (N, in, H, W) -> y (N, out, Ho, Wo); backward: dy (N, out, Ho, Wo) -> dx.

    Two im2col layouts, chosen per call by the output size, both giving the same numbers:
    - "nchw" (large images, few channels, e.g. LeNet's conv1): cols (N, C*kh*kw, Ho*Wo) and one
      batched GEMM W (O, C*kh*kw) @ cols[n], whose result is already (N, O, Ho*Wo).
    - "chwn" (small images, many channels, e.g. conv2): the batch goes last, cols
      (C*kh*kw, Ho*Wo*N), so each GEMM is one big product and col2im adds long contiguous
      rows; it pays for two small transposes of x and y.
    """

    kind = "conv"
    prefix = "conv"
    # Below this many output pixels per image, per-image GEMMs are too small to run fast.
    CHWN_BELOW_PIXELS = 256

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        *,
        rng: np.random.Generator | None = None,
        init: str = "he",
    ) -> None:
        super().__init__()
        if min(in_channels, out_channels, kernel_size, stride) < 1 or padding < 0:
            raise ValueError("Conv2D sizes must be positive (padding >= 0)")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        rng = rng if rng is not None else np.random.default_rng(0)
        shape = (out_channels, in_channels, kernel_size, kernel_size)
        fan_in = in_channels * kernel_size * kernel_size
        fan_out = out_channels * kernel_size * kernel_size
        self._new_params(
            w=make_weights(init, rng, shape, fan_in, fan_out),
            b=np.zeros(out_channels, dtype=np.float32),
        )
        self.cache: ConvCache | None = None

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        """y = conv(x, w) + b: x (N, C, H, W) -> y (N, O, Ho, Wo)."""
        w, b = self.params["w"], self.params["b"]
        x = np.asarray(x, dtype=w.dtype)
        check_ndim(x, 4, "(N, C, H, W)")
        n, c, h, wd = x.shape
        k, s, p = self.kernel_size, self.stride, self.padding
        if c != self.in_channels:
            raise ShapeError(f"expected {self.in_channels} input channels, got shape {x.shape}")
        if h + 2 * p < k or wd + 2 * p < k:
            raise ShapeError(f"input {h}x{wd} (padding {p}) is smaller than the {k}x{k} kernel")
        ho, wo = conv_output_size(h, k, s, p), conv_output_size(wd, k, s, p)
        w2d = w.reshape(self.out_channels, -1)  # (O, C*k*k)
        layout = "nchw" if ho * wo >= self.CHWN_BELOW_PIXELS else "chwn"
        if layout == "nchw":
            win = windows(pad_hw(x, p), k, k, s)  # (N, C, Ho, Wo, k, k) view
            cols = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * k * k, ho * wo)  # one copy
            y = np.matmul(w2d, cols)  # (N, O, Ho*Wo)
            y += b[:, None]
            y = y.reshape(n, self.out_channels, ho, wo)
        else:
            xt = np.ascontiguousarray(pad_hw(x, p).transpose(1, 2, 3, 0))  # (C, Hp, Wp, N)
            win = sliding_window_view(xt, (k, k), axis=(1, 2))[:, ::s, ::s]  # (C,Ho,Wo,N,k,k)
            cols = win.transpose(0, 4, 5, 1, 2, 3).reshape(c * k * k, ho * wo * n)  # one copy
            yt = w2d @ cols  # (O, Ho*Wo*N)
            yt += b[:, None]
            y = np.ascontiguousarray(yt.reshape(-1, ho, wo, n).transpose(3, 0, 1, 2))
        if train:
            self.cache = ConvCache(layout, cols, input_shape=x.shape, output_hw=(ho, wo))
        return y  # (N, O, Ho, Wo)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy (N, O, Ho, Wo) -> grads w, b and dx (N, C, H, W) (None if not needed)."""
        cache = self._cached()
        n, c, h, wd = cache.input_shape
        ho, wo = cache.output_hw
        k, s, p = self.kernel_size, self.stride, self.padding
        o = self.out_channels
        w2d = self.params["w"].reshape(o, -1)  # (O, C*k*k)
        grad_w2d = self.grads["w"].reshape(o, -1)  # view: writes land in grads["w"]
        padded_n = (n, c, h + 2 * p, wd + 2 * p)
        if cache.layout == "nchw":
            dy3 = np.ascontiguousarray(dy).reshape(n, o, ho * wo)  # (N, O, P)
            np.sum(dy3, axis=(0, 2), out=self.grads["b"])
            # Per-image dW_n = dy_n @ cols_n^T, summed over the batch.
            np.sum(np.matmul(dy3, cache.cols.transpose(0, 2, 1)), axis=0, out=grad_w2d)
            if not self.need_input_grad:
                return None
            dcols = np.matmul(w2d.T, dy3).reshape(n, c, k, k, ho, wo)
            dxp = col2im_add(dcols, padded_n, s, "nchw")  # (N, C, Hp, Wp)
        else:
            dyt = np.ascontiguousarray(dy.transpose(1, 2, 3, 0)).reshape(o, -1)  # (O, P*N)
            np.sum(dyt, axis=1, out=self.grads["b"])
            np.matmul(dyt, cache.cols.T, out=grad_w2d)  # (O, C*k*k)
            if not self.need_input_grad:
                return None
            dcols = (w2d.T @ dyt).reshape(c, k, k, ho, wo, n)
            padded_t = (c, h + 2 * p, wd + 2 * p, n)
            dxp = col2im_add(dcols, padded_t, s, "chwn").transpose(3, 0, 1, 2)  # (N,C,Hp,Wp)
        dx = dxp[:, :, p : p + h, p : p + wd]
        return np.ascontiguousarray(dx)  # (N, C, H, W)
