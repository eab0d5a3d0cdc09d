// minips's neural network in plain JavaScript: the same layers, parameter names, shapes and
// memory layouts as minips/nn (NumPy), specified in docs/model.md. Plain ES modules, no
// dependencies: it runs in a browser Web Worker and in Node (the tests compare the two
// implementations on the same weights and batch).
//
// A tensor is {data: Float32Array, shape: [d0, d1, ...]} in C (row-major) order; batches are
// NCHW. Every layer has forward(x, train) and backward(dy) side by side; backward fills
// layer.grads (overwritten, never accumulated across steps) and returns dx, or null when the
// layers below need no input gradient.
//
// The loops over whole tensors (matrix products, window copies, ReLU, pooling) and the
// arrays a pass computes come from an engine (engine.js): the plain loops of gemm.js and
// kernels.js unless the model is given another (useEngine). With the WebAssembly engine,
// the tensors of one pass (from a forward to the end of its backward) live in its memory
// until the next forward begins; parameters and gradients are plain arrays.

import { jsEngine } from "./engine.js";

/** Number of elements of a shape. */
export function sizeOf(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

/** A zero tensor of the given shape. */
export function zeros(shape) {
  return { data: new Float32Array(sizeOf(shape)), shape: [...shape] };
}

/** A zero tensor of one pass (an output, a gradient), in `engine`'s memory. */
function passTensor(engine, shape) {
  return { data: engine.floats(sizeOf(shape)), shape: [...shape] };
}

// ------------------------------------------------------------------------------ layers

/** Fully-connected layer y = x @ w + b; w (in, out), b (out,). x (N, in) -> y (N, out). */
export class Dense {
  constructor(inFeatures, outFeatures) {
    this.kind = "fc";
    this.prefix = "fc";
    this.inFeatures = inFeatures;
    this.outFeatures = outFeatures;
    this.params = { w: zeros([inFeatures, outFeatures]), b: zeros([outFeatures]) };
    this.grads = { w: zeros([inFeatures, outFeatures]), b: zeros([outFeatures]) };
    this.needInputGrad = true;
    this.engine = jsEngine;
    this.x = null; // the forward input, for dw = x^T @ dy
    this.dy = null; // the output's gradient of the last backward: the `sf` codec's factor
  }

  /** The weight gradient's sufficient factors {x (N, in), dy (N, out)}: dw = x^T dy (the
   * `sf` codec, docs/protocol.md §13.3); valid until the next forward. */
  sufficientFactors() {
    return { x: this.x, dy: this.dy };
  }

  forward(x, train = true) {
    const n = x.shape[0];
    if (x.shape.length !== 2 || x.shape[1] !== this.inFeatures) {
      throw new Error(`Dense expects (N, ${this.inFeatures}), got (${x.shape})`);
    }
    const y = passTensor(this.engine, [n, this.outFeatures]);
    this.engine.gemm(x.data, this.params.w.data, y.data, n, this.inFeatures, this.outFeatures);
    const b = this.params.b.data;
    for (let i = 0; i < n; i++) {
      const row = i * this.outFeatures;
      for (let j = 0; j < this.outFeatures; j++) y.data[row + j] += b[j];
    }
    if (train) this.x = x;
    return y;
  }

  backward(dy) {
    const n = dy.shape[0];
    const [inF, outF] = [this.inFeatures, this.outFeatures];
    this.dy = dy;
    this.engine.gemmTA(this.x.data, dy.data, this.grads.w.data, inF, n, outF); // dw = x^T dy
    const db = this.grads.b.data;
    db.fill(0);
    for (let i = 0; i < n; i++) for (let j = 0; j < outF; j++) db[j] += dy.data[i * outF + j];
    if (!this.needInputGrad) return null;
    const dx = passTensor(this.engine, [n, inF]);
    this.engine.gemmTB(dy.data, this.params.w.data, dx.data, n, outF, inF); // dx = dy @ w^T
    return dx;
  }
}

/** y = max(x, 0) elementwise; dx = dy where x > 0, else 0. Any shape. */
export class ReLU {
  constructor() {
    this.kind = "act";
    this.prefix = "relu";
    this.params = {};
    this.grads = {};
    this.needInputGrad = true;
    this.engine = jsEngine;
    this.y = null; // y > 0 exactly where x > 0, so the output doubles as the mask
  }

  forward(x, train = true) {
    const y = passTensor(this.engine, x.shape);
    this.engine.relu(x.data, y.data, y.data.length);
    if (train) this.y = y;
    return y;
  }

  backward(dy) {
    if (!this.needInputGrad) return null;
    const dx = passTensor(this.engine, dy.shape);
    this.engine.reluBackward(dy.data, this.y.data, dx.data, dx.data.length);
    return dx;
  }
}

/** Reshape (N, ...) -> (N, prod(...)) in C order (no copy); backward reshapes back. */
export class Flatten {
  constructor() {
    this.kind = "flatten";
    this.prefix = "flatten";
    this.params = {};
    this.grads = {};
    this.needInputGrad = true;
    this.inputShape = null;
  }

  forward(x, train = true) {
    if (train) this.inputShape = [...x.shape];
    return { data: x.data, shape: [x.shape[0], x.data.length / x.shape[0]] };
  }

  backward(dy) {
    if (!this.needInputGrad) return null;
    return { data: dy.data, shape: [...this.inputShape] };
  }
}

/**
 * Max pooling over size x size windows moved by stride, NCHW, no padding.
 * x (N, C, H, W) -> y (N, C, Ho, Wo), Ho = floor((H - size) / stride) + 1. Backward sends each
 * dy to the first maximum of its window in row-major order (ties keep the earliest).
 */
export class MaxPool2D {
  constructor(size = 2, stride = 2) {
    this.kind = "pool";
    this.prefix = "pool";
    this.size = size;
    this.stride = stride;
    this.params = {};
    this.grads = {};
    this.needInputGrad = true;
    this.engine = jsEngine;
    this.argmax = null; // Int32Array (N*C*Ho*Wo): flat input index of each window's maximum
    this.inputShape = null;
  }

  forward(x, train = true) {
    const [n, c, h, w] = x.shape;
    const [k, s] = [this.size, this.stride];
    const ho = Math.floor((h - k) / s) + 1;
    const wo = Math.floor((w - k) / s) + 1;
    const y = passTensor(this.engine, [n, c, ho, wo]);
    const argmax = this.engine.ints(y.data.length);
    this.engine.maxPool(x.data, y.data, argmax, { planes: n * c, h, w, k, s, ho, wo });
    if (train) {
      this.argmax = argmax;
      this.inputShape = [...x.shape];
    }
    return y;
  }

  backward(dy) {
    if (!this.needInputGrad) return null;
    const dx = passTensor(this.engine, this.inputShape);
    this.engine.maxPoolBackward(dy.data, this.argmax, dx.data, dy.data.length);
    return dx;
  }
}

/**
 * 2-D convolution (cross-correlation), NCHW, as one GEMM over an im2col matrix:
 * w (out, in, k, k), b (out,); x (N, in, H, W) -> y (N, out, Ho, Wo),
 *   y[n,o,i,j] = b[o] + sum_{c,u,v} w[o,c,u,v] * xp[n,c,s*i+u,s*j+v]   (xp: x zero-padded by p)
 * cols (C*k*k, N*Ho*Wo) holds every window of the batch, one per column (column n*P + pixel,
 * P = Ho*Wo), so the whole batch is one product Y = W (O, C*k*k) @ cols, whose inner loop
 * runs over N*P contiguous columns (per-image products of LeNet's 8x8 conv2 output would
 * loop over only 64). Backward: dW = dY @ cols^T, dcols = W^T @ dY, and col2im adds dcols
 * back onto dx (Chellapilla et al. 2006; minips/nn/conv.py does the same with NumPy).
 */
export class Conv2D {
  constructor(inChannels, outChannels, kernelSize, stride = 1, padding = 0) {
    this.kind = "conv";
    this.prefix = "conv";
    Object.assign(this, { inChannels, outChannels, kernelSize, stride, padding });
    const wShape = [outChannels, inChannels, kernelSize, kernelSize];
    this.params = { w: zeros(wShape), b: zeros([outChannels]) };
    this.grads = { w: zeros(wShape), b: zeros([outChannels]) };
    this.needInputGrad = true;
    this.engine = jsEngine;
    this.cols = null; // Float32Array (C*k*k, N*Ho*Wo) of the last training forward
    this.inputShape = null;
  }

  outputSize(size) {
    return Math.floor((size + 2 * this.padding - this.kernelSize) / this.stride) + 1;
  }

  /** The window geometry of im2col.js for an input of shape (N, C, H, W). */
  geometry([n, c, h, w]) {
    const [k, s, p] = [this.kernelSize, this.stride, this.padding];
    return { n, c, h, w, k, s, p, ho: this.outputSize(h), wo: this.outputSize(w) };
  }

  forward(x, train = true) {
    const [n, c, h, w] = x.shape;
    if (c !== this.inChannels) throw new Error(`Conv2D expects ${this.inChannels} channels`);
    const engine = this.engine;
    const [o, k] = [this.outChannels, this.kernelSize];
    const g = this.geometry(x.shape);
    const [ckk, pixels] = [c * k * k, g.ho * g.wo];
    const cols = engine.floats(ckk * n * pixels);
    engine.im2col(x.data, cols, g);
    const yt = engine.floats(o * n * pixels); // (O, N*P)
    engine.gemm(this.params.w.data, cols, yt, o, ckk, n * pixels);
    const y = passTensor(engine, [n, o, g.ho, g.wo]); // (O, N, P) -> (N, O, P), plus bias
    engine.convOutput(yt, this.params.b.data, y.data, o, n, pixels);
    if (train) {
      this.cols = cols;
      this.inputShape = [...x.shape];
    }
    return y;
  }

  backward(dy) {
    const engine = this.engine;
    const [n, c] = this.inputShape;
    const [o, k] = [this.outChannels, this.kernelSize];
    const pixels = dy.shape[2] * dy.shape[3];
    const ckk = c * k * k;
    const dyt = engine.floats(o * n * pixels); // (N, O, P) -> (O, N*P), and db
    engine.convOutputGrad(dy.data, dyt, this.grads.b.data, o, n, pixels);
    engine.gemmTB(dyt, this.cols, this.grads.w.data, o, n * pixels, ckk); // dW = dY cols^T
    if (!this.needInputGrad) return null;
    const dcols = engine.floats(ckk * n * pixels);
    engine.gemmTA(this.params.w.data, dyt, dcols, ckk, o, n * pixels); // dcols = W^T dY
    const dx = passTensor(engine, this.inputShape);
    engine.col2im(dcols, dx.data, this.geometry(this.inputShape));
    return dx;
  }
}

// ------------------------------------------------------------------------------ models

/**
 * Layers applied in order; parameters named "<layer>.<param>" in forward order, layers named
 * by prefix and a per-prefix counter (conv1, conv2, fc1, relu1, pool1, flatten1), as
 * minips.nn.Sequential does. inputShape: per-example shape, checked by forward when given.
 */
export class Sequential {
  constructor(layers, inputShape = null) {
    this.layers = [];
    const counters = {};
    for (const layer of layers) {
      counters[layer.prefix] = (counters[layer.prefix] || 0) + 1;
      this.layers.push({ name: `${layer.prefix}${counters[layer.prefix]}`, layer });
    }
    this.inputShape = inputShape;
    this.engine = jsEngine;
    // dx of the layers up to the first one with parameters is never used: skip it.
    for (const { layer } of this.layers) {
      layer.needInputGrad = false;
      if (Object.keys(layer.params).length) break;
    }
  }

  /** Run every layer's kernels on `engine` (engine.js); returns this. */
  useEngine(engine) {
    for (const { layer } of this.layers) layer.engine = engine;
    this.engine = engine;
    return this;
  }

  /** Map name -> tensor of every parameter, in forward order (w before b). */
  get params() {
    return this.named("params");
  }

  /** Map name -> tensor of every gradient (overwritten by each backward). */
  get grads() {
    return this.named("grads");
  }

  named(which) {
    const out = new Map();
    for (const { name, layer } of this.layers) {
      for (const [key, t] of Object.entries(layer[which])) out.set(`${name}.${key}`, t);
    }
    return out;
  }

  /** Copy values (a Float32Array of the parameter's size) into parameter `name`. */
  setParam(name, values) {
    const param = this.params.get(name);
    if (!param) throw new Error(`unknown parameter ${name}`);
    if (values.length !== param.data.length) {
      throw new Error(`parameter ${name} has ${param.data.length} values, got ${values.length}`);
    }
    param.data.set(values);
  }

  /** x (N, *inputShape) -> logits (N, K); caches what backward needs when train. */
  forward(x, train = true) {
    if (this.inputShape && x.shape.slice(1).join() !== this.inputShape.join()) {
      throw new Error(`input (${x.shape}) does not match (N, ${this.inputShape})`);
    }
    this.engine.beginPass(); // the last pass's tensors may be recycled from here on
    for (const { layer } of this.layers) x = layer.forward(x, train);
    return x;
  }

  /** Backpropagate dL/dlogits (N, K), filling every layer's grads. */
  backward(dlogits) {
    let grad = dlogits;
    for (let i = this.layers.length - 1; i >= 0 && grad !== null; i--) {
      grad = this.layers[i].layer.backward(grad);
    }
  }

  get nParams() {
    let total = 0;
    for (const t of this.params.values()) total += t.data.length;
    return total;
  }
}

/** Caffe's LeNet-5 (docs/model.md 3.3): (N, 1, 28, 28) -> (N, 10), 431,080 parameters. */
export function lenet5() {
  return new Sequential(
    [
      new Conv2D(1, 20, 5), // conv1 (N, 20, 24, 24)
      new ReLU(),
      new MaxPool2D(2, 2), // (N, 20, 12, 12)
      new Conv2D(20, 50, 5), // conv2 (N, 50, 8, 8)
      new ReLU(),
      new MaxPool2D(2, 2), // (N, 50, 4, 4)
      new Flatten(), // (N, 800)
      new Dense(800, 500), // fc1
      new ReLU(),
      new Dense(500, 10), // fc2 -> logits
    ],
    [1, 28, 28],
  );
}

/** Flatten -> (Dense -> ReLU) per hidden width -> Dense(nClasses) (docs/model.md 3.4). */
export function mlp({ hidden = [256, 128], in_features = 784, n_classes = 10 } = {}) {
  const layers = [new Flatten()];
  let width = in_features;
  for (const h of hidden) {
    layers.push(new Dense(width, h), new ReLU());
    width = h;
  }
  layers.push(new Dense(width, n_classes));
  return new Sequential(layers, in_features === 784 ? [1, 28, 28] : null);
}

/** Build the model a hello's config.model names: {name, kwargs}, its products on `engine`. */
export function buildModel(spec, engine = jsEngine) {
  if (spec.name === "lenet5") return lenet5().useEngine(engine);
  if (spec.name === "mlp") return mlp(spec.kwargs || {}).useEngine(engine);
  throw new Error(`unknown model ${spec.name}: this worker knows lenet5 and mlp`);
}

// -------------------------------------------------------------------------------- loss

/**
 * Mean softmax cross-entropy of logits (N, K) against integer labels (N,), and its gradient:
 *   loss = mean_n [logsumexp(z_n) - z_n[y_n]],  dz_n = (softmax(z_n) - onehot(y_n)) / N.
 */
export function softmaxCrossEntropy(logits, labels) {
  const [n, k] = logits.shape;
  const dlogits = zeros([n, k]);
  let loss = 0;
  for (let i = 0; i < n; i++) {
    const row = logits.data.subarray(i * k, (i + 1) * k);
    let max = -Infinity;
    for (let j = 0; j < k; j++) max = Math.max(max, row[j]);
    let sumExp = 0;
    for (let j = 0; j < k; j++) sumExp += Math.exp(row[j] - max);
    loss += Math.log(sumExp) - (row[labels[i]] - max);
    for (let j = 0; j < k; j++) {
      const p = Math.exp(row[j] - max) / sumExp;
      dlogits.data[i * k + j] = (p - (j === labels[i] ? 1 : 0)) / n;
    }
  }
  return { loss: loss / n, dlogits };
}

/** Index of the largest logit of each row: (N, K) -> Int32Array (N). */
export function argmaxRows(logits) {
  const [n, k] = logits.shape;
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    let best = 0;
    for (let j = 1; j < k; j++) if (logits.data[i * k + j] > logits.data[i * k + best]) best = j;
    out[i] = best;
  }
  return out;
}
