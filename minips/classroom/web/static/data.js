// Data for a browser worker (docs/model.md §4): IDX files as the gateway serves them, the
// normalisation that turns uint8 pixels into the float32 inputs NumPy computes, and the
// portable shuffle of the batch order (the same orders as minips/data/shuffle.py).
import { splitmix64Mix } from "./sampling.js";

const MASK64 = (1n << 64n) - 1n;
const GAMMA = 0x9e3779b97f4a7c15n;

/** Parse IDX bytes (an ArrayBuffer) of uint8 data: {shape, data: Uint8Array}. */
export function parseIdx(buffer) {
  const view = new DataView(buffer);
  if (view.getUint16(0) !== 0 || view.getUint8(2) !== 0x08) {
    throw new Error("not an IDX file of uint8 data");
  }
  const ndim = view.getUint8(3);
  const shape = [];
  for (let i = 0; i < ndim; i++) shape.push(view.getUint32(4 + 4 * i)); // big-endian
  const start = 4 + 4 * ndim;
  const size = shape.reduce((a, b) => a * b, 1);
  if (buffer.byteLength !== start + size) throw new Error("IDX file has the wrong length");
  return { shape, data: new Uint8Array(buffer, start, size) };
}

/**
 * uint8 pixels -> float32 inputs, x = pixel * f32(1 / (255 std)) - f32(mean / std), each step
 * rounded to float32 like NumPy's (the product of a float32 and a small integer is exact in
 * a double, and a double difference rounds to the same float32 as a float32 one).
 */
export function normalise(pixels, mean, std) {
  const scale = Math.fround(1 / (255 * std));
  const shift = Math.fround(mean / std);
  const out = new Float32Array(pixels.length);
  for (let i = 0; i < pixels.length; i++) out[i] = Math.fround(pixels[i] * scale) - shift;
  return out;
}

/** SplitMix64's outputs 0..count-1 for seed `seed` (a BigInt), as a BigUint64Array. */
export function splitmix64(seed, count) {
  const keys = new BigUint64Array(count);
  for (let i = 0; i < count; i++) keys[i] = splitmix64Mix((seed + BigInt(i + 1) * GAMMA) & MASK64);
  return keys;
}

/** The portable shuffle of docs/model.md §4.2: 0..n-1 in ascending order of their keys. */
export function shuffle(seed, n) {
  const keys = splitmix64(seed, n);
  return Int32Array.from({ length: n }, (_, i) => i).sort((a, b) => (keys[a] < keys[b] ? -1 : 1));
}

/** Epoch `epoch`'s batch order of rank `rank` in a run of `seed` (docs/model.md §4.3). */
export function epochOrder(seed, rank, epoch, n) {
  const worker = (BigInt(seed) * 1000n + BigInt(rank)) & MASK64;
  return shuffle(splitmix64(worker, epoch + 1)[epoch], n);
}
