"""The partition of a model over a server group (minips/group/partition.py, docs/protocol.md
16.1): balanced for the zoo's models, exactly the documented rule, and its slices views."""

import re
from pathlib import Path

import numpy as np
import pytest

from minips.errors import ConfigError
from minips.group.partition import SLICE_BYTES, partition, partition_of_model
from minips.nn import build_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


@pytest.mark.parametrize("model", ["lenet5", "mlp"])
@pytest.mark.parametrize("servers", [2, 4])
def test_the_largest_shard_carries_at_most_1_1_times_the_mean(model, servers):
    params = build_model(model).params
    shard_bytes = partition_of_model(params, servers).shard_bytes()
    assert sum(shard_bytes) == sum(a.nbytes for a in params.values())
    assert max(shard_bytes) <= 1.1 * sum(shard_bytes) / servers, shard_bytes


@pytest.mark.parametrize("model", ["lenet5", "mlp"])
@pytest.mark.parametrize("servers", [1, 2, 3, 4, 7])
def test_every_entry_of_every_parameter_is_on_exactly_one_shard(model, servers):
    params = build_model(model).params
    part = partition_of_model(params, servers)
    for name, array in params.items():
        covered = np.zeros(array.shape[0] if array.shape else 1, np.int64)
        for piece in part.slices(name):
            covered[piece.start : piece.stop] += 1
            assert piece.shape == (piece.stop - piece.start, *array.shape[1:])
        assert (covered == 1).all(), name


def _by_hand(shapes, servers):
    """docs/protocol.md 16.1 written again, as plainly as possible: name -> [(shard, rows)]."""
    load = [0] * servers
    where = {}
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        if servers >= 2 and size * 4 > SLICE_BYTES and shape[0] >= servers:
            rows = shape[0]
            where[name] = [
                (j, j * rows // servers, (j + 1) * rows // servers) for j in range(servers)
            ]
            for j, start, stop in where[name]:
                load[j] += (stop - start) * size // rows * 4
    for name, shape in shapes.items():
        if name not in where:
            j = load.index(min(load))  # the first of the least loaded
            where[name] = [(j, 0, shape[0] if shape else 0)]
            load[j] += int(np.prod(shape)) * 4
    return where


@pytest.mark.parametrize("servers", [1, 2, 3, 5])
def test_the_partition_is_the_documented_rule(servers):
    rng = np.random.default_rng(7)
    shapes = {
        f"p{i}.w": tuple(int(d) for d in rng.integers(1, 90, rng.integers(1, 4))) for i in range(30)
    }
    shapes["big.w"] = (3, 40000)  # over the slice size but only 3 rows: whole when K > 3
    shapes["scalar"] = ()
    part = partition(shapes, servers)
    got = {name: [(s.shard, s.start, s.stop) for s in part.slices(name)] for name in shapes}
    assert got == _by_hand(shapes, servers)


def test_model_order_and_shard_order():
    params = build_model("lenet5").params
    part = partition_of_model(params, 2)
    for shard in part.by_shard:
        names = [s.name for s in shard]
        assert names == [n for n in params if n in names]  # each shard in model order
    assert [s.shard for s in part.slices("fc1.w")] == [0, 1]
    assert partition_of_model(params, 2) == part  # a pure function


def test_one_server_holds_everything_whole():
    params = build_model("lenet5").params
    part = partition_of_model(params, 1)
    assert all(s.whole for s in part.by_shard[0])
    assert part.shard_shapes(0) == {name: a.shape for name, a in params.items()}


def test_split_gives_views_and_assemble_puts_them_back():
    params = build_model("lenet5", seed=3).params
    part = partition_of_model(params, 3)
    pieces = part.split(params)
    for j, shard in enumerate(pieces):
        assert list(shard) == [s.name for s in part.by_shard[j]]
        for name, view in shard.items():
            assert view.flags.c_contiguous and np.shares_memory(view, params[name])
    for name, array in params.items():
        by_shard = {j: pieces[j][name] for j in range(3) if name in pieces[j]}
        np.testing.assert_array_equal(part.assemble(name, by_shard), array)


def test_assemble_takes_missing_slices_from_the_previous_array_without_writing_it():
    part = partition({"w": (6, 20000)}, 2)
    previous = np.zeros((6, 20000), np.float32)
    previous.flags.writeable = False
    full = part.assemble("w", {1: np.ones((3, 20000), np.float32)}, previous)
    assert full[:3].sum() == 0 and (full[3:] == 1).all() and not previous.any()
    with pytest.raises(ValueError, match="shards \\[0\\]"):
        part.assemble("w", {1: np.ones((3, 20000), np.float32)})


def test_slice_offsets_are_flat_positions():
    part = partition({"w": (10, 3000)}, 3)
    assert [(s.offset, s.size) for s in part.slices("w")] == [
        (0, 9000),
        (9000, 9000),
        (18000, 12000),
    ]


def test_bad_group_sizes_are_one_line_errors():
    with pytest.raises(ConfigError, match="at least 1 server"):
        partition({"w": (2,)}, 0)
    with pytest.raises(ConfigError, match="at least one parameter"):
        partition({}, 2)


def test_the_documented_example_is_what_the_code_computes():
    """docs/protocol.md 16.1's LeNet-5 table at K = 2, row for row."""
    text = DOC.read_text(encoding="utf-8")
    table = text.split("<!-- partition-lenet5-k2 -->", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| (\d+) \| (\d+):(\d+) \|", table, re.M)
    part = partition_of_model(build_model("lenet5").params, 2)
    expected = [(s.name, s.shard, s.start, s.stop) for shard in part.by_shard for s in shard]
    assert [(n, int(j), int(a), int(b)) for n, j, a, b in rows] == expected
    totals = re.search(r"shard 0 carries ([\d,]+) bytes, shard 1 ([\d,]+)", text)
    assert [int(t.replace(",", "")) for t in totals.groups()] == part.shard_bytes()


def test_a_group_too_large_for_the_model_is_refused():
    with pytest.raises(ConfigError, match=r"shard\(s\) 2 would hold nothing"):
        partition({"a": (3,), "b": (4,)}, 3)


def test_a_parameter_of_exactly_slice_bytes_is_whole_and_one_row_more_is_split():
    """16.1: split only *more than* 65,536 bytes (16,384 float32 entries)."""
    assert SLICE_BYTES == 65536
    part = partition({"at": (128, 128), "past": (129, 128)}, servers=2)
    (at,) = part.slices("at")
    assert at.whole and at.shape == (128, 128)
    past = part.slices("past")
    assert [(p.shard, p.start, p.stop, p.whole) for p in past] == [
        (0, 0, 64, False),
        (1, 64, 129, False),
    ]
