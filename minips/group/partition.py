"""The partition of a model's parameters over a server group of K shards.

A pure function of the parameters (their names, shapes and model order) and K, so that a
worker in any language computes the same one (docs/protocol.md 16.1 is the normative text):

    1. With K >= 2, a parameter of more than SLICE_BYTES bytes with at least K rows is
       *split*: shard j holds rows [floor(j * R / K), floor((j + 1) * R / K)) of its first
       axis (R rows).
    2. Every other parameter is *whole*: in model order, each goes to the shard carrying
       the fewest bytes so far (the split slices counted first), the lowest index on a tie.

Splitting along the first axis keeps a slice a tensor of the same kind: a Dense weight
(in, out) becomes (rows, out), whose gradient is x[:, rows]^T dy (sufficient factors per
slice); a conv weight (O, C, kh, kw) becomes (o, C, kh, kw), a matrix of o rows for
low-rank. A slice is contiguous in C order, so it travels as a view, without a copy.

Like ps-lite's key ranges (Postoffice::GetServerKeyRanges splits the key space evenly) and
MXNet's kvstore (arrays over MXNET_KVSTORE_BIGARRAY_BOUND are split over all servers, small
ones sent whole to one), big tensors are cut across all shards and small ones kept whole;
placing the small ones on the least loaded shard (instead of MXNet's key hash) keeps every
shard near the mean: LeNet-5's fc1.w is 93% of the model.

    part = partition({"fc1.w": (800, 500), "fc1.b": (500,)}, servers=2)
    part.slices("fc1.w")     # [Slice(fc1.w, shard 0, rows 0:400), Slice(..., shard 1, 400:800)]
    part.split(grads)        # [{name: view of shard 0's part}, {... shard 1's}]
    part.shard_bytes()       # bytes each shard carries

With K = 1 every parameter is whole on shard 0: the plain server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from minips.errors import ConfigError
from minips.protocol.sampling import Sampler

if TYPE_CHECKING:
    from minips.nn import Sequential

SLICE_BYTES = 65536  # a parameter over this many bytes (float32: 16,384 entries) is split
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


@dataclass(frozen=True)
class Partition:
    """Where each parameter lives in a group of `servers` shards (see the module docstring).

    shapes: parameter name -> full shape, in model order. by_shard[j]: shard j's slices, in
    model order.
    """

    shapes: dict[str, tuple[int, ...]]
    by_shard: tuple[tuple[Slice, ...], ...]

    @property
    def servers(self) -> int:
        return len(self.by_shard)

    def shard_slices(self, shard: int) -> ShardSlices:
        """What shard `shard` holds: name -> its Slice, in model order."""
        return ShardSlices((piece.name, piece) for piece in self.by_shard[shard])

    def slices(self, name: str) -> list[Slice]:
        """The slices of parameter `name`, by shard (one for a whole parameter)."""
        return [s for shard in self.by_shard for s in shard if s.name == name]

    def shard_shapes(self, shard: int) -> dict[str, tuple[int, ...]]:
        """name -> slice shape of what `shard` holds, in model order."""
        return {s.name: s.shape for s in self.by_shard[shard]}

    def shard_bytes(self) -> list[int]:
        """The float32 bytes each shard holds."""
        return [sum(s.nbytes for s in shard) for shard in self.by_shard]

    def split(self, arrays: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Full arrays (any subset of the parameters) -> one dict per shard of its slices'
        views, in the order of `arrays`; a shard that holds none of them gets {}."""
        parts: list[dict[str, Any]] = [{} for _ in self.by_shard]
        for name, array in arrays.items():
            for piece in self.slices(name):
                parts[piece.shard][name] = piece.of(array)
        return parts

    def assemble(
        self, name: str, pieces: Mapping[int, np.ndarray], previous: np.ndarray | None = None
    ) -> np.ndarray:
        """Parameter `name` from the slices that arrived (shard -> slice array), the rest
        from `previous` (the last full array; needed unless every slice arrived).

        A new array every time (`previous` is never written), except that a whole
        parameter's one slice is returned as it is.
        """
        slices = self.slices(name)
        if len(slices) == 1:
            return pieces[slices[0].shard]
        if len(pieces) == len(slices):
            return np.concatenate([pieces[s.shard] for s in slices])
        if previous is None:
            missing = [s.shard for s in slices if s.shard not in pieces]
            raise ValueError(f"{name}: the slices of shards {missing} are missing")
        full = previous.copy()
        for s in slices:
            if s.shard in pieces:
                full[s.start : s.stop] = pieces[s.shard]
        return full

    def describe(self) -> list[dict[str, Any]]:
        """Per shard: its bytes and its slices as "name[start:stop]" (for logs and stats)."""
        return [
            {
                "bytes": sum(s.nbytes for s in shard),
                "slices": [s.name if s.whole else f"{s.name}[{s.start}:{s.stop}]" for s in shard],
            }
            for shard in self.by_shard
        ]


