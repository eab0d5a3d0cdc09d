// The "wasm-simd" engine (engine.js): the kernels of gemm.wasm and kernels.wasm, and one
// pass's arrays in their memory (gemm.wasm's, which kernels.wasm imports) so that they
// reach the kernels without a copy.
//
// Its memory holds two regions, [arena | scratch]:
// - the arena: floats() and ints() hand out views of it, one after the other, until the
//   next beginPass() starts again from its beginning. They are also zeroed, as the plain
//   engine's fresh arrays are, but the memory is the same every pass (the fresh 8 MB arrays
//   LeNet's plain engine allocates each step cost about as much in page faults as the
//   copies they hold);
// - scratch: a kernel's operands that live elsewhere (the parameters and their gradients
//   are plain arrays) are copied there for the call (and results copied back).
// Growing the memory detaches every view of the old one, so it grows only while no arena
// array of this pass exists: in beginPass(), to what the last pass asked for (no array of
// the last pass is used once a new pass begins), and for scratch before the pass's first
// floats(). Otherwise an arena that is full hands out plain arrays, and a call whose
// operands do not fit in scratch runs the plain kernel: slower for one pass, never wrong.
// So the first pass runs on plain arrays with the operands copied, and the next ones in
// place.

const ALIGN = 16; // bytes: each array starts on a v128 boundary
const PAGE = 65536; // bytes in a WebAssembly memory page
const padded = (bytes) => Math.ceil(bytes / ALIGN) * ALIGN;

export class WasmEngine {
  /** exports: the two instances' exports (memory: gemm.wasm's); plain: the JS engine, for
   * the fallbacks. */
  constructor(exports, plain) {
    this.name = "wasm-simd";
    this.exports = exports;
    this.memory = exports.memory;
    this.plain = plain;
    this.arenaBytes = 0; // capacity; scratch starts right after
    this.used = 0; // bytes of the arena handed out in this pass
    this.wanted = { arena: 0, scratch: 0 }; // what this pass asked for
  }

  beginPass() {
    const { arena, scratch } = this.wanted;
    if (arena > this.arenaBytes || this.arenaBytes + scratch > this.memory.buffer.byteLength) {
      this.arenaBytes = Math.max(arena, this.arenaBytes);
      const missing = this.arenaBytes + scratch - this.memory.buffer.byteLength;
      if (missing > 0) this.memory.grow(Math.ceil(missing / PAGE));
    }
    this.used = 0;
    this.wanted = { arena: 0, scratch: 0 };
  }

  floats(size) {
    return this.take(size, Float32Array);
  }

  ints(size) {
    return this.take(size, Int32Array);
  }

  take(size, Type) {
    const bytes = padded(4 * size);
    this.wanted.arena += bytes;
    if (this.used + bytes > this.arenaBytes) return new Type(size); // full until next pass
    const view = new Type(this.memory.buffer, this.used, size);
    view.fill(0);
    this.used += bytes;
    return view;
  }

  /** c (m, n) = a (m, k) @ b (k, n); c += ... when accumulate. */
  gemm(a, b, c, m, k, n, accumulate = false) {
    const operands = [[a, m * k, "in"], [b, k * n, "in"], [c, m * n, accumulate ? "inout" : "out"]];
    this.call(operands, this.exports.product_scratch(m, k, n), ([pa, pb, pc], packed) =>
      this.exports.product(pa, 4 * k, 4, pb, pc, m, k, n, packed),
    () => this.plain.gemm(a, b, c, m, k, n, accumulate));
  }

  /** c (m, n) = a^T @ b with a (k, m), b (k, n); c += ... when accumulate. */
  gemmTA(a, b, c, m, k, n, accumulate = false) {
    const operands = [[a, k * m, "in"], [b, k * n, "in"], [c, m * n, accumulate ? "inout" : "out"]];
    this.call(operands, this.exports.product_scratch(m, k, n), ([pa, pb, pc], packed) =>
      this.exports.product(pa, 4, 4 * m, pb, pc, m, k, n, packed),
    () => this.plain.gemmTA(a, b, c, m, k, n, accumulate));
  }

  /** c (m, n) = a @ b^T with a (m, k), b (n, k); c += ... when accumulate. */
  gemmTB(a, b, c, m, k, n, accumulate = false) {
    const operands = [[a, m * k, "in"], [b, n * k, "in"], [c, m * n, accumulate ? "inout" : "out"]];
    this.call(operands, 0, ([pa, pb, pc]) => this.exports.product_tb(pa, pb, pc, m, k, n),
      () => this.plain.gemmTB(a, b, c, m, k, n, accumulate));
  }

  /** im2col.js's im2col: cols (C*k*k, N*Ho*Wo) from x (N, C, H, W). */
  im2col(x, cols, g) {
    const operands = [[x, g.n * g.c * g.h * g.w, "in"], [cols, windowsSize(g), "inout"]];
    this.call(operands, 0, ([px, pcols]) =>
      this.exports.im2col(px, pcols, g.n, g.c, g.h, g.w, g.k, g.s, g.p, g.ho, g.wo),
    () => this.plain.im2col(x, cols, g));
  }

