"""Exercise softmax-xent (about 25 minutes).

Goal: the classification loss every minips worker starts its backward pass from
(minips/nn/losses.py), written so that it never overflows.

For logits z (N, K) and integer labels y (N,):

    p[n] = softmax(z[n]) = exp(z[n]) / sum_k exp(z[n, k])
    loss = mean over n of  -log p[n, y[n]]
    dloss/dz = ?   (derive it: the answer is short)

Return (loss as a Python float, dlogits (N, K)).

Hints: exp(1000) is inf in floating point, but softmax(z) = softmax(z - c) for any c per
row. log p[n, y] can be computed without computing p first (log-sum-exp). The loss is a
*mean*: what does that do to the gradient?

Check:  minips exercise check softmax-xent --file softmax_xent.py
"""

import numpy as np


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """logits (N, K), labels (N,) int -> (mean loss, dL/dlogits (N, K))."""
    # TODO: shift each row (stability), then log-sum-exp and the loss
    # TODO: the gradient
    raise NotImplementedError
