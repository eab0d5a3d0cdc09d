// docs/model.md's worked examples against the JavaScript network on each engine (the
// Python side is tests/test_model_doc.py), the portable shuffle's worked example against
// data.js, and docs/protocol.md's VSGD sample against sampling.js.
// Usage: node model_doc.mjs; exits 1 and says what differs on failure.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { jsEngine, wasmEngine } from "../../minips/classroom/web/static/engine.js";
import {
  Conv2D, Dense, Flatten, MaxPool2D, ReLU, Sequential, buildModel, softmaxCrossEntropy,
} from "../../minips/classroom/web/static/nn.js";
import { epochOrder, shuffle } from "../../minips/classroom/web/static/data.js";
import { sampleIndices } from "../../minips/classroom/web/static/sampling.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const modelDoc = readFileSync(root + "docs/model.md", "utf8");
const protocolDoc = readFileSync(root + "docs/protocol.md", "utf8");

function example(label) {
  const re = new RegExp(`<!-- model-example-${label} -->\\s*\`\`\`json\\s*\\n([\\s\\S]*?)\`\`\``);
  return JSON.parse(modelDoc.match(re)[1]);
}

const flat = (nested) => (Array.isArray(nested) ? nested.flat(Infinity) : [nested]);
const shapeOf = (nested) => (Array.isArray(nested) ? [nested.length, ...shapeOf(nested[0])] : []);
let failures = 0;

function close(what, actual, expected, tol = 1e-5) {
  const want = flat(expected);
  const got = Array.from(actual);
  const bad = got.length !== want.length || got.some((v, i) => Math.abs(v - want[i]) > tol);
  if (bad) failures++;
  console.log(`${bad ? "FAIL" : "ok  "} ${what}${bad ? `: got ${got} want ${want}` : ""}`);
}

function check(what, model, label) {
  const ex = example(label);
  for (const [name, values] of Object.entries(ex.params)) {
    model.setParam(name, Float32Array.from(flat(values)));
  }
  const x = { data: Float32Array.from(flat(ex.x)), shape: shapeOf(ex.x) };
  const logits = model.forward(x, true);
  close(`${what} logits`, logits.data, ex.logits);
  const { loss, dlogits } = softmaxCrossEntropy(logits, ex.labels);
  close(`${what} loss`, [loss], ex.loss);
  model.backward(dlogits);
  const names = [...model.grads.keys()];
  if (names.join() !== Object.keys(ex.grads).join()) {
    failures++;
    console.log(`FAIL ${what} parameter names ${names} differ from the doc's`);
  }
  for (const [name, values] of Object.entries(ex.grads)) {
    close(`${what} grad ${name}`, model.grads.get(name).data, values);
  }
}

const wasm = await wasmEngine((name) => readFileSync(`${root}minips/classroom/web/static/${name}`));
if (!wasm) throw new Error("the .wasm files do not validate in this Node (no WebAssembly SIMD?)");
for (const engine of [jsEngine, wasm]) {
  check(`${engine.name} mlp`, buildModel(example("mlp").model, engine), "mlp");
  const conv = [new Conv2D(1, 2, 2), new ReLU(), new MaxPool2D(2, 2), new Flatten(), new Dense(8, 3)];
  check(`${engine.name} conv`, new Sequential(conv).useEngine(engine), "conv");
}

// model.md §4.2-4.3's portable shuffle: the training order and two epochs of a worker.
const block = (label) => modelDoc.match(new RegExp(`<!-- ${label} -->\\s*\`\`\`\\s*\\n([\\s\\S]*?)\`\`\``))[1]
  .trim().split("\n");
const orders = [
  ["training order shuffle(0, 10)", Array.from(shuffle(0n, 10)), block("shuffle-training-order")[0]],
  ["epoch 0 of rank 1, seed 0", Array.from(epochOrder(0, 1, 0, 10)), block("shuffle-epochs")[0]],
  ["epoch 1 of rank 1, seed 0", Array.from(epochOrder(0, 1, 1, 10)), block("shuffle-epochs")[1]],
];
for (const [what, got, want] of orders) {
  const same = got.join(" ") === want.trim();
  if (!same) failures++;
  console.log(`${same ? "ok  " : "FAIL"} shuffle ${what}: ${got.join(" ")}${same ? "" : ` want ${want}`}`);
}

const sample = protocolDoc.match(/<!-- vsgd-sample -->\s*```\s*\n(.*?)```/s)[1].trim();
const mine = Array.from(sampleIndices("fc1.w", 1000, 0.01, 4)).join(" ");
if (mine !== sample) failures++;
console.log(`${mine === sample ? "ok  " : "FAIL"} vsgd sample of fc1.w: ${mine}`);
process.exit(failures ? 1 : 0);