  /** im2col.js's col2im: x += the windows of cols. */
  col2im(cols, x, g) {
    const operands = [[cols, windowsSize(g), "in"], [x, g.n * g.c * g.h * g.w, "inout"]];
    this.call(operands, 0, ([pcols, px]) =>
      this.exports.col2im(pcols, px, g.n, g.c, g.h, g.w, g.k, g.s, g.p, g.ho, g.wo),
    () => this.plain.col2im(cols, x, g));
  }

  /** kernels.js's convOutput: y (N, O, P) = yt (O, N, P) + b[o]. */
  convOutput(yt, b, y, o, n, pixels) {
    const size = o * n * pixels;
    const operands = [[yt, size, "in"], [b, o, "in"], [y, size, "out"]];
    this.call(operands, 0, ([pyt, pb, py]) => this.exports.conv_output(pyt, pb, py, o, n, pixels),
      () => this.plain.convOutput(yt, b, y, o, n, pixels));
  }

  /** kernels.js's convOutputGrad: dyt (O, N, P) = dy (N, O, P), db = its sums. */
  convOutputGrad(dy, dyt, db, o, n, pixels) {
    const size = o * n * pixels;
    const operands = [[dy, size, "in"], [dyt, size, "out"], [db, o, "out"]];
    this.call(operands, 0, ([pdy, pdyt, pdb]) =>
      this.exports.conv_output_grad(pdy, pdyt, pdb, o, n, pixels),
    () => this.plain.convOutputGrad(dy, dyt, db, o, n, pixels));
  }

  /** kernels.js's relu: y = max(x, 0). */
  relu(x, y, size) {
    this.call([[x, size, "in"], [y, size, "out"]], 0, ([px, py]) => this.exports.relu(px, py, size),
      () => this.plain.relu(x, y, size));
  }

  /** kernels.js's reluBackward: dx = dy where y > 0, else 0. */
  reluBackward(dy, y, dx, size) {
    const operands = [[dy, size, "in"], [y, size, "in"], [dx, size, "out"]];
    this.call(operands, 0, ([pdy, py, pdx]) => this.exports.relu_backward(pdy, py, pdx, size),
      () => this.plain.reluBackward(dy, y, dx, size));
  }

  /** kernels.js's maxPool: y and argmax (an Int32Array) from x. */
  maxPool(x, y, argmax, g) {
    const size = g.planes * g.ho * g.wo;
    const operands = [[x, g.planes * g.h * g.w, "in"], [y, size, "out"], [argmax, size, "out"]];
    this.call(operands, 0, ([px, py, pa]) =>
      this.exports.max_pool(px, py, pa, g.planes, g.h, g.w, g.k, g.s, g.ho, g.wo),
    () => this.plain.maxPool(x, y, argmax, g));
  }

  /** kernels.js's maxPoolBackward: dx[argmax[o]] += dy[o]. */
  maxPoolBackward(dy, argmax, dx, size) {
    const operands = [[dy, size, "in"], [argmax, size, "in"], [dx, dx.length, "inout"]];
    this.call(operands, 0, ([pdy, pa, pdx]) => this.exports.max_pool_backward(pdy, pa, pdx, size),
      () => this.plain.maxPoolBackward(dy, argmax, dx, size));
  }

  /**
   * Run one kernel. operands: [array, size, mode] with mode "in" (read), "out" (zeroed,
   * then written) or "inout" (read and written). Arrays in this memory are used where they
   * are; the others are copied into scratch (in) and back (out). kernel(addresses, extra)
   * gets their byte addresses and that of `extraFloats` more floats of scratch. When
   * scratch is too small, plain() runs instead (and the next pass grows it).
   */
  call(operands, extraFloats, kernel, plain) {
    if (operands.some(([, size]) => size === 0)) return plain(); // nothing to do, or all zeros
    const memory = this.memory.buffer;
    const scratch = this.arenaBytes;
    let top = scratch;
    const addresses = [];
    const copies = [];
    for (const [array, size, mode] of operands) {
      if (array.buffer === memory) {
        if (mode === "out") array.fill(0, 0, size);
        addresses.push(array.byteOffset);
      } else {
        copies.push({ array, size, mode, at: top });
        addresses.push(top);
        top += padded(4 * size);
      }
    }
    const extra = top;
    top += padded(4 * extraFloats);
    this.wanted.scratch = Math.max(this.wanted.scratch, top - scratch);
    if (top > memory.byteLength) {
      if (this.used > 0) return plain(); // growing now would detach this pass's arrays
      this.memory.grow(Math.ceil((top - memory.byteLength) / PAGE));
    }
    for (const copy of copies) {
      // a view of the copy's place, of the array's own type (argmax is an Int32Array)
      copy.place = new copy.array.constructor(this.memory.buffer, copy.at, copy.size);
      if (copy.mode === "out") copy.place.fill(0);
      else copy.place.set(copy.array.subarray(0, copy.size));
    }
    kernel(addresses, extra);
    for (const { array, mode, place } of copies) if (mode !== "in") array.set(place);
  }
}

/** Number of floats of im2col's cols for geometry g. */
function windowsSize(g) {
  return g.c * g.k * g.k * g.n * g.ho * g.wo;
}
