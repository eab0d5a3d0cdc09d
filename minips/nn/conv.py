"""2-D convolution as one matrix product over an im2col matrix (forward and backward together).

For an input x (N, C, H, W), a kernel w (O, C, kh, kw) and stride s, padding p:

    Ho = (H + 2p - kh) // s + 1,   Wo = (W + 2p - kw) // s + 1
    y[n, o, i, j] = b[o] + sum_{c, u, v} w[o, c, u, v] * xp[n, c, s*i + u, s*j + v]

(xp is x zero-padded by p; cross-correlation, as in PyTorch and Caffe). Rearranging the
windows of xp into columns turns this into a GEMM (Chellapilla et al. 2006, "High
Performance Convolutional Neural Networks for Document Processing"); the backward pass is
two more GEMMs, dW = dY · cols^T and dcols = W^T · dY, and col2im scatters dcols back.
The bias rides in the GEMMs (the "bias trick"): cols has one more row, all ones, and W
one more column, b, so Y = [W | b] · [cols; 1] and [dW | db] = dY · [cols; 1]^T, with no
separate pass over Y for the add or over dY for the sum.

Memory order: batch last. The layer computes in (C, H, W, N) order, the batch the
innermost axis, because then every piece of the work is long contiguous runs:
- im2col is one copy of a strided view of the padded input (`window_view`), into cols
  (C*k*k, Ho*Wo*N); one GEMM W (O, C*k*k) @ cols gives y already in (O, Ho, Wo, N)
  order, and the backward's GEMMs take dy in that order as it is;
- col2im is k*k slice adds of long rows (summed per kernel column first).
Arrays keep their NCHW *shape* at the layer's boundary: y is returned as the (N, O, Ho, Wo)
transposed view of the batch-last result, and dx likewise. A NumPy array's shape is its
meaning; its strides only say where the numbers sit. ReLU and MaxPool2D keep the memory
order they are given, so the next conv receives a batch-last array and its
`batch_last(x)` is a view, not a copy (the first conv copies its (N, 1, 28, 28) input once).

Pooling blocks. When a b x b max pool of stride b takes y (`pool_block`, set by Sequential),
the columns of cols are ordered (u, v, Ho/b, Wo/b, N) instead, with output row i = b*i' + u
and column j = b*j' + v: the GEMM then leaves each pooling-window offset (u, v) as one
contiguous (Ho/b, Wo/b, N) block per channel, and y is handed on as its windows, the
(N, O, Ho/b, b, Wo/b, b) view (its reshape to (N, O, Ho, Wo) is the output). The pool's
b*b views are then long contiguous runs instead of runs of N floats. The column order is
the GEMM's own business: the same products, only the output columns permuted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from minips.errors import ShapeError
from minips.nn.base import Layer, check_ndim, make_weights, reuse_or_empty


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length along one axis: (size + 2 * padding - kernel) // stride + 1."""
    return (size + 2 * padding - kernel) // stride + 1


