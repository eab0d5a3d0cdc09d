// The WebAssembly engine against the plain one (engine.js), kernel by kernel and on whole
// passes of the models: the plain loops of gemm.js and kernels.js are the oracle.
// Usage: node compare_engines.mjs; prints one line per check, exits 1 if any fails.
// Operands are tried both where the engine keeps a pass's arrays (its memory) and as plain
// arrays (copied in and out), on sizes that leave every remainder of the SIMD loops.
import { readFileSync } from "node:fs";
import { jsEngine, wasmEngine } from "../../minips/classroom/web/static/engine.js";
import { buildModel, softmaxCrossEntropy } from "../../minips/classroom/web/static/nn.js";

const staticFile = (name) => readFileSync(new URL(`../../minips/classroom/web/static/${name}`, import.meta.url));
const wasm = await wasmEngine(staticFile);
if (!wasm) throw new Error("the .wasm files do not validate in this Node (no WebAssembly SIMD?)");

let seed = 12345;
const random = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648) * 2 - 1;
const randoms = (n) => Float32Array.from({ length: n }, random);
let failures = 0;

/** max |a - b| / max |a| (0 for equal arrays; NaN equals NaN here). */
function relError(a, b) {
  if (a.length !== b.length) return Infinity;
  let [diff, scale] = [0, 0];
  for (let i = 0; i < a.length; i++) {
    if (Number.isNaN(a[i]) && Number.isNaN(b[i])) continue;
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(a[i]));
  }
  return diff === 0 ? 0 : diff / scale;
}

function check(what, expected, actual, tolerance = 1e-5) {
  const err = relError(expected, actual);
  const ok = err <= tolerance;
  if (!ok) failures++;
  console.log(`${ok ? "ok  " : "FAIL"} ${what}: relative error ${err.toExponential(2)}`);
}

/**
 * Run `kernel(engine, ...arrays)` on both engines from the same inputs and compare every
 * array afterwards. inputs: the arrays (Float32Array or Int32Array); for the WASM engine
 * they are copied into its memory (resident) or passed as plain copies.
 */
function compare(what, inputs, kernel, tolerance) {
  for (const resident of [true, false]) {
    const plain = inputs.map((a) => a.slice());
    wasm.beginPass();
    const mine = inputs.map((a) => {
      if (!resident) return a.slice();
      const view = a instanceof Int32Array ? wasm.ints(a.length) : wasm.floats(a.length);
      view.set(a);
      return view;
    });
    if (resident && !mine.every((a) => a.buffer === wasm.memory.buffer)) {
      wasm.beginPass(); // the first pass sized the memory: now they fit
      return compare(what, inputs, kernel, tolerance);
    }
    kernel(jsEngine, ...plain);
    kernel(wasm, ...mine);
    plain.forEach((a, i) =>
      check(`${what} [${i}] ${resident ? "in wasm memory" : "plain arrays"}`, a, mine[i], tolerance),
    );
  }
}

// ------------------------------------------------------------------------- products
for (const [m, k, n] of [[1, 1, 1], [3, 5, 7], [4, 8, 8], [5, 9, 17], [13, 3, 33], [50, 37, 260], [64, 100, 10]]) {
  for (const accumulate of [false, true]) {
    const c = randoms(m * n);
    const tag = `${m}x${k}x${n}${accumulate ? " accumulate" : ""}`;
    compare(`gemm ${tag}`, [randoms(m * k), randoms(k * n), c],
      (e, a, b, out) => e.gemm(a, b, out, m, k, n, accumulate));
    compare(`gemmTA ${tag}`, [randoms(k * m), randoms(k * n), c],
      (e, a, b, out) => e.gemmTA(a, b, out, m, k, n, accumulate));
    compare(`gemmTB ${tag}`, [randoms(m * k), randoms(n * k), c],
      (e, a, b, out) => e.gemmTB(a, b, out, m, k, n, accumulate));
  }
}
// product packs b one block at a time when b has more than 2^18 floats or k > m, else
// all of it first: both orders, both remainders
for (const [m, k, n] of [[6, 300, 1001], [9, 1100, 250], [300, 40, 1001], [301, 41, 250]]) {
  compare(`gemm ${m}x${k}x${n}`, [randoms(m * k), randoms(k * n), randoms(m * n)],
    (e, a, b, out) => e.gemm(a, b, out, m, k, n));
  compare(`gemmTA ${m}x${k}x${n}`, [randoms(k * m), randoms(k * n), randoms(m * n)],
    (e, a, b, out) => e.gemmTA(a, b, out, m, k, n, true));
}
// gemmTB sums k terms in slices of 512: a k that spans several
compare("gemmTB 3x1100x5", [randoms(3 * 1100), randoms(5 * 1100), randoms(15)],
  (e, a, b, out) => e.gemmTB(a, b, out, 3, 1100, 5));

