;; The matrix products of gemm.js in WebAssembly with 128-bit SIMD (a v128 holds four
;; float32 lanes). The same products of the same row-major float32 matrices, but in this
;; module's memory: every pointer is a byte address into it (wasm_engine.js places the
;; arrays and calls these). Read it beside gemm.js: the arithmetic is the same, only each
;; instruction of the hot loops does four columns at once, and a few rows share each load.
;; kernels.wat (the other loops of the network) works on this same memory.
;;
;; Built into gemm.wasm by tools/build_wasm.py (wabt's wat2wasm).
;;
;;   product     c (m, n) += A (m, k) @ b (k, n)   A(i, p) at a + i*sai + p*sap (bytes), so
;;                 gemm:   A = a (m, k)             sai = 4k, sap = 4
;;                 gemmTA: A = a^T with a (k, m)    sai = 4,  sap = 4m
;;   product_tb  c (m, n) += a (m, k) @ b^T, b (n, k)   (gemmTB: dot products of rows)
;;
;; Both ADD into c (the caller zeroes c first for a plain product), so accumulate comes free.
(module
  (memory (export "memory") 1)

  ;; ---------------------------------------------------------------- c += A @ b

  ;; A tile of 4 rows x 8 columns of c kept in eight v128 registers for the whole sum over
  ;; p: each step loads b[p, j..j+8) once (two v128) and uses it for four rows, each row's
  ;; A(i, p) loaded straight into four lanes (v128.load32_splat: one broadcast load, where
  ;; f32.load then f32x4.splat takes a shuffle too). gemm.js's addRowCombination, four
  ;; columns per instruction and four rows per load of b.
  (func $tile_4x8
    (param $a i32) (param $sai i32) (param $sap i32)  ;; A(i, p) at a + i*sai + p*sap
    (param $b i32) (param $sb i32)                    ;; b[p, j] at b + p*sb + 4j
    (param $c i32) (param $sc i32)                    ;; c[i, j] at c + i*sc + 4j
    (param $k i32)
    (local $c0l v128) (local $c0h v128) (local $c1l v128) (local $c1h v128)
    (local $c2l v128) (local $c2h v128) (local $c3l v128) (local $c3h v128)
    (local $bl v128) (local $bh v128) (local $x v128)
    (local $a1 i32) (local $a2 i32) (local $a3 i32) (local $end i32)
    (local.set $a1 (local.get $sai))
    (local.set $a2 (i32.shl (local.get $sai) (i32.const 1)))
    (local.set $a3 (i32.add (local.get $a1) (local.get $a2)))
    (local.set $c0l (v128.load (local.get $c)))
    (local.set $c0h (v128.load offset=16 (local.get $c)))
    (local.set $c1l (v128.load (i32.add (local.get $c) (local.get $sc))))
    (local.set $c1h (v128.load offset=16 (i32.add (local.get $c) (local.get $sc))))
    (local.set $c2l (v128.load (i32.add (local.get $c) (i32.shl (local.get $sc) (i32.const 1)))))
    (local.set $c2h (v128.load offset=16 (i32.add (local.get $c) (i32.shl (local.get $sc) (i32.const 1)))))
    (local.set $c3l (v128.load (i32.add (local.get $c) (i32.mul (local.get $sc) (i32.const 3)))))
    (local.set $c3h (v128.load offset=16 (i32.add (local.get $c) (i32.mul (local.get $sc) (i32.const 3)))))
    (local.set $end (i32.add (local.get $b) (i32.mul (local.get $k) (local.get $sb))))
    (block $done
      (loop $p
        (br_if $done (i32.ge_u (local.get $b) (local.get $end)))
        (local.set $bl (v128.load (local.get $b)))
        (local.set $bh (v128.load offset=16 (local.get $b)))
        (local.set $x (v128.load32_splat (local.get $a)))
        (local.set $c0l (f32x4.add (local.get $c0l) (f32x4.mul (local.get $x) (local.get $bl))))
        (local.set $c0h (f32x4.add (local.get $c0h) (f32x4.mul (local.get $x) (local.get $bh))))
        (local.set $x (v128.load32_splat (i32.add (local.get $a) (local.get $a1))))
        (local.set $c1l (f32x4.add (local.get $c1l) (f32x4.mul (local.get $x) (local.get $bl))))
        (local.set $c1h (f32x4.add (local.get $c1h) (f32x4.mul (local.get $x) (local.get $bh))))
        (local.set $x (v128.load32_splat (i32.add (local.get $a) (local.get $a2))))
        (local.set $c2l (f32x4.add (local.get $c2l) (f32x4.mul (local.get $x) (local.get $bl))))
        (local.set $c2h (f32x4.add (local.get $c2h) (f32x4.mul (local.get $x) (local.get $bh))))
        (local.set $x (v128.load32_splat (i32.add (local.get $a) (local.get $a3))))
        (local.set $c3l (f32x4.add (local.get $c3l) (f32x4.mul (local.get $x) (local.get $bl))))
        (local.set $c3h (f32x4.add (local.get $c3h) (f32x4.mul (local.get $x) (local.get $bh))))
        (local.set $a (i32.add (local.get $a) (local.get $sap)))
        (local.set $b (i32.add (local.get $b) (local.get $sb)))
        (br $p)))
    (v128.store (local.get $c) (local.get $c0l))
    (v128.store offset=16 (local.get $c) (local.get $c0h))
    (v128.store (i32.add (local.get $c) (local.get $sc)) (local.get $c1l))
    (v128.store offset=16 (i32.add (local.get $c) (local.get $sc)) (local.get $c1h))
    (v128.store (i32.add (local.get $c) (i32.shl (local.get $sc) (i32.const 1))) (local.get $c2l))
    (v128.store offset=16 (i32.add (local.get $c) (i32.shl (local.get $sc) (i32.const 1))) (local.get $c2h))
    (v128.store (i32.add (local.get $c) (i32.mul (local.get $sc) (i32.const 3))) (local.get $c3l))
    (v128.store offset=16 (i32.add (local.get $c) (i32.mul (local.get $sc) (i32.const 3))) (local.get $c3h)))

  ;; The same for a single row (the last m mod 4 rows).
  (func $tile_1x8
    (param $a i32) (param $sap i32) (param $b i32) (param $sb i32) (param $c i32) (param $k i32)
    (local $cl v128) (local $ch v128) (local $x v128) (local $end i32)
    (local.set $cl (v128.load (local.get $c)))
    (local.set $ch (v128.load offset=16 (local.get $c)))
    (local.set $end (i32.add (local.get $b) (i32.mul (local.get $k) (local.get $sb))))
    (block $done
      (loop $p
        (br_if $done (i32.ge_u (local.get $b) (local.get $end)))
        (local.set $x (v128.load32_splat (local.get $a)))
        (local.set $cl (f32x4.add (local.get $cl) (f32x4.mul (local.get $x) (v128.load (local.get $b)))))
        (local.set $ch (f32x4.add (local.get $ch) (f32x4.mul (local.get $x) (v128.load offset=16 (local.get $b)))))
        (local.set $a (i32.add (local.get $a) (local.get $sap)))
        (local.set $b (i32.add (local.get $b) (local.get $sb)))
        (br $p)))
    (v128.store (local.get $c) (local.get $cl))
    (v128.store offset=16 (local.get $c) (local.get $ch)))

  ;; c[i, j] += sum_p A(i, p) * b[p, j] one float at a time, for i < m and j < cols: the
  ;; last n mod 8 columns.
  (func $scalar_columns
    (param $a i32) (param $sai i32) (param $sap i32) (param $b i32) (param $sb i32)
    (param $c i32) (param $sc i32) (param $m i32) (param $k i32) (param $cols i32)
    (local $i i32) (local $j i32) (local $p i32) (local $sum f32)
    (local $ai i32) (local $bj i32) (local $cij i32)
    (loop $rows
      (local.set $j (i32.const 0))
      (loop $columns
        (local.set $cij (i32.add (i32.add (local.get $c) (i32.mul (local.get $i) (local.get $sc)))
                                 (i32.shl (local.get $j) (i32.const 2))))
        (local.set $sum (f32.load (local.get $cij)))
        (local.set $ai (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $sai))))
        (local.set $bj (i32.add (local.get $b) (i32.shl (local.get $j) (i32.const 2))))
        (local.set $p (i32.const 0))
        (block $done
          (loop $terms
            (br_if $done (i32.ge_u (local.get $p) (local.get $k)))
            (local.set $sum (f32.add (local.get $sum)
                                     (f32.mul (f32.load (local.get $ai)) (f32.load (local.get $bj)))))
            (local.set $ai (i32.add (local.get $ai) (local.get $sap)))
            (local.set $bj (i32.add (local.get $bj) (local.get $sb)))
            (local.set $p (i32.add (local.get $p) (i32.const 1)))
            (br $terms)))
        (f32.store (local.get $cij) (local.get $sum))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br_if $columns (i32.lt_u (local.get $j) (local.get $cols))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $rows (i32.lt_u (local.get $i) (local.get $m)))))

  ;; Copy the k x 8 block of b at b (rows sb bytes apart) into k x 8 contiguous floats at
  ;; packed. The rows of a block are a whole row of b apart; when that is a multiple of
  ;; 4 KiB (LeNet's conv2: 4096 columns) they all compete for the same few cache sets, so
  ;; the tiles read the copy instead (the packing of Goto & van de Geijn 2008).
  (func $pack_columns (param $b i32) (param $sb i32) (param $k i32) (param $packed i32)
    (local $end i32)
    (local.set $end (i32.add (local.get $packed) (i32.shl (local.get $k) (i32.const 5))))
    (block $done
      (loop $rows
        (br_if $done (i32.ge_u (local.get $packed) (local.get $end)))
        (v128.store (local.get $packed) (v128.load (local.get $b)))
        (v128.store offset=16 (local.get $packed) (v128.load offset=16 (local.get $b)))
        (local.set $b (i32.add (local.get $b) (local.get $sb)))
        (local.set $packed (i32.add (local.get $packed) (i32.const 32)))
        (br $rows))))

  ;; c[i0..i1, j..j+8) += A(i0..i1, :) @ the packed block of b at panel: 4-row tiles, then
  ;; single rows. c_j is the address of c[0, j]; rows of c are sc bytes apart.
  (func $rows_against_block
    (param $a i32) (param $sai i32) (param $sap i32) (param $panel i32) (param $c_j i32)
    (param $sc i32) (param $k i32) (param $i0 i32) (param $i1 i32)
    (local $i i32)
    (local.set $i (local.get $i0))
    (block $fours_done
      (loop $fours
        (br_if $fours_done (i32.gt_u (i32.add (local.get $i) (i32.const 4)) (local.get $i1)))
        (call $tile_4x8
          (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $sai)))
          (local.get $sai) (local.get $sap) (local.get $panel) (i32.const 32)
          (i32.add (local.get $c_j) (i32.mul (local.get $i) (local.get $sc)))
          (local.get $sc) (local.get $k))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $fours)))
    (block $ones_done
      (loop $ones
        (br_if $ones_done (i32.ge_u (local.get $i) (local.get $i1)))
        (call $tile_1x8
          (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $sai)))
          (local.get $sap) (local.get $panel) (i32.const 32)
          (i32.add (local.get $c_j) (i32.mul (local.get $i) (local.get $sc)))
          (local.get $k))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $ones))))

  ;; Whether product packs all of b before its tiles, row by row of c: when b (k x n
  ;; floats) fits in 1 MiB, about a core's second-level cache, and the tiles are short (k
  ;; <= m terms, so loading and storing c's tiles is much of the work). Else one 8-column
  ;; block at a time.
  (func $packs_all_of_b (param $m i32) (param $k i32) (param $n i32) (result i32)
    (i32.and (i32.le_u (i32.mul (local.get $k) (local.get $n)) (i32.const 262144))
             (i32.le_u (local.get $k) (local.get $m))))

  ;; Floats of scratch product needs for m, k and n (its `packed`).
  (func (export "product_scratch") (param $m i32) (param $k i32) (param $n i32) (result i32)
    (if (result i32) (call $packs_all_of_b (local.get $m) (local.get $k) (local.get $n))
      (then (i32.mul (local.get $k) (i32.and (local.get $n) (i32.const -8))))
      (else (i32.shl (local.get $k) (i32.const 3)))))

  ;; c (m, n) += A (m, k) @ b (k, n); m, n >= 1; packed: product_scratch(m, k, n) floats.
  ;; The tiles cover c's full 8-column blocks in one of two orders:
  ;; - b fits in cache (packs_all_of_b): every block packed first, then 4-row groups
  ;;   outside, blocks inside: c is walked row by row and each group's rows of A stay in
  ;;   the first-level cache (LeNet's dcols = W^T dY: m = 500 rows, k = 50);
  ;; - otherwise blocks outside, each packed just before its turn, every row inside: the
  ;;   block stays in cache while A, smaller than b here, is read again per block (LeNet's
  ;;   conv2 forward: b = cols is 8 MB).
  ;; The last n mod 8 columns, one float at a time.
  (func (export "product")
    (param $a i32) (param $sai i32) (param $sap i32) (param $b i32) (param $c i32)
    (param $m i32) (param $k i32) (param $n i32) (param $packed i32)
    (local $sb i32) (local $blocks i32) (local $block i32) (local $panel i32) (local $i i32)
    (local.set $sb (i32.shl (local.get $n) (i32.const 2)))  ;; a row of b or c, in bytes
    (local.set $blocks (i32.shr_u (local.get $n) (i32.const 3)))
    (if (call $packs_all_of_b (local.get $m) (local.get $k) (local.get $n))
      (then
        (block $packed_all
          (loop $pack
            (br_if $packed_all (i32.ge_u (local.get $block) (local.get $blocks)))
            (call $pack_columns (i32.add (local.get $b) (i32.shl (local.get $block) (i32.const 5)))
              (local.get $sb) (local.get $k)
              (i32.add (local.get $packed) (i32.mul (local.get $block) (i32.shl (local.get $k) (i32.const 5)))))
            (local.set $block (i32.add (local.get $block) (i32.const 1)))
            (br $pack)))
        (block $groups_done
          (loop $groups
            (br_if $groups_done (i32.ge_u (local.get $i) (local.get $m)))
            (local.set $block (i32.const 0))
            (block $blocks_done
              (loop $each_block
                (br_if $blocks_done (i32.ge_u (local.get $block) (local.get $blocks)))
                (call $rows_against_block (local.get $a) (local.get $sai) (local.get $sap)
                  (i32.add (local.get $packed) (i32.mul (local.get $block) (i32.shl (local.get $k) (i32.const 5))))
                  (i32.add (local.get $c) (i32.shl (local.get $block) (i32.const 5)))
                  (local.get $sb) (local.get $k)
                  (local.get $i) (call $min (i32.add (local.get $i) (i32.const 4)) (local.get $m)))
                (local.set $block (i32.add (local.get $block) (i32.const 1)))
                (br $each_block)))
            (local.set $i (i32.add (local.get $i) (i32.const 4)))
            (br $groups))))
      (else
        (block $blocks_done
          (loop $each_block
            (br_if $blocks_done (i32.ge_u (local.get $block) (local.get $blocks)))
            (call $pack_columns (i32.add (local.get $b) (i32.shl (local.get $block) (i32.const 5)))
              (local.get $sb) (local.get $k) (local.get $packed))
            (call $rows_against_block (local.get $a) (local.get $sai) (local.get $sap)
              (local.get $packed) (i32.add (local.get $c) (i32.shl (local.get $block) (i32.const 5)))
              (local.get $sb) (local.get $k) (i32.const 0) (local.get $m))
            (local.set $block (i32.add (local.get $block) (i32.const 1)))
            (br $each_block)))))
    (if (i32.and (local.get $n) (i32.const 7))
      (then
        (call $scalar_columns
          (local.get $a) (local.get $sai) (local.get $sap)
          (i32.add (local.get $b) (i32.shl (local.get $blocks) (i32.const 5))) (local.get $sb)
          (i32.add (local.get $c) (i32.shl (local.get $blocks) (i32.const 5))) (local.get $sb)
          (local.get $m) (local.get $k) (i32.and (local.get $n) (i32.const 7))))))

  (func $min (param $x i32) (param $y i32) (result i32)
    (select (local.get $x) (local.get $y) (i32.lt_u (local.get $x) (local.get $y))))

  ;; ------------------------------------------------------------- c += a @ b^T

  ;; The sum of the four lanes of acc plus the terms p in [from, k) that a four-wide loop
  ;; left over: sum_p x[p] * y[p] for rows x, y (byte addresses) once acc holds the rest.
  (func $finish_dot (param $acc v128) (param $x i32) (param $y i32) (param $from i32) (param $k i32)
    (result f32)
    (local $sum f32)
    (local.set $sum
      (f32.add
        (f32.add (f32x4.extract_lane 0 (local.get $acc)) (f32x4.extract_lane 1 (local.get $acc)))
        (f32.add (f32x4.extract_lane 2 (local.get $acc)) (f32x4.extract_lane 3 (local.get $acc)))))
    (local.set $x (i32.add (local.get $x) (i32.shl (local.get $from) (i32.const 2))))
    (local.set $y (i32.add (local.get $y) (i32.shl (local.get $from) (i32.const 2))))
    (block $done
      (loop $terms
        (br_if $done (i32.ge_u (local.get $from) (local.get $k)))
        (local.set $sum (f32.add (local.get $sum) (f32.mul (f32.load (local.get $x)) (f32.load (local.get $y)))))
        (local.set $x (i32.add (local.get $x) (i32.const 4)))
        (local.set $y (i32.add (local.get $y) (i32.const 4)))
        (local.set $from (i32.add (local.get $from) (i32.const 1)))
        (br $terms)))
    (local.get $sum))

  ;; One dot product of rows x and y of length k, four lanes at a time.
  (func $dot (param $x i32) (param $y i32) (param $k i32) (result f32)
    (local $acc v128) (local $q i32) (local $end i32)
    (local.set $end (i32.shl (i32.and (local.get $k) (i32.const -4)) (i32.const 2)))
    (block $done
      (loop $quads
        (br_if $done (i32.ge_u (local.get $q) (local.get $end)))
        (local.set $acc (f32x4.add (local.get $acc)
          (f32x4.mul (v128.load (i32.add (local.get $x) (local.get $q)))
                     (v128.load (i32.add (local.get $y) (local.get $q))))))
        (local.set $q (i32.add (local.get $q) (i32.const 16)))
        (br $quads)))
    (call $finish_dot (local.get $acc) (local.get $x) (local.get $y)
      (i32.shr_u (local.get $end) (i32.const 2)) (local.get $k)))

  ;; c[r, s] += a[r] . b[s] for 2 rows of a and 4 rows of b (all k long, contiguous): eight
  ;; four-lane partial sums, so each load of a serves four products and each of b two
  ;; (gemm.js's gemmTB does four rows of b per row of a).
  (func $dots_2x4
    (param $a i32) (param $b i32) (param $sk i32) (param $c i32) (param $sc i32) (param $k i32)
    (local $s00 v128) (local $s01 v128) (local $s02 v128) (local $s03 v128)
    (local $s10 v128) (local $s11 v128) (local $s12 v128) (local $s13 v128)
    (local $x0 v128) (local $x1 v128) (local $y v128)
    (local $a1 i32) (local $b1 i32) (local $b2 i32) (local $b3 i32) (local $q i32) (local $end i32)
    (local.set $a1 (i32.add (local.get $a) (local.get $sk)))
    (local.set $b1 (i32.add (local.get $b) (local.get $sk)))
    (local.set $b2 (i32.add (local.get $b1) (local.get $sk)))
    (local.set $b3 (i32.add (local.get $b2) (local.get $sk)))
    (local.set $end (i32.shl (i32.and (local.get $k) (i32.const -4)) (i32.const 2)))
    (block $done
      (loop $quads
        (br_if $done (i32.ge_u (local.get $q) (local.get $end)))
        (local.set $x0 (v128.load (i32.add (local.get $a) (local.get $q))))
        (local.set $x1 (v128.load (i32.add (local.get $a1) (local.get $q))))
        (local.set $y (v128.load (i32.add (local.get $b) (local.get $q))))
        (local.set $s00 (f32x4.add (local.get $s00) (f32x4.mul (local.get $x0) (local.get $y))))
        (local.set $s10 (f32x4.add (local.get $s10) (f32x4.mul (local.get $x1) (local.get $y))))
        (local.set $y (v128.load (i32.add (local.get $b1) (local.get $q))))
        (local.set $s01 (f32x4.add (local.get $s01) (f32x4.mul (local.get $x0) (local.get $y))))
        (local.set $s11 (f32x4.add (local.get $s11) (f32x4.mul (local.get $x1) (local.get $y))))
        (local.set $y (v128.load (i32.add (local.get $b2) (local.get $q))))
        (local.set $s02 (f32x4.add (local.get $s02) (f32x4.mul (local.get $x0) (local.get $y))))
        (local.set $s12 (f32x4.add (local.get $s12) (f32x4.mul (local.get $x1) (local.get $y))))
        (local.set $y (v128.load (i32.add (local.get $b3) (local.get $q))))
        (local.set $s03 (f32x4.add (local.get $s03) (f32x4.mul (local.get $x0) (local.get $y))))
        (local.set $s13 (f32x4.add (local.get $s13) (f32x4.mul (local.get $x1) (local.get $y))))
        (local.set $q (i32.add (local.get $q) (i32.const 16)))
        (br $quads)))
    (local.set $q (i32.shr_u (local.get $end) (i32.const 2)))  ;; the first p left over
    (call $add_to (local.get $c) (call $finish_dot (local.get $s00) (local.get $a) (local.get $b) (local.get $q) (local.get $k)))
    (call $add_to (i32.add (local.get $c) (i32.const 4)) (call $finish_dot (local.get $s01) (local.get $a) (local.get $b1) (local.get $q) (local.get $k)))
    (call $add_to (i32.add (local.get $c) (i32.const 8)) (call $finish_dot (local.get $s02) (local.get $a) (local.get $b2) (local.get $q) (local.get $k)))
    (call $add_to (i32.add (local.get $c) (i32.const 12)) (call $finish_dot (local.get $s03) (local.get $a) (local.get $b3) (local.get $q) (local.get $k)))
    (local.set $c (i32.add (local.get $c) (local.get $sc)))
    (call $add_to (local.get $c) (call $finish_dot (local.get $s10) (local.get $a1) (local.get $b) (local.get $q) (local.get $k)))
    (call $add_to (i32.add (local.get $c) (i32.const 4)) (call $finish_dot (local.get $s11) (local.get $a1) (local.get $b1) (local.get $q) (local.get $k)))
    (call $add_to (i32.add (local.get $c) (i32.const 8)) (call $finish_dot (local.get $s12) (local.get $a1) (local.get $b2) (local.get $q) (local.get $k)))
    (call $add_to (i32.add (local.get $c) (i32.const 12)) (call $finish_dot (local.get $s13) (local.get $a1) (local.get $b3) (local.get $q) (local.get $k))))

  (func $add_to (param $at i32) (param $value f32)
    (f32.store (local.get $at) (f32.add (f32.load (local.get $at)) (local.get $value))))

  ;; c (m, n) += a (m, k) @ b^T, b (n, k), in slices of 512 of the k terms: a slice of
  ;; every row of a and b is 2 KiB, so the rows the inner loops reuse stay in cache even
  ;; when rows are long (LeNet's conv1 dW: k = 64 images x 576 pixels).
  (func (export "product_tb")
    (param $a i32) (param $b i32) (param $c i32) (param $m i32) (param $k i32) (param $n i32)
    (local $k0 i32) (local $len i32)
    (block $done
      (loop $slices
        (br_if $done (i32.ge_u (local.get $k0) (local.get $k)))
        (local.set $len (i32.sub (local.get $k) (local.get $k0)))
        (if (i32.gt_u (local.get $len) (i32.const 512)) (then (local.set $len (i32.const 512))))
        (call $slice_tb
          (i32.add (local.get $a) (i32.shl (local.get $k0) (i32.const 2)))
          (i32.add (local.get $b) (i32.shl (local.get $k0) (i32.const 2)))
          (local.get $c) (local.get $m) (local.get $len) (local.get $n)
          (i32.shl (local.get $k) (i32.const 2)))
        (local.set $k0 (i32.add (local.get $k0) (local.get $len)))
        (br $slices))))

  ;; c (m, n) += the terms of one slice: len terms starting at a and b, whose rows are sk
  ;; bytes apart. Blocks of 4 rows of b outside, pairs of rows of a inside (b's four rows
  ;; stay in cache); what is left over, one dot product at a time.
  (func $slice_tb
    (param $a i32) (param $b i32) (param $c i32) (param $m i32) (param $len i32) (param $n i32)
    (param $sk i32)
    (local $sc i32) (local $i i32) (local $j i32)
    (local.set $sc (i32.shl (local.get $n) (i32.const 2)))
    (block $quads_done
      (loop $quads
        (br_if $quads_done (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $n)))
        (local.set $i (i32.const 0))
        (block $pairs_done
          (loop $pairs
            (br_if $pairs_done (i32.gt_u (i32.add (local.get $i) (i32.const 2)) (local.get $m)))
            (call $dots_2x4
              (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $sk)))
              (i32.add (local.get $b) (i32.mul (local.get $j) (local.get $sk)))
              (local.get $sk)
              (i32.add (i32.add (local.get $c) (i32.mul (local.get $i) (local.get $sc)))
                       (i32.shl (local.get $j) (i32.const 2)))
              (local.get $sc) (local.get $len))
            (local.set $i (i32.add (local.get $i) (i32.const 2)))
            (br $pairs)))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $quads)))
    ;; Left over: the last row of a when m is odd (columns < j), and every row for the
    ;; last n mod 4 columns.
    (call $single_dots (local.get $a) (local.get $b) (local.get $c) (local.get $len)
      (local.get $sk) (local.get $n)
      (i32.and (local.get $m) (i32.const -2)) (local.get $m) (i32.const 0) (local.get $j))
    (call $single_dots (local.get $a) (local.get $b) (local.get $c) (local.get $len)
      (local.get $sk) (local.get $n)
      (i32.const 0) (local.get $m) (local.get $j) (local.get $n)))

  ;; c[i, j] += a[i] . b[j] (len terms; rows sk bytes apart) for i in [i0, i1), j in
  ;; [j0, j1), one dot product each.
  (func $single_dots
    (param $a i32) (param $b i32) (param $c i32) (param $len i32) (param $sk i32) (param $n i32)
    (param $i0 i32) (param $i1 i32) (param $j0 i32) (param $j1 i32)
    (local $i i32) (local $j i32)
    (local.set $i (local.get $i0))
    (block $rows_done
      (loop $rows
        (br_if $rows_done (i32.ge_u (local.get $i) (local.get $i1)))
        (local.set $j (local.get $j0))
        (block $columns_done
          (loop $columns
            (br_if $columns_done (i32.ge_u (local.get $j) (local.get $j1)))
            (call $add_to
              (i32.add (local.get $c)
                (i32.shl (i32.add (i32.mul (local.get $i) (local.get $n)) (local.get $j)) (i32.const 2)))
              (call $dot (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $sk)))
                         (i32.add (local.get $b) (i32.mul (local.get $j) (local.get $sk)))
                         (local.get $len)))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $columns)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $rows))))
)
