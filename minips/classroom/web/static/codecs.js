// Gradient codecs of the browser worker: the JavaScript twins of minips/transmission/codecs/ (one class
// per codec, the same names, options and wire parts; docs/protocol.md §13 is the normative
// layout, and tests/js/codecs_doc.mjs encodes its worked examples byte for byte).
//
// | codec     | class             | parts (frames)              |
// | --------- | ----------------- | --------------------------- |
// | `dense`   | Identity          | the float32 tensor          |
// | `fp16`    | Fp16              | the float16 tensor          |
// | `topk`    | TopK              | `indices` int32, `values`   |
// | `sf`      | SufficientFactors | `x` (B, in), `dy` (B, out)  |
// | `lowrank` | LowRank           | `p` (n, r), `q` (m, r)      |
//
// A part is {name, dtype, shape, codec, part?, of?, data}: data a Float32Array (float32),
// Uint16Array (float16 bits) or Int32Array (int32), as wire.js's encodeMessage sends it.
// A gradient is a tensor {data: Float32Array, shape}, or for `sf` the layer's factors
// {x, dy} (two tensors). An Encoder keeps one codec object per parameter (top-k's residual,
// PowerSGD's residual and Q), as minips.transmission.codecs.Encoder does.

import { gemm, gemmTA } from "./gemm.js";
import { narrow, widen } from "./half.js";

/** A small seeded generator (mulberry32): uniform floats in [0, 1). Only the codecs' own
 * random choices use it (top-k's ties, low-rank's start: a worker's business, protocol 13). */
function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A codec spec this worker cannot follow (unknown codec or option): the reason says which. */
export class CannotFollow extends Error {}

const size = (shape) => shape.reduce((a, b) => a * b, 1);

/** float32 values on the wire as `dtype`: {data, wide} (wide: the float32 values sent). */
function toWire(values, dtype, name) {
  if (dtype === "float32") return { data: values, wide: values };
  const { bits, overflowed } = narrow(values);
  if (overflowed) throw new Error(`gradient ${name} overflows float16 (|g| > 65504)`);
  return { data: bits, wide: widen(bits) };
}

function checkDtype(codec, dtype) {
  if (dtype !== "float32" && dtype !== "float16") {
    throw new CannotFollow(`codec ${codec}: dtype must be float32 or float16, got ${dtype}`);
  }
  return dtype;
}

/** `dense`, the identity: the float32 gradient itself (a view: sent as it is). */
export class Identity {
  static codec = "dense";
  static options = [];
  encode(name, grad) {
    return [{ name, dtype: "float32", shape: grad.shape, codec: "dense", data: grad.data }];
  }
}

/** `fp16`: the gradient rounded to float16 (ties to even, as NumPy); 2 bytes an entry. */
export class Fp16 {
  static codec = "fp16";
  static options = [];
  encode(name, grad) {
    const { bits } = narrow(grad.data); // overflow is an Inf the server refuses (nonfinite)
    return [{ name, dtype: "float16", shape: grad.shape, codec: "fp16", data: bits }];
  }
}

const SAMPLE = 4096; // entries sampled for top-k's pre-threshold (minips/transmission/codecs/topk.py)

/**
 * The indices of the k largest |values[i]|, ascending (exact, ties aside). As the NumPy
 * twin (top_k_indices): a random sample of 4,096 magnitudes gives a threshold about 2k
 * entries exceed, and the exact selection runs on those candidates only; when fewer than
 * k pass (or the tensor is small) it runs on every entry.
 */
export function topKIndices(values, k, random) {
  const n = values.length;
  if (k >= n) return Int32Array.from({ length: n }, (_, i) => i);
  if (k === 0) return new Int32Array(0);
  if (2 * k < n && n > 4 * SAMPLE) {
    const sample = new Float32Array(SAMPLE);
    for (let s = 0; s < SAMPLE; s++) sample[s] = Math.abs(values[Math.floor(random() * n)]);
    sample.sort();
    const rank = Math.min(SAMPLE - 1, Math.ceil(((2 * k) / n) * SAMPLE)); // ~2k/n quantile
    const threshold = sample[SAMPLE - 1 - rank];
    let count = 0;
    for (let i = 0; i < n; i++) if (Math.abs(values[i]) >= threshold) count++;
    if (count >= k) {
      const candidates = new Int32Array(count);
      for (let i = 0, c = 0; i < n; i++) if (Math.abs(values[i]) >= threshold) candidates[c++] = i;
      return largest(values, candidates, k);
    }
  }
  return largest(values, Int32Array.from({ length: n }, (_, i) => i), k);
}

/** The k of `candidates` (ascending indices) with the largest |values|, ascending. */
function largest(values, candidates, k) {
  const magnitudes = Float32Array.from(candidates, (i) => Math.abs(values[i]));
  const kth = Float32Array.from(magnitudes).sort()[magnitudes.length - k];
  const out = new Int32Array(k);
  let above = 0;
  for (let c = 0; c < candidates.length; c++) if (magnitudes[c] > kth) above++;
  let ties = k - above; // entries equal to the k-th value: the first ones by index
  for (let c = 0, o = 0; c < candidates.length && o < k; c++) {
    if (magnitudes[c] > kth || (magnitudes[c] === kth && ties-- > 0)) out[o++] = candidates[c];
  }
  return out;
}

