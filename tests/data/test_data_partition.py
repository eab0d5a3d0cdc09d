"""The partition of the training set among workers (minips/data/sharding.py, docs/model.md
4.2): Python and JavaScript give the same owner to every example, every example has exactly
one owner, and the label skew is what the option says (Dirichlet alpha, K shards)."""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from minips.data import load_dataset
from minips.data.sharding import (
    owners,
    parse_partition,
    shard_positions,
    shard_sizes,
)
from minips.errors import ConfigError
from minips.results.labels import label_histograms

NODE = shutil.which("node")
SCRIPT = Path(__file__).resolve().parents[1] / "js" / "partition.mjs"
CASES = [
    {"seed": 0, "world_size": 4, "partition": "dirichlet:0.1"},
    {"seed": 7, "world_size": 3, "partition": "dirichlet:1"},
    {"seed": 2**40 + 5, "world_size": 16, "partition": "dirichlet:0.05"},
    {"seed": 1, "world_size": 8, "partition": "dirichlet:1000"},
    {"seed": 0, "world_size": 5, "partition": "shards:2"},
    {"seed": 11, "world_size": 7, "partition": "shards:3"},
    {"seed": 3, "world_size": 10, "partition": "shards:1"},
    {"seed": 0, "world_size": 6, "partition": "iid"},
]


def sample_labels() -> np.ndarray:
    return load_dataset("sample").y_train  # (5500,) in training order, 550 per label


def skewed_labels() -> np.ndarray:
    """1,237 labels with uneven class sizes (one class of 3), in a random order."""
    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(10), [300, 3, 41, 200, 100, 99, 150, 144, 100, 100])
    return rng.permutation(labels)


@pytest.mark.skipif(NODE is None, reason="node not found")
@pytest.mark.parametrize("labels", [sample_labels, skewed_labels])
def test_javascript_gives_every_example_the_same_owner_as_python(tmp_path, labels):
    y = labels()
    y.astype(np.uint8).tofile(tmp_path / "labels.bin")
    (tmp_path / "cases.json").write_text(json.dumps(CASES))
    result = subprocess.run(
        [NODE, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(CASES)
    for case, line in zip(CASES, lines, strict=True):
        python = owners(y, case["world_size"], case["partition"], case["seed"])
        assert json.loads(line) == python.tolist(), case


@pytest.mark.parametrize("case", CASES)
def test_every_example_goes_to_exactly_one_worker(case):
    y = sample_labels()
    w = case["world_size"]
    parts = [shard_positions(y, r, w, case["partition"], case["seed"]) for r in range(w)]
    every = np.concatenate(parts)
    assert len(every) == len(y)
    assert np.array_equal(np.sort(every), np.arange(len(y)))
    assert all(np.all(np.diff(p) > 0) for p in parts)  # each in training order
    hist = label_histograms(y, w, case["partition"], case["seed"])
    assert np.array_equal(hist.sum(axis=0), np.bincount(y, minlength=10))


def test_iid_is_the_contiguous_slice():
    y = sample_labels()
    for r in range(3):
        assert np.array_equal(
            shard_positions(y, r, 3, "iid", 9), np.arange(r * len(y) // 3, (r + 1) * len(y) // 3)
        )


def test_the_same_seed_gives_the_same_partition_and_another_seed_another():
    y = sample_labels()
    first = owners(y, 4, "dirichlet:0.5", 1)
    assert np.array_equal(first, owners(y, 4, "dirichlet:0.5", 1))
    assert not np.array_equal(first, owners(y, 4, "dirichlet:0.5", 2))


def _skew(hist: np.ndarray) -> float:
    """Mean over workers of the largest label's share of the worker's examples."""
    return float(np.mean(hist.max(axis=1) / hist.sum(axis=1)))


def test_alpha_0_1_is_skewed_and_alpha_1000_near_iid():
    y = sample_labels()  # 550 per label
    for seed in range(3):
        skewed = label_histograms(y, 4, "dirichlet:0.1", seed)
        near_iid = label_histograms(y, 4, "dirichlet:1000", seed)
        # alpha 0.1: a worker is dominated by few labels, and most (worker, label) cells hold
        # under a tenth of their fair share; alpha 1000: every cell within 25% of 550 / 4
        assert _skew(skewed) > 0.3, skewed
        assert np.mean(skewed < 0.1 * 550 / 4) > 0.4, skewed
        assert np.all(np.abs(near_iid - 550 / 4) < 0.25 * 550 / 4), near_iid
        assert _skew(near_iid) < 0.13


def test_the_urn_matches_the_dirichlet_multinomial_mean_share():
    """Under Dir(alpha 1_W) a worker's expected squared share of a class is
    (alpha + 1) / (W alpha + 1) / W (the second moment of a Dirichlet marginal)."""
    y = np.zeros(4000, dtype=np.int64)  # one class, so each seed is one urn
    for alpha, text in ((0.1, "dirichlet:0.1"), (1.0, "dirichlet:1")):
        shares = [label_histograms(y, 4, text, s)[:, 0] / len(y) for s in range(200)]
        measured = float(np.mean(np.square(shares)))
        expected = (alpha + 1) / (4 * alpha + 1) / 4
        assert abs(measured - expected) < 0.15 * expected, (alpha, measured, expected)


@pytest.mark.parametrize("world_size,k", [(5, 2), (7, 3), (10, 1), (4, 4), (20, 2)])
def test_shards_give_each_worker_at_most_k_labels(world_size, k):
    y = sample_labels()
    hist = label_histograms(y, world_size, f"shards:{k}", 0)
    assert np.all((hist > 0).sum(axis=1) <= k), hist
    assert np.all(hist.sum(axis=1) > 0)


def test_shards_with_w_k_a_multiple_of_the_labels_are_fedavgs_equal_shards():
    hist = label_histograms(sample_labels(), 10, "shards:2", 0)  # 20 shards of 275
    assert np.all(hist.sum(axis=1) == 550)
    assert set(np.unique(hist)) <= {0, 275, 550}


def test_shard_sizes_go_to_the_largest_shards_first():
    assert shard_sizes([10, 6, 0, 5], 5) == [2, 2, 0, 1]  # 10/1 wins, then 6/1 over 10/2
    assert shard_sizes([10, 5, 0, 5], 5) == [3, 1, 0, 1]  # 10/2 ties 5/1: the smallest label
    assert shard_sizes([6, 6], 2) == [1, 1]


@pytest.mark.parametrize(
    "text,kind,value",
    [
        ("iid", "iid", 0),
        ("dirichlet:0.1", "dirichlet", 100000),
        ("dirichlet:2", "dirichlet", 2000000),
        ("dirichlet:0.000001", "dirichlet", 1),
        ("shards:2", "shards", 2),
    ],
)
def test_parse(text, kind, value):
    part = parse_partition(text)
    assert part.kind == kind and value in (part.alpha_millionths, part.k)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "IID",
        "dirichlet:",
        "dirichlet:0",
        "dirichlet:-1",
        "dirichlet:1e-3",
        "dirichlet:0.0000001",
        "dirichlet:10001",
        "shards:0",
        "shards:x",
        "label:2",
    ],
)
def test_bad_partitions_are_one_line_errors(text):
    with pytest.raises(ConfigError, match="partition"):
        parse_partition(text)


def test_shards_that_cannot_cover_the_labels_are_refused():
    with pytest.raises(ConfigError, match="shards"):
        owners(sample_labels(), 4, "shards:2", 0)  # 8 shards for 10 labels


DOC = Path(__file__).resolve().parents[2] / "docs" / "model.md"


def _doc_block(name: str) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"<!-- {name} -->\n```\n") + len(f"<!-- {name} -->\n```\n")
    return text[start : text.index("```", start)].strip().splitlines()


