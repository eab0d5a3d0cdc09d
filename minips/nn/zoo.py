"""The model zoo: LeNet-5 (Caffe's variant) and a multi-layer perceptron, seeded."""

from __future__ import annotations

import inspect

import numpy as np

from minips.errors import ConfigError
from minips.nn.layers import Conv2D, Dense, Flatten, MaxPool2D, ReLU
from minips.nn.model import Sequential

INPUT_SHAPE = (1, 28, 28)  # one 28x28 greyscale image, MNIST / Fashion-MNIST


def lenet5(seed: int = 0) -> Sequential:
    """Caffe's LeNet: conv(1->20, 5) relu pool2, conv(20->50, 5) relu pool2, fc(800->500) relu,
    fc(500->10): 431,080 parameters, 93% of them in fc1.

    Input (N, 1, 28, 28) -> logits (N, 10); shapes: 28 -> conv 24 -> pool 12 -> conv 8 ->
    pool 4, so fc1 sees 50 * 4 * 4 = 800 features. He init before each ReLU, Glorot for the
    classifier; the same seed gives the same weights.
    """
    rng = np.random.default_rng(seed)
    layers = [
        Conv2D(1, 20, 5, rng=rng),  # conv1 (N, 20, 24, 24)
        ReLU(),
        MaxPool2D(2, 2),  # pool1 (N, 20, 12, 12)
        Conv2D(20, 50, 5, rng=rng),  # conv2 (N, 50, 8, 8)
        ReLU(),
        MaxPool2D(2, 2),  # pool2 (N, 50, 4, 4)
        Flatten(),  # (N, 800)
        Dense(800, 500, rng=rng),  # fc1
        ReLU(),
        Dense(500, 10, rng=rng, init="glorot"),  # fc2 -> logits
    ]
    return Sequential(
        layers, input_shape=INPUT_SHAPE, spec={"name": "lenet5", "kwargs": {}, "seed": seed}
    )


def mlp(
    hidden: tuple[int, ...] | list[int] = (256, 128),
    in_features: int = 784,
    n_classes: int = 10,
    seed: int = 0,
) -> Sequential:
    """Fully-connected net: flatten -> (Dense -> ReLU) per hidden width -> Dense(n_classes).

    Input (N, ...) with in_features values per example (N, 1, 28, 28) by default -> (N, K).
    """
    hidden = [int(width) for width in hidden]
    if any(width < 1 for width in hidden) or in_features < 1 or n_classes < 2:
        raise ConfigError(
            f"mlp needs positive widths and n_classes >= 2, got hidden={hidden}, "
            f"in_features={in_features}, n_classes={n_classes}"
        )
    rng = np.random.default_rng(seed)
    layers: list = [Flatten()]
    width_in = in_features
    for width in hidden:
        layers += [Dense(width_in, width, rng=rng), ReLU()]
        width_in = width
    layers.append(Dense(width_in, n_classes, rng=rng, init="glorot"))
    spec = {
        "name": "mlp",
        "kwargs": {"hidden": hidden, "in_features": in_features, "n_classes": n_classes},
        "seed": seed,
    }
    input_shape = INPUT_SHAPE if in_features == int(np.prod(INPUT_SHAPE)) else None
    return Sequential(layers, input_shape=input_shape, spec=spec)


_BUILDERS = {"lenet5": lenet5, "mlp": mlp}
MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def build_model(name: str, seed: int = 0, **kwargs) -> Sequential:
    """Build a zoo model by name, e.g. build_model("mlp", seed=1, hidden=[64]).

    ConfigError (one line) for an unknown name or an option the model does not take.
    The result's `.spec` is {"name": name, "kwargs": {...}, "seed": seed} (JSON/msgpack
    friendly; kwargs without the seed), so build_model(spec["name"], spec["seed"],
    **spec["kwargs"]) rebuilds the same model.
    """
    builder = _BUILDERS.get(name)
    if builder is None:
        raise ConfigError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)}")
    accepted = set(inspect.signature(builder).parameters) - {"seed"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ConfigError(
            f"model {name} does not take option(s) {', '.join(unknown)}; "
            f"it takes {', '.join(sorted(accepted)) or 'none'}"
        )
    return builder(seed=seed, **kwargs)
