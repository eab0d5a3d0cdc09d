// How a browser worker's step travels by the run's transmission plan (the `plan` of hello's
// config, docs/model.md §1; minips/transmission/plan.py and minips/worker/transmit.py are the
// NumPy twins): up, each gradient in its codec (codecs.js), every k-th step for a push
// interval k; down, every pull encoding of docs/protocol.md §13.7 written straight into the
// parameters. planProblem() says what in a plan this page cannot follow.
//
// Per parameter, by its plan entry {push, pull, every, priority}:
// - push: the codec spec; for `sf` the layer's factors (x, dy) are encoded instead of the
//   dense gradient (Dense.sufficientFactors);
// - every k: the gradient is summed locally (`sf`: the factors stacked, since
//   [x1; x2]^T [dy1; dy2] = x1^T dy1 + x2^T dy2) and pushed every k-th step;
// - pull and priority: the server's business; the worker accepts whatever arrives.
// The step goes in ONE push whose base is the oldest of its gradients' (a sum over k steps
// is as stale as its first): the server treats it exactly as the NumPy worker's separate
// pushes of one step (protocol.md §5.3: a step is summed, with its smallest base). A plan's
// `wait_free` asks a worker to send each layer while backward still computes; this worker
// computes on one thread and sends its step whole after backward (the same bytes).

import { CannotFollow, Encoder, parseSpec } from "./codecs.js";
import { widen } from "./half.js";

const PLAN_FORMAT = 1;
const ENTRY_KEYS = ["push", "pull", "every", "priority"];
const PULL_CODECS = { dense: [], fp16: [], delta: ["ratio", "dtype", "warmup"] };

/** Why this page cannot follow `plan` (hello's config.plan), or null when it can. */
export function planProblem(plan) {
  if (!plan) return null;
  if ((plan.format ?? PLAN_FORMAT) !== PLAN_FORMAT) return `the run's plan has format ${plan.format}; this page reads format ${PLAN_FORMAT}`;
  const known = ["format", "wait_free", "params", "predicted"];
  const extra = Object.keys(plan).filter((k) => !known.includes(k));
  if (extra.length) return `the run's plan has key(s) ${extra.join(", ")} this page does not know`;
  for (const [name, entry] of Object.entries(plan.params || {})) {
    const keys = Object.keys(entry).filter((k) => !ENTRY_KEYS.includes(k));
    if (keys.length) return `the plan of ${name} has key(s) ${keys.join(", ")} this page does not know`;
    try {
      parseSpec(entry.push ?? "dense");
    } catch (err) {
      if (err instanceof CannotFollow) return `${name}: ${err.message}`;
      throw err;
    }
    const pull = entry.pull ?? "dense";
    const codec = typeof pull === "string" ? pull : pull.codec;
    if (!(codec in PULL_CODECS)) return `${name}: this page cannot decode pull codec ${JSON.stringify(codec)}`;
  }
  return null;
}

/** A push-interval sum: the oldest base, and the dense sum or the stacked factors. */
class Pending {
  constructor(base) {
    Object.assign(this, { base, dense: null, xs: [], dys: [] });
  }

  add(grad) {
    if (grad.x) {
      this.xs.push(copy(grad.x)); // copies: the layer's caches change with the next pass
      this.dys.push(copy(grad.dy));
    } else if (this.dense === null) {
      this.dense = copy(grad);
    } else {
      for (let i = 0; i < this.dense.data.length; i++) this.dense.data[i] += grad.data[i];
    }
  }

  gradient() {
    return this.xs.length ? { x: stack(this.xs), dy: stack(this.dys) } : this.dense;
  }
}

const copy = (t) => ({ data: Float32Array.from(t.data), shape: [...t.shape] });

function stack(tensors) {
  const rows = tensors.reduce((n, t) => n + t.shape[0], 0);
  const data = new Float32Array(rows * tensors[0].shape[1]);
  let at = 0;
  for (const t of tensors) {
    data.set(t.data, at);
    at += t.data.length;
  }
  return { data, shape: [rows, tensors[0].shape[1]] };
}

