// The network's loops other than the matrix products (gemm.js), in plain JavaScript on flat
// row-major arrays: the window copies of a convolution and the layout changes around its
// product, ReLU and max pooling. The "js" engine (engine.js) runs these; kernels.wat has
// the same loops in WebAssembly and the tests compare the two.

// ------------------------------------------------------------------ convolution windows

// A window geometry g is {n, c, h, w, k, s, p, ho, wo}: batch, channels, input height and
// width, kernel size, stride, zero padding, output height and width (ho = floor((h + 2p -
// k) / s) + 1). cols (C*k*k, N*Ho*Wo) holds every window of the batch, one per column:
//   cols[(c*k+u)*k+v][n*Ho*Wo + i*Wo + j] = xp[n, c, s*i+u, s*j+v]   (xp: x zero-padded by p)

/** im2col: fill cols from x; entries that fall on the padding are left as they are (0). */
export function im2col(x, cols, g) {
  forEachWindowEntry(g, (col, at) => (cols[col] = x[at]));
}

/** col2im, the adjoint of im2col: x[n, c, s*i+u-p, s*j+v-p] += cols[...] (padding skipped). */
export function col2im(cols, x, g) {
  forEachWindowEntry(g, (col, at) => (x[at] += cols[col]));
}

/** visit(col, at) for every entry of cols that lies on x (index col of cols, at of x). */
function forEachWindowEntry({ n, c, h, w, k, s, p, ho, wo }, visit) {
  const columns = n * ho * wo;
  for (let ch = 0; ch < c; ch++) {
    for (let u = 0; u < k; u++) {
      for (let v = 0; v < k; v++) {
        let col = ((ch * k + u) * k + v) * columns;
        for (let img = 0; img < n; img++) {
          const plane = (img * c + ch) * h * w;
          for (let i = 0; i < ho; i++) {
            const r = s * i + u - p;
            for (let j = 0; j < wo; j++, col++) {
              const q = s * j + v - p;
              if (r >= 0 && r < h && q >= 0 && q < w) visit(col, plane + r * w + q);
            }
          }
        }
      }
    }
  }
}

/** The convolution's output from its product: y (N, O, P) = yt (O, N, P) + b[o]. */
export function convOutput(yt, b, y, o, n, pixels) {
  for (let oc = 0; oc < o; oc++) {
    for (let img = 0; img < n; img++) {
      const from = (oc * n + img) * pixels;
      const to = (img * o + oc) * pixels;
      for (let q = 0; q < pixels; q++) y[to + q] = yt[from + q] + b[oc];
    }
  }
}

/** Back through convOutput: dyt (O, N, P) = dy (N, O, P); db[o] = sum over n, p of dy. */
export function convOutputGrad(dy, dyt, db, o, n, pixels) {
  for (let oc = 0; oc < o; oc++) {
    let sum = 0;
    for (let img = 0; img < n; img++) {
      const from = (img * o + oc) * pixels;
      const to = (oc * n + img) * pixels;
      for (let q = 0; q < pixels; q++) sum += dyt[to + q] = dy[from + q];
    }
    db[oc] = sum;
  }
}

// -------------------------------------------------------------------------- activations

/** y[i] = max(x[i], 0) for i < size (NaN gives 0). */
export function relu(x, y, size) {
  for (let i = 0; i < size; i++) y[i] = x[i] > 0 ? x[i] : 0;
}

/** dx[i] = dy[i] where y[i] > 0 (y: the forward output, positive exactly where x was), else 0. */
export function reluBackward(dy, y, dx, size) {
  for (let i = 0; i < size; i++) dx[i] = y[i] > 0 ? dy[i] : 0;
}

// -------------------------------------------------------------------------- max pooling

// A pooling geometry g is {planes, h, w, k, s, ho, wo}: N*C planes of h x w, windows k x k
// moved by s, no padding, ho = floor((h - k) / s) + 1.

/** y (planes, ho, wo) = the maximum of each window; argmax[o] = the flat index in x of the
 * first maximum of window o in row-major order (ties keep the earliest). */
export function maxPool(x, y, argmax, { planes, h, w, k, s, ho, wo }) {
  let out = 0;
  for (let plane = 0; plane < planes; plane++) {
    const base = plane * h * w;
    for (let i = 0; i < ho; i++) {
      for (let j = 0; j < wo; j++, out++) {
        let best = base + s * i * w + s * j;
        for (let u = 0; u < k; u++) {
          for (let v = 0; v < k; v++) {
            const idx = base + (s * i + u) * w + s * j + v;
            if (x[idx] > x[best]) best = idx; // strict: ties keep the earlier
          }
        }
        y[out] = x[best];
        argmax[out] = best;
      }
    }
  }
}

/** dx[argmax[o]] += dy[o] for o < size (dx zeroed by the caller). */
export function maxPoolBackward(dy, argmax, dx, size) {
  for (let o = 0; o < size; o++) dx[argmax[o]] += dy[o];
}
