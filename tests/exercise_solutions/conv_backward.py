"""Solution of exercise conv-backward: window by window, the transpose of the forward."""

import numpy as np


def conv_backward(x, w, dy, stride, padding):
    n, c, h, wd = x.shape
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for i in range(dy.shape[2]):
        for j in range(dy.shape[3]):
            rows = slice(i * stride, i * stride + k)
            cols = slice(j * stride, j * stride + k)
            dw += np.einsum("no,ncuv->ocuv", dy[:, :, i, j], xp[:, :, rows, cols])
            dxp[:, :, rows, cols] += np.einsum("no,ocuv->ncuv", dy[:, :, i, j], w)
    return dxp[:, :, padding : padding + h, padding : padding + wd], dw, dy.sum(axis=(0, 2, 3))
