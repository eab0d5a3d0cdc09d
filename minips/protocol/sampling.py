"""VSGD's coordinate samples: which entries of each parameter a worker reports with a push.

Worker and server pick the same coordinates without talking, by a rule a worker in any
language computes (docs/protocol.md 6.4, with the CRC-32 and SplitMix64 spelled out):

    k = min(size, max(min_samples, ceil(rho * size)));  seed = crc32(name as UTF-8)
    S = the k flat (C-order) indices of smallest SplitMix64 key_seed(i), ascending

Ranking by a hash spreads S over the whole tensor (a stride would alias with the rows of
a weight matrix).
"""

from __future__ import annotations

import math
import zlib

import numpy as np

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64_mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on a uint64 array (arithmetic wraps mod 2^64)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def sample_size(size: int, rho: float, min_samples: int) -> int:
    """k = min(size, max(min_samples, ceil(rho * size))): at least a few dozen, at most all."""
    return min(size, max(min_samples, math.ceil(rho * size)))


def sample_indices(name: str, size: int, rho: float, min_samples: int) -> np.ndarray:
    """The flat indices S of parameter `name` (`size` entries), ascending int64 (see above)."""
    k = sample_size(size, rho, min_samples)
    if k == size:
        return np.arange(size, dtype=np.int64)
    seed = np.uint64(zlib.crc32(name.encode("utf-8")))
    steps = np.arange(1, size + 1, dtype=np.uint64)  # (size,)
    keys = splitmix64_mix(seed + steps * GOLDEN_GAMMA)  # (size,) uint64, all distinct
    chosen = np.argpartition(keys, k - 1)[:k]  # the k smallest keys, in no order
    return np.sort(chosen).astype(np.int64)


class Sampler:
    """Sample indices per parameter name, computed once and cached (both sides use this).

    rho: the fraction of each parameter sampled; min_samples: the floor on the count.
    """

    def __init__(self, rho: float, min_samples: int) -> None:
        self.rho = rho
        self.min_samples = min_samples
        self._indices: dict[tuple[str, int], np.ndarray] = {}

    def indices(self, name: str, size: int) -> np.ndarray:
        key = (name, size)
        cached = self._indices.get(key)
        if cached is None:
            cached = self._indices[key] = sample_indices(name, size, self.rho, self.min_samples)
            cached.flags.writeable = False
        return cached

    def values(self, name: str, param: np.ndarray) -> np.ndarray:
        """param's entries at its sample, as a new float32 array of shape (k,)."""
        flat = param.reshape(-1)  # (size,) a view for C-contiguous arrays
        return np.asarray(flat[self.indices(name, flat.size)], dtype=np.float32)
