// docs/protocol.md §13's worked examples against the browser worker's codecs, in Node (the
// Python side is tests/test_codecs_doc.py; the same checks in Chromium are
// tests/test_web_codecs.py). Usage: node codecs_doc.mjs; exits 1 and says what differs.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import * as codecs from "../../minips/classroom/web/static/codecs.js";
import * as transmit from "../../minips/classroom/web/static/transmit.js";
import * as wire from "../../minips/classroom/web/static/wire.js";
import { applyDeltaExample, encodeExamples } from "./codec_examples.mjs";

const root = fileURLToPath(new URL("../../", import.meta.url));
const doc = readFileSync(root + "docs/protocol.md", "utf8");

/** The hex of the block after `<!-- label -->`, normalised to single spaces. */
function docFrame(label) {
  const match = doc.match(new RegExp(`<!-- ${label} -->\\s*\`\`\`\\s*\\n([\\s\\S]*?)\`\`\``));
  if (!match) throw new Error(`${label} not found in docs/protocol.md`);
  return match[1].trim().split(/\s+/).join(" ");
}

let failures = 0;
function check(what, ok, detail = "") {
  if (!ok) failures++;
  console.log(`${ok ? "ok  " : "FAIL"} ${what}${ok ? "" : `: ${detail}`}`);
}

const made = encodeExamples({ codecs, wire, transmit });
for (const codec of ["fp16", "topk", "sf", "lowrank"]) {
  made[codec].forEach((frame, i) => {
    const want = docFrame(`codec-${codec}-frame-${i}`);
    check(`${codec} frame ${i}`, frame === want, `got\n${frame}\nwant\n${want}`);
  });
}
const product = made.lowrankProduct;
const g = [2, 0, -1, 1, 0, -0.5];
check("lowrank p q^T of its own encoding", product.every((v, i) => Math.abs(v - g[i]) < 1e-6), `${product}`);

const deltaFrames = [0, 1, 2].map((i) => docFrame(`codec-delta-frame-${i}`).split(" ").map((h) => parseInt(h, 16)));
const held = applyDeltaExample({ wire, transmit }, deltaFrames);
check("delta pull applied to ones", held.join() === [1, 1.25, 1, 1, 1, 0.5].join(), `${held}`);

console.log(failures ? `${failures} check(s) failed` : "every check passed");
process.exit(failures ? 1 : 0);
