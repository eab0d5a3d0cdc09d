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
// - "wasm-simd": the same kernels in gemm.wasm and kernels.wasm (built from gemm.wat and
//   kernels.wat by tools/build_wasm.py), the pass's arrays in their memory (wasm_engine.js).

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

/**
 * The WASM engine, or null where this runtime cannot run it (no WebAssembly, or no SIMD:
 * then the modules do not validate). `fetchBytes(name)` returns a file of this directory
 * (an ArrayBuffer or a byte array: fetch in a browser, readFileSync in Node).
 */
export async function wasmEngine(fetchBytes) {
  if (typeof WebAssembly !== "object") return null;
  const [gemmBytes, kernelBytes] = await Promise.all(["gemm.wasm", "kernels.wasm"].map(fetchBytes));
  if (!WebAssembly.validate(gemmBytes) || !WebAssembly.validate(kernelBytes)) return null;
  const gemm = (await WebAssembly.instantiate(gemmBytes)).instance.exports;
  const imports = { gemm: { memory: gemm.memory } }; // kernels.wasm works on gemm's memory
  const kernels = (await WebAssembly.instantiate(kernelBytes, imports)).instance.exports;
  return new WasmEngine({ ...gemm, ...kernels }, jsEngine);
}

/** The WASM engine when its files load and run here, else jsEngine (same fetchBytes). */
export async function bestEngine(fetchBytes) {
  try {
    return (await wasmEngine(fetchBytes)) || jsEngine;
  } catch {
    return jsEngine; // no wasm files or a runtime that refuses them: the plain loops still work
  }
}
