// The worker page: starts the Web Worker (worker.js) and shows what it reports. Options come
// from the query string: ?steps=N (stop after N steps), &eval=N (test examples for the
// accuracy, 500), &evalsec=S (seconds between accuracy checks, 5), &id=NAME (the worker id;
// a random one by default), &engine=js (the plain JavaScript products even where WebAssembly
// SIMD runs), &stamps=1 (each step's messaging stamped: tools/profile_messaging.py).
// window.minipsStatus holds the latest status for scripts (the
// tests read it through the DevTools protocol).
//
// The tab's seat survives a reload: its worker id and progress are kept in sessionStorage
// (one tab's, kept across reloads), so a reloaded page is the same worker coming back: it
// gets its rank and shard again and goes on from the step it had reached (protocol.md §14.3).

import { explain, stateMessage } from "./words.js";

const params = new URLSearchParams(location.search);
const randomId = () =>
  "browser-" + Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, "0")).join("");
const SEAT = "minips-seat";
const seats = (() => {
  try {
    return window.sessionStorage;
  } catch {
    return null; // storage disabled: every load is a new worker
  }
})();
const saved = JSON.parse(seats?.getItem(SEAT) || "null");
// The address the gateway sees this browser at: shown as its host on the dashboard.
const peer = await fetch(new URL("/peer", location.href)).then((r) => (r.ok ? r.json() : {})).catch(() => ({}));
const options = {
  base: new URL("/", location.href).href,
  host: peer.address || null,
  workerId: params.get("id") || saved?.workerId || randomId(),
  resume: saved?.progress || null,
  maxSteps: Number(params.get("steps")) || null,
  evalExamples: Number(params.get("eval")) || 500,
  evalSeconds: Number(params.get("evalsec")) || 5,
  engine: params.get("engine"),
  stamps: params.has("stamps"),
};

const ENGINES = {
  "wasm-simd": "WebAssembly SIMD (gemm.wasm, kernels.wasm)",
  js: "plain JavaScript (gemm.js, kernels.js)",
};
const show = (id, text) => (document.getElementById(id).textContent = text);
window.minipsStatus = { state: "starting" };

/** Keep the seat for a reload: the worker id, and the progress while it trains. Once the
 * tab is done its shard is trained: a reload then is a new worker, not that shard again. */
function keepSeat(s) {
  if (s.state === "done" || s.state === "ended") return seats?.removeItem(SEAT);
  const workerId = s.workerId || options.workerId;
  const training = s.state === "training" && s.rank !== undefined;
  const progress = training
    ? { rank: s.rank, worldSize: s.worldSize, steps: s.steps, samples: s.samples, version: s.version }
    : null;
  seats?.setItem(SEAT, JSON.stringify({ workerId, progress }));
}

// The worker reports every step (100 a second on the MLP), and redrawing the page each time
// takes the CPU the worker's next step needs: the text is redrawn at most every
// REDRAW_MS, at once when the state changes. The status and the seat follow every report.
const REDRAW_MS = 200;
let latest = null;
let redraw = null; // the pending timer
function render(s) {
  window.minipsStatus = s;
  keepSeat(s);
  const changed = !latest || s.state !== latest.state;
  latest = s;
  if (changed) draw(s);
  else redraw ??= setTimeout(() => ((redraw = null), draw(latest)), REDRAW_MS);
}

function draw(s) {
  show("state", stateMessage(s));
  if (s.rank !== undefined) show("rank", `${s.rank} of ${s.worldSize}${s.slowdown > 1 ? ` (slowdown ${s.slowdown}x)` : ""}`);
  if (s.model) show("what", `${s.model} / ${s.dataset} / ${s.rule}`);
  if (s.engine) show("engine", ENGINES[s.engine] || s.engine);
  show("steps", `${s.steps} (${s.samples} examples, server version ${s.version ?? "-"})`);
  if (s.stepsPerSecond) show("speed", `${s.stepsPerSecond.toFixed(2)} steps/s, ${s.computeMs.toFixed(0)} ms compute per step`);
  if (s.stalenessMean !== null && s.stalenessMean !== undefined) {
    show("staleness", `last ${s.lastStaleness}, mean ${s.stalenessMean.toFixed(1)} (last 50), max ${s.stalenessMax}`);
  }
  if (s.loss !== undefined) show("loss", s.loss.toFixed(4));
  if (s.accuracy !== null && s.accuracy !== undefined) show("accuracy", `${(100 * s.accuracy).toFixed(1)}%`);
  document.title = `minips: ${s.state}, step ${s.steps}`;
}

/** A failure in words a student can act on; the technical line goes under "details". */
function fail(error) {
  clearTimeout(redraw); // a pending redraw would cover the failure with the last status
  const { what, todo } = explain(error, window.minipsStatus);
  window.minipsStatus = { ...window.minipsStatus, state: "failed", error: error.message, code: error.code, message: what };
  show("state", what);
  const box = document.getElementById("error");
  box.hidden = false;
  show("error-what", todo);
  show("error-details", error.message);
  document.title = "minips: stopped";
}

const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
worker.onmessage = (event) => {
  if (event.data.type === "status") render(event.data.status);
  if (event.data.type === "error") fail(event.data);
};
worker.onerror = (event) => fail({ message: event.message });
worker.postMessage({ type: "start", options });