// ------------------------------------------------------------------ conv kernels
const outputSize = (size, k, s, p) => Math.floor((size + 2 * p - k) / s) + 1;
for (const [n, c, h, w, k, s, p] of [[2, 3, 7, 6, 3, 1, 1], [3, 2, 9, 9, 5, 1, 0], [2, 2, 8, 7, 3, 2, 2], [1, 1, 5, 5, 2, 1, 0]]) {
  const g = { n, c, h, w, k, s, p, ho: outputSize(h, k, s, p), wo: outputSize(w, k, s, p) };
  const colsSize = c * k * k * n * g.ho * g.wo;
  const tag = `n${n} c${c} ${h}x${w} k${k} s${s} p${p}`;
  compare(`im2col ${tag}`, [randoms(n * c * h * w), new Float32Array(colsSize)],
    (e, x, cols) => e.im2col(x, cols, g));
  compare(`col2im ${tag}`, [randoms(colsSize), randoms(n * c * h * w)],
    (e, cols, x) => e.col2im(cols, x, g));
}
for (const [o, n, pixels] of [[5, 3, 7], [20, 4, 64], [2, 1, 1]]) {
  const size = o * n * pixels;
  compare(`convOutput o${o} n${n} p${pixels}`, [randoms(size), randoms(o), randoms(size)],
    (e, yt, b, y) => e.convOutput(yt, b, y, o, n, pixels));
  compare(`convOutputGrad o${o} n${n} p${pixels}`, [randoms(size), randoms(size), randoms(o)],
    (e, dy, dyt, db) => e.convOutputGrad(dy, dyt, db, o, n, pixels));
}

// ---------------------------------------------------------------- ReLU, pooling
for (const size of [1, 7, 64, 1003]) {
  const x = randoms(size);
  x[0] = NaN; // NaN gives 0 in both; -0 and 0 as well
  if (size > 2) [x[1], x[2]] = [-0, 0];
  compare(`relu ${size}`, [x, randoms(size)], (e, x, y) => e.relu(x, y, size), 0);
  compare(`reluBackward ${size}`, [randoms(size), x, randoms(size)],
    (e, dy, y, dx) => e.reluBackward(dy, y, dx, size), 0);
}
for (const [planes, h, w, k, s] of [[3, 5, 6, 2, 2], [2, 7, 7, 3, 2], [4, 8, 8, 2, 1]]) {
  const g = { planes, h, w, k, s, ho: Math.floor((h - k) / s) + 1, wo: Math.floor((w - k) / s) + 1 };
  const x = randoms(planes * h * w);
  x[1] = x[0]; // a tie: the earlier one wins in both
  const size = planes * g.ho * g.wo;
  compare(`maxPool ${planes}x${h}x${w} k${k} s${s}`, [x, randoms(size), new Int32Array(size)],
    (e, x, y, argmax) => e.maxPool(x, y, argmax, g), 0);
  const argmax = new Int32Array(size);
  jsEngine.maxPool(x, new Float32Array(size), argmax, g);
  compare(`maxPoolBackward ${planes}x${h}x${w} k${k} s${s}`, [randoms(size), argmax, randoms(x.length)],
    (e, dy, argmax, dx) => e.maxPoolBackward(dy, argmax, dx, size));
}

// ------------------------------------------------------- the fallbacks of the engine
{
  // Operands too large for scratch while this pass has arrays in the memory: the plain
  // kernel runs (the memory must not grow under a live array), and the next pass grows.
  const engine = await wasmEngine(staticFile);
  engine.floats(8); // a first pass asks for 8 floats (a plain array: no arena yet)
  engine.beginPass(); // the arena now holds them
  const live = engine.floats(8);
  const before = engine.memory.buffer.byteLength;
  const [m, k, n] = [40, 300, 200];
  const [a, b] = [randoms(m * k), randoms(k * n)];
  const [expected, actual] = [new Float32Array(m * n), new Float32Array(m * n)];
  jsEngine.gemm(a, b, expected, m, k, n);
  engine.gemm(a, b, actual, m, k, n);
  check("gemm through the plain fallback", expected, actual);
  const same = engine.memory.buffer.byteLength === before && live.buffer === engine.memory.buffer;
  engine.beginPass();
  const grown = engine.memory.buffer.byteLength > before;
  if (!same || !grown) failures++;
  console.log(`${same && grown ? "ok  " : "FAIL"} memory grew only at the next pass`);
}

// ----------------------------------------------------------------- whole passes
for (const name of ["lenet5", "mlp"]) {
  const oracle = buildModel({ name }, jsEngine);
  const model = buildModel({ name }, await wasmEngine(staticFile));
  for (const [param, t] of oracle.params) {
    t.data.set(randoms(t.data.length).map((v) => 0.1 * v));
    model.setParam(param, t.data);
  }
  // The first pass runs on plain arrays, the next in the engine's memory, a larger batch
  // makes it grow again: every pass must agree.
  for (const batch of [16, 16, 40, 8]) {
    const x = { data: randoms(batch * 784), shape: [batch, 1, 28, 28] };
    const labels = Int32Array.from({ length: batch }, (_, i) => (i * 7) % 10);
    const results = [oracle, model].map((net) => {
      const logits = net.forward(x, true);
      const { dlogits } = softmaxCrossEntropy(logits, labels);
      net.backward(dlogits);
      return { logits: logits.data.slice(), grads: net.grads };
    });
    check(`${name} batch ${batch} logits`, results[0].logits, results[1].logits);
    for (const [param, g] of results[0].grads) {
      check(`${name} batch ${batch} grad ${param}`, g.data, results[1].grads.get(param).data, 1e-4);
    }
  }
}

console.log(failures ? `${failures} check(s) failed` : "every check passed");
process.exit(failures ? 1 : 0);
