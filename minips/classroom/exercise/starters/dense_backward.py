"""Exercise dense-backward (about 20 minutes).

Goal: derive the backward pass of a fully-connected layer by the chain rule, the step every
worker runs for LeNet-5's fc1 and fc2 (minips/nn/layers.py, Dense).

Forward: y = x @ w + b, with x (N, in), w (in, out), b (out,), y (N, out).
Given dy = dL/dy (N, out), return dx = dL/dx (N, in), dw = dL/dw (in, out), db = dL/db (out,).

Hints: write y[n, j] = sum_i x[n, i] w[i, j] + b[j] and differentiate one element at a
time; every gradient has the shape of what it is the gradient of. b is added to every row.

Check:  minips exercise check dense-backward --file dense_backward.py
"""

import numpy as np


def dense_backward(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (N, in), w (in, out), dy (N, out) -> (dx (N, in), dw (in, out), db (out,))."""
    # TODO: dx, from dy and w
    # TODO: dw, from x and dy
    # TODO: db, from dy
    raise NotImplementedError
