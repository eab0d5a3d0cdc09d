// IEEE 754 half precision (float16) for the wire's "float16" arrays (docs/protocol.md §4,
// §13): float32 -> float16 bits rounded to nearest, ties to even (what NumPy's
// astype(float16) does, so a browser's fp16 frames equal a NumPy worker's byte for byte),
// and float16 bits -> float32 through a table of all 65,536 values.

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The float16 bits (a number 0..0xffff) of float32 bits `f` (an unsigned 32-bit number). */
export function halfBits(f) {
  const sign = (f >>> 16) & 0x8000;
  const exponent = (f >>> 23) & 0xff;
  const mantissa = f & 0x7fffff;
  if (exponent === 0xff) {
    // Inf stays Inf; a NaN keeps its top mantissa bits and stays a NaN (as NumPy does)
    const bits = 0x7c00 + (mantissa >>> 13);
    return sign | (mantissa && bits === 0x7c00 ? 0x7c01 : bits);
  }
  const e = exponent - 112; // the float16 exponent field, 127 - 15 = 112 below float32's
  if (e >= 31) return sign | 0x7c00; // beyond 65520 (and at it): Inf
  if (e <= 0) {
    if (e < -10) return sign; // below 2^-25: rounds to (signed) zero
    // a subnormal float16: the implicit bit made explicit, shifted into 10 bits
    const full = mantissa | 0x800000;
    const shift = 14 - e;
    const bits = full >>> shift;
    const rest = full & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    return sign | (rest > half || (rest === half && bits & 1) ? bits + 1 : bits);
  }
  const bits = (e << 10) | (mantissa >>> 13);
  const rest = mantissa & 0x1fff;
  // a carry out of the mantissa moves into the exponent: 65504 + rounding up is Inf, as it must
  return sign | (rest > 0x1000 || (rest === 0x1000 && bits & 1) ? bits + 1 : bits);
}

/** float32 value -> float16 bits. */
export function toHalf(value) {
  f32[0] = value;
  return halfBits(u32[0]);
}

/** float16 bits -> the float32 value they stand for (exactly). */
function halfValue(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

let table = null;

/** The float32 value of every float16 bit pattern (256 KB, built on first use). */
export function halfTable() {
  if (table === null) {
    table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) table[h] = halfValue(h);
  }
  return table;
}

/**
 * A Float32Array narrowed to float16: {bits: a Uint16Array (`out` if given), overflowed:
 * whether a finite input became Inf (|x| >= 65520)}.
 */
export function narrow(values, out = new Uint16Array(values.length)) {
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  let overflowed = false;
  for (let i = 0; i < values.length; i++) {
    const h = halfBits(bits[i]);
    out[i] = h;
    if ((h & 0x7fff) === 0x7c00 && ((bits[i] >>> 23) & 0xff) !== 0xff) overflowed = true;
  }
  return { bits: out, overflowed };
}

/** float16 bits (a Uint16Array, or the little-endian bytes of one) widened to float32. */
export function widen(halves, out = null) {
  const t = halfTable();
  if (halves instanceof Uint8Array) {
    const n = halves.length >> 1;
    out = out || new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = t[halves[2 * i] | (halves[2 * i + 1] << 8)];
    return out;
  }
  out = out || new Float32Array(halves.length);
  for (let i = 0; i < halves.length; i++) out[i] = t[halves[i]];
  return out;
}
