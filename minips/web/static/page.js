// The worker page: starts the Web Worker (worker.js) and shows what it reports. Options come
// from the query string: ?steps=N (stop after N steps), &eval=N (test examples for the
// accuracy, 500), &evalsec=S (seconds between accuracy checks, 5), &id=NAME (the worker id;
// a random one by default), &engine=js (the plain JavaScript products even where WebAssembly
// SIMD runs). window.minipsStatus holds the latest status for scripts (the
// tests read it through the DevTools protocol).

const params = new URLSearchParams(location.search);
const randomId = () =>
  "browser-" + Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, "0")).join("");
const options = {
  base: new URL("/", location.href).href,
  workerId: params.get("id") || randomId(),
  maxSteps: Number(params.get("steps")) || null,
  evalExamples: Number(params.get("eval")) || 500,
  evalSeconds: Number(params.get("evalsec")) || 5,
  engine: params.get("engine"),
};

const ENGINES = {
  "wasm-simd": "WebAssembly SIMD (gemm.wasm, kernels.wasm)",
  js: "plain JavaScript (gemm.js, kernels.js)",
};
const show = (id, text) => (document.getElementById(id).textContent = text);
window.minipsStatus = { state: "starting" };

function render(s) {
  window.minipsStatus = s;
  show("state", s.state);
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

const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
worker.onmessage = (event) => {
  if (event.data.type === "status") render(event.data.status);
  if (event.data.type === "error") {
    window.minipsStatus = { ...window.minipsStatus, state: "failed", error: event.data.message };
    const box = document.getElementById("error");
    box.hidden = false;
    box.textContent = `error: ${event.data.message}`;
  }
};
worker.onerror = (event) => {
  window.minipsStatus = { state: "failed", error: event.message };
  show("state", `failed: ${event.message}`);
};
worker.postMessage({ type: "start", options });
