"""A shard's Slice of a parameter: what a server of a group holds of it, and what its store,
its rules and the wire's `of` name (the partition that places the slices is
minips/group/partition.py; docs/protocol.md 16.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

FLOAT32_BYTES = 4  # every parameter is float32 (docs/model.md)


@dataclass(frozen=True)
class Slice:
    """One shard's part of one parameter: rows [start, stop) of its first axis.

    shape: the slice's own shape, (stop - start, *full_shape[1:]). A whole parameter has
    start 0, stop = its rows (0-d parameters: start = stop = 0, shape ()). offset: where
    the slice begins in the parameter flattened in C order.
    """

    name: str
    shard: int
    start: int
    stop: int
    shape: tuple[int, ...]
    whole: bool
    full_shape: tuple[int, ...] = ()  # the whole parameter's

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * FLOAT32_BYTES

    @property
    def offset(self) -> int:
        row = int(np.prod(self.shape[1:], dtype=np.int64)) if self.shape else 1
        return self.start * row

    def of(self, array: Any) -> Any:
        """This slice of a full array (a view: rows of a C-contiguous array are contiguous)."""
        return array if self.whole else array[self.start : self.stop]
