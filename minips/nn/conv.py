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
- im2col is k*k slice copies, each a whole batch of rows of Wo*N contiguous floats, into
  cols (C*k*k, Ho*Wo*N); one GEMM W (O, C*k*k) @ cols gives y already in (O, Ho, Wo, N)
  order, and the backward's GEMMs take dy in that order as it is;
- col2im is k*k slice adds of the same long rows (summed per kernel column first).
Arrays keep their NCHW *shape* at the layer's boundary: y is returned as the (N, O, Ho, Wo)
transposed view of the batch-last result, and dx likewise. A NumPy array's shape is its
meaning; its strides only say where the numbers sit. ReLU and MaxPool2D keep the memory
order they are given, so the next conv receives a batch-last array and its
`batch_last(x)` is a view, not a copy (the first conv copies its (N, 1, 28, 28) input once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def im2col(xpt: np.ndarray, k: int, stride: int, out: np.ndarray) -> np.ndarray:
    """Fill out (C, k, k, Ho, Wo, N) with every k x k window of xpt (C, Hp, Wp, N).

    out[c, u, v, i, j, n] = xpt[c, s*i + u, s*j + v, n]: one strided slice copy of the
    whole batch per kernel offset (u, v). Reshaped to (C*k*k, Ho*Wo*N), out is the im2col
    matrix; returns out.
    """
    ho, wo = out.shape[3:5]
    for u in range(k):
        for v in range(k):
            out[:, u, v] = xpt[:, u : u + stride * ho : stride, v : v + stride * wo : stride]
    return out


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
    dcols: np.ndarray | None = None  # (C*k*k, Ho*Wo*N) backward's W^T @ dY (scratch)


class Conv2D(Layer):
    """2-D convolution. w: (out, in, kh, kw) (PyTorch's layout), b: (out,).

    forward: x (N, in, H, W) -> y (N, out, Ho, Wo); backward: dy (N, out, Ho, Wo) -> dx
    (N, in, H, W). Any memory order is accepted; y and dx are batch-last in memory (see the
    module docstring): call np.ascontiguousarray on them where C order matters.

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
        """y = conv(x, w) + b: x (N, C, H, W) -> y (N, O, Ho, Wo), batch-last in memory."""
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
        old = self.cache if train else None  # an evaluation must not clobber the cache
        cols = reuse_or_empty(old.cols if old else None, (c * k * k + 1, ho * wo * n), w.dtype)
        im2col(pad_hw(batch_last(x), p), k, s, out=cols[:-1].reshape(c, k, k, ho, wo, n))
        cols[-1] = 1.0  # the bias row
        w_b = np.concatenate([w.reshape(self.out_channels, -1), b[:, None]], axis=1)
        yt = w_b @ cols  # (O, Ho*Wo*N)
        if train:
            self.cache = ConvCache(cols, input_shape=x.shape, dcols=old.dcols if old else None)
        return yt.reshape(-1, ho, wo, n).transpose(3, 0, 1, 2)  # (N, O, Ho, Wo) view

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy (N, O, Ho, Wo) -> grads w, b and dx (N, C, H, W) (None if not needed)."""
        cache = self._cached()
        n, c, h, wd = cache.input_shape
        k, s, p = self.kernel_size, self.stride, self.padding
        o = self.out_channels
        dyt = batch_last(np.asarray(dy, dtype=cache.cols.dtype)).reshape(o, -1)  # (O, Ho*Wo*N)
        # [dW | db]^T = [cols; 1] @ dY^T, (C*k*k + 1, O): computed transposed, the same
        # product is a faster BLAS kernel for these shapes than dY @ [cols; 1]^T.
        grad_w_b = cache.cols @ dyt.T
        np.copyto(self.grads["w"].reshape(o, -1), grad_w_b[:-1].T)
        np.copyto(self.grads["b"], grad_w_b[-1])
        if not self.need_input_grad:
            return None
        ho, wo = conv_output_size(h, k, s, p), conv_output_size(wd, k, s, p)
        dcols_shape = (c * k * k, ho * wo * n)
        cache.dcols = dcols = reuse_or_empty(cache.dcols, dcols_shape, dyt.dtype)
        np.matmul(self.params["w"].reshape(o, -1).T, dyt, out=dcols)  # (C*k*k, Ho*Wo*N)
        padded = (c, h + 2 * p, wd + 2 * p, n)
        dxpt = col2im_add(dcols.reshape(c, k, k, ho, wo, n), padded, s)  # (C, Hp, Wp, N)
        return dxpt[:, p : p + h, p : p + wd].transpose(3, 0, 1, 2)  # (N, C, H, W) view