class ShardSlices(dict[str, Slice]):
    """A shard's slices (name -> Slice), as its ParameterStore holds them; VSGD asks them
    for its samples (`sampler`), since a split parameter's are the whole parameter's."""

    def sampler(self, rho: float, min_samples: int) -> SliceSampler:
        """VSGD's sampler of this shard's slices (docs/protocol.md 16.6)."""
        return SliceSampler(rho, min_samples, self)


class SliceSampler(Sampler):
    """A shard's samples (docs/protocol.md 16.6): for a slice of a split parameter, the
    whole parameter's sample S_P restricted to the slice's coordinates, as positions in the
    slice; a whole parameter's own sample otherwise.

    slices: name -> the shard's Slice of it.
    """

    def __init__(self, rho: float, min_samples: int, slices: Mapping[str, Slice]) -> None:
        super().__init__(rho, min_samples)
        self.slices = dict(slices)

    def indices(self, name: str, size: int) -> np.ndarray:
        piece = self.slices.get(name)
        if piece is None or piece.whole:
            return super().indices(name, size)
        key = (name, -size)  # cached apart from a whole parameter of the same size
        cached = self._indices.get(key)
        if cached is None:
            whole = super().indices(name, int(np.prod(piece.full_shape, dtype=np.int64)))
            cached = self._indices[key] = whole[sample_rows(whole, piece)] - piece.offset
            cached.flags.writeable = False
        return cached


def sample_rows(indices: np.ndarray, piece: Slice) -> slice:
    """Which entries of a whole parameter's sample (its ascending flat `indices`) fall in
    `piece`: the shard's sample values are values[result], at positions indices[result] -
    piece.offset of the slice (docs/protocol.md 16.6)."""
    low, high = np.searchsorted(indices, [piece.offset, piece.offset + piece.size])
    return slice(int(low), int(high))


def partition(
    shapes: Mapping[str, Iterable[int]] | Iterable[tuple[str, Iterable[int]]], servers: int
) -> Partition:
    """The partition of parameters `shapes` (name -> shape, in model order) over `servers`
    shards; ConfigError for servers < 1, no parameters, or a shard left empty."""
    items = list(shapes.items() if isinstance(shapes, Mapping) else shapes)
    full = {str(name): tuple(int(d) for d in shape) for name, shape in items}
    if servers < 1:
        raise ConfigError(f"a server group needs at least 1 server, got {servers}")
    if not full:
        raise ConfigError("a partition needs at least one parameter")
    by_shard: list[list[Slice]] = [[] for _ in range(servers)]
    load = [0] * servers
    whole: list[str] = []
    for name, shape in full.items():
        rows = shape[0] if shape else 0
        nbytes = int(np.prod(shape, dtype=np.int64)) * FLOAT32_BYTES
        if servers == 1 or nbytes <= SLICE_BYTES or rows < servers:
            whole.append(name)
            continue
        for j in range(servers):
            start, stop = j * rows // servers, (j + 1) * rows // servers
            piece = Slice(name, j, start, stop, (stop - start, *shape[1:]), False, shape)
            by_shard[j].append(piece)
            load[j] += piece.nbytes
    for name in whole:
        shape = full[name]
        j = min(range(servers), key=lambda k: (load[k], k))
        rows = shape[0] if shape else 0
        piece = Slice(name, j, 0, rows, shape, True, shape)
        by_shard[j].append(piece)
        load[j] += piece.nbytes
    empty = [j for j in range(servers) if not by_shard[j]]
    if empty:
        raise ConfigError(
            f"{servers} servers are too many for a model of {len(full)} parameters: "
            f"shard(s) {_first_few(empty)} would hold nothing"
        )
    order = {name: i for i, name in enumerate(full)}
    ordered = tuple(tuple(sorted(s, key=lambda p: order[p.name])) for s in by_shard)
    return Partition(full, ordered)


def partition_of_model(params: Mapping[str, np.ndarray], servers: int) -> Partition:
    """The partition of a model's parameters (name -> array, model order)."""
    return partition({name: array.shape for name, array in params.items()}, servers)


def _first_few(numbers: list[int], shown: int = 8) -> str:
    """ "1, 2, 3" or, past `shown` numbers, "1, 2, ..., 9 (12 in all)": an error stays a line."""
    if len(numbers) <= shown:
        return ", ".join(map(str, numbers))
    first = ", ".join(map(str, numbers[: shown - 1]))
    return f"{first}, ..., {numbers[-1]} ({len(numbers)} in all)"


def group_gain(model: Sequential, servers: int) -> float:
    """How many times a worker's share of a server's link grows with a group of `servers`
    shards, each behind a link of its own: a step's bytes split by the partition, every
    shard's part crossing its own link at once, so the largest part sets the time. 1 for
    one server; LeNet-5: 1.98 at 2 shards, 3.87 at 4. (The planner's Cluster.link_gain.)"""
    if servers == 1:
        return 1.0
    shard_bytes = partition_of_model(model.params, servers).shard_bytes()
    return sum(shard_bytes) / max(shard_bytes)
