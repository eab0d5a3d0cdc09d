// Compare the JavaScript network with NumPy's on the same weights and batch.
// Usage: node compare_numpy.mjs DIR [ENGINE], ENGINE js (default) or wasm (engine.js), where
// DIR/case.json (written by tests/test_web_js.py)
// names the model and raw little-endian float32 / int32 .bin files for the parameters, the
// batch, the labels, and NumPy's logits and gradients. Prints one line per array with its
// relative error (max |js - numpy| / max |numpy|); exits 1 if any exceeds the tolerance.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { jsEngine, wasmEngine } from "../../minips/classroom/web/static/engine.js";
import { buildModel, softmaxCrossEntropy } from "../../minips/classroom/web/static/nn.js";

const dir = process.argv[2];
const staticFile = (name) => readFileSync(new URL(`../../minips/classroom/web/static/${name}`, import.meta.url));
const engine = process.argv[3] === "wasm" ? await wasmEngine(staticFile) : jsEngine;
if (!engine) throw new Error("the .wasm files do not validate in this Node (no WebAssembly SIMD?)");
const spec = JSON.parse(readFileSync(join(dir, "case.json"), "utf8"));
const f32 = (file) => {
  const buf = readFileSync(join(dir, file));
  return new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
};

const model = buildModel(spec.model, engine);
for (const p of spec.params) model.setParam(p.name, f32(p.file));
const x = { data: f32(spec.x.file), shape: spec.x.shape };
const labels = Int32Array.from(readFileSync(join(dir, spec.labels)));

function relError(actual, expected) {
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < expected.length; i++) {
    diff = Math.max(diff, Math.abs(actual[i] - expected[i]));
    scale = Math.max(scale, Math.abs(expected[i]));
  }
  return diff / Math.max(scale, 1e-30);
}

let failed = 0;
const check = (name, actual, expected) => {
  const err = actual.length === expected.length ? relError(actual, expected) : Infinity;
  const ok = err < spec.tolerance;
  if (!ok) failed++;
  console.log(`${ok ? "ok  " : "FAIL"} ${name} relative error ${err.toExponential(2)}`);
};

// Two passes: the WebAssembly engine runs its first on plain arrays (its memory is sized
// by that pass) and the second in its own memory; both must give NumPy's numbers.
for (const pass of [1, 2]) {
  const start = performance.now();
  const logits = model.forward(x, true);
  const { loss, dlogits } = softmaxCrossEntropy(logits, labels);
  model.backward(dlogits);
  const ms = performance.now() - start;
  check(`logits (pass ${pass})`, logits.data, f32(spec.logits));
  check(`loss (pass ${pass})`, [loss], [spec.loss]);
  const grads = model.grads;
  for (const p of spec.params) check(`grad ${p.name} (pass ${pass})`, grads.get(p.name).data, f32(p.grad));
  console.log(`${spec.model.name}: forward+backward of ${x.shape[0]} examples in ${ms.toFixed(0)} ms`
    + ` on engine ${engine.name} (pass ${pass})`);
}
process.exit(failed ? 1 : 0);
