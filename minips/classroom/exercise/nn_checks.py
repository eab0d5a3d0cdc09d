"""Checks of the backprop exercises: dense backward, conv backward, softmax cross-entropy.

Each student answer is compared with two references that do not depend on each other:
minips's own layer (minips.nn, float64) and centred differences of the forward pass
(gradcheck.py) at sampled coordinates; the check first confirms that the two agree, so a
finding is about the student's code, not the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import ModuleType

import numpy as np

from minips.classroom.exercise.common import CheckResult, call, compare, student_function
from minips.classroom.exercise.gradcheck import numerical_gradient, relative_error
from minips.classroom.exercise.naive import conv2d_forward_naive
from minips.nn import Conv2D, Dense, softmax_cross_entropy

RTOL = 1e-5  # float64 throughout: a right answer agrees to ~1e-12


def scale_hint(name: str, got: np.ndarray, want: np.ndarray, n: int) -> str:
    """A hint when `got` is the reference divided or multiplied by the batch size n."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if n > 1 and got.shape == want.shape and np.allclose(got * n, want, rtol=1e-6):
        return f" ({name} is {n} times too small, the batch size: sum over the batch, not mean)"
    if n > 1 and got.shape == want.shape and np.allclose(got, want * n, rtol=1e-6):
        return f" ({name} is {n} times too large, the batch size: the loss is a mean over N)"
    return ""


def _dense_objective(layer: Dense, x: np.ndarray, dy: np.ndarray) -> float:
    """sum(y * dy): its gradient with respect to anything is what backward(dy) gives."""
    return float(np.sum(layer.forward(x, train=False) * dy))


def _conv_objective(x, w, b, stride: int, padding: int, dy: np.ndarray) -> float:
    """sum(conv(x, w, b) * dy) by the loop implementation, independent of Conv2D."""
    return float(np.sum(conv2d_forward_naive(x, w, b, stride, padding) * dy))


def _xent_value(logits: np.ndarray, labels: np.ndarray) -> float:
    return softmax_cross_entropy(logits, labels)[0]


def _numeric_agrees(forward: Callable[[], float], array: np.ndarray, grad: np.ndarray) -> bool:
    """Centred differences at up to 6 coordinates agree with `grad` (the reference)?"""
    rng = np.random.default_rng(0)
    coords = [tuple(int(rng.integers(0, s)) for s in array.shape) for _ in range(6)]
    numeric = numerical_gradient(forward, array, eps=1e-6, indices=coords)
    picked = np.array([grad[c] for c in coords])
    return relative_error(picked, np.array([numeric[c] for c in coords])) < 1e-6


def _compare_grads(result: CheckResult, case: str, got, want: dict, n: int) -> bool:
    """Compare the student's tuple with the reference dict; record one finding per array."""
    if not isinstance(got, tuple | list) or len(got) != len(want):
        result.fail(f"{case}: expected a tuple ({', '.join(want)}), got {type(got).__name__}")
        return False
    good = True
    for (name, reference), value in zip(want.items(), got, strict=True):
        problem = compare(name, value, reference, RTOL)
        if problem:
            result.fail(
                f"{name} wrong for {case}: {problem}{scale_hint(name, value, reference, n)}"
            )
            good = False
    return good


def check_dense_backward(module: ModuleType) -> CheckResult:
    """dense_backward(x (N, in), w (in, out), dy (N, out)) -> (dx, dw, db) for y = x @ w + b."""
    result = CheckResult()
    function = student_function(module, "dense_backward")
    rng = np.random.default_rng(7)
    for n, fan_in, fan_out in [(1, 3, 2), (5, 4, 3), (8, 6, 1)]:
        case = f"N={n}, in={fan_in}, out={fan_out}"
        layer = Dense(fan_in, fan_out, rng=rng)
        layer.cast(np.float64)
        layer.params["b"][:] = rng.standard_normal(fan_out)
        x, dy = rng.standard_normal((n, fan_in)), rng.standard_normal((n, fan_out))
        layer.forward(x)
        dx = layer.backward(dy)
        want = {"dx": dx, "dw": layer.grads["w"].copy(), "db": layer.grads["b"].copy()}
        forward = partial(_dense_objective, layer, x, dy)
        assert _numeric_agrees(forward, layer.params["w"], want["dw"]), "reference broken"
        got = call(function, x.copy(), layer.params["w"].copy(), dy.copy(), what=f"for {case}")
        if _compare_grads(result, case, got, want, n):
            result.ok(f"dx, dw, db right for {case}")
    return result


