;; The loops of kernels.js in WebAssembly with 128-bit SIMD (a v128 holds four float32
;; lanes): the window copies of a convolution and the layout around its product, ReLU and
;; max pooling, under the same names (im2col, col2im, conv_output, conv_output_grad, relu,
;; relu_backward, max_pool, max_pool_backward). They work on the memory of gemm.wasm (the
;; products), imported as "gemm" "memory": every pointer is a byte address into it.
;;
;; Built into kernels.wasm by tools/build_wasm.py (wabt's wat2wasm).
(module
  (import "gemm" "memory" (memory 1))

  ;; ------------------------------------------------------------- im2col, col2im

  ;; im2col (to_x = 0) or col2im (to_x = 1) of kernels.js for the geometry (n, c, h, w, k,
  ;; s, p, ho, wo). Each (channel, u, v) row of cols is, per image and output row i, one
  ;; run of output columns j whose input column q = s*j + v - p falls inside [0, w): the
  ;; run's ends are worked out once per (u, v), so the inner loop has no bounds tests.
  (func $windows
    (param $x i32) (param $cols i32) (param $n i32) (param $c i32) (param $h i32)
    (param $w i32) (param $k i32) (param $s i32) (param $p i32) (param $ho i32) (param $wo i32)
    (param $to_x i32)
    (local $ch i32) (local $u i32) (local $v i32) (local $img i32) (local $i i32)
    (local $r i32) (local $j0 i32) (local $j1 i32) (local $plane i32) (local $col i32)
    (local.set $col (local.get $cols))
    (loop $channels
      (local.set $u (i32.const 0))
      (loop $us
        (local.set $v (i32.const 0))
        (loop $vs
          ;; j0 = first j with s*j >= p - v; j1 = first j with s*j >= w + p - v (<= wo)
          (local.set $j0 (call $ceil_div_nonneg (i32.sub (local.get $p) (local.get $v)) (local.get $s)))
          (local.set $j1 (call $ceil_div_nonneg
            (i32.sub (i32.add (local.get $w) (local.get $p)) (local.get $v)) (local.get $s)))
          (if (i32.gt_s (local.get $j1) (local.get $wo)) (then (local.set $j1 (local.get $wo))))
          (local.set $img (i32.const 0))
          (loop $images
            (local.set $plane (i32.add (local.get $x) (i32.shl
              (i32.mul (i32.add (i32.mul (local.get $img) (local.get $c)) (local.get $ch))
                       (i32.mul (local.get $h) (local.get $w)))
              (i32.const 2))))
            (local.set $i (i32.const 0))
            (loop $rows
              (local.set $r (i32.sub (i32.add (i32.mul (local.get $s) (local.get $i)) (local.get $u))
                                     (local.get $p)))
              ;; r inside [0, h) (unsigned: a negative r is huge) and a non-empty run
              (if (i32.and (i32.lt_u (local.get $r) (local.get $h))
                           (i32.lt_s (local.get $j0) (local.get $j1)))
                (then
                  (call $run
                    (i32.add (local.get $plane) (i32.shl
                      (i32.sub (i32.add (i32.add (i32.mul (local.get $r) (local.get $w))
                                                 (i32.mul (local.get $s) (local.get $j0)))
                                        (local.get $v))
                               (local.get $p))
                      (i32.const 2)))
                    (i32.add (local.get $col) (i32.shl (local.get $j0) (i32.const 2)))
                    (i32.sub (local.get $j1) (local.get $j0)) (local.get $s) (local.get $to_x))))
              (local.set $col (i32.add (local.get $col) (i32.shl (local.get $wo) (i32.const 2))))
              (local.set $i (i32.add (local.get $i) (i32.const 1)))
              (br_if $rows (i32.lt_u (local.get $i) (local.get $ho))))
            (local.set $img (i32.add (local.get $img) (i32.const 1)))
            (br_if $images (i32.lt_u (local.get $img) (local.get $n))))
          (local.set $v (i32.add (local.get $v) (i32.const 1)))
          (br_if $vs (i32.lt_u (local.get $v) (local.get $k))))
        (local.set $u (i32.add (local.get $u) (i32.const 1)))
        (br_if $us (i32.lt_u (local.get $u) (local.get $k))))
      (local.set $ch (i32.add (local.get $ch) (i32.const 1)))
      (br_if $channels (i32.lt_u (local.get $ch) (local.get $c)))))

  ;; ceil(a / s) for s >= 1, and 0 when a <= 0.
  (func $ceil_div_nonneg (param $a i32) (param $s i32) (result i32)
    (if (result i32) (i32.le_s (local.get $a) (i32.const 0))
      (then (i32.const 0))
      (else (i32.div_u (i32.sub (i32.add (local.get $a) (local.get $s)) (i32.const 1)) (local.get $s)))))

  ;; One run of len entries: col[j] = x[s*j] (to_x = 0) or x[s*j] += col[j] (to_x = 1).
  ;; With stride 1 both sides are contiguous: four floats per v128.
  (func $run (param $x i32) (param $col i32) (param $len i32) (param $s i32) (param $to_x i32)
    (local $end i32)
    (if (i32.eq (local.get $s) (i32.const 1))
      (then
        (local.set $end (i32.add (local.get $col) (i32.shl (i32.and (local.get $len) (i32.const -4)) (i32.const 2))))
        (block $done
          (loop $quads
            (br_if $done (i32.ge_u (local.get $col) (local.get $end)))
            (if (local.get $to_x)
              (then (v128.store (local.get $x)
                      (f32x4.add (v128.load (local.get $x)) (v128.load (local.get $col)))))
              (else (v128.store (local.get $col) (v128.load (local.get $x)))))
            (local.set $x (i32.add (local.get $x) (i32.const 16)))
            (local.set $col (i32.add (local.get $col) (i32.const 16)))
            (br $quads)))
        (local.set $len (i32.and (local.get $len) (i32.const 3)))))
    ;; what is left (any stride): one float at a time
    (block $done
      (loop $singles
        (br_if $done (i32.eqz (local.get $len)))
        (if (local.get $to_x)
          (then (f32.store (local.get $x) (f32.add (f32.load (local.get $x)) (f32.load (local.get $col)))))
          (else (f32.store (local.get $col) (f32.load (local.get $x)))))
        (local.set $x (i32.add (local.get $x) (i32.shl (local.get $s) (i32.const 2))))
        (local.set $col (i32.add (local.get $col) (i32.const 4)))
        (local.set $len (i32.sub (local.get $len) (i32.const 1)))
        (br $singles))))

  (func (export "im2col")
    (param $x i32) (param $cols i32) (param $n i32) (param $c i32) (param $h i32)
    (param $w i32) (param $k i32) (param $s i32) (param $p i32) (param $ho i32) (param $wo i32)
    (call $windows (local.get $x) (local.get $cols) (local.get $n) (local.get $c) (local.get $h)
      (local.get $w) (local.get $k) (local.get $s) (local.get $p) (local.get $ho) (local.get $wo)
      (i32.const 0)))

  (func (export "col2im")
    (param $cols i32) (param $x i32) (param $n i32) (param $c i32) (param $h i32)
    (param $w i32) (param $k i32) (param $s i32) (param $p i32) (param $ho i32) (param $wo i32)
    (call $windows (local.get $x) (local.get $cols) (local.get $n) (local.get $c) (local.get $h)
      (local.get $w) (local.get $k) (local.get $s) (local.get $p) (local.get $ho) (local.get $wo)
      (i32.const 1)))

  ;; ------------------------------------------------- the layout around the conv product

  ;; y (N, O, P) = yt (O, N, P) + b[o]: one run of P floats per (o, image), b[o] in every lane.
  (func (export "conv_output")
    (param $yt i32) (param $b i32) (param $y i32) (param $o i32) (param $n i32) (param $pixels i32)
    (local $oc i32) (local $img i32) (local $bias v128) (local $run i32)
    (local.set $run (i32.shl (local.get $pixels) (i32.const 2)))
    (loop $channels
      (local.set $bias (v128.load32_splat (i32.add (local.get $b) (i32.shl (local.get $oc) (i32.const 2)))))
      (local.set $img (i32.const 0))
      (loop $images
        (call $add_run
          (local.get $yt)  ;; yt advances run by run: (o, image) is its natural order
          (i32.add (local.get $y) (i32.mul (local.get $run)
            (i32.add (i32.mul (local.get $img) (local.get $o)) (local.get $oc))))
          (local.get $bias) (local.get $pixels))
        (local.set $yt (i32.add (local.get $yt) (local.get $run)))
        (local.set $img (i32.add (local.get $img) (i32.const 1)))
        (br_if $images (i32.lt_u (local.get $img) (local.get $n))))
      (local.set $oc (i32.add (local.get $oc) (i32.const 1)))
      (br_if $channels (i32.lt_u (local.get $oc) (local.get $o)))))

  ;; to[q] = from[q] + lane 0 of bias, q < len.
  (func $add_run (param $from i32) (param $to i32) (param $bias v128) (param $len i32)
    (local $end i32)
    (local.set $end (i32.add (local.get $from) (i32.shl (i32.and (local.get $len) (i32.const -4)) (i32.const 2))))
    (block $done
      (loop $quads
        (br_if $done (i32.ge_u (local.get $from) (local.get $end)))
        (v128.store (local.get $to) (f32x4.add (v128.load (local.get $from)) (local.get $bias)))
        (local.set $from (i32.add (local.get $from) (i32.const 16)))
        (local.set $to (i32.add (local.get $to) (i32.const 16)))
        (br $quads)))
    (local.set $end (i32.add (local.get $end) (i32.shl (i32.and (local.get $len) (i32.const 3)) (i32.const 2))))
    (block $done
      (loop $singles
        (br_if $done (i32.ge_u (local.get $from) (local.get $end)))
        (f32.store (local.get $to) (f32.add (f32.load (local.get $from)) (f32x4.extract_lane 0 (local.get $bias))))
        (local.set $from (i32.add (local.get $from) (i32.const 4)))
        (local.set $to (i32.add (local.get $to) (i32.const 4)))
        (br $singles))))

  ;; dyt (O, N, P) = dy (N, O, P) and db[o] = the sum over images and pixels of dy[., o, .],
  ;; summed in float64 (two lanes per f64x2) as the JavaScript sums are.
  (func (export "conv_output_grad")
    (param $dy i32) (param $dyt i32) (param $db i32) (param $o i32) (param $n i32) (param $pixels i32)
    (local $oc i32) (local $img i32) (local $run i32) (local $from i32) (local $end i32)
    (local $sum v128) (local $x v128) (local $rest f64)
    (local.set $run (i32.shl (local.get $pixels) (i32.const 2)))
    (loop $channels
      (local.set $sum (v128.const f64x2 0 0))
      (local.set $rest (f64.const 0))  ;; the runs' last P mod 4 floats
      (local.set $img (i32.const 0))
      (loop $images
        (local.set $from (i32.add (local.get $dy) (i32.mul (local.get $run)
          (i32.add (i32.mul (local.get $img) (local.get $o)) (local.get $oc)))))
        (local.set $end (i32.add (local.get $from)
          (i32.shl (i32.and (local.get $pixels) (i32.const -4)) (i32.const 2))))
        (block $done
          (loop $quads
            (br_if $done (i32.ge_u (local.get $from) (local.get $end)))
            (local.set $x (v128.load (local.get $from)))
            (v128.store (local.get $dyt) (local.get $x))
            (local.set $sum (f64x2.add (local.get $sum) (f64x2.promote_low_f32x4 (local.get $x))))
            (local.set $sum (f64x2.add (local.get $sum) (f64x2.promote_low_f32x4
              (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $x) (local.get $x)))))
            (local.set $from (i32.add (local.get $from) (i32.const 16)))
            (local.set $dyt (i32.add (local.get $dyt) (i32.const 16)))
            (br $quads)))
        (local.set $end (i32.add (local.get $end) (i32.shl (i32.and (local.get $pixels) (i32.const 3)) (i32.const 2))))
        (block $done
          (loop $singles
            (br_if $done (i32.ge_u (local.get $from) (local.get $end)))
            (f32.store (local.get $dyt) (f32.load (local.get $from)))
            (local.set $rest (f64.add (local.get $rest) (f64.promote_f32 (f32.load (local.get $from)))))
            (local.set $from (i32.add (local.get $from) (i32.const 4)))
            (local.set $dyt (i32.add (local.get $dyt) (i32.const 4)))
            (br $singles)))
        (local.set $img (i32.add (local.get $img) (i32.const 1)))
        (br_if $images (i32.lt_u (local.get $img) (local.get $n))))
      (f32.store (i32.add (local.get $db) (i32.shl (local.get $oc) (i32.const 2)))
        (f32.demote_f64 (f64.add (local.get $rest)
          (f64.add (f64x2.extract_lane 0 (local.get $sum)) (f64x2.extract_lane 1 (local.get $sum))))))
      (local.set $oc (i32.add (local.get $oc) (i32.const 1)))
      (br_if $channels (i32.lt_u (local.get $oc) (local.get $o)))))

  ;; ------------------------------------------------------------------------- ReLU

  ;; y = max(x, 0): f32x4.pmax(0, x) is "0 < x ? x : 0", NaN giving 0 as in kernels.js.
  (func (export "relu") (param $x i32) (param $y i32) (param $size i32)
    (local $end i32) (local $v f32)
    (local.set $end (i32.add (local.get $x) (i32.shl (i32.and (local.get $size) (i32.const -4)) (i32.const 2))))
    (block $done
      (loop $quads
        (br_if $done (i32.ge_u (local.get $x) (local.get $end)))
        (v128.store (local.get $y) (f32x4.pmax (v128.const f32x4 0 0 0 0) (v128.load (local.get $x))))
        (local.set $x (i32.add (local.get $x) (i32.const 16)))
        (local.set $y (i32.add (local.get $y) (i32.const 16)))
        (br $quads)))
    (local.set $end (i32.add (local.get $end) (i32.shl (i32.and (local.get $size) (i32.const 3)) (i32.const 2))))
    (block $done
      (loop $singles
        (br_if $done (i32.ge_u (local.get $x) (local.get $end)))
        (local.set $v (f32.load (local.get $x)))
        (f32.store (local.get $y) (select (local.get $v) (f32.const 0) (f32.gt (local.get $v) (f32.const 0))))
        (local.set $x (i32.add (local.get $x) (i32.const 4)))
        (local.set $y (i32.add (local.get $y) (i32.const 4)))
        (br $singles))))

  ;; dx = dy where y > 0, else 0: the comparison's all-ones lanes mask dy.
  (func (export "relu_backward") (param $dy i32) (param $y i32) (param $dx i32) (param $size i32)
    (local $end i32)
    (local.set $end (i32.add (local.get $dy) (i32.shl (i32.and (local.get $size) (i32.const -4)) (i32.const 2))))
    (block $done
      (loop $quads
        (br_if $done (i32.ge_u (local.get $dy) (local.get $end)))
        (v128.store (local.get $dx) (v128.and (v128.load (local.get $dy))
          (f32x4.gt (v128.load (local.get $y)) (v128.const f32x4 0 0 0 0))))
        (local.set $dy (i32.add (local.get $dy) (i32.const 16)))
        (local.set $y (i32.add (local.get $y) (i32.const 16)))
        (local.set $dx (i32.add (local.get $dx) (i32.const 16)))
        (br $quads)))
    (local.set $end (i32.add (local.get $end) (i32.shl (i32.and (local.get $size) (i32.const 3)) (i32.const 2))))
    (block $done
      (loop $singles
        (br_if $done (i32.ge_u (local.get $dy) (local.get $end)))
        (f32.store (local.get $dx) (select (f32.load (local.get $dy)) (f32.const 0)
          (f32.gt (f32.load (local.get $y)) (f32.const 0))))
        (local.set $dy (i32.add (local.get $dy) (i32.const 4)))
        (local.set $y (i32.add (local.get $y) (i32.const 4)))
        (local.set $dx (i32.add (local.get $dx) (i32.const 4)))
        (br $singles))))

  ;; ------------------------------------------------------------------ max pooling

  ;; kernels.js's maxPool, one window at a time; argmax holds int32 indices into x.
  (func (export "max_pool")
    (param $x i32) (param $y i32) (param $argmax i32) (param $planes i32) (param $h i32)
    (param $w i32) (param $k i32) (param $s i32) (param $ho i32) (param $wo i32)
    (local $plane i32) (local $i i32) (local $j i32) (local $u i32) (local $v i32)
    (local $base i32) (local $start i32) (local $best i32) (local $idx i32) (local $top f32) (local $value f32)
    (loop $planes
      (local.set $base (i32.mul (local.get $plane) (i32.mul (local.get $h) (local.get $w))))
      (local.set $i (i32.const 0))
      (loop $rows
        (local.set $j (i32.const 0))
        (loop $columns
          (local.set $start (i32.add (local.get $base) (i32.add
            (i32.mul (i32.mul (local.get $s) (local.get $i)) (local.get $w))
            (i32.mul (local.get $s) (local.get $j)))))
          (local.set $best (local.get $start))
          (local.set $top (f32.load (i32.add (local.get $x) (i32.shl (local.get $best) (i32.const 2)))))
          (local.set $u (i32.const 0))
          (loop $us
            (local.set $v (i32.const 0))
            (loop $vs
              (local.set $idx (i32.add (local.get $start)
                (i32.add (i32.mul (local.get $u) (local.get $w)) (local.get $v))))
              (local.set $value (f32.load (i32.add (local.get $x) (i32.shl (local.get $idx) (i32.const 2)))))
              (if (f32.gt (local.get $value) (local.get $top))  ;; strict: ties keep the earlier
                (then (local.set $top (local.get $value)) (local.set $best (local.get $idx))))
              (local.set $v (i32.add (local.get $v) (i32.const 1)))
              (br_if $vs (i32.lt_u (local.get $v) (local.get $k))))
            (local.set $u (i32.add (local.get $u) (i32.const 1)))
            (br_if $us (i32.lt_u (local.get $u) (local.get $k))))
          (f32.store (local.get $y) (local.get $top))
          (i32.store (local.get $argmax) (local.get $best))
          (local.set $y (i32.add (local.get $y) (i32.const 4)))
          (local.set $argmax (i32.add (local.get $argmax) (i32.const 4)))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $columns (i32.lt_u (local.get $j) (local.get $wo))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $rows (i32.lt_u (local.get $i) (local.get $ho))))
      (local.set $plane (i32.add (local.get $plane) (i32.const 1)))
      (br_if $planes (i32.lt_u (local.get $plane) (local.get $planes)))))

  ;; dx[argmax[o]] += dy[o], o < size.
  (func (export "max_pool_backward") (param $dy i32) (param $argmax i32) (param $dx i32) (param $size i32)
    (local $end i32) (local $at i32)
    (local.set $end (i32.add (local.get $dy) (i32.shl (local.get $size) (i32.const 2))))
    (block $done
      (loop $entries
        (br_if $done (i32.ge_u (local.get $dy) (local.get $end)))
        (local.set $at (i32.add (local.get $dx) (i32.shl (i32.load (local.get $argmax)) (i32.const 2))))
        (f32.store (local.get $at) (f32.add (f32.load (local.get $at)) (f32.load (local.get $dy))))
        (local.set $dy (i32.add (local.get $dy) (i32.const 4)))
        (local.set $argmax (i32.add (local.get $argmax) (i32.const 4)))
        (br $entries))))
)
