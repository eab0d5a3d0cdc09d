"""Solution of exercise topk-feedback."""

import numpy as np


class TopKErrorFeedback:
    def __init__(self, k):
        self.k = k
        self.residual = None

    def compress(self, grad):
        if self.residual is None:
            self.residual = np.zeros_like(grad)
        acc = (self.residual + grad).ravel()
        indices = np.argpartition(np.abs(acc), -self.k)[-self.k :]
        values = acc[indices].copy()
        acc[indices] = 0
        self.residual = acc.reshape(grad.shape)
        return indices, values
