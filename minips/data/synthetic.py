"""A synthetic 10-class image set generated from a seed: fast, offline, and easy to learn.

Each class is a fixed random "template" of 4x4-pixel blocks (a 7x7 binary grid scaled to
28x28); an example is its class template plus Gaussian pixel noise, clipped to [0, 1] and
quantised to uint8 like a real IDX image. Templates differ in about half of their blocks, so
a small CNN or MLP separates the classes to > 90% within a few epochs, while the noise keeps
single examples ambiguous enough that the loss curve is not a step. Tests use it because it
needs no files and is bit-for-bit reproducible from the seed.
"""

from __future__ import annotations

import numpy as np

N_CLASSES = 10
IMAGE_SIDE = 28
GRID_SIDE = 7  # template resolution: 7x7 blocks of 4x4 pixels
SIGNAL = 0.6  # intensity step between "off" and "on" template blocks
BACKGROUND = 0.2
NOISE_STD = 0.3

# Mean and std of pixel/255 over generated images (measured over seeds 0..9, rounded);
# used by the same normalisation path as the IDX datasets.
SYNTHETIC_MEAN = 0.4949
SYNTHETIC_STD = 0.3472


def make_synthetic(
    seed: int = 0, n_train: int = 2000, n_test: int = 500
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate ``(x_train, y_train, x_test, y_test)``: uint8 images (N, 28, 28), uint8 labels.

    Labels are balanced (``i % 10`` before shuffling); train and test share the templates
    but not the noise. The same seed always gives the same arrays.
    """
    rng = np.random.default_rng(seed)
    grids = rng.random((N_CLASSES, GRID_SIDE, GRID_SIDE)) < 0.5  # (10, 7, 7) on/off blocks
    block = np.ones((IMAGE_SIDE // GRID_SIDE, IMAGE_SIDE // GRID_SIDE))
    templates = np.stack([np.kron(g, block) for g in grids])  # (10, 28, 28) in {0, 1}
    templates = BACKGROUND + SIGNAL * templates

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.permutation(np.arange(n) % N_CLASSES).astype(np.uint8)  # (n,)
        noise = rng.normal(0.0, NOISE_STD, size=(n, IMAGE_SIDE, IMAGE_SIDE))  # (n, 28, 28)
        pixels = np.clip(templates[labels] + noise, 0.0, 1.0)  # (n, 28, 28)
        return np.round(pixels * 255).astype(np.uint8), labels

    x_train, y_train = draw(n_train)
    x_test, y_test = draw(n_test)
    return x_train, y_train, x_test, y_test
