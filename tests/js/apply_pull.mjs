// A pull reply made by minips.protocol.wire (the frames in DIR/frame-<i>.bin) applied by the
// browser's transmit.applyPull to parameters whose starting values are DIR/<name>.bin; writes
// what each then holds to DIR/<name>.out.bin. Usage: node apply_pull.mjs DIR NAME:SIZE ...
import { readFileSync, writeFileSync } from "node:fs";
import { applyPull } from "../../minips/classroom/web/static/transmit.js";
import { decodeMessage, packFrames } from "../../minips/classroom/web/static/wire.js";

const [dir, ...specs] = process.argv.slice(2);
const frames = [];
for (let i = 0; ; i++) {
  try {
    frames.push(new Uint8Array(readFileSync(`${dir}/frame-${i}.bin`)));
  } catch {
    break;
  }
}
const params = new Map(specs.map((spec) => {
  const [name] = spec.split(":");
  const data = new Float32Array(new Uint8Array(readFileSync(`${dir}/${name}.bin`)).buffer);
  return [name, { data, shape: [data.length] }];
}));
const message = packFrames(frames);
applyPull({ params }, decodeMessage(message.buffer.slice(0, message.byteLength)));
for (const [name, t] of params) writeFileSync(`${dir}/${name}.out.bin`, new Uint8Array(t.data.buffer));
console.log("applied", frames.length - 1, "frames");
