// docs/protocol.md §13.6-13.7's worked examples made by the browser worker's own code
// (codecs.js, wire.js, transmit.js), for a runner to compare with the document's hex: Node
// (codecs_doc.mjs) and Chromium (tests/test_web_codecs.py, through the gateway's /static/).
// It imports nothing itself: the runner hands it the three modules, so the same file runs
// from disk and inside a page.

const HEADER = { op: "push", rid: 2, worker: "w0", seq: 0, base: 0 };
const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");

/** The frames of one message (hex strings), frame 0 first. */
function frames(wire, message) {
  return wire.unpackFrames(message.buffer.slice(message.byteOffset, message.byteOffset + message.byteLength)).map(hex);
}

/**
 * {label: [hex of frame 0, frame 1, ...]} for the push examples (fp16, topk, sf, lowrank),
 * and `delta`: the values a worker holding ones has after the documented delta reply, plus
 * `lowrankProduct`: p q^T of LowRank's own encoding of that example's gradient (rank 1).
 */
export function encodeExamples({ codecs, wire, transmit }) {
  const out = {};
  const push = (parts) => frames(wire, wire.encodeMessage(HEADER, parts));
  const tensor = (values, shape) => ({ data: Float32Array.from(values), shape });

  out.fp16 = push(new codecs.Fp16().encode("fc.b", tensor([0.5, -1.0], [2])));

  const topk = new codecs.TopK({ ratio: 2 / 6 });
  out.topk = push(topk.encode("fc.w", tensor([0, 3, 0, 0, 0, -1.5], [2, 3])));

  // The example composes float32 x with float16 dy: the x part of a float32 sf codec and
  // the dy part of a float16 one.
  const factors = { x: tensor([1, 0, 0, 2], [2, 2]), dy: tensor([0.5, 0, -1, 0.25, 1, 0], [2, 3]) };
  const [x] = new codecs.SufficientFactors({ dtype: "float32" }).encode("fc.w", factors);
  const [, dy] = new codecs.SufficientFactors({ dtype: "float16" }).encode("fc.w", factors);
  out.sf = push([x, dy]);

  // PowerSGD's factors are its own (orthonormal p): the document's p and q in the parts
  // LowRank makes for that gradient, and LowRank's product checked on its own.
  const g = tensor([2, 0, -1, 1, 0, -0.5], [2, 3]);
  const [p, q] = new codecs.LowRank({ rank: 1 }).encode("fc.w", g);
  out.lowrankProduct = Array.from({ length: 6 }, (_, i) => p.data[Math.floor(i / 3)] * q.data[i % 3]);
  out.lowrank = push([
    { ...p, data: Float32Array.from([1, 0.5]) },
    { ...q, data: Float32Array.from([2, 0, -1]) },
  ]);
  return out;
}

/** The documented delta reply (frames as byte arrays) applied to fc.w = ones: its values. */
export function applyDeltaExample({ wire, transmit }, documentFrames) {
  const message = wire.packFrames(documentFrames.map((f) => Uint8Array.from(f)));
  const reply = wire.decodeMessage(message.buffer);
  const w = { data: new Float32Array(6).fill(1), shape: [2, 3] };
  const b = { data: new Float32Array(2), shape: [2] };
  const model = { params: new Map([["fc.w", w], ["fc.b", b]]) };
  transmit.applyPull(model, reply);
  return Array.from(w.data);
}
