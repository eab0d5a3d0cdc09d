"""Train minips's NumPy LeNet-5 by hand: forward, loss, backward, SGD step; then check one
layer's gradient against centred differences.

No optimizer object and no trainer: every step of training is written out below, as a
worker does it (minips/worker/worker.py) except that here the step is applied locally instead of
being pushed to a server.

    python examples/01_train_by_hand.py          (--fast: a few steps only, for the tests)
"""

import sys
import time

import numpy as np

from minips.classroom.exercise.gradcheck import numerical_gradient, relative_error
from minips.data import load_dataset
from minips.nn import lenet5, softmax_cross_entropy

FAST = "--fast" in sys.argv
STEPS, BATCH, LR = (10, 32, 0.05) if FAST else (400, 64, 0.05)


def accuracy(model, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of x classified as y (train=False: no activations are cached)."""
    return float(np.mean(model.forward(x, train=False).argmax(axis=1) == y))


def train(model, data) -> None:
    """Plain mini-batch SGD: w <- w - lr * dL/dw for every parameter, one batch at a time."""
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for step in range(1, STEPS + 1):
        batch = rng.choice(len(data.y_train), BATCH, replace=False)
        logits = model.forward(data.x_train[batch])  # (B, 10); caches what backward needs
        loss, dlogits = softmax_cross_entropy(logits, data.y_train[batch])  # dL/dlogits (B, 10)
        model.backward(dlogits)  # fills model.grads: "conv1.w" -> dL/dw, same shape as w
        for name, w in model.params.items():  # the update rule a server would apply
            w -= LR * model.grads[name]  # in place: model.params are the live arrays
        if step % max(1, STEPS // 5) == 0:
            print(f"step {step:4d}  loss {loss:.3f}  ({time.perf_counter() - start:.1f} s)")


def check_gradient(model, data, layer_param: str = "conv2.w", n_coords: int = 5) -> float:
    """Compare backprop's dL/d(layer_param) with centred differences at a few coordinates.

    In float64 (model.astype): in float32 the rounding of the loss would swamp the tiny
    differences f(w + eps) - f(w - eps).
    """
    model64 = model.astype(np.float64)
    x, y = data.x_train[:4].astype(np.float64), data.y_train[:4]

    def loss() -> float:  # recomputed from the current contents of the weights
        return softmax_cross_entropy(model64.forward(x), y)[0]

    _, dlogits = softmax_cross_entropy(model64.forward(x), y)
    model64.backward(dlogits)
    analytic = model64.grads[layer_param]
    rng = np.random.default_rng(1)
    coords = [tuple(rng.integers(0, s) for s in analytic.shape) for _ in range(n_coords)]
    numeric = numerical_gradient(loss, model64.params[layer_param], indices=coords)
    picked = np.array([analytic[c] for c in coords])
    error = relative_error(picked, np.array([numeric[c] for c in coords]))
    print(f"gradient check of {layer_param} at {n_coords} coordinates: relative error {error:.2e}")
    return error


if __name__ == "__main__":
    data = load_dataset("sample")  # bundled Fashion-MNIST subset: 5,500 train, 1,000 test
    model = lenet5(seed=0)
    x_test, y_test = data.x_test[:200], data.y_test[:200]
    print(f"test accuracy before: {accuracy(model, x_test, y_test):.3f}")
    train(model, data)
    print(f"test accuracy after:  {accuracy(model, x_test, y_test):.3f}")
    error = check_gradient(model, data)
    assert error < 1e-6, "backprop and centred differences disagree"  # O(eps^2) agreement
