"""Hand-written NumPy neural networks: layers, loss, a Sequential model and a model zoo.

    from minips.nn import lenet5, softmax_cross_entropy
    model = lenet5(seed=0)
    loss, dlogits = softmax_cross_entropy(model.forward(x), y)   # x (N, 1, 28, 28) float32
    model.backward(dlogits)                                      # fills model.grads

Shapes NCHW, float32 on the hot path; every layer also runs in float64 (`model.astype`)
for gradient checks. Conv and pool outputs are NCHW-shaped views of batch-last
(C, H, W, N) memory, or, from a first conv that feeds a tiling max pool in a Sequential,
that pool's (N, C, H/b, b, W/b, b) windows (conv.py says why); np.ascontiguousarray gives
C order where it matters. The loop implementations that check these, and centred
differences, are the classroom's (minips/classroom/exercise/naive.py, gradcheck.py).
"""

from minips.nn.base import Layer
from minips.nn.conv import Conv2D
from minips.nn.layers import Dense, Dropout, Flatten, MaxPool2D, ReLU
from minips.nn.losses import softmax_cross_entropy
from minips.nn.model import LayerInfo, Sequential
from minips.nn.zoo import MODEL_NAMES, build_model, lenet5, mlp

__all__ = [
    "Conv2D",
    "Dense",
    "Dropout",
    "Flatten",
    "Layer",
    "LayerInfo",
    "MODEL_NAMES",
    "MaxPool2D",
    "ReLU",
    "Sequential",
    "build_model",
    "lenet5",
    "mlp",
    "softmax_cross_entropy",
]
