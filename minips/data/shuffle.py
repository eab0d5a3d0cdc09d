"""The data order, portable: a shuffle any language computes in a few lines (docs/model.md 4).

Both the training set's fixed order and each worker's batch order per epoch are one
function of a seed on SplitMix64 (Steele, Lea, Flood, OOPSLA 2014), defined with its keys
in docs/model.md 4.2-4.3 (JavaScript: minips/classroom/web/static/data.js):

    shuffle(s, n)    = the positions 0..n-1 in ascending order of key_s(position)
    training order   shuffle(seed, N_train)                   (seed 0 for every run)
    worker's epoch e shuffle(key_w(e), n_shard), w = seed * 1000 + rank   (mod 2^64)
"""

from __future__ import annotations

import numpy as np

from minips.protocol.sampling import GOLDEN_GAMMA, splitmix64_mix

MASK64 = (1 << 64) - 1


def splitmix64(seed: int, count: int) -> np.ndarray:
    """key_seed(0 .. count-1): SplitMix64's first `count` outputs of `seed`, (count,) uint64."""
    steps = np.arange(1, count + 1, dtype=np.uint64)  # (count,)
    return splitmix64_mix(np.uint64(seed & MASK64) + steps * GOLDEN_GAMMA)


def shuffle(seed: int, n: int) -> np.ndarray:
    """The positions 0..n-1 in ascending order of their keys: a permutation, (n,) int64."""
    return np.argsort(splitmix64(seed, n), kind="stable").astype(np.int64)


class EpochShuffle:
    """A worker's batch order: `permutation(n)` gives epoch 0's order, then epoch 1's, ...
    (the interface of numpy.random.Generator.permutation, for iterate_batches).

    seed: the run's seed; rank: the worker's. Epoch e's order is shuffle(key_w(e), n) with
    w = seed * 1000 + rank (mod 2^64): one seed per worker, one per epoch drawn from it.
    """

    def __init__(self, seed: int, rank: int) -> None:
        self.stream = (seed * 1000 + rank) & MASK64
        self.epoch = 0

    def permutation(self, n: int) -> np.ndarray:
        order = shuffle(int(splitmix64(self.stream, self.epoch + 1)[-1]), n)
        self.epoch += 1
        return order
