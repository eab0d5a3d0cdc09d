"""Loop-by-loop convolution and max pooling: slow, obviously correct, the test oracle.

Straight from the definitions (CS231n assignment 2 style); the fast versions in conv.py and
layers.py must agree with these to rounding error. Use only on small arrays.
"""

from __future__ import annotations

import numpy as np


def conv2d_forward_naive(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1, padding: int = 0
) -> np.ndarray:
    """x (N, C, H, W), w (O, C, kh, kw), b (O,) -> y (N, O, Ho, Wo), cross-correlation."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ho = (h + 2 * padding - kh) // stride + 1
    wo = (wd + 2 * padding - kw) // stride + 1
    y = np.zeros((n, o, ho, wo), dtype=x.dtype)
    for i in range(n):
        for f in range(o):
            for r in range(ho):
                for c in range(wo):
                    window = xp[i, :, r * stride : r * stride + kh, c * stride : c * stride + kw]
                    y[i, f, r, c] = np.sum(window * w[f]) + b[f]
    return y


def conv2d_backward_naive(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dy (N, O, Ho, Wo) -> (dx (N, C, H, W), dw (O, C, kh, kw), db (O,))."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    ho, wo = dy.shape[2:]
    for i in range(n):
        for f in range(o):
            for r in range(ho):
                for c in range(wo):
                    rows = slice(r * stride, r * stride + kh)
                    cols = slice(c * stride, c * stride + kw)
                    dw[f] += dy[i, f, r, c] * xp[i, :, rows, cols]
                    dxp[i, :, rows, cols] += dy[i, f, r, c] * w[f]
    db = dy.sum(axis=(0, 2, 3))
    return dxp[:, :, padding : padding + h, padding : padding + wd], dw, db


def maxpool_forward_naive(x: np.ndarray, size: int = 2, stride: int = 2) -> np.ndarray:
    """x (N, C, H, W) -> y (N, C, Ho, Wo), the max of each size x size window."""
    n, c, h, w = x.shape
    ho, wo = (h - size) // stride + 1, (w - size) // stride + 1
    y = np.zeros((n, c, ho, wo), dtype=x.dtype)
    for i in range(n):
        for k in range(c):
            for r in range(ho):
                for q in range(wo):
                    window = x[i, k, r * stride : r * stride + size, q * stride : q * stride + size]
                    y[i, k, r, q] = window.max()
    return y


def maxpool_backward_naive(
    dy: np.ndarray, x: np.ndarray, size: int = 2, stride: int = 2
) -> np.ndarray:
    """dy (N, C, Ho, Wo) -> dx (N, C, H, W): each dy goes to its window's first maximum."""
    dx = np.zeros_like(x)
    n, c, ho, wo = dy.shape
    for i in range(n):
        for k in range(c):
            for r in range(ho):
                for q in range(wo):
                    window = x[i, k, r * stride : r * stride + size, q * stride : q * stride + size]
                    u, v = np.unravel_index(np.argmax(window), window.shape)  # first max
                    dx[i, k, r * stride + u, q * stride + v] += dy[i, k, r, q]
    return dx
