"""The browser worker's codecs (minips/classroom/web/static/codecs.js) against docs/protocol.md §13
and against their NumPy twins (minips/transmission/codecs/), in Node and in headless Chromium.

- the worked examples of §13.6-13.7, encoded byte for byte by the JavaScript codecs (Node:
  tests/js/codecs_doc.mjs; Chromium: the same tests/js/codec_examples.mjs in a page of the
  gateway, importing the modules the worker page imports);
- a few steps of each codec on the same gradients, in NumPy and in JavaScript: equal bytes
  for fp16, topk (error feedback, warm-up, float16 values) and sf; for lowrank, from the
  same random start, the same product p q^T (PowerSGD's columns may differ in sign).
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_server_protocol_doc import _doc_frame

from minips.transmission import codecs
from minips.transmission.codecs import Factors

JS_TESTS = Path(__file__).resolve().parents[1] / "js"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node not found: JS tests need Node >= 18")
PUSH_EXAMPLES = {"fp16": 2, "topk": 3, "sf": 3, "lowrank": 3}  # codec -> frames


def _node(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NODE, *args], capture_output=True, text=True, timeout=120)


@needs_node
def test_the_js_codecs_encode_the_documented_examples_byte_for_byte():
    result = _node(str(JS_TESTS / "codecs_doc.mjs"))
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok  ") == sum(PUSH_EXAMPLES.values()) + 2
    assert result.stdout.endswith("every check passed\n")


def _special_values() -> np.ndarray:
    """float32 values that test float16 rounding: ties, subnormals, the range's ends."""
    rng = np.random.default_rng(0)
    ties = (np.arange(1, 2000, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-10)
    tiny = np.float32(2.0**-24) * np.array([0.25, 0.5, 0.75, 1, 1.5, 2.5, 1023.5], np.float32)
    edges = np.array([65504, 65519.99, -65504, 6.1e-5, 6.104e-5, 0, -0.0], np.float32)
    noise = rng.standard_normal(20_000).astype(np.float32) * np.float32(10.0) ** rng.integers(
        -8, 4, 20_000
    ).astype(np.float32)
    return np.concatenate([ties, -ties, tiny, -tiny, edges, noise]).astype(np.float32)


def _write_parts(tmp_path: Path, label: str, t: int, parts) -> list[dict]:
    rows = []
    for i, part in enumerate(parts):
        file = f"{label}.{t}.{i}.bin"
        (tmp_path / file).write_bytes(part.array.tobytes())
        array = part.array
        rows.append({"part": part.part, "dtype": str(array.dtype), "shape": list(array.shape),
                     "file": file})  # fmt: skip
    return rows


def _byte_case(tmp_path: Path, label: str, spec, shape, grads) -> dict:
    """NumPy's encoder on `grads`, step by step: the parts the JS codec must equal."""
    codec = codecs.make_codec(spec)
    steps = []
    for t, grad in enumerate(grads):
        step = {}
        if isinstance(grad, Factors):
            for key in ("x", "dy"):
                factor, file = getattr(grad, key), f"{label}.{t}.{key}.bin"
                factor.tofile(tmp_path / file)
                step[key], step[f"{key}Shape"] = file, list(factor.shape)
        else:
            grad.tofile(tmp_path / f"{label}.{t}.grad.bin")
            step["grad"] = f"{label}.{t}.grad.bin"
        step["parts"] = _write_parts(tmp_path, label, t, codec.encode("p", grad))
        steps.append(step)
    return {"label": label, "spec": spec, "shape": list(shape), "steps": steps, "compare": "bytes"}


def _lowrank_case(tmp_path: Path, label: str, spec, shape, grads) -> dict:
    """NumPy's PowerSGD from its random start: each step's p q^T, and that start."""
    codec = codecs.make_codec(spec)
    steps = []
    for t, grad in enumerate(grads):
        parts = codec.encode("p", grad)
        if t == 0:
            (tmp_path / f"{label}.q0.bin").write_bytes(
                np.random.default_rng(spec.get("seed", 0))
                .standard_normal((int(np.prod(shape[1:])), min(spec["rank"], shape[0])))
                .astype(np.float32)
                .tobytes()
            )
        p, q = (part.array.astype(np.float32) for part in parts)
        grad.tofile(tmp_path / f"{label}.{t}.grad.bin")
        (p @ q.T).astype(np.float32).tofile(tmp_path / f"{label}.{t}.product.bin")
        steps.append({"grad": f"{label}.{t}.grad.bin", "product": f"{label}.{t}.product.bin"})
    return {"label": label, "spec": spec, "shape": list(shape), "steps": steps,
            "compare": "product", "q0": f"{label}.q0.bin"}  # fmt: skip


def _cases(tmp_path: Path) -> list[dict]:
    rng = np.random.default_rng(7)

    def grads(shape, n=4):
        return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]

    special = _special_values()
    big = (200, 300)  # 60,000 entries: top-k takes its sampled pre-threshold
    cases = [
        _byte_case(tmp_path, "fp16", "fp16", special.shape, [special]),
        _byte_case(tmp_path, "dense", "dense", (7, 5), grads((7, 5), 1)),
        _byte_case(tmp_path, "topk", {"codec": "topk", "ratio": 0.01}, big, grads(big)),
        _byte_case(
            tmp_path, "topk-small", {"codec": "topk", "ratio": 0.2}, (30, 20), grads((30, 20))
        ),  # fmt: skip
        _byte_case(
            tmp_path,
            "topk-warmup-fp16",
            {"codec": "topk", "ratio": 0.01, "warmup": 3, "dtype": "float16"},
            big,
            grads(big, 5),
        ),  # fmt: skip
    ]
    if "momentum" in codecs.TopK.options:  # momentum correction, where the NumPy side has it
        spec = {"codec": "topk", "ratio": 0.05, "momentum": 0.9}
        cases.append(_byte_case(tmp_path, "topk-momentum", spec, big, grads(big)))
    factors = [Factors(*(rng.standard_normal(s).astype(np.float32) for s in ((16, 40), (16, 30))))]
    for dtype in ("float32", "float16"):
        cases.append(_byte_case(tmp_path, f"sf-{dtype}", {"codec": "sf", "dtype": dtype},
                                (40, 30), factors))  # fmt: skip
    for spec, shape in [
        ({"codec": "lowrank", "rank": 4}, (60, 50)),
        ({"codec": "lowrank", "rank": 2, "dtype": "float16", "seed": 3}, (20, 3, 5, 5)),
    ]:
        cases.append(_lowrank_case(tmp_path, f"lowrank-{len(shape)}d", spec, shape, grads(shape)))
    return cases


