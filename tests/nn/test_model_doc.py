"""docs/model.md against minips: the worked examples, the layer tables, config and data.

If this fails, either minips or the normative document changed: fix them together (and the
JavaScript network, which tests/js/model_doc.mjs checks against the same examples).
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from minips.data import NORMALIZATION
from minips.nn import build_model, softmax_cross_entropy
from minips.nn.layers import Conv2D, Dense, Flatten, MaxPool2D, ReLU
from minips.nn.model import Sequential
from minips.run.config import RunConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "model.md"


def doc_example(label: str) -> dict:
    """The JSON block that follows `<!-- model-example-LABEL -->` in docs/model.md."""
    match = re.search(
        rf"<!-- model-example-{label} -->\s*```json\s*\n(.*?)```", DOC.read_text(), re.S
    )
    assert match, f"example {label} not found in {DOC}"
    return json.loads(match.group(1))


def _check(model: Sequential, example: dict) -> None:
    model.set_params(
        {k: np.array(v, np.float32) for k, v in example["params"].items()}, strict=True
    )
    logits = model.forward(np.array(example["x"], np.float32))
    np.testing.assert_allclose(logits, example["logits"], atol=1e-5)
    loss, dlogits = softmax_cross_entropy(logits, np.array(example["labels"]))
    assert loss == pytest.approx(example["loss"], abs=1e-5)
    model.backward(dlogits)
    assert list(model.grads) == list(example["grads"])
    for name, grad in model.grads.items():
        np.testing.assert_allclose(grad, example["grads"][name], atol=1e-5, err_msg=name)


def test_mlp_example_matches_minips_nn():
    example = doc_example("mlp")
    spec = example["model"]
    _check(build_model(spec["name"], **spec["kwargs"]), example)


def test_conv_example_matches_minips_nn():
    example = doc_example("conv")
    model = Sequential([Conv2D(1, 2, 2), ReLU(), MaxPool2D(2, 2), Flatten(), Dense(8, 3)])
    _check(model, example)


def test_a_wrong_gradient_would_be_caught():
    example = doc_example("mlp")
    example["grads"]["fc1.w"][0][0] += 1e-3
    with pytest.raises(AssertionError):
        _check(build_model("mlp", hidden=[2], in_features=3, n_classes=2), example)


def _table_params(model_name: str) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes listed in the doc's table for `model_name`."""
    section = DOC.read_text().split(f"### 3.3 `{model_name}`")[1].split("###")[0]
    found = re.findall(r"`(\w+\.[wb])` \(([\d, ]+)\)", section)
    return {name: tuple(int(d) for d in dims.split(",") if d.strip()) for name, dims in found}


def test_lenet5_table_lists_every_parameter_with_its_shape_in_order():
    model = build_model("lenet5")
    shapes = {name: tuple(a.shape) for name, a in model.params.items()}
    table = _table_params("lenet5")
    assert list(table) == list(shapes) and table == shapes
    assert "431,080 parameters" in DOC.read_text() and model.n_params == 431_080


def test_mlp_defaults_in_the_doc_are_the_zoos():
    model = build_model("mlp")
    text = DOC.read_text()
    listed = re.findall(r"`(fc\d\.[wb])` \(([\d, ]+)\)", text.split("### 3.4")[1].split("###")[0])
    assert [(n, tuple(int(d) for d in s.split(",") if d.strip())) for n, s in listed] == [
        (n, tuple(a.shape)) for n, a in model.params.items()
    ]
    assert f"{model.n_params:,} parameters" in text


def test_config_table_names_every_key_the_server_sends():
    spec = RunConfig(model="mlp", dataset="synthetic")
    config = spec.hello_config(build_model("mlp").spec)
    section = DOC.read_text().split("## 1.")[1].split("## 2.")[0]
    documented = set(re.findall(r"^\| `(\w+)`", section, re.M))
    documented |= {"rank", "world_size"}
    assert set(config) | {"rank", "world_size", "rule"} <= documented


def test_normalisation_table_is_the_code():
    section = DOC.read_text().split("### 4.1")[1].split("### 4.2")[0]
    for name, (mean, std) in NORMALIZATION.items():
        row = next(line for line in section.splitlines() if f"`{name}`" in line)
        assert f"{mean:.4f}" in row and f"{std:.4f}" in row, name


def _doc_block(label: str) -> list[list[int]]:
    """The lines of integers in the block after `<!-- LABEL -->` in docs/model.md."""
    match = re.search(rf"<!-- {label} -->\s*```\s*\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"{label} not found in {DOC}"
    return [[int(v) for v in line.split()] for line in match.group(1).strip().splitlines()]


def test_the_portable_shuffle_is_the_documents_worked_example():
    from minips.data.shuffle import EpochShuffle, shuffle, splitmix64

    text = " ".join(DOC.read_text().split())
    assert [hex(int(k)) for k in splitmix64(0, 2)] == ["0xe220a8397b1dcdaf", "0x6e789e6aa1b965f4"]
    assert f"`key_0(0)` = {hex(int(splitmix64(0, 1)[0]))}" in text
    assert [hex(int(k)) for k in splitmix64(1, 2)] == ["0x910a2dec89025cc1", "0xbeeb8da1658eec67"]
    assert _doc_block("shuffle-training-order") == [shuffle(0, 10).tolist()]
    epochs = EpochShuffle(seed=0, rank=1)
    assert _doc_block("shuffle-epochs") == [epochs.permutation(10).tolist() for _ in range(2)]


def test_the_training_order_and_a_workers_batches_are_the_portable_shuffle():
    """What minips does: the loaded training set is the file's examples in shuffle(0, N)
    order, and a worker's epochs visit its shard in EpochShuffle's orders."""
    from minips.data import iterate_batches, load_dataset, read_idx
    from minips.data.datasets import SAMPLE_DIR, idx_paths
    from minips.data.shuffle import shuffle
    from minips.worker.client import PSClient
    from minips.worker.worker import Worker

    file_labels = read_idx(idx_paths(SAMPLE_DIR)["train_labels"])
    loaded = load_dataset("sample", data_dir=SAMPLE_DIR.parent)
    np.testing.assert_array_equal(loaded.y_train, file_labels[shuffle(0, len(file_labels))])
    spec = {"name": "mlp", "kwargs": {"hidden": [4]}}
    config = {"model": spec, "dataset": "sample", "data_dir": str(SAMPLE_DIR.parent),
              "batch_size": 8, "epochs": 2, "seed": 7}  # fmt: skip
    with PSClient("tcp://127.0.0.1:9") as client:  # never asked: _join only reads hello
        shard, order = Worker(client)._join({"rank": 1, "world_size": 3, "config": config})
    n = len(shard.y_train)
    for epoch in range(2):
        expected = shuffle(int(splitmix64_of(7 * 1000 + 1, epoch)), n)
        labels = np.concatenate([yb for _, yb in iterate_batches(shard.x_train, shard.y_train,
                                                                 8, order)])  # fmt: skip
        np.testing.assert_array_equal(labels, shard.y_train[expected])


def splitmix64_of(seed: int, i: int) -> int:
    """Output i of SplitMix64(seed), written out as docs/model.md 4.2 gives it."""
    mask = (1 << 64) - 1
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)