/** Encodes each step's gradients by the plan (see the module comment); one per worker. */
export class StepSender {
  constructor(model, plan) {
    this.model = model;
    const params = (plan && plan.params) || {};
    this.specs = Object.fromEntries(Object.entries(params).map(([n, p]) => [n, p.push ?? "dense"]));
    this.every = Object.fromEntries(Object.entries(params).map(([n, p]) => [n, p.every ?? 1]));
    this.factors = new Set(Object.keys(this.specs).filter((n) => parseSpec(this.specs[n])[0] === "sf"));
    this.encoder = new Encoder();
    this.pending = new Map(); // name -> Pending
    this.stepIndex = 0;
  }

  /**
   * After a backward at parameters of version `base`: {parts, base} of the step's push,
   * parts the wire parts of every gradient due this step, base the oldest one's version.
   */
  step(base) {
    const due = new Map();
    let oldest = base;
    for (const { name: layerName, layer } of this.model.layers) {
      for (const key of Object.keys(layer.params)) {
        const name = `${layerName}.${key}`;
        const grad = this.factors.has(name) ? layer.sufficientFactors() : layer.grads[key];
        const every = this.every[name] || 1;
        if (every === 1) {
          due.set(name, grad);
          continue;
        }
        if (!this.pending.has(name)) this.pending.set(name, new Pending(base));
        const pending = this.pending.get(name);
        pending.add(grad);
        if ((this.stepIndex + 1) % every === 0) {
          due.set(name, pending.gradient());
          oldest = Math.min(oldest, pending.base);
          this.pending.delete(name);
        }
      }
    }
    this.stepIndex++;
    return { parts: this.encoder.encode(due, this.specs), base: oldest };
  }
}

/**
 * Write a reply's parameters (a pull, or a fused push's pull half) into `model`, one copy
 * from the message: `dense` float32 bytes as they are, `fp16` widened, `delta` ADDED
 * (w.flat[indices[j]] += values[j], in float32: protocol.md §13.7). The model's parameters
 * are then exactly the server's replica of them. Unknown names or codecs throw.
 */
export function applyPull(model, reply) {
  const params = model.params;
  const descriptors = reply.header.arrays || [];
  for (let i = 0; i < descriptors.length; i++) {
    const d = descriptors[i];
    const param = params.get(d.name);
    if (!param) throw new Error(`the server sent ${d.name}, which this model does not have`);
    const frame = reply.frames[i];
    if (d.codec === "dense" && d.dtype === "float32") {
      need(frame.byteLength === param.data.byteLength, d);
      new Uint8Array(param.data.buffer, param.data.byteOffset, frame.byteLength).set(frame);
    } else if (d.codec === "fp16") {
      need(frame.byteLength === 2 * param.data.length, d);
      widen(frame, param.data);
    } else if (d.codec === "delta" && d.part === "indices") {
      addDelta(param.data, frame, descriptors[i + 1], reply.frames[i + 1]);
      i++; // the values part
    } else {
      throw new Error(`${d.name}: this page cannot decode pull codec ${d.codec} (${d.dtype})`);
    }
  }
}

function need(ok, d) {
  if (!ok) throw new Error(`${d.name}: the frame's size does not fit the parameter`);
}

/** w[indices[j]] += values[j] (float32 sums: a double sum of two float32s rounds alike). */
function addDelta(w, indexBytes, valuesDesc, valueBytes) {
  if (!valuesDesc || valuesDesc.part !== "values") throw new Error("a delta without its values");
  const indices = aligned(indexBytes, Int32Array);
  const values = valuesDesc.dtype === "float16" ? widen(valueBytes) : aligned(valueBytes, Float32Array);
  if (indices.length !== values.length) throw new Error("a delta's indices and values differ in number");
  for (let j = 0; j < indices.length; j++) {
    const at = indices[j];
    if (!(at >= 0 && at < w.length)) throw new Error(`a delta index ${at} outside its parameter`);
    w[at] += values[j];
  }
}

/** A typed array over bytes that may sit at any offset (copied only when unaligned). */
function aligned(bytes, Type) {
  if (bytes.byteOffset % Type.BYTES_PER_ELEMENT === 0) {
    return new Type(bytes.buffer, bytes.byteOffset, bytes.byteLength / Type.BYTES_PER_ELEMENT);
  }
  return new Type(bytes.slice().buffer);
}
