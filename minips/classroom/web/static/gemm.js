// The three matrix products a network needs, on flat row-major Float32Arrays (the NumPy
// network calls BLAS instead; gemm.wat has them in WebAssembly SIMD, and the tests compare
// the two). Loops are ordered so the innermost one walks contiguous memory, and unrolled by
// four so each load serves four multiply-adds.

/**
 * c (m, n) = a (m, k) @ b (k, n), or c += ... when accumulate. i-p-j order: the inner loop
 * adds rows of b into a row of c; four rows of b per pass, so c is loaded and stored a
 * quarter as often (this is the loop all the time goes into).
 */
export function gemm(a, b, c, m, k, n, accumulate = false) {
  if (!accumulate) c.fill(0, 0, m * n);
  for (let i = 0; i < m; i++) addRowCombination(a, i * k, b, c, i * n, k, n, 1);
}

/** c (m, n) = a^T @ b with a (k, m), b (k, n); c += ... when accumulate. */
export function gemmTA(a, b, c, m, k, n, accumulate = false) {
  if (!accumulate) c.fill(0, 0, m * n);
  for (let i = 0; i < m; i++) addRowCombination(a, i, b, c, i * n, k, n, m);
}

/**
 * c[ci .. ci+n) += sum_p coef[p] * b[p*n .. p*n+n), coef[p] = a[a0 + p*stride], p < k.
 * Terms with coefficient 0 (dead ReLUs) are skipped.
 */
function addRowCombination(a, a0, b, c, ci, k, n, stride) {
  let p = 0;
  for (; p + 4 <= k; p += 4) {
    const c0 = a[a0 + p * stride];
    const c1 = a[a0 + (p + 1) * stride];
    const c2 = a[a0 + (p + 2) * stride];
    const c3 = a[a0 + (p + 3) * stride];
    if (c0 === 0 && c1 === 0 && c2 === 0 && c3 === 0) continue;
    const [b0, b1, b2, b3] = [p * n, (p + 1) * n, (p + 2) * n, (p + 3) * n];
    for (let j = 0; j < n; j++) {
      c[ci + j] += c0 * b[b0 + j] + c1 * b[b1 + j] + c2 * b[b2 + j] + c3 * b[b3 + j];
    }
  }
  for (; p < k; p++) {
    const cp = a[a0 + p * stride];
    if (cp === 0) continue;
    const bp = p * n;
    for (let j = 0; j < n; j++) c[ci + j] += cp * b[bp + j];
  }
}

/**
 * c (m, n) = a @ b^T with a (m, k), b (n, k): dot products of rows, four rows of b at a time
 * (each element of a is loaded once per four products); c += ... when accumulate. Sums are
 * doubles: more precise than float32 BLAS, well within the tests' 1e-4.
 */
export function gemmTB(a, b, c, m, k, n, accumulate = false) {
  for (let i = 0; i < m; i++) {
    const ai = i * k;
    const ci = i * n;
    let j = 0;
    for (; j + 4 <= n; j += 4) {
      const [b0, b1, b2, b3] = [j * k, (j + 1) * k, (j + 2) * k, (j + 3) * k];
      let [s0, s1, s2, s3] = [0, 0, 0, 0];
      for (let p = 0; p < k; p++) {
        const x = a[ai + p];
        s0 += x * b[b0 + p];
        s1 += x * b[b1 + p];
        s2 += x * b[b2 + p];
        s3 += x * b[b3 + p];
      }
      const keep = accumulate ? 1 : 0; // c's old values count only when accumulating
      c[ci + j] = s0 + keep * c[ci + j];
      c[ci + j + 1] = s1 + keep * c[ci + j + 1];
      c[ci + j + 2] = s2 + keep * c[ci + j + 2];
      c[ci + j + 3] = s3 + keep * c[ci + j + 3];
    }
    for (; j < n; j++) {
      let sum = accumulate ? c[ci + j] : 0;
      for (let p = 0; p < k; p++) sum += a[ai + p] * b[j * k + p];
      c[ci + j] = sum;
    }
  }
}
