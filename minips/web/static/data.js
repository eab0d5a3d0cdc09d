// Data for a browser worker (docs/model.md §4): IDX files as the gateway serves them, and the
// normalisation that turns uint8 pixels into the float32 inputs NumPy computes.

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

/** A small seeded generator (mulberry32): uniform floats in [0, 1). */
export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A uniformly random permutation of 0..n-1 (Fisher-Yates) drawn from `random`. */
export function permutation(n, random) {
  const order = Int32Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order;
}
