"""Exercise conv-backward (about 60 minutes).

Goal: backpropagate through a 2-D convolution with stride and zero padding, the layer
that costs a LeNet-5 worker most of its compute (minips/nn/conv.py does it with im2col).

Forward (below, written with loops so you can read it): x (N, C, H, W), w (O, C, k, k),
b (O,) -> y (N, O, Ho, Wo), Ho = (H + 2p - k) // s + 1,

    y[n, o, i, j] = b[o] + sum_{c, u, v} w[o, c, u, v] * xp[n, c, s*i + u, s*j + v]

where xp is x padded with p zeros on each side of H and W.

Given dy = dL/dy, return dx (N, C, H, W), dw (O, C, k, k) and db (O,). Loops are fine.

Hints: each y[n, o, i, j] touched one window of xp: send dy[n, o, i, j] back to every
element of that window (into a padded dxp, then cut the padding off) and to w. Check
stride 1 / padding 0 first; then what changes with s > 1, and with p > 0?

Check:  minips exercise check conv-backward --file conv_backward.py
(it compares with centred differences and with minips's Conv2D for several s and p)
"""

import numpy as np


def conv_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, padding: int):
    """The forward pass, for reading and for your own gradient checks."""
    n, _, h, wd = x.shape
    o, _, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ho, wo = (h + 2 * padding - k) // stride + 1, (wd + 2 * padding - k) // stride + 1
    y = np.zeros((n, o, ho, wo))
    for i in range(ho):
        for j in range(wo):
            window = xp[:, :, i * stride : i * stride + k, j * stride : j * stride + k]
            y[:, :, i, j] = np.einsum("ncuv,ocuv->no", window, w) + b
    return y


def conv_backward(x: np.ndarray, w: np.ndarray, dy: np.ndarray, stride: int, padding: int):
    """x (N, C, H, W), w (O, C, k, k), dy (N, O, Ho, Wo) -> (dx, dw, db)."""
    # TODO: db: which axes of dy does b touch?
    # TODO: dw and dxp, window by window (see the hints)
    # TODO: dx: dxp without its padding
    raise NotImplementedError
