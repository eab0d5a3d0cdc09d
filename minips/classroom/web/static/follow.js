// Whether this page can do what a run asks (docs/model.md §1: "a worker that cannot encode
// a codec must not join"). The worker asks right after hello; a page that cannot follow says
// `bye` with `refused` and its reason (docs/protocol.md §5.6), so the teacher reads the
// reason in the run's output and the student on the page, instead of a tab that trains
// wrong or goes silent.

import { parsePartition } from "./partition.js";
import { planProblem } from "./transmit.js";

// The models of docs/model.md §3 this page builds (nn.js), with the kwargs each takes.
const MODELS = { lenet5: [], mlp: ["hidden", "in_features", "n_classes"] };

/**
 * Why this page cannot follow the run of hello's `config` on `engine` (engine.js), or null.
 * asked: the page's options; `engine: "wasm"` demands the WebAssembly SIMD engine.
 */
export function cannotFollow(config, engine, asked = {}) {
  const model = config.model || {};
  if (!(model.name in MODELS)) {
    return `this page cannot build model ${JSON.stringify(model.name)} (it knows ${Object.keys(MODELS).join(", ")})`;
  }
  const unknown = Object.keys(model.kwargs || {}).filter((k) => !MODELS[model.name].includes(k));
  if (unknown.length) return `this page's ${model.name} has no option(s) ${unknown.join(", ")}`;
  if (asked.engine === "wasm" && engine.name !== "wasm-simd") {
    return "this browser cannot run the WebAssembly SIMD engine the page was asked for (engine=wasm)";
  }
  if (config.partition !== undefined) {
    try {
      parsePartition(config.partition);
    } catch (err) {
      return `this page cannot cut its shard: ${err.message}`;
    }
  }
  return planProblem(config.plan);
}
