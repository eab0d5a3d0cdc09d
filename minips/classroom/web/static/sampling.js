// VSGD's coordinate samples (docs/protocol.md 6.4): which entries of each parameter a push
// reports, chosen from the parameter's name and size alone so worker and server agree.
//   k      = min(size, max(minSamples, ceil(rho * size)))
//   seed   = CRC-32(UTF-8 name)
//   key(i) = splitmix64_mix(seed + (i + 1) * 0x9E3779B97F4A7C15)   (mod 2^64)
//   S      = the k indices with the smallest keys, in ascending index order
// The reference implementation is minips/protocol/sampling.py.

const MASK64 = (1n << 64n) - 1n;
const GOLDEN_GAMMA = 0x9e3779b97f4a7c15n;
const M1 = 0xbf58476d1ce4e5b9n;
const M2 = 0x94d049bb133111ebn;

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let bit = 0; bit < 8; bit++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

/** zlib's CRC-32 of a byte array, as an unsigned number. */
export function crc32(bytes) {
  let crc = 0xffffffff;
  for (const byte of bytes) crc = CRC_TABLE[(crc ^ byte) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

/** SplitMix64's output function on a BigInt in [0, 2^64). */
export function splitmix64Mix(z) {
  z = ((z ^ (z >> 30n)) * M1) & MASK64;
  z = ((z ^ (z >> 27n)) * M2) & MASK64;
  return z ^ (z >> 31n);
}

/** k = min(size, max(minSamples, ceil(rho * size))). */
export function sampleSize(size, rho, minSamples) {
  return Math.min(size, Math.max(minSamples, Math.ceil(rho * size)));
}

/** The sample's flat indices for parameter `name` of `size` entries, ascending (Int32Array). */
export function sampleIndices(name, size, rho, minSamples) {
  const k = sampleSize(size, rho, minSamples);
  if (k === size) return Int32Array.from({ length: size }, (_, i) => i);
  const seed = BigInt(crc32(new TextEncoder().encode(name)));
  const keys = new BigUint64Array(size);
  for (let i = 0; i < size; i++) {
    keys[i] = splitmix64Mix((seed + BigInt(i + 1) * GOLDEN_GAMMA) & MASK64);
  }
  // The keys are distinct, so the k smallest are those <= the k-th smallest.
  const threshold = keys.slice().sort()[k - 1];
  const chosen = new Int32Array(k);
  let found = 0;
  for (let i = 0; i < size; i++) if (keys[i] <= threshold) chosen[found++] = i;
  return chosen;
}

/** Sample indices per (name, size), computed once each; values() picks a parameter's. */
export class Sampler {
  constructor(rho, minSamples) {
    this.rho = rho;
    this.minSamples = minSamples;
    this.cache = new Map();
  }

  indices(name, size) {
    const key = `${name}/${size}`;
    if (!this.cache.has(key)) {
      this.cache.set(key, sampleIndices(name, size, this.rho, this.minSamples));
    }
    return this.cache.get(key);
  }

  /** The entries of `values` (a parameter's Float32Array) at its sample, as a Float32Array. */
  values(name, values) {
    const idx = this.indices(name, values.length);
    const out = new Float32Array(idx.length);
    for (let i = 0; i < idx.length; i++) out[i] = values[idx[i]];
    return out;
  }
}
