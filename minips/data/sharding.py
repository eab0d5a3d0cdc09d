"""Which training examples each worker gets: `--partition iid | dirichlet:ALPHA | shards:K`.

Portable like the shuffle (docs/model.md 4.2): integer arithmetic on SplitMix64 outputs, so a
worker in any language (the browser's: minips/classroom/web/static/partition.js) computes
the very same partition. `labels` is the training set in its training order, N examples.

    iid           rank r of W: positions [r*N//W, (r+1)*N//W)
    dirichlet:A   label skew of Hsu, Qi, Brown 2019, drawn as a Polya urn (Blackwell,
                  MacQueen 1973): example j of class c goes to worker w with probability
                  (A + k_cw) / (W*A + m_c), k_cw its class-c examples so far
    shards:K      FedAvg's pathological non-IID split (McMahan et al., AISTATS 2017)

The exact draws (the stream P = seed*1000 - 1, the urn's integers, the shards' cut and
deal) are docs/model.md 4.2. A worker's examples keep their training order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from minips.data.shuffle import MASK64, shuffle, splitmix64
from minips.errors import ConfigError

ALPHA_SCALE = 10**6  # ALPHA counts in millionths: the urn's weights are integers
MAX_ALPHA = 10**4  # W*A + 10^6*N stays below 2^53, exact in a JavaScript number
N_CLASSES = 10
_DIRICHLET = re.compile(r"^dirichlet:(\d+)(?:\.(\d{1,6}))?$")
_SHARDS = re.compile(r"^shards:(\d{1,6})$")


@dataclass(frozen=True)
class Partition:
    """A parsed --partition: kind "iid", "dirichlet" (alpha in millionths) or "shards" (k)."""

    kind: str
    alpha_millionths: int = 0
    k: int = 0


def parse_partition(text: str) -> Partition:
    """ "iid", "dirichlet:0.1", "shards:2" -> Partition; one-line ConfigError otherwise.

    ALPHA is a decimal without exponent, at most 6 digits after the point, in (0, 10000].
    """
    if text == "iid":
        return Partition("iid")
    if match := _DIRICHLET.match(text):
        whole, frac = match.group(1), match.group(2) or ""
        alpha = int(whole) * ALPHA_SCALE + int(frac.ljust(6, "0"))
        if not 0 < alpha <= MAX_ALPHA * ALPHA_SCALE:
            raise ConfigError(f"--partition {text}: ALPHA must be in (0, {MAX_ALPHA}]")
        return Partition("dirichlet", alpha_millionths=alpha)
    if match := _SHARDS.match(text):
        if int(match.group(1)) < 1:
            raise ConfigError(f"--partition {text}: K must be at least 1")
        return Partition("shards", k=int(match.group(1)))
    raise ConfigError(
        f"bad --partition {text!r}: iid, dirichlet:ALPHA (e.g. dirichlet:0.1) or shards:K"
    )


def partition_stream(seed: int) -> int:
    """P = seed*1000 - 1 (mod 2^64): the partition's SplitMix64 seed."""
    return (seed * 1000 - 1) & MASK64


def owners(labels: np.ndarray, world_size: int, text: str, seed: int) -> np.ndarray:
    """The worker of every training position, (N,) int64 (labels (N,) in training order)."""
    part, n = parse_partition(text), len(labels)
    if world_size < 1 or world_size > n:
        raise ConfigError(f"cannot split {n} training examples among {world_size} workers")
    if part.kind == "iid":
        bounds = [r * n // world_size for r in range(world_size + 1)]
        return np.repeat(np.arange(world_size, dtype=np.int64), np.diff(bounds))
    if part.kind == "dirichlet":
        return _urn_owners(labels, world_size, part.alpha_millionths, partition_stream(seed))
    return _shard_owners(labels, world_size, part.k, partition_stream(seed))


def _urn_owners(labels: np.ndarray, world_size: int, alpha: int, stream: int) -> np.ndarray:
    """Dirichlet-multinomial by a Polya urn per class; weights scaled by 10^6 (module doc)."""
    keys = splitmix64(stream, len(labels)).tolist()  # key_P(j), Python ints
    counts = [[0] * world_size for _ in range(N_CLASSES)]  # k_cw
    drawn = [0] * N_CLASSES  # m_c
    out = np.empty(len(labels), dtype=np.int64)
    for j, label in enumerate(labels.tolist()):
        total = world_size * alpha + ALPHA_SCALE * drawn[label]
        u = (keys[j] * total) >> 64  # uniform in [0, total)
        row, acc, w = counts[label], 0, -1
        while acc <= u:
            w += 1
            acc += alpha + ALPHA_SCALE * row[w]
        row[w] += 1
        drawn[label] += 1
        out[j] = w
    return out


def shard_sizes(class_counts: list[int], n_shards: int) -> list[int]:
    """Shards per label: 1 per present label, then each further one to the label whose shards
    are largest (largest n_c / s_c, the smallest label on a tie), compared in integers."""
    shards = [1 if n else 0 for n in class_counts]
    for _ in range(n_shards - sum(shards)):
        best = -1
        for c, (n, s) in enumerate(zip(class_counts, shards, strict=True)):
            if s and (best < 0 or n * shards[best] > class_counts[best] * s):
                best = c
        shards[best] += 1
    return shards


def _shard_owners(labels: np.ndarray, world_size: int, k: int, stream: int) -> np.ndarray:
    """W*K one-label shards (label ascending, then training order), dealt by shuffle(P, W*K)."""
    n_shards = world_size * k
    counts = np.bincount(labels, minlength=N_CLASSES).tolist()
    present = sum(1 for c in counts if c)
    if n_shards < present or n_shards > len(labels):
        raise ConfigError(
            f"shards:{k} with {world_size} workers: {n_shards} shards for {len(labels)} "
            f"examples of {present} labels (need labels <= workers * K <= examples)"
        )
    deal = shuffle(stream, n_shards)  # worker w gets shards deal[w*K : (w+1)*K]
    shard_owner = np.empty(n_shards, dtype=np.int64)
    shard_owner[deal] = np.arange(n_shards) // k
    out = np.empty(len(labels), dtype=np.int64)
    first = 0  # index of the label's first shard
    for label, pieces in enumerate(shard_sizes(counts, n_shards)):
        positions = np.flatnonzero(labels == label)  # ascending training order
        n = len(positions)
        for i in range(pieces):
            out[positions[i * n // pieces : (i + 1) * n // pieces]] = shard_owner[first + i]
        first += pieces
    return out


def shard_positions(
    labels: np.ndarray, rank: int, world_size: int, text: str, seed: int
) -> np.ndarray:
    """The training positions of worker `rank`, ascending, (n_shard,) int64."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"bad shard: rank {rank} of world size {world_size}")
    return np.flatnonzero(owners(labels, world_size, text, seed) == rank)