@needs_node
def test_the_js_codecs_send_what_their_numpy_twins_send(tmp_path):
    cases = _cases(tmp_path)
    (tmp_path / "case.json").write_text(json.dumps({"tolerance": 1e-4, "cases": cases}))
    result = _node(str(JS_TESTS / "compare_codecs.mjs"), str(tmp_path))
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    assert "FAIL" not in result.stdout and result.stdout.endswith("every check passed\n")
    assert result.stdout.count("ok  ") >= sum(len(c["steps"]) for c in cases)


@needs_node
def test_the_comparison_fails_on_a_wrong_byte(tmp_path):
    cases = [c for c in _cases(tmp_path) if c["label"] == "topk"]
    values = tmp_path / cases[0]["steps"][1]["parts"][1]["file"]
    wrong = bytearray(values.read_bytes())
    wrong[0] ^= 1  # one bit of the second step's first value
    values.write_bytes(bytes(wrong))
    (tmp_path / "case.json").write_text(json.dumps({"tolerance": 1e-4, "cases": cases}))
    result = _node(str(JS_TESTS / "compare_codecs.mjs"), str(tmp_path))
    assert result.returncode == 1 and "FAIL topk step 1 values" in result.stdout


@pytest.mark.slow
def test_the_documented_examples_in_chromium(tmp_path):
    """The same examples in a real page: the modules the worker page imports, from the
    gateway's /static/, and tests/js/codec_examples.mjs run in the page."""
    from test_web_support import Chromium, require_browser, wait_for

    require_browser()
    from minips.classroom.web import start_gateway

    examples = (JS_TESTS / "codec_examples.mjs").read_text()
    delta = [list(_doc_frame(f"codec-delta-frame-{i}")) for i in range(3)]
    script = f"""(async () => {{
        const load = (name) => import(new URL("/static/" + name, location.href).href);
        const [codecs, wire, transmit] = await Promise.all(
            ["codecs.js", "wire.js", "transmit.js"].map(load));
        const source = {json.dumps(examples)};
        const url = URL.createObjectURL(new Blob([source], {{ type: "text/javascript" }}));
        const examples = await import(url);
        const made = examples.encodeExamples({{ codecs, wire, transmit }});
        made.delta = examples.applyDeltaExample({{ wire, transmit }}, {json.dumps(delta)});
        made.agent = navigator.userAgent;
        return JSON.stringify(made);
    }})()"""
    chromium = Chromium(tmp_path)
    # Only HTTP is used: no server behind the gateway is ever reached.
    with start_gateway("tcp://127.0.0.1:9") as gateway:
        try:
            _, session = chromium.open(gateway.url + "static/page.css")
            wait_for(lambda: _evaluate(chromium, session, "document.readyState === 'complete' "
                     "&& location.protocol === 'http:'"), 20, "the page to load")  # fmt: skip
            result = chromium.call("Runtime.evaluate", session, expression=script,
                                   awaitPromise=True, returnByValue=True)  # fmt: skip
        finally:
            chromium.close()
    assert "exceptionDetails" not in result, result
    made = json.loads(result["result"]["value"])
    assert "Chrome" in made["agent"]
    for codec, count in PUSH_EXAMPLES.items():
        for i in range(count):
            want = _doc_frame(f"codec-{codec}-frame-{i}")
            assert bytes.fromhex(made[codec][i].replace(" ", "")) == want, (codec, i)
    assert made["delta"] == [1, 1.25, 1, 1, 1, 0.5]
    np.testing.assert_allclose(made["lowrankProduct"], [2, 0, -1, 1, 0, -0.5], atol=1e-6)


