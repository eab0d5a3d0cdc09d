"""Where a browser worker's compute goes: each layer's forward and backward in Chromium.

Opens a page of the gateway's origin in headless Chromium (no worker, no server traffic)
and runs the network of minips/classroom/web/static/nn.js there on a random batch, on each engine:
--passes forward + backward passes, the first --warmup ones not counted, each layer's
forward and backward timed (performance.now); prints one JSON line per engine with the
median of each, and of the whole pass.

    python tools/profile_web.py --model lenet5 --batch-size 64

Needs chromium and pip install '.[web]'. Compare with a real worker's compute_ms and
comm_ms from tools/bench_web.py: what is not here is messaging and data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_web_support import Chromium, server_process, wait_for  # noqa: E402

from minips.classroom.web import start_gateway  # noqa: E402

_PROFILE_IN_THE_PAGE = """
(async () => {
  const { buildModel, softmaxCrossEntropy } = await import("/static/nn.js");
  const { bestEngine, jsEngine } = await import("/static/engine.js");
  const fetchBytes = async (name) => (await fetch(`/static/${name}`)).arrayBuffer();
  const engine = ARGS.engine === "js" ? jsEngine : await bestEngine(fetchBytes);
  const model = buildModel({ name: ARGS.model, kwargs: {} }, engine);
  let seed = 1;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648) - 0.5;
  for (const t of model.params.values()) t.data.set(t.data.map(() => 0.1 * random()));
  const n = ARGS.batch;
  const x = { data: Float32Array.from({ length: n * 784 }, random), shape: [n, 1, 28, 28] };
  const labels = Int32Array.from({ length: n }, (_, i) => i % 10);
  const times = {};
  const timed = (key, fn) => (...args) => {
    const start = performance.now();
    const out = fn(...args);
    (times[key] ??= []).push(performance.now() - start);
    return out;
  };
  for (const { name, layer } of model.layers) {
    layer.forward = timed(`${name} forward`, layer.forward.bind(layer));
    layer.backward = timed(`${name} backward`, layer.backward.bind(layer));
  }
  const pass = timed("pass", () => {
    const { dlogits } = softmaxCrossEntropy(model.forward(x, true), labels);
    model.backward(dlogits);
  });
  for (let i = 0; i < ARGS.passes; i++) pass();
  const median = (v) => [...v].sort((a, b) => a - b)[v.length >> 1];
  const out = { engine: engine.name };
  for (const [key, v] of Object.entries(times)) out[key] = +median(v.slice(ARGS.warmup)).toFixed(2);
  return JSON.stringify(out);
})()
"""


def profile(chromium: Chromium, url: str, args: argparse.Namespace, engine: str) -> dict:
    _, session = chromium.open(url)
    wait_for(lambda: chromium.status(session) == {}, 30, "the page to load")
    given = {"engine": engine, "model": args.model, "batch": args.batch_size,
             "passes": args.passes, "warmup": args.warmup}  # fmt: skip
    result = chromium.call(
        "Runtime.evaluate",
        session,
        expression=f"const ARGS = {json.dumps(given)};" + _PROFILE_IN_THE_PAGE,
        awaitPromise=True,
        returnByValue=True,
    )
    if "exceptionDetails" in result:
        raise SystemExit(f"error: the page failed: {result['exceptionDetails']}")
    return json.loads(result["result"]["value"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet5", choices=["lenet5", "mlp"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--engines", default="wasm,js", help="comma-separated: wasm, js")
    args = parser.parse_args()
    print(json.dumps({**vars(args), "load_1min": round(os.getloadavg()[0], 2)}))
    # Chromium's helpers may still be writing its profile as the directory goes
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        chromium = Chromium(Path(tmp))
        try:
            with server_process(Path(tmp), "--workers", "1") as endpoint:
                with start_gateway(endpoint) as gateway:
                    for engine in args.engines.split(","):
                        line = profile(chromium, gateway.url + "static/page.css", args, engine)
                        print(json.dumps(line), flush=True)
        finally:
            chromium.close()
    print(json.dumps({"load_1min_after": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