def check_conv_backward(module: ModuleType) -> CheckResult:
    """conv_backward(x, w, dy, stride, padding) -> (dx, dw, db), NCHW, square kernels."""
    result = CheckResult()
    function = student_function(module, "conv_backward")
    rng = np.random.default_rng(3)
    for stride, padding in [(1, 0), (1, 1), (2, 0), (2, 1), (3, 2)]:
        case = f"stride={stride}, padding={padding}"
        n, c, o, size, k = 2, 2, 3, 7, 3
        layer = Conv2D(c, o, k, stride, padding, rng=rng)
        layer.cast(np.float64)
        x = rng.standard_normal((n, c, size, size))
        y = layer.forward(x)
        dy = rng.standard_normal(y.shape)
        dx = layer.backward(dy)
        want = {"dx": dx, "dw": layer.grads["w"].copy(), "db": layer.grads["b"].copy()}
        w, b = layer.params["w"], layer.params["b"]
        forward = partial(_conv_objective, x, w, b, stride, padding, dy)
        assert _numeric_agrees(forward, w, want["dw"]), "reference broken (dw)"
        assert _numeric_agrees(forward, x, want["dx"]), "reference broken (dx)"
        got = call(function, x.copy(), w.copy(), dy.copy(), stride, padding, what=f"for {case}")
        if _compare_grads(result, case, got, want, n):
            result.ok(f"dx, dw, db right for {case} (minips's Conv2D and centred differences)")
    return result


def check_softmax_cross_entropy(module: ModuleType) -> CheckResult:
    """softmax_cross_entropy(logits (N, K), labels (N,)) -> (mean loss, dlogits (N, K))."""
    result = CheckResult()
    function = student_function(module, "softmax_cross_entropy")
    rng = np.random.default_rng(5)
    cases = [
        ("N=4, K=5, small logits", rng.standard_normal((4, 5)), 0.0),
        ("N=1, K=3", rng.standard_normal((1, 3)), 0.0),
        ("N=6, K=10, logits near 1000", rng.standard_normal((6, 10)), 1000.0),
        ("N=3, K=4, logits near -1000", rng.standard_normal((3, 4)), -1000.0),
    ]
    for case, logits, shift in cases:
        logits = logits * 3 + shift
        labels = rng.integers(0, logits.shape[1], logits.shape[0])
        loss, dlogits = softmax_cross_entropy(logits, labels)
        if shift == 0.0:
            forward = partial(_xent_value, logits, labels)
            assert _numeric_agrees(forward, logits, dlogits), "reference broken"
        got = call(function, logits.copy(), labels.copy(), what=f"for {case}")
        if not isinstance(got, tuple | list) or len(got) != 2:
            result.fail(f"{case}: expected a tuple (loss, dlogits), got {type(got).__name__}")
            continue
        got_loss, got_grad = got
        n = logits.shape[0]
        if not np.isfinite(np.asarray(got_loss, dtype=np.float64)).all():
            # Near +1000 exp overflows to inf (inf / inf is nan); near -1000 every exp
            # underflows to 0 (log 0 = -inf, 0 / 0 is nan).
            flow = "overflows to inf" if shift > 0 else "underflows to 0 for every class"
            result.fail(
                f"loss is {got_loss} for {case}: exp {flow}; subtract each row's max "
                "before exp (softmax(z) = softmax(z - max z))"
            )
        elif np.ndim(got_loss) != 0:
            result.fail(f"loss for {case} has shape {np.shape(got_loss)}: return one number")
        elif abs(float(got_loss) - loss) > 1e-6 * max(1.0, abs(loss)):
            hint = ""
            if n > 1 and abs(float(got_loss) - n * loss) < 1e-6 * n * max(1.0, abs(loss)):
                hint = f" (it is {n} times too large: the loss is the mean over the batch)"
            result.fail(
                f"loss wrong for {case}: got {float(got_loss):.6g}, expected {loss:.6g}{hint}"
            )
        problem = compare("dlogits", got_grad, dlogits, RTOL)
        if problem:
            hint = scale_hint("dlogits", got_grad, dlogits, n)
            result.fail(f"dlogits wrong for {case}: {problem}{hint}")
        if result.passed:
            result.ok(f"loss and dlogits right for {case}")
    return result