def _evaluate(chromium, session, expression):
    result = chromium.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
    return result["result"].get("value")


@needs_node
def test_a_pull_reply_of_every_encoding_lands_in_the_parameters_as_numpy_computes(tmp_path):
    """dense, fp16 and delta (float32 and float16 values) of a reply built by the reference
    wire code, at whatever offsets the header leaves them, written into the parameters."""
    from minips.protocol import wire
    from minips.protocol.wire import WirePart

    rng = np.random.default_rng(3)
    start = {name: rng.standard_normal(n).astype(np.float32)
             for name, n in (("a", 35), ("b", 7), ("c", 9), ("d", 20))}  # fmt: skip
    idx_a, idx_d = np.array([0, 4, 11, 34], np.int32), np.array([2, 3, 19], np.int32)
    val_a = rng.standard_normal(4).astype(np.float32)
    val_d = rng.standard_normal(3).astype(np.float16)
    new_b, new_c = (
        rng.standard_normal(7).astype(np.float16),
        rng.standard_normal(9).astype(np.float32),
    )
    parts = [
        WirePart("b", new_b, "fp16"),
        WirePart("a", idx_a, "delta", "indices", (35,)),
        WirePart("a", val_a, "delta", "values", (35,)),
        WirePart("c", new_c),
        WirePart("d", idx_d, "delta", "indices", (20,)),
        WirePart("d", val_d, "delta", "values", (20,)),
    ]
    header = {
        "op": "pull",
        "rid": 7,
        "version": 3,
        "param_versions": {},
        "stop": False,
    }
    frames = wire.encode_parts(header, parts)
    while (4 + 4 * len(frames) + len(frames[0])) % 4 != 1:  # the arrays off 4-byte alignment
        header["padding"] = header.get("padding", "") + "x"
        frames = wire.encode_parts(header, parts)
    for i, frame in enumerate(frames):
        (tmp_path / f"frame-{i}.bin").write_bytes(bytes(frame))
    for name, values in start.items():
        values.tofile(tmp_path / f"{name}.bin")
    result = _node(str(JS_TESTS / "apply_pull.mjs"), str(tmp_path), *start)
    assert result.returncode == 0, result.stderr
    expected = {name: values.copy() for name, values in start.items()}
    expected["a"][idx_a] += val_a
    expected["b"] = new_b.astype(np.float32)
    expected["c"] = new_c
    expected["d"][idx_d] += val_d.astype(np.float32)
    for name, values in expected.items():
        got = np.fromfile(tmp_path / f"{name}.out.bin", np.float32)
        assert got.tobytes() == values.tobytes(), name
