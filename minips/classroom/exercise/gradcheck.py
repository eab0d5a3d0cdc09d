"""Centred-difference gradient checking, the test that backprop code is right.

    df/dx_i ~= (f(x + eps e_i) - f(x - eps e_i)) / (2 eps)      error O(eps^2)

Run it in float64 (`Sequential.astype(np.float64)`): in float32 the rounding of f swamps
the difference quotient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np


def numerical_gradient(
    f: Callable[[], float],
    x: np.ndarray,
    eps: float = 1e-6,
    indices: Iterable[tuple[int, ...]] | None = None,
) -> np.ndarray:
    """d f() / d x by centred differences, perturbing x in place (and restoring it).

    f: recomputes the scalar from the current contents of x. indices: the coordinates to
    check (all when None); the others stay 0 in the result, which has x's shape.
    """
    grad = np.zeros_like(x)
    coords = np.ndindex(x.shape) if indices is None else indices
    for index in coords:
        original = x[index]
        x[index] = original + eps
        plus = f()
        x[index] = original - eps
        minus = f()
        x[index] = original
        grad[index] = (plus - minus) / (2 * eps)
    return grad


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / max(||a|| + ||b||, tiny): 0 when equal, about 1 when unrelated."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = max(float(np.linalg.norm(a) + np.linalg.norm(b)), 1e-30)
    return float(np.linalg.norm(a - b)) / scale