def _key(seed: int, i: int) -> int:
    """SplitMix64 output i of `seed`, in plain Python integers (docs/model.md 4.2)."""
    mask = (1 << 64) - 1
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def _urn_from_the_doc(y: list[int], w: int, alpha: int, seed: int) -> list[int]:
    """The dirichlet rule exactly as docs/model.md words it, one example at a time."""
    p = (seed * 1000 - 1) % 2**64
    k, m, out = [[0] * w for _ in range(10)], [0] * 10, []
    for j, c in enumerate(y):
        u = (_key(p, j) * (w * alpha + 10**6 * m[c])) >> 64
        sums = np.cumsum([alpha + 10**6 * k[c][v] for v in range(w)])
        owner = int(np.argmax(u < sums))
        k[c][owner] += 1
        m[c] += 1
        out.append(owner)
    return out


def test_the_docs_small_example_is_the_rule_as_written_and_the_implementation():
    y = np.arange(12) % 3
    rows = dict(line.split(None, 1) for line in _doc_block("partition-small"))
    assert rows["dirichlet:0.5"].split() == [str(o) for o in owners(y, 3, "dirichlet:0.5", 5)]
    assert rows["shards:2"].split() == [str(o) for o in owners(y, 3, "shards:2", 5)]
    assert _urn_from_the_doc(y.tolist(), 3, 500000, 5) == owners(y, 3, "dirichlet:0.5", 5).tolist()
    y = sample_labels()
    assert _urn_from_the_doc(y.tolist(), 4, 100000, 0) == owners(y, 4, "dirichlet:0.1", 0).tolist()


def test_the_docs_sample_histograms():
    y = sample_labels()
    first = " ".join(str(o) for o in owners(y, 4, "dirichlet:0.1", 0)[:16])
    assert _doc_block("partition-first-owners") == [first]
    for block, world_size, text in (
        ("partition-dirichlet", 4, "dirichlet:0.1"),
        ("partition-shards", 5, "shards:2"),
    ):
        hist = label_histograms(y, world_size, text, 0)
        assert [[int(v) for v in line.split()] for line in _doc_block(block)] == hist.tolist()
    assert f"`key_P(0)` = 0x{_key(2**64 - 1, 0):016x}" in DOC.read_text(encoding="utf-8")


@pytest.mark.skipif(NODE is None, reason="node not found")
def test_the_page_refuses_a_gateway_shard_that_is_not_its_own():
    script = SCRIPT.with_name("partition_fetch.mjs")
    run = [NODE, str(script)]
    good = subprocess.run([*run, "good"], capture_output=True, text=True, timeout=60)
    bad = subprocess.run([*run, "bad"], capture_output=True, text=True, timeout=60)
    assert good.stdout.split()[0] == "ok", good.stdout + good.stderr
    assert "is not the one this page computes" in bad.stdout, bad.stdout + bad.stderr


@pytest.mark.skipif(NODE is None, reason="node not found")
def test_a_page_that_cannot_parse_the_partition_refuses_the_run():
    configs = [{"config": {"model": {"name": "mlp"}, "partition": p}, "engine": "js"}
               for p in ("dirichlet:0.1", "shards:2", "zipf:2")]  # fmt: skip
    follow = SCRIPT.with_name("follow.mjs")
    done = subprocess.run([NODE, str(follow), json.dumps(configs)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    reasons = json.loads(done.stdout)
    assert reasons[:2] == [None, None]
    assert reasons[2].startswith("this page cannot cut its shard: bad --partition")
