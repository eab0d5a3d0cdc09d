"""The JavaScript network (minips/classroom/web/static/nn.js) against minips.nn, run with Node.

The same JS files the browser worker loads are imported by the Node scripts in tests/js/.
Python writes weights, a batch and NumPy's logits and gradients as raw .bin files; the Node
script recomputes them on each engine (the plain loops, and the .wasm files) and compares
(relative error < 1e-4 per array). compare_engines.mjs checks the WebAssembly kernels
against the plain ones directly.
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_web_support import numpy_case

from minips.nn import build_model

JS_TESTS = Path(__file__).resolve().parents[1] / "js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node not found: JS tests need Node >= 18")
TOLERANCE = 1e-4
ENGINES = {"js": "js", "wasm": "wasm-simd"}  # compare_numpy.mjs's argument -> engine name


def _node(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NODE, str(JS_TESTS / script), *args], capture_output=True, text=True, timeout=120
    )


def _write_case(tmp_path: Path, model_name: str, batch: int, seed: int) -> dict:
    """Write weights, a batch and NumPy's outputs (numpy_case); return the case description."""
    case = numpy_case(model_name, batch, seed)
    spec = {"model": case["spec"], "tolerance": TOLERANCE, "loss": case["loss"], "params": []}
    for name, param in case["params"].items():
        param.astype("<f4").tofile(tmp_path / f"{name}.bin")
        case["grads"][name].astype("<f4").tofile(tmp_path / f"{name}.grad.bin")
        spec["params"].append({"name": name, "file": f"{name}.bin", "grad": f"{name}.grad.bin"})
    case["x"].astype("<f4").tofile(tmp_path / "x.bin")
    case["labels"].astype(np.uint8).tofile(tmp_path / "labels.bin")
    case["logits"].astype("<f4").tofile(tmp_path / "logits.bin")
    spec.update(x={"file": "x.bin", "shape": list(case["x"].shape)}, labels="labels.bin")
    spec["logits"] = "logits.bin"
    (tmp_path / "case.json").write_text(json.dumps(spec))
    return spec


@pytest.mark.parametrize("engine", ["js", "wasm"])
@pytest.mark.parametrize("model_name", ["lenet5", "mlp"])
def test_js_forward_and_backward_equal_numpys(tmp_path, model_name, engine):
    _write_case(tmp_path, model_name, batch=16, seed=3)
    result = _node("compare_numpy.mjs", str(tmp_path), engine)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    # two passes, each: logits, loss and every gradient
    assert result.stdout.count("ok  ") == 2 * (2 + len(build_model(model_name).params))
    assert result.stdout.count(f"on engine {ENGINES[engine]}") == 2


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
    # per engine (js, wasm): 6 checks of the mlp example, 6 of the conv one; then the
    # shuffle's three orders and vsgd's sample
    assert "FAIL" not in result.stdout and result.stdout.count("ok  ") == 2 * 12 + 3 + 1
    assert result.stdout.count("ok   shuffle ") == 3
    assert result.stdout.count("ok   wasm-simd ") == 12


def test_the_wasm_engine_computes_what_the_plain_loops_compute():
    result = _node("compare_engines.mjs")
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "FAIL" not in result.stdout and result.stdout.endswith("every check passed\n")
