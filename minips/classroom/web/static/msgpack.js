// The part of msgpack (https://github.com/msgpack/msgpack/blob/master/spec.md) that minips
// headers use: nil, booleans, integers, floats, UTF-8 strings, arrays and maps with string
// keys. Extension types are refused (docs/protocol.md §2); bin is decoded but never sent.

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Encode a JavaScript value (null, boolean, number, string, array, plain object, Map). */
export function pack(value) {
  const out = [];
  write(value, out);
  return new Uint8Array(out);
}

function bytesOf(n, size) {
  // Big-endian bytes of a non-negative integer below 2^(8*size).
  const bytes = [];
  let big = BigInt(n);
  for (let i = 0; i < size; i++, big >>= 8n) bytes.unshift(Number(big & 0xffn));
  return bytes;
}

function write(value, out) {
  if (value === null || value === undefined) out.push(0xc0);
  else if (value === false) out.push(0xc2);
  else if (value === true) out.push(0xc3);
  else if (typeof value === "number" && Number.isInteger(value)) writeInt(value, out);
  else if (typeof value === "number") {
    const view = new DataView(new ArrayBuffer(8));
    view.setFloat64(0, value);
    out.push(0xcb, ...new Uint8Array(view.buffer));
  } else if (typeof value === "string") {
    const bytes = encoder.encode(value);
    const n = bytes.length;
    if (n < 32) out.push(0xa0 | n);
    else if (n < 256) out.push(0xd9, n);
    else if (n < 65536) out.push(0xda, ...bytesOf(n, 2));
    else out.push(0xdb, ...bytesOf(n, 4));
    for (const b of bytes) out.push(b);
  } else if (Array.isArray(value)) {
    writeLength(value.length, 0x90, 0xdc, out);
    for (const item of value) write(item, out);
  } else if (typeof value === "object") {
    const entries = value instanceof Map ? [...value] : Object.entries(value);
    writeLength(entries.length, 0x80, 0xde, out);
    for (const [key, item] of entries) {
      write(String(key), out);
      write(item, out);
    }
  } else throw new Error(`msgpack: cannot encode ${typeof value}`);
}

function writeLength(n, fix, code16, out) {
  if (n < 16) out.push(fix | n);
  else if (n < 65536) out.push(code16, ...bytesOf(n, 2));
  else out.push(code16 + 1, ...bytesOf(n, 4));
}

function writeInt(n, out) {
  if (n >= 0) {
    if (n < 128) out.push(n);
    else if (n < 256) out.push(0xcc, n);
    else if (n < 65536) out.push(0xcd, ...bytesOf(n, 2));
    else if (n < 2 ** 32) out.push(0xce, ...bytesOf(n, 4));
    else out.push(0xcf, ...bytesOf(n, 8));
  } else if (n >= -32) out.push(n & 0xff);
  else {
    // int64, two's complement: always correct, a few bytes longer than needed
    out.push(0xd3, ...bytesOf(BigInt.asUintN(64, BigInt(n)), 8));
  }
}

/** Decode one msgpack value that fills `bytes` (a Uint8Array) exactly. */
export function unpack(bytes) {
  const reader = { view: new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength), pos: 0 };
  const value = read(reader);
  if (reader.pos !== bytes.byteLength) throw new Error("msgpack: trailing bytes");
  return value;
}

function read(r) {
  const v = r.view;
  const code = v.getUint8(r.pos++);
  const take = (n) => {
    const at = r.pos;
    r.pos += n;
    if (r.pos > v.byteLength) throw new Error("msgpack: truncated");
    return at;
  };
  if (code < 0x80) return code;
  if (code >= 0xe0) return code - 256;
  if ((code & 0xf0) === 0x80) return readMap(r, code & 0x0f);
  if ((code & 0xf0) === 0x90) return readArray(r, code & 0x0f);
  if ((code & 0xe0) === 0xa0) return readString(r, code & 0x1f);
  switch (code) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xc4: return readBin(r, v.getUint8(take(1)));
    case 0xc5: return readBin(r, v.getUint16(take(2)));
    case 0xc6: return readBin(r, v.getUint32(take(4)));
    case 0xca: return v.getFloat32(take(4));
    case 0xcb: return v.getFloat64(take(8));
    case 0xcc: return v.getUint8(take(1));
    case 0xcd: return v.getUint16(take(2));
    case 0xce: return v.getUint32(take(4));
    case 0xcf: return Number(v.getBigUint64(take(8)));
    case 0xd0: return v.getInt8(take(1));
    case 0xd1: return v.getInt16(take(2));
    case 0xd2: return v.getInt32(take(4));
    case 0xd3: return Number(v.getBigInt64(take(8)));
    case 0xd9: return readString(r, v.getUint8(take(1)));
    case 0xda: return readString(r, v.getUint16(take(2)));
    case 0xdb: return readString(r, v.getUint32(take(4)));
    case 0xdc: return readArray(r, v.getUint16(take(2)));
    case 0xdd: return readArray(r, v.getUint32(take(4)));
    case 0xde: return readMap(r, v.getUint16(take(2)));
    case 0xdf: return readMap(r, v.getUint32(take(4)));
    default: throw new Error(`msgpack: type 0x${code.toString(16)} not allowed`);
  }
}

function readBytes(r, n) {
  const start = r.view.byteOffset + r.pos;
  r.pos += n;
  if (r.pos > r.view.byteLength) throw new Error("msgpack: truncated");
  return new Uint8Array(r.view.buffer, start, n);
}

const readString = (r, n) => decoder.decode(readBytes(r, n));
const readBin = (r, n) => readBytes(r, n).slice();

function readArray(r, n) {
  const out = [];
  for (let i = 0; i < n; i++) out.push(read(r));
  return out;
}

function readMap(r, n) {
  const out = {};
  for (let i = 0; i < n; i++) {
    const key = read(r);
    out[key] = read(r);
  }
  return out;
}