def batch_last(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> the same numbers as a C-contiguous (C, H, W, N) array.

    A view (no copy) when x is the transposed view of such an array, as conv and pool
    outputs are; a copy otherwise.
    """
    return np.ascontiguousarray(x.transpose(1, 2, 3, 0))


def pad_hw(xt: np.ndarray, padding: int) -> np.ndarray:
    """Zero-pad the two spatial axes of a batch-last (C, H, W, N) array by `padding`."""
    if padding == 0:
        return xt
    return np.pad(xt, ((0, 0), (padding, padding), (padding, padding), (0, 0)))


def window_view(xpt: np.ndarray, k: int, stride: int, block: int, ho: int, wo: int) -> np.ndarray:
    """Every k x k window of xpt (C, Hp, Wp, N), as a read-only strided view (no copy).

    Shape (C, k, k, b, b, Ho/b, Wo/b, N) for block b (b divides Ho and Wo):
        view[c, u, v, a, e, i, j, n] = xpt[c, s*(b*i + a) + u, s*(b*j + e) + v, n]
    so with b = 1 it is (C, k, k, 1, 1, Ho, Wo, N), the plain im2col order, and copied into
    a (C*k*k, Ho*Wo*N) array it is the im2col matrix.
    """
    c, _, _, n = xpt.shape
    sc, sh, sw, sn = xpt.strides
    s, b = stride, block
    shape = (c, k, k, b, b, ho // b, wo // b, n)
    strides = (sc, sh, sw, s * sh, s * sw, s * b * sh, s * b * sw, sn)
    return as_strided(xpt, shape, strides, writeable=False)


def col2im_add(dcols: np.ndarray, padded_shape: tuple[int, ...], stride: int) -> np.ndarray:
    """The adjoint of im2col: scatter-add window gradients back onto the padded grid.

    dcols (C, k, k, Ho, Wo, N) -> dxpt (C, Hp, Wp, N) = padded_shape, with
    dxpt[c, s*i + u, s*j + v, n] += dcols[c, u, v, i, j, n]: strided slice adds of the whole
    batch, instead of np.add.at's per-element work.

    A slice of dxpt at a column offset v has contiguous runs of only Wo*N floats, and NumPy
    adds such runs through its ufunc buffer (a copy in and out). So the k row offsets u of
    each kernel column v are first summed into `band` (C, Hp, Wo, N), whose row slices
    band[:, u : u + s*Ho : s] are long contiguous runs (all of it when s = 1), and only the
    k bands are added at column offsets: k strided adds instead of k*k.
    """
    c, k, _, ho, wo, n = dcols.shape
    dxpt = np.zeros(padded_shape, dtype=dcols.dtype)
    band = np.empty((c, padded_shape[1], wo, n), dtype=dcols.dtype)
    for v in range(k):
        band.fill(0)
        for u in range(k):
            band[:, u : u + stride * ho : stride] += dcols[:, u, v]
        dxpt[:, :, v : v + stride * wo : stride] += band
    return dxpt


@dataclass
class ConvCache:
    """What Conv2D.backward needs from its forward pass, and its reusable work buffers."""

    cols: np.ndarray  # (C*k*k + 1, Ho*Wo*N): the im2col matrix, batch last, and a row of ones
    input_shape: tuple[int, ...]  # (N, C, H, W) before padding
    block: int  # the pool block b of cols' column order (1: plain (Ho, Wo, N) order)
    dcols: np.ndarray | None = None  # (C*k*k, Ho*Wo*N) backward's W^T @ dY (scratch)


class Conv2D(Layer):
    """2-D convolution. w: (out, in, kh, kw) (PyTorch's layout), b: (out,).

    forward: x (N, in, H, W) -> y (N, out, Ho, Wo); backward: dy (N, out, Ho, Wo) -> dx
    (N, in, H, W). Any memory order is accepted; y and dx are batch-last in memory (see the
    module docstring): call np.ascontiguousarray on them where C order matters.

    pool_block: 1, or the size b of a b x b, stride-b max pool that takes y (Sequential sets
    it: minips.nn.model.pool_blocks). Then, when b divides Ho and Wo, y is handed on as its
    (N, out, Ho/b, b, Wo/b, b) windows (the module docstring says why), and backward takes
    dy in that shape or in (N, out, Ho, Wo).

    A training forward reuses the previous training forward's im2col buffer (that cache
    is dead once a new forward replaces it), and backward its scratch, so a steady training
    loop allocates neither (a fresh 8 MB array costs its page faults on every step).
    """

    kind = "conv"
    prefix = "conv"

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
        self.pool_block = 1
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
        """y = conv(x, w) + b: x (N, C, H, W) -> y (N, O, Ho, Wo), batch-last in memory,
        or its (N, O, Ho/b, b, Wo/b, b) windows (see pool_block)."""
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
        block = self.pool_block if ho % self.pool_block == wo % self.pool_block == 0 else 1
        old = self.cache if train else None  # an evaluation must not clobber the cache
        cols = reuse_or_empty(old.cols if old else None, (c * k * k + 1, ho * wo * n), w.dtype)
        windows = window_view(pad_hw(batch_last(x), p), k, s, block, ho, wo)
        np.copyto(cols[:-1].reshape(windows.shape), windows)  # im2col
        cols[-1] = 1.0  # the bias row
        w_b = np.concatenate([w.reshape(self.out_channels, -1), b[:, None]], axis=1)
        yt = w_b @ cols  # (O, b, b, Ho/b, Wo/b, N) in memory
        if train:
            dcols = old.dcols if old else None
            self.cache = ConvCache(cols, input_shape=x.shape, block=block, dcols=dcols)
        y = yt.reshape(-1, block, block, ho // block, wo // block, n).transpose(5, 0, 3, 1, 4, 2)
        return y if block > 1 else y.reshape(n, -1, ho, wo)  # (N, O, Ho, Wo) view

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy (N, O, Ho, Wo) or its windows -> grads w, b and dx (N, C, H, W) (None if not
        needed)."""
        cache = self._cached()
        n, c, h, wd = cache.input_shape
        k, s, p, b = self.kernel_size, self.stride, self.padding, cache.block
        o = self.out_channels
        ho, wo = conv_output_size(h, k, s, p), conv_output_size(wd, k, s, p)
        dy = np.asarray(dy, dtype=cache.cols.dtype)
        windows = dy.reshape(n, o, ho // b, b, wo // b, b)  # a view, whichever shape dy has
        dyt = np.ascontiguousarray(windows.transpose(1, 3, 5, 2, 4, 0)).reshape(o, -1)
        # [dW | db]^T = [cols; 1] @ dY^T, (C*k*k + 1, O): computed transposed, the same
        # product is a faster BLAS kernel for these shapes than dY @ [cols; 1]^T.
        grad_w_b = cache.cols @ dyt.T
        np.copyto(self.grads["w"].reshape(o, -1), grad_w_b[:-1].T)
        np.copyto(self.grads["b"], grad_w_b[-1])
        if not self.need_input_grad:
            return None
        if b > 1:  # col2im wants dY's columns in plain (Ho, Wo, N) order
            dyt = np.ascontiguousarray(windows.transpose(1, 2, 3, 4, 5, 0)).reshape(o, -1)
        dcols_shape = (c * k * k, ho * wo * n)
        cache.dcols = dcols = reuse_or_empty(cache.dcols, dcols_shape, dyt.dtype)
        np.matmul(self.params["w"].reshape(o, -1).T, dyt, out=dcols)  # (C*k*k, Ho*Wo*N)
        padded = (c, h + 2 * p, wd + 2 * p, n)
        dxpt = col2im_add(dcols.reshape(c, k, k, ho, wo, n), padded, s)  # (C, Hp, Wp, N)
        return dxpt[:, p : p + h, p : p + wd].transpose(3, 0, 1, 2)  # (N, C, H, W) view
