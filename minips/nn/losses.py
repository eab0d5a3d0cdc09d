"""Softmax cross-entropy, the classification loss, with its gradient."""

from __future__ import annotations

import numpy as np

from minips.errors import DataError, ShapeError


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of softmax(logits) against integer labels, and d(loss)/d(logits).

    logits (N, K) float, labels (N,) int in [0, K) -> (mean_loss, dlogits (N, K), logits' dtype).

        p = softmax(z) = exp(z - max z) / sum exp(z - max z)     (shifted: no overflow)
        loss = mean_n [ logsumexp(z_n) - z_n[y_n] ]
        dloss/dz_n = (p_n - onehot(y_n)) / N
    """
    logits = np.asarray(logits)
    labels = np.asarray(labels)
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ShapeError(
            f"expected logits (N, K) and labels (N,), got {logits.shape} and {labels.shape}"
        )
    n, k = logits.shape
    if n == 0:
        raise ShapeError("softmax_cross_entropy of an empty batch")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.min() < 0 or labels.max() >= k:
        raise DataError(f"labels must lie in [0, {k}), got [{labels.min()}, {labels.max()}]")
    shifted = logits - logits.max(axis=1, keepdims=True)  # (N, K), max 0 per row
    exp = np.exp(shifted)  # (N, K)
    sum_exp = exp.sum(axis=1, keepdims=True)  # (N, 1)
    rows = np.arange(n)
    loss = float(np.mean(np.log(sum_exp[:, 0]) - shifted[rows, labels]))
    dlogits = exp / sum_exp  # (N, K) softmax probabilities
    dlogits[rows, labels] -= 1.0
    dlogits /= n
    return loss, dlogits
