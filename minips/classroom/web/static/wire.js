// minips messages in a browser: a msgpack header + raw array frames (docs/protocol.md §2-4),
// carried in one binary WebSocket message as the gateway's framing (protocol.md §14.2):
//   uint32 n, uint32 len[0..n-1], then the n frames back to back (all little-endian).

import { pack, unpack } from "./msgpack.js";

// Typed arrays use the platform's byte order; the wire is little-endian.
if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  throw new Error("minips's browser worker needs a little-endian platform");
}

/**
 * Join frames (Uint8Arrays) into one WebSocket message: a Uint8Array at the start of
 * `buffer` (an ArrayBuffer to reuse: a push is megabytes, and a fresh buffer each step costs
 * its page faults again) when it is large enough, else of a new ArrayBuffer.
 */
export function packFrames(frames, buffer = null) {
  const prefix = new Uint32Array(1 + frames.length);
  prefix[0] = frames.length;
  frames.forEach((f, i) => (prefix[1 + i] = f.byteLength));
  const total = prefix.byteLength + frames.reduce((s, f) => s + f.byteLength, 0);
  const reuse = buffer !== null && buffer.byteLength >= total;
  const out = new Uint8Array(reuse ? buffer : new ArrayBuffer(total), 0, total);
  out.set(new Uint8Array(prefix.buffer), 0);
  let at = prefix.byteLength;
  for (const f of frames) {
    out.set(f, at);
    at += f.byteLength;
  }
  return out;
}

/** Split one WebSocket message (an ArrayBuffer) into its frames (Uint8Array views). */
export function unpackFrames(buffer) {
  const view = new DataView(buffer);
  const n = view.getUint32(0, true);
  let at = 4 + 4 * n;
  const frames = [];
  for (let i = 0; i < n; i++) {
    const length = view.getUint32(4 + 4 * i, true);
    frames.push(new Uint8Array(buffer, at, length));
    at += length;
  }
  if (at !== buffer.byteLength) throw new Error("bad framing from the gateway");
  return frames;
}

/**
 * Encode a request: header (a plain object; v is added) and its arrays, each a wire part
 * {name, dtype, shape, codec, part?, of?, data} (codecs.js; dtype and codec default to
 * "float32" and "dense") whose data is a typed array of the dtype (float16 as the bits, a
 * Uint16Array). Returns a Uint8Array, in `buffer` when it is large enough (packFrames).
 */
export function encodeMessage(header, arrays = [], buffer = null) {
  const full = { v: 1, ...header };
  if (arrays.length) full.arrays = arrays.map(descriptor);
  const frames = [pack(full)];
  for (const a of arrays) frames.push(new Uint8Array(a.data.buffer, a.data.byteOffset, a.data.byteLength));
  return packFrames(frames, buffer);
}

/** An array's descriptor, its keys in protocol.md §4's order. */
function descriptor(a) {
  const d = { name: a.name, dtype: a.dtype || "float32", shape: a.shape, codec: a.codec || "dense" };
  if (a.part !== undefined) Object.assign(d, { part: a.part, of: a.of });
  return d;
}

/**
 * Decode a reply: {header, frames}, frames[i] the bytes of header.arrays[i] (views of the
 * message, unaligned: pulls.js copies them straight into the parameters).
 */
export function decodeMessage(buffer) {
  const [head, ...frames] = unpackFrames(buffer);
  const header = unpack(head);
  if ((header.arrays || []).length !== frames.length) {
    throw new Error(`a reply with ${frames.length} array frames for ${(header.arrays || []).length} descriptors`);
  }
  return { header, frames };
}
