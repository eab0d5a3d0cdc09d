"""Exercise topk-feedback (about 30 minutes).

Goal: send only the k largest gradient entries without losing the rest (Lin et al., "Deep
Gradient Compression", ICLR 2018; Stich et al., "Sparsified SGD with Memory", NeurIPS
2018). What is not sent is kept in a *residual* and added to the next gradient:

    acc      = residual + grad
    indices  = the k flat positions of acc with the largest |acc|
    values   = acc at those positions          (what goes on the wire)
    residual = acc with those positions set to 0

so at every step sent + residual == previous residual + grad, exactly: nothing is lost,
only delayed. (fc1 of LeNet-5 is 93% of the model: this is how you would shrink its push.)

Check:  minips exercise check topk-feedback --file topk_feedback.py
"""

import numpy as np


class TopKErrorFeedback:
    """Top-k sparsification of one gradient tensor with error feedback."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.residual: np.ndarray | None = None  # created at the first gradient's shape

    def compress(self, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """grad (any shape) -> (indices: k flat int positions, values: k floats)."""
        # TODO: accumulate, pick the k largest magnitudes, update the residual
        raise NotImplementedError
