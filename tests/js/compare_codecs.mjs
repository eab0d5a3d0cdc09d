// The browser's codecs (minips/classroom/web/static/codecs.js) against their NumPy twins
// (minips/transmission/codecs/), step by step. Usage: node compare_codecs.mjs DIR, where DIR/case.json
// (written by tests/test_web_codecs.py) lists per codec its spec, the gradients of a few
// steps and what NumPy's encoder sent at each: the parts' bytes must be equal (fp16, topk,
// sf: the same roundings and the same error feedback), or, for lowrank (PowerSGD's
// orthonormalisation differs by column signs), the product p q^T within `tolerance` and
// relative to the gradient's norm. Exits 1 and says what differs.
import { readFileSync } from "node:fs";
import { makeCodec } from "../../minips/classroom/web/static/codecs.js";
import { widen } from "../../minips/classroom/web/static/half.js";

const dir = process.argv[2];
const spec = JSON.parse(readFileSync(`${dir}/case.json`, "utf8"));
const read = (file) => new Uint8Array(readFileSync(`${dir}/${file}`));
const floats = (file) => new Float32Array(read(file).buffer);
let failures = 0;

function check(what, ok, detail) {
  if (!ok) failures++;
  console.log(`${ok ? "ok  " : "FAIL"} ${what}${ok ? "" : `: ${detail}`}`);
}

const bytesOf = (data) => new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
const sameBytes = (a, b) => a.length === b.length && a.every((v, i) => v === b[i]);
const asFloats = (part) => (part.dtype === "float16" ? widen(part.data) : part.data);

/** p q^T (n x m) of a lowrank encoding's two parts. */
function product(p, q) {
  const [n, r] = p.shape;
  const m = q.shape[0];
  const [pf, qf] = [asFloats(p), asFloats(q)];
  const out = new Float64Array(n * m);
  for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) for (let c = 0; c < r; c++) out[i * m + j] += pf[i * r + c] * qf[j * r + c];
  return out;
}

for (const c of spec.cases) {
  const codec = makeCodec(c.spec);
  if (c.q0) {
    codec.start(c.shape[0], c.shape.slice(1).reduce((a, b) => a * b, 1));
    codec.q = floats(c.q0); // NumPy's random start, so both iterate from the same Q
  }
  c.steps.forEach((step, t) => {
    const grad = c.spec.codec === "sf" || c.spec === "sf"
      ? { x: { data: floats(step.x), shape: step.xShape }, dy: { data: floats(step.dy), shape: step.dyShape } }
      : { data: floats(step.grad), shape: c.shape };
    const parts = codec.encode("p", grad);
    const what = `${c.label} step ${t}`;
    if (c.compare === "product") {
      const got = product(parts[0], parts[1]);
      const want = floats(step.product);
      let [err, norm] = [0, 0];
      want.forEach((v, i) => ((err = Math.max(err, Math.abs(got[i] - v))), (norm = Math.max(norm, Math.abs(v)))));
      check(`${what} p q^T`, err <= spec.tolerance * norm, `max error ${err} against max |g| ${norm}`);
      return;
    }
    check(`${what} parts`, parts.map((p) => p.part ?? null).join() === step.parts.map((p) => p.part).join(), "part names");
    step.parts.forEach((want, i) => {
      const got = parts[i];
      const ok = got.dtype === want.dtype && got.shape.join() === want.shape.join() && sameBytes(bytesOf(got.data), read(want.file));
      check(`${what} ${want.part ?? "frame"} (${want.dtype} ${want.shape})`, ok, `dtype ${got.dtype}, shape ${got.shape}`);
    });
  });
}
console.log(failures ? `${failures} check(s) failed` : "every check passed");
process.exit(failures ? 1 : 0);
