// The engines the network (nn.js) runs its heavy loops on. An engine has a name (the page
// shows it) and:
//   floats(size), ints(size)   zeroed Float32Array / Int32Array for one pass's tensors
//   beginPass()                a forward starts: the last pass's arrays may be recycled
//   gemm, gemmTA, gemmTB       the matrix products of gemm.js, same arguments
//   im2col, col2im, convOutput, convOutputGrad, relu, reluBackward, maxPool,
//   maxPoolBackward            the loops of kernels.js, same arguments
// Engines:
// - "js": gemm.js's and kernels.js's plain loops and fresh arrays: the oracle the tests
//   compare the other engine against, and the fallback wherever WebAssembly SIMD is missing.
// - "wasm-simd": the same kernels in kernels.wasm (built from kernels.wat by
//   tools/build_wasm.py), the pass's arrays in its memory (wasm_engine.js).

import { gemm, gemmTA, gemmTB } from "./gemm.js";
import * as kernels from "./kernels.js";
import { WasmEngine } from "./wasm_engine.js";

export const jsEngine = {
  name: "js",
  floats: (size) => new Float32Array(size),
  ints: (size) => new Int32Array(size),
  beginPass() {},
  gemm,
  gemmTA,
  gemmTB,
  ...kernels,
};

/** The WASM engine of kernels.wasm's bytes, or null where this runtime cannot run it (no
 * WebAssembly, or no SIMD: then the module does not validate). */
export async function wasmEngine(bytes) {
  if (typeof WebAssembly !== "object" || !WebAssembly.validate(bytes)) return null;
  const { instance } = await WebAssembly.instantiate(bytes);
  return new WasmEngine(instance.exports, jsEngine);
}

/** The WASM engine when kernels.wasm loads and runs here, else jsEngine. `fetchBytes(name)`
 * returns a file of this directory as an ArrayBuffer (fetch in a browser, a file in Node). */
export async function bestEngine(fetchBytes) {
  try {
    return (await wasmEngine(await fetchBytes("kernels.wasm"))) || jsEngine;
  } catch {
    return jsEngine; // no wasm file or a runtime that refuses it: the plain loops still work
  }
}
