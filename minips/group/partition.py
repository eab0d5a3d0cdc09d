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
from minips.protocol.slices import FLOAT32_BYTES, Slice

if TYPE_CHECKING:
    from minips.nn import Sequential

SLICE_BYTES = 65536  # a parameter over this many bytes (float32: 16,384 entries) is split


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
