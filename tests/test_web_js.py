"""The JavaScript network (minips/web/static/nn.js) against minips.nn, run with Node.

The same JS files the browser worker loads are imported by the Node scripts in tests/js/.
Python writes weights, a batch and NumPy's logits and gradients as raw .bin files; the Node
script recomputes them and compares (relative error < 1e-4 per array).
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from minips.data import load_dataset
from minips.nn import build_model, softmax_cross_entropy

JS_TESTS = Path(__file__).resolve().parent / "js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node not found: JS tests need Node >= 18")
TOLERANCE = 1e-4


def _node(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NODE, str(JS_TESTS / script), *args], capture_output=True, text=True, timeout=120
    )


def _write_case(tmp_path: Path, model_name: str, batch: int, seed: int) -> dict:
    """Write weights, a batch and NumPy's outputs; return the case description."""
    model = build_model(model_name, seed=seed)
    data = load_dataset("synthetic").shard(0, 4)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(data.y_train), batch, replace=False)
    x, labels = data.x_train[pick], data.y_train[pick]
    # Perturb the biases off zero so a wrong bias gradient or broadcast cannot hide.
    for name, param in model.params.items():
        if name.endswith(".b"):
            param += rng.normal(0, 0.1, param.shape).astype(np.float32)
    logits = model.forward(x)
    loss, dlogits = softmax_cross_entropy(logits, labels)
    model.backward(dlogits)
    case = {"model": model.spec, "tolerance": TOLERANCE, "loss": loss, "params": []}
    for name, param in model.params.items():
        param.astype("<f4").tofile(tmp_path / f"{name}.bin")
        model.grads[name].astype("<f4").tofile(tmp_path / f"{name}.grad.bin")
        case["params"].append({"name": name, "file": f"{name}.bin", "grad": f"{name}.grad.bin"})
    x.astype("<f4").tofile(tmp_path / "x.bin")
    labels.astype(np.uint8).tofile(tmp_path / "labels.bin")
    logits.astype("<f4").tofile(tmp_path / "logits.bin")
    case.update(x={"file": "x.bin", "shape": list(x.shape)}, labels="labels.bin")
    case["logits"] = "logits.bin"
    (tmp_path / "case.json").write_text(json.dumps(case))
    return case


@pytest.mark.parametrize("model_name", ["lenet5", "mlp"])
def test_js_forward_and_backward_equal_numpys(tmp_path, model_name):
    _write_case(tmp_path, model_name, batch=16, seed=3)
    result = _node("compare_numpy.mjs", str(tmp_path))
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok  ") == 2 + len(build_model(model_name).params)


def test_the_comparison_fails_on_a_wrong_gradient(tmp_path):
    case = _write_case(tmp_path, "mlp", batch=4, seed=1)
    grad_file = tmp_path / case["params"][0]["grad"]
    grad = np.fromfile(grad_file, "<f4")
    grad[7] += 0.01 * np.abs(grad).max()  # 1% off in one entry
    grad.tofile(grad_file)
    result = _node("compare_numpy.mjs", str(tmp_path))
    assert result.returncode == 1 and "FAIL grad fc1.w" in result.stdout


def test_js_matches_the_worked_examples_of_the_docs():
    result = _node("model_doc.mjs")
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout and result.stdout.count("ok  ") == 13