/**
 * `topk` with error feedback (Stich et al. 2018; Lin et al., DGC, ICLR 2018):
 *   a = r + g;  S = top-k(|a|);  send (S, a_S);  r <- a with a_S removed
 * so sent + r_new == r_old + g exactly in float32 (with float16 values, the rounding error
 * stays in r). warmup W: step t < W sends the density ratio ** ((t + 1) / (W + 1)).
 * momentum m (DGC's momentum correction, protocol.md 13.8): u = m u + g is fed to the
 * residual instead of g, and the server applies this parameter without its own momentum.
 */
export class TopK {
  static codec = "topk";
  static options = ["ratio", "warmup", "dtype", "seed", "momentum"];
  static required = ["ratio"];

  constructor({ ratio, warmup = 0, dtype = "float32", seed = 0, momentum = 0 }) {
    if (!(ratio > 0 && ratio <= 1)) throw new CannotFollow(`codec topk: ratio ${ratio} not in (0, 1]`);
    if (!Number.isInteger(warmup) || warmup < 0) throw new CannotFollow(`codec topk: warmup ${warmup}`);
    if (!(momentum >= 0 && momentum < 1)) throw new CannotFollow(`codec topk: momentum ${momentum}`);
    Object.assign(this, { ratio, warmup, momentum, dtype: checkDtype("topk", dtype) });
    this.residual = null; // float32, the parameter's size
    this.velocity = null; // u, with momentum
    this.steps = 0;
    this.random = mulberry32(seed);
  }

  /** The fraction of entries the next encode sends (warm-up included). */
  density() {
    if (this.steps < this.warmup) return this.ratio ** ((this.steps + 1) / (this.warmup + 1));
    return this.ratio;
  }

  encode(name, grad) {
    const n = grad.data.length;
    if (this.residual === null || this.residual.length !== n) {
      this.residual = new Float32Array(n);
      this.velocity = this.momentum ? new Float32Array(n) : null;
    }
    const [r, g] = [this.residual, grad.data];
    if (this.velocity !== null) {
      const [u, m] = [this.velocity, Math.fround(this.momentum)];
      for (let i = 0; i < n; i++) {
        u[i] = Math.fround(m * u[i]) + g[i]; // rounded as NumPy's u *= m; u += g
        r[i] += u[i];
      }
    } else {
      for (let i = 0; i < n; i++) r[i] += g[i];
    }
    const k = Math.min(n, Math.ceil(this.density() * n));
    const indices = topKIndices(r, k, this.random);
    const picked = Float32Array.from(indices, (i) => r[i]);
    const { data, wide } = toWire(picked, this.dtype, name);
    for (let j = 0; j < k; j++) r[indices[j]] -= wide[j]; // 0, or float16's rounding error
    this.steps++;
    const of = grad.shape;
    return [
      { name, dtype: "int32", shape: [k], codec: "topk", part: "indices", of, data: indices },
      { name, dtype: this.dtype, shape: [k], codec: "topk", part: "values", of, data },
    ];
  }
}

/**
 * `sf`, sufficient factors (Xie et al. 2015; Poseidon, ATC 2017): a Dense layer's weight
 * gradient x^T dy sent as x (B, in) and dy (B, out) (the batch mean's 1/B is in dy).
 */
export class SufficientFactors {
  static codec = "sf";
  static options = ["dtype"];

  constructor({ dtype = "float32" }) {
    this.dtype = checkDtype("sf", dtype);
  }

  encode(name, grad) {
    const { x, dy } = grad;
    if (!x || !dy) throw new Error(`codec sf for ${name} needs the layer's factors (x, dy)`);
    const of = [x.shape[1], dy.shape[1]];
    return [
      { name, dtype: this.dtype, shape: x.shape, codec: "sf", part: "x", of, data: toWire(x.data, this.dtype, name).data },
      { name, dtype: this.dtype, shape: dy.shape, codec: "sf", part: "dy", of, data: toWire(dy.data, this.dtype, name).data },
    ];
  }
}

/**
 * `lowrank` (Vogels et al., PowerSGD, NeurIPS 2019, one worker's half): the gradient as a
 * matrix M (n, m), n = shape[0], plus the residual, approximated by P Q^T with one power
 * iteration from last step's Q:
 *   M = G + r;  P = orth(M Q);  Q = M^T P;  send P (n, rank), Q (m, rank);  r <- M - P Q^T
 * orth is Gram-Schmidt here (NumPy's twin uses a QR: the columns may differ in sign, the
 * product P Q^T, which is all the server sees, does not). Q starts random (seeded).
 */
export class LowRank {
  static codec = "lowrank";
  static options = ["rank", "dtype", "seed"];

  constructor({ rank = 4, dtype = "float32", seed = 0 }) {
    if (!Number.isInteger(rank) || rank < 1) throw new CannotFollow(`codec lowrank: rank ${rank}`);
    Object.assign(this, { rank, seed, dtype: checkDtype("lowrank", dtype) });
    this.residual = null; // M, (n, m)
    this.q = null; // (m, rank), the power iteration's warm start
  }

  encode(name, grad) {
    const shape = grad.shape;
    if (shape.length < 2) throw new Error(`codec lowrank for ${name} needs a matrix, got (${shape})`);
    const [n, m] = [shape[0], size(shape) / shape[0]];
    if (this.residual === null || this.residual.length !== n * m) this.start(n, m);
    const [M, r] = [this.residual, this.q.length / m];
    for (let i = 0; i < M.length; i++) M[i] += grad.data[i];
    const p = new Float32Array(n * r);
    gemm(M, this.q, p, n, m, r); // M Q
    orthonormalise(p, n, r);
    const P = toWire(p, this.dtype, name);
    const q = new Float32Array(m * r);
    gemmTA(M, P.wide, q, m, n, r); // M^T P
    const Q = toWire(q, this.dtype, name);
    this.q = Q.wide;
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < m; j++) {
        let dot = 0;
        for (let c = 0; c < r; c++) dot += P.wide[i * r + c] * Q.wide[j * r + c];
        M[i * m + j] -= Math.fround(dot); // what the receiver rebuilds stays out of r
      }
    }
    return [
      { name, dtype: this.dtype, shape: [n, r], codec: "lowrank", part: "p", of: shape, data: P.data },
      { name, dtype: this.dtype, shape: [m, r], codec: "lowrank", part: "q", of: shape, data: Q.data },
    ];
  }

  /** A zero residual and a standard normal Q (Box-Muller on a seeded generator). */
  start(n, m) {
    const rank = Math.min(this.rank, n, m);
    const random = mulberry32(this.seed);
    this.residual = new Float32Array(n * m);
    this.q = Float32Array.from({ length: m * rank }, () => {
      const u = 1 - random(); // (0, 1]: the logarithm is finite
      return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random());
    });
  }
}

/** Columns of a (rows, cols) row-major matrix made orthonormal (modified Gram-Schmidt, in
 * doubles); a column that vanishes stays zero (it then sends nothing, r keeps it all). */
export function orthonormalise(a, rows, cols) {
  for (let c = 0; c < cols; c++) {
    for (let prev = 0; prev < c; prev++) {
      let dot = 0;
      for (let i = 0; i < rows; i++) dot += a[i * cols + c] * a[i * cols + prev];
      for (let i = 0; i < rows; i++) a[i * cols + c] -= dot * a[i * cols + prev];
    }
    let norm = 0;
    for (let i = 0; i < rows; i++) norm += a[i * cols + c] ** 2;
    norm = Math.sqrt(norm);
    for (let i = 0; i < rows; i++) a[i * cols + c] = norm > 1e-30 ? a[i * cols + c] / norm : 0;
  }
}

export const CODEC_CLASSES = Object.fromEntries(
  [Identity, Fp16, TopK, SufficientFactors, LowRank].map((cls) => [cls.codec, cls]),
);

/** A push spec ("fp16", {codec: "topk", ratio: 0.01, ...}) as [codec, options]; CannotFollow
 * for a codec or an option this worker does not know (minips.transmission.codecs.parse_spec's twin). */
export function parseSpec(spec) {
  const [codec, options] = typeof spec === "string"
    ? [spec, {}]
    : [spec && spec.codec, Object.fromEntries(Object.entries(spec || {}).filter(([k]) => k !== "codec"))];
  const cls = CODEC_CLASSES[codec];
  if (!cls) throw new CannotFollow(`this page cannot encode codec ${JSON.stringify(codec)} (it knows ${Object.keys(CODEC_CLASSES).join(", ")})`);
  const unknown = Object.keys(options).filter((k) => !cls.options.includes(k));
  if (unknown.length) throw new CannotFollow(`this page's codec ${codec} has no option(s) ${unknown.join(", ")}`);
  const missing = (cls.required || []).filter((k) => !(k in options));
  if (missing.length) throw new CannotFollow(`codec ${codec}: option(s) ${missing.join(", ")} required`);
  return [codec, options];
}

/** A fresh codec object for one parameter. */
export function makeCodec(spec) {
  const [codec, options] = parseSpec(spec);
  return new CODEC_CLASSES[codec](options);
}

/** One codec object per parameter, kept while its spec stays the same. */
export class Encoder {
  constructor() {
    this.codecs = new Map(); // name -> [spec as JSON, codec]
  }

  codec(name, spec) {
    const key = JSON.stringify(spec);
    const held = this.codecs.get(name);
    if (held && held[0] === key) return held[1];
    const codec = makeCodec(spec);
    this.codecs.set(name, [key, codec]);
    return codec;
  }

  /** The wire parts of `grads` (a Map name -> gradient), "dense" where `specs` has none. */
  encode(grads, specs = {}) {
    const parts = [];
    for (const [name, grad] of grads) parts.push(...this.codec(name, specs[name] || "dense").encode(name, grad));
    return parts;
  }
}
