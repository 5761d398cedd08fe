// RUN: COCO_ROUNDTRIP
// The generic form round-trips, and is checked itself (one coco-opt prints it for both):
// RUN: coco-opt %s --split-input-file --print-op-generic | tee %t.mlir | coco-opt --split-input-file | filecheck %s
// RUN: filecheck %s --check-prefix=GENERIC < %t.mlir

// Every element type, every layout, scalars; `replicated` (alone or on every axis) is
// written as no layout, and a one-axis bracket list prints bare.

func.func @types(%f16: !coco.tensor<8xf16>, %bf16: !coco.tensor<8xbf16>, %f32: !coco.tensor<8xf32>,
                 %f64: !coco.tensor<8xf64>, %i32: !coco.tensor<8xi32>, %i64: !coco.tensor<8xi64>,
                 %i1: !coco.tensor<8xi1>, %scalar: !coco.tensor<f32>, %scalar_i: !coco.tensor<i64, local>,
                 %r: !coco.tensor<4x8xf32, replicated>, %l: !coco.tensor<4x8xf32, local>,
                 %s0: !coco.tensor<4x8xf32, sliced<0>>, %s1: !coco.tensor<4x8xf32, sliced<1>>,
                 %b: !coco.tensor<2x4x8xbf16, [sliced<2>]>) {
  func.return
}

// CHECK-LABEL: func.func @types(
// CHECK-SAME:    %f16: !coco.tensor<8xf16>, %bf16: !coco.tensor<8xbf16>, %f32: !coco.tensor<8xf32>,
// CHECK-SAME:    %f64: !coco.tensor<8xf64>, %i32: !coco.tensor<8xi32>, %i64: !coco.tensor<8xi64>,
// CHECK-SAME:    %i1: !coco.tensor<8xi1>, %scalar: !coco.tensor<f32>, %scalar_i: !coco.tensor<i64, local>,
// CHECK-SAME:    %r: !coco.tensor<4x8xf32>, %l: !coco.tensor<4x8xf32, local>,
// CHECK-SAME:    %s0: !coco.tensor<4x8xf32, sliced<0>>, %s1: !coco.tensor<4x8xf32, sliced<1>>,
// CHECK-SAME:    %b: !coco.tensor<2x4x8xbf16, sliced<2>>) {
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "types", function_type = (!coco.tensor<8xf16>,
// GENERIC:       ^bb0(%f16: !coco.tensor<8xf16>,

// -----

// Grids: 1-D static, 2-D with one layout per axis, N-D with one axis sized at launch.

func.func @grid1(%x: !coco.tensor<8xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[8]>} {
  func.return
}

// CHECK-LABEL: func.func @grid1(%x: !coco.tensor<8xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[8]>} {

// GENERIC: }) {coco.grid = #coco.grid<[8]>} : () -> ()

// -----

func.func @grid_dynamic(%x: !coco.tensor<8xf32, local>) attributes {coco.grid = #coco.grid<[?]>} {
  func.return
}

// CHECK-LABEL: func.func @grid_dynamic(%x: !coco.tensor<8xf32, local>) attributes {coco.grid = #coco.grid<[?]>} {

// -----

func.func @grid2(%x: !coco.tensor<8x16xf16, [local, sliced<1>]>,
                 %y: !coco.tensor<8x16xf16, [replicated, replicated]>,
                 %z: !coco.tensor<8x16xf16, [sliced<0>, sliced<1>]>,
                 %w: !coco.tensor<8x16xf16, [sliced<0>, sliced<0>]>,
                 %v: !coco.tensor<8x16xf16, [replicated, local]>)
    attributes {coco.grid = #coco.grid<[2, 4]>} {
  func.return
}

// CHECK-LABEL: func.func @grid2(
// CHECK-SAME:    %x: !coco.tensor<8x16xf16, [local, sliced<1>]>,
// CHECK-SAME:    %y: !coco.tensor<8x16xf16>,
// CHECK-SAME:    %z: !coco.tensor<8x16xf16, [sliced<0>, sliced<1>]>,
// CHECK-SAME:    %w: !coco.tensor<8x16xf16, [sliced<0>, sliced<0>]>,
// CHECK-SAME:    %v: !coco.tensor<8x16xf16, [replicated, local]>)
// CHECK-SAME:    attributes {coco.grid = #coco.grid<[2, 4]>} {

// -----

func.func @grid3(%x: !coco.tensor<8x16xf16, [local, sliced<1>, replicated]>)
    attributes {coco.grid = #coco.grid<[2, ?, 2]>} {
  func.return
}

// CHECK-LABEL: func.func @grid3(%x: !coco.tensor<8x16xf16, [local, sliced<1>, replicated]>) attributes {coco.grid = #coco.grid<[2, ?, 2]>} {

// -----

// Binary elementwise ops: `replicated (+) X -> X`, broadcasting (a lower-rank operand's
// sliced<d> is dim d + rank gap of the result), scalars, attr-dicts.

func.func @binary(%a: !coco.tensor<4x8xf32>, %b: !coco.tensor<4x8xf32, sliced<0>>,
                  %l: !coco.tensor<4x8xf32, local>, %v: !coco.tensor<8xf32, sliced<0>>,
                  %s: !coco.tensor<f32>) {
  %0 = coco.add %a, %b : !coco.tensor<4x8xf32>, !coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf32, sliced<0>>
  %1 = coco.sub %b, %b : !coco.tensor<4x8xf32, sliced<0>>
  %2 = coco.mul %s, %l : !coco.tensor<f32>, !coco.tensor<4x8xf32, local> -> !coco.tensor<4x8xf32, local>
  %3 = coco.div %l, %a {tag = "x"} : !coco.tensor<4x8xf32, local>, !coco.tensor<4x8xf32> -> !coco.tensor<4x8xf32, local>
  %4 = coco.max %a, %v : !coco.tensor<4x8xf32>, !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<4x8xf32, sliced<1>>
  %5 = coco.min %a, %a : !coco.tensor<4x8xf32>
  %6 = coco.pow %s, %s : !coco.tensor<f32>
  func.return
}

// CHECK-LABEL: func.func @binary(
// CHECK-NEXT:    %0 = coco.add %a, %b : !coco.tensor<4x8xf32>, !coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %1 = coco.sub %b, %b : !coco.tensor<4x8xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %2 = coco.mul %s, %l : !coco.tensor<f32>, !coco.tensor<4x8xf32, local> -> !coco.tensor<4x8xf32, local>{{$}}
// CHECK-NEXT:    %3 = coco.div %l, %a {tag = "x"} : !coco.tensor<4x8xf32, local>, !coco.tensor<4x8xf32> -> !coco.tensor<4x8xf32, local>{{$}}
// CHECK-NEXT:    %4 = coco.max %a, %v : !coco.tensor<4x8xf32>, !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<4x8xf32, sliced<1>>{{$}}
// CHECK-NEXT:    %5 = coco.min %a, %a : !coco.tensor<4x8xf32>{{$}}
// CHECK-NEXT:    %6 = coco.pow %s, %s : !coco.tensor<f32>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "binary"
// GENERIC:         %0 = "coco.add"(%a, %b) : (!coco.tensor<4x8xf32>, !coco.tensor<4x8xf32, sliced<0>>) -> !coco.tensor<4x8xf32, sliced<0>>
// GENERIC:         %3 = "coco.div"(%l, %a) {tag = "x"} : (!coco.tensor<4x8xf32, local>, !coco.tensor<4x8xf32>) -> !coco.tensor<4x8xf32, local>

// -----

// Unary ops; neg, abs and relu also take integers.

func.func @unary(%x: !coco.tensor<16xf16, sliced<0>>, %i: !coco.tensor<16xi32, local>,
                 %d: !coco.tensor<f64>) {
  %0 = coco.neg %x : !coco.tensor<16xf16, sliced<0>>
  %1 = coco.neg %i : !coco.tensor<16xi32, local>
  %2 = coco.abs %i : !coco.tensor<16xi32, local>
  %3 = coco.sqrt %x : !coco.tensor<16xf16, sliced<0>>
  %4 = coco.rsqrt %d : !coco.tensor<f64>
  %5 = coco.exp %x : !coco.tensor<16xf16, sliced<0>>
  %6 = coco.log %x : !coco.tensor<16xf16, sliced<0>>
  %7 = coco.tanh %x : !coco.tensor<16xf16, sliced<0>>
  %8 = coco.relu %i : !coco.tensor<16xi32, local>
  %9 = coco.gelu %x {approx = "tanh"} : !coco.tensor<16xf16, sliced<0>>
  %10 = coco.sigmoid %x : !coco.tensor<16xf16, sliced<0>> -> !coco.tensor<16xf16, sliced<0>>
  %11 = coco.abs %x : !coco.tensor<16xf16, sliced<0>>
  %12 = coco.relu %d : !coco.tensor<f64>
  func.return
}

// CHECK-LABEL: func.func @unary(
// CHECK-NEXT:    %0 = coco.neg %x : !coco.tensor<16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %1 = coco.neg %i : !coco.tensor<16xi32, local>{{$}}
// CHECK-NEXT:    %2 = coco.abs %i : !coco.tensor<16xi32, local>{{$}}
// CHECK-NEXT:    %3 = coco.sqrt %x : !coco.tensor<16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %4 = coco.rsqrt %d : !coco.tensor<f64>{{$}}
// CHECK-NEXT:    %5 = coco.exp %x : !coco.tensor<16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %6 = coco.log %x : !coco.tensor<16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %7 = coco.tanh %x : !coco.tensor<16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %8 = coco.relu %i : !coco.tensor<16xi32, local>{{$}}
// CHECK-NEXT:    %9 = coco.gelu %x {approx = "tanh"} : !coco.tensor<16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %10 = coco.sigmoid %x : !coco.tensor<16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %11 = coco.abs %x : !coco.tensor<16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %12 = coco.relu %d : !coco.tensor<f64>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "unary"
// GENERIC:         %0 = "coco.neg"(%x) : (!coco.tensor<16xf16, sliced<0>>) -> !coco.tensor<16xf16, sliced<0>>

// -----

// Comparisons give i1 with the combined layout; select combines all three layouts.

func.func @cmp_select(%a: !coco.tensor<8xi64>, %b: !coco.tensor<8xi64, local>, %x: !coco.tensor<8xbf16>,
                      %c: !coco.tensor<i1>) {
  %0 = coco.cmp eq %a, %b : !coco.tensor<8xi64>, !coco.tensor<8xi64, local> -> !coco.tensor<8xi1, local>
  %1 = coco.cmp ne %a, %a : !coco.tensor<8xi64>, !coco.tensor<8xi64> -> !coco.tensor<8xi1>
  %2 = coco.cmp lt %a, %a : !coco.tensor<8xi64>, !coco.tensor<8xi64> -> !coco.tensor<8xi1>
  %3 = coco.cmp le %a, %a : !coco.tensor<8xi64>, !coco.tensor<8xi64> -> !coco.tensor<8xi1>
  %4 = coco.cmp gt %x, %x : !coco.tensor<8xbf16>, !coco.tensor<8xbf16> -> !coco.tensor<8xi1>
  %5 = coco.cmp ge %x, %x {k} : !coco.tensor<8xbf16>, !coco.tensor<8xbf16> -> !coco.tensor<8xi1>
  %6 = coco.select %0, %a, %b : !coco.tensor<8xi1, local>, !coco.tensor<8xi64>, !coco.tensor<8xi64, local> -> !coco.tensor<8xi64, local>
  %7 = coco.select %4, %x, %x {k = 2} : !coco.tensor<8xi1>, !coco.tensor<8xbf16>, !coco.tensor<8xbf16> -> !coco.tensor<8xbf16>
  %8 = coco.select %c, %a, %a : !coco.tensor<i1>, !coco.tensor<8xi64>, !coco.tensor<8xi64> -> !coco.tensor<8xi64>
  func.return
}

// CHECK-LABEL: func.func @cmp_select(
// CHECK-NEXT:    %0 = coco.cmp eq %a, %b : !coco.tensor<8xi64>, !coco.tensor<8xi64, local> -> !coco.tensor<8xi1, local>{{$}}
// CHECK-NEXT:    %1 = coco.cmp ne %a, %a : !coco.tensor<8xi64>, !coco.tensor<8xi64> -> !coco.tensor<8xi1>{{$}}
// CHECK-NEXT:    %2 = coco.cmp lt %a, %a : !coco.tensor<8xi64>, !coco.tensor<8xi64> -> !coco.tensor<8xi1>{{$}}
// CHECK-NEXT:    %3 = coco.cmp le %a, %a : !coco.tensor<8xi64>, !coco.tensor<8xi64> -> !coco.tensor<8xi1>{{$}}
// CHECK-NEXT:    %4 = coco.cmp gt %x, %x : !coco.tensor<8xbf16>, !coco.tensor<8xbf16> -> !coco.tensor<8xi1>{{$}}
// CHECK-NEXT:    %5 = coco.cmp ge %x, %x {k} : !coco.tensor<8xbf16>, !coco.tensor<8xbf16> -> !coco.tensor<8xi1>{{$}}
// CHECK-NEXT:    %6 = coco.select %0, %a, %b : !coco.tensor<8xi1, local>, !coco.tensor<8xi64>, !coco.tensor<8xi64, local> -> !coco.tensor<8xi64, local>{{$}}
// CHECK-NEXT:    %7 = coco.select %4, %x, %x {k = 2 : i64} : !coco.tensor<8xi1>, !coco.tensor<8xbf16>, !coco.tensor<8xbf16> -> !coco.tensor<8xbf16>{{$}}
// CHECK-NEXT:    %8 = coco.select %c, %a, %a : !coco.tensor<i1>, !coco.tensor<8xi64>, !coco.tensor<8xi64> -> !coco.tensor<8xi64>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "cmp_select"
// GENERIC:         %0 = "coco.cmp"(%a, %b) <{predicate = #coco<cmp_predicate eq>}> : (!coco.tensor<8xi64>, !coco.tensor<8xi64, local>) -> !coco.tensor<8xi1, local>

// -----

// Casts between every element type; `-> ELT` is shorthand for the same tensor with ELT.
// Casts between every element type.
func.func @cast(%x: !coco.tensor<8xf16, local>, %i: !coco.tensor<8xi1>) {
  %0 = coco.cast %x : !coco.tensor<8xf16, local> -> !coco.tensor<8xf32, local>
  %1 = coco.cast %0 : !coco.tensor<8xf32, local> -> !coco.tensor<8xbf16, local>
  %2 = coco.cast %1 : !coco.tensor<8xbf16, local> -> !coco.tensor<8xf64, local>
  %3 = coco.cast %2 {k} : !coco.tensor<8xf64, local> -> !coco.tensor<8xi32, local>
  %4 = coco.cast %3 : !coco.tensor<8xi32, local> -> !coco.tensor<8xi64, local>
  %5 = coco.cast %i : !coco.tensor<8xi1> -> !coco.tensor<8xf16>
  %6 = coco.cast %x : !coco.tensor<8xf16, local>
  %7 = coco.cast %4 : !coco.tensor<8xi64, local> -> !coco.tensor<8xi1, local>
  func.return
}

// CHECK-LABEL: func.func @cast(
// CHECK-NEXT:    %0 = coco.cast %x : !coco.tensor<8xf16, local> -> !coco.tensor<8xf32, local>{{$}}
// CHECK-NEXT:    %1 = coco.cast %0 : !coco.tensor<8xf32, local> -> !coco.tensor<8xbf16, local>{{$}}
// CHECK-NEXT:    %2 = coco.cast %1 : !coco.tensor<8xbf16, local> -> !coco.tensor<8xf64, local>{{$}}
// CHECK-NEXT:    %3 = coco.cast %2 {k} : !coco.tensor<8xf64, local> -> !coco.tensor<8xi32, local>{{$}}
// CHECK-NEXT:    %4 = coco.cast %3 : !coco.tensor<8xi32, local> -> !coco.tensor<8xi64, local>{{$}}
// CHECK-NEXT:    %5 = coco.cast %i : !coco.tensor<8xi1> -> !coco.tensor<8xf16>{{$}}
// CHECK-NEXT:    %6 = coco.cast %x : !coco.tensor<8xf16, local>{{$}}
// CHECK-NEXT:    %7 = coco.cast %4 : !coco.tensor<8xi64, local> -> !coco.tensor<8xi1, local>{{$}}
// CHECK-NEXT:    func.return{{$}}

// -----

// Constants: replicated splats of every element type; literals print in their shortest
// form that parses back (an exponent needs a `.` in the mantissa), booleans as 0/1,
// non-finite floats as inf/-inf/nan.

func.func @constant() {
  %0 = coco.constant 0.9 : !coco.tensor<f32>
  %1 = coco.constant -2.5e-3 : !coco.tensor<4x4xbf16>
  %2 = coco.constant 1.0 : !coco.tensor<f16>
  %3 = coco.constant 3 : !coco.tensor<f64>
  %4 = coco.constant 7 : !coco.tensor<i32>
  %5 = coco.constant -1 : !coco.tensor<8xi64> {k}
  %6 = coco.constant true : !coco.tensor<i1>
  %7 = coco.constant false : !coco.tensor<i1>
  %8 = coco.constant inf : !coco.tensor<f32>
  %9 = coco.constant -inf : !coco.tensor<bf16>
  %10 = coco.constant nan : !coco.tensor<f64>
  %11 = coco.constant -0.0 : !coco.tensor<f32>
  %12 = coco.constant 1.0e-5 : !coco.tensor<f32>
  %13 = coco.constant 25.0e+19 : !coco.tensor<f64>
  %14 = coco.constant -2147483648 : !coco.tensor<i32>
  %15 = coco.constant 9223372036854775807 : !coco.tensor<i64>
  func.return
}

// CHECK-LABEL: func.func @constant() {
// CHECK-NEXT:    %0 = coco.constant 0.9 : !coco.tensor<f32>{{$}}
// CHECK-NEXT:    %1 = coco.constant -0.0025 : !coco.tensor<4x4xbf16>{{$}}
// CHECK-NEXT:    %2 = coco.constant 1.0 : !coco.tensor<f16>{{$}}
// CHECK-NEXT:    %3 = coco.constant 3.0 : !coco.tensor<f64>{{$}}
// CHECK-NEXT:    %4 = coco.constant 7 : !coco.tensor<i32>{{$}}
// CHECK-NEXT:    %5 = coco.constant -1 : !coco.tensor<8xi64> {k}{{$}}
// CHECK-NEXT:    %6 = coco.constant 1 : !coco.tensor<i1>{{$}}
// CHECK-NEXT:    %7 = coco.constant 0 : !coco.tensor<i1>{{$}}
// CHECK-NEXT:    %8 = coco.constant inf : !coco.tensor<f32>{{$}}
// CHECK-NEXT:    %9 = coco.constant -inf : !coco.tensor<bf16>{{$}}
// CHECK-NEXT:    %10 = coco.constant nan : !coco.tensor<f64>{{$}}
// CHECK-NEXT:    %11 = coco.constant -0.0 : !coco.tensor<f32>{{$}}
// CHECK-NEXT:    %12 = coco.constant 1.0e-05 : !coco.tensor<f32>{{$}}
// CHECK-NEXT:    %13 = coco.constant 2.5e+20 : !coco.tensor<f64>{{$}}
// CHECK-NEXT:    %14 = coco.constant -2147483648 : !coco.tensor<i32>{{$}}
// CHECK-NEXT:    %15 = coco.constant 9223372036854775807 : !coco.tensor<i64>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "constant"
// GENERIC:         %0 = "coco.constant"() <{value = 9.000000e-01 : f64}> : () -> !coco.tensor<f32>
// GENERIC:         %4 = "coco.constant"() <{value = 7 : i64}> : () -> !coco.tensor<i32>

// -----

// Dense constants: one value per element, nested by dims, stored (as splats are) as f64 or
// i64 and rounded to the element type where used (non-finite values: dense_constant_nonfinite.mlir).

func.func @dense_constant() {
  %0 = coco.constant dense<[1.0, -2.5, 0.1, 3]> : !coco.tensor<4xf32>
  %1 = coco.constant dense<[[-0.0, 1.0e-5, 65504.0]]> : !coco.tensor<1x3xf16>
  %2 = coco.constant dense<[[[0.5]], [[-0.25]]]> : !coco.tensor<2x1x1xbf16> {k}
  %3 = coco.constant dense<[-2147483648, 7]> : !coco.tensor<2xi32>
  %4 = coco.constant dense<[true, false, 1]> : !coco.tensor<3xi1>
  %5 = coco.constant dense<[1, 2]> : !coco.tensor<2xf64>
  func.return
}

// CHECK-LABEL: func.func @dense_constant() {
// CHECK-NEXT:    %0 = coco.constant dense<[1.0, -2.5, 0.1, 3.0]> : !coco.tensor<4xf32>{{$}}
// CHECK-NEXT:    %1 = coco.constant dense<{{\[\[}}-0.0, 1.0e-05, 65504.0]]> : !coco.tensor<1x3xf16>{{$}}
// CHECK-NEXT:    %2 = coco.constant dense<{{\[\[\[}}0.5]], {{\[\[}}-0.25]]]> : !coco.tensor<2x1x1xbf16> {k}{{$}}
// CHECK-NEXT:    %3 = coco.constant dense<[-2147483648, 7]> : !coco.tensor<2xi32>{{$}}
// CHECK-NEXT:    %4 = coco.constant dense<[1, 0, 1]> : !coco.tensor<3xi1>{{$}}
// CHECK-NEXT:    %5 = coco.constant dense<[1.0, 2.0]> : !coco.tensor<2xf64>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "dense_constant"
// GENERIC:         %0 = "coco.constant"() <{value = dense<[1.000000e+00, -2.500000e+00, 1.000000e-01, 3.000000e+00]> : tensor<4xf64>}> : () -> !coco.tensor<4xf32>
// GENERIC:         %3 = "coco.constant"() <{value = dense<[-2147483648, 7]> : tensor<2xi64>}> : () -> !coco.tensor<2xi32>

// -----

func.func @dropout(%x: !coco.tensor<8xf32, sliced<0>>, %y: !coco.tensor<8xf16, local>) {
  %0 = coco.dropout %x, 0.1 seed 7 : !coco.tensor<8xf32, sliced<0>>
  %1 = coco.dropout %y, 0.0 seed 0 {k} : !coco.tensor<8xf16, local>
  %2 = coco.dropout %x, 0.5 seed -3 : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32, sliced<0>>
  %3 = coco.dropout %x, 1.0e-5 seed 1 : !coco.tensor<8xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: func.func @dropout(
// CHECK-NEXT:    %0 = coco.dropout %x, 1.000000e-01 seed 7 : !coco.tensor<8xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %1 = coco.dropout %y, 0.000000e+00 seed 0 {k} : !coco.tensor<8xf16, local>{{$}}
// CHECK-NEXT:    %2 = coco.dropout %x, 5.000000e-01 seed -3 : !coco.tensor<8xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %3 = coco.dropout %x, 1.000000e-05 seed 1 : !coco.tensor<8xf32, sliced<0>>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "dropout"
// GENERIC:         %0 = "coco.dropout"(%x) <{prob = 1.000000e-01 : f64, seed = 7 : i64}> : (!coco.tensor<8xf32, sliced<0>>) -> !coco.tensor<8xf32, sliced<0>>

// -----

// Matmul: every layout rule, and batched forms.

func.func @matmul(%a: !coco.tensor<4x8xf16>, %b: !coco.tensor<8x16xf16>, %ar: !coco.tensor<4x8xf16, sliced<0>>,
                  %bc: !coco.tensor<8x16xf16, sliced<1>>, %ak: !coco.tensor<4x8xf16, sliced<1>>,
                  %bk: !coco.tensor<8x16xf16, sliced<0>>, %al: !coco.tensor<4x8xf16, local>,
                  %bl: !coco.tensor<8x16xf16, local>, %x: !coco.tensor<2x4x8xf16, sliced<0>>,
                  %xb: !coco.tensor<2x8x16xf16, sliced<0>>) {
  %0 = coco.matmul %a, %b : !coco.tensor<4x8xf16>, !coco.tensor<8x16xf16> -> !coco.tensor<4x16xf16>
  %1 = coco.matmul %ar, %b : !coco.tensor<4x8xf16, sliced<0>>, !coco.tensor<8x16xf16> -> !coco.tensor<4x16xf16, sliced<0>>
  %2 = coco.matmul %a, %bc : !coco.tensor<4x8xf16>, !coco.tensor<8x16xf16, sliced<1>> -> !coco.tensor<4x16xf16, sliced<1>>
  %3 = coco.matmul %ak, %bk : !coco.tensor<4x8xf16, sliced<1>>, !coco.tensor<8x16xf16, sliced<0>> -> !coco.tensor<4x16xf16, local>
  %4 = coco.matmul %al, %b : !coco.tensor<4x8xf16, local>, !coco.tensor<8x16xf16> -> !coco.tensor<4x16xf16, local>
  %5 = coco.matmul %al, %bl {k} : !coco.tensor<4x8xf16, local>, !coco.tensor<8x16xf16, local> -> !coco.tensor<4x16xf16, local>
  %6 = coco.matmul %x, %b : !coco.tensor<2x4x8xf16, sliced<0>>, !coco.tensor<8x16xf16> -> !coco.tensor<2x4x16xf16, sliced<0>>
  %7 = coco.matmul %x, %xb : !coco.tensor<2x4x8xf16, sliced<0>>, !coco.tensor<2x8x16xf16, sliced<0>> -> !coco.tensor<2x4x16xf16, sliced<0>>
  func.return
}

// CHECK-LABEL: func.func @matmul(
// CHECK-NEXT:    %0 = coco.matmul %a, %b : !coco.tensor<4x8xf16>, !coco.tensor<8x16xf16> -> !coco.tensor<4x16xf16>{{$}}
// CHECK-NEXT:    %1 = coco.matmul %ar, %b : !coco.tensor<4x8xf16, sliced<0>>, !coco.tensor<8x16xf16> -> !coco.tensor<4x16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %2 = coco.matmul %a, %bc : !coco.tensor<4x8xf16>, !coco.tensor<8x16xf16, sliced<1>> -> !coco.tensor<4x16xf16, sliced<1>>{{$}}
// CHECK-NEXT:    %3 = coco.matmul %ak, %bk : !coco.tensor<4x8xf16, sliced<1>>, !coco.tensor<8x16xf16, sliced<0>> -> !coco.tensor<4x16xf16, local>{{$}}
// CHECK-NEXT:    %4 = coco.matmul %al, %b : !coco.tensor<4x8xf16, local>, !coco.tensor<8x16xf16> -> !coco.tensor<4x16xf16, local>{{$}}
// CHECK-NEXT:    %5 = coco.matmul %al, %bl {k} : !coco.tensor<4x8xf16, local>, !coco.tensor<8x16xf16, local> -> !coco.tensor<4x16xf16, local>{{$}}
// CHECK-NEXT:    %6 = coco.matmul %x, %b : !coco.tensor<2x4x8xf16, sliced<0>>, !coco.tensor<8x16xf16> -> !coco.tensor<2x4x16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %7 = coco.matmul %x, %xb : !coco.tensor<2x4x8xf16, sliced<0>>, !coco.tensor<2x8x16xf16, sliced<0>> -> !coco.tensor<2x4x16xf16, sliced<0>>{{$}}
// CHECK-NEXT:    func.return{{$}}

// -----

// Full reductions to a scalar: a sliced input gives this rank's partial (local) result.

func.func @reduce(%x: !coco.tensor<4x8xf32, sliced<1>>, %r: !coco.tensor<4x8xf64>, %l: !coco.tensor<8xi32, local>,
                  %h: !coco.tensor<8xf16, local>) {
  %0 = coco.reduce sum %x : !coco.tensor<4x8xf32, sliced<1>> -> !coco.tensor<f32, local>
  %1 = coco.reduce max %r : !coco.tensor<4x8xf64> -> !coco.tensor<f64>
  %2 = coco.reduce min %l : !coco.tensor<8xi32, local> -> !coco.tensor<i32, local>
  %3 = coco.reduce norm %r {k} : !coco.tensor<4x8xf64> -> !coco.tensor<f64>
  %4 = coco.reduce norm %h : !coco.tensor<8xf16, local> -> !coco.tensor<f16, local>
  func.return
}

// CHECK-LABEL: func.func @reduce(
// CHECK-NEXT:    %0 = coco.reduce sum %x : !coco.tensor<4x8xf32, sliced<1>> -> !coco.tensor<f32, local>{{$}}
// CHECK-NEXT:    %1 = coco.reduce max %r : !coco.tensor<4x8xf64> -> !coco.tensor<f64>{{$}}
// CHECK-NEXT:    %2 = coco.reduce min %l : !coco.tensor<8xi32, local> -> !coco.tensor<i32, local>{{$}}
// CHECK-NEXT:    %3 = coco.reduce norm %r {k} : !coco.tensor<4x8xf64> -> !coco.tensor<f64>{{$}}
// CHECK-NEXT:    %4 = coco.reduce norm %h : !coco.tensor<8xf16, local> -> !coco.tensor<f16, local>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "reduce"
// GENERIC:         %0 = "coco.reduce"(%x) <{kind = #coco<reduction_kind sum>}> : (!coco.tensor<4x8xf32, sliced<1>>) -> !coco.tensor<f32, local>

// -----

// Slice (CoCoNet's Scatter) and update (the program's side effects).

func.func @slice_update(%w: !coco.tensor<8x4xf32>, %m: !coco.tensor<8x4xf32, sliced<0>>) {
  %0 = coco.slice %w : !coco.tensor<8x4xf32> -> !coco.tensor<8x4xf32, sliced<0>>
  %1 = coco.slice %w {k} : !coco.tensor<8x4xf32> -> !coco.tensor<8x4xf32, sliced<1>>
  %2 = coco.slice %m : !coco.tensor<8x4xf32, sliced<0>>
  %3 = coco.add %0, %m : !coco.tensor<8x4xf32, sliced<0>>
  coco.update %m, %3 {k} : !coco.tensor<8x4xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: func.func @slice_update(
// CHECK-NEXT:    %0 = coco.slice %w : !coco.tensor<8x4xf32> -> !coco.tensor<8x4xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %1 = coco.slice %w {k} : !coco.tensor<8x4xf32> -> !coco.tensor<8x4xf32, sliced<1>>{{$}}
// CHECK-NEXT:    %2 = coco.slice %m : !coco.tensor<8x4xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %3 = coco.add %0, %m : !coco.tensor<8x4xf32, sliced<0>>{{$}}
// CHECK-NEXT:    coco.update %m, %3 {k} : !coco.tensor<8x4xf32, sliced<0>>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "slice_update"
// GENERIC:         "coco.update"(%m, %3) {k} : (!coco.tensor<8x4xf32, sliced<0>>, !coco.tensor<8x4xf32, sliced<0>>) -> ()

// -----

// Ops on a 2-D grid: the rules apply one grid axis at a time.

func.func @grid2_ops(%x: !coco.tensor<8x16xf16, [local, sliced<1>]>, %r: !coco.tensor<8x16xf16>,
                     %w: !coco.tensor<16x32xf16, [replicated, sliced<1>]>)
    attributes {coco.grid = #coco.grid<[2, 4]>} {
  %0 = coco.add %x, %r : !coco.tensor<8x16xf16, [local, sliced<1>]>, !coco.tensor<8x16xf16> -> !coco.tensor<8x16xf16, [local, sliced<1>]>
  %1 = coco.slice %r : !coco.tensor<8x16xf16> -> !coco.tensor<8x16xf16, [replicated, sliced<0>]>
  %2 = coco.matmul %r, %w : !coco.tensor<8x16xf16>, !coco.tensor<16x32xf16, [replicated, sliced<1>]> -> !coco.tensor<8x32xf16, [replicated, sliced<1>]>
  %3 = coco.reduce sum %x : !coco.tensor<8x16xf16, [local, sliced<1>]> -> !coco.tensor<f16, [local, local]>
  %4 = coco.slice %1 : !coco.tensor<8x16xf16, [replicated, sliced<0>]> -> !coco.tensor<8x16xf16, [sliced<1>, sliced<0>]>
  func.return
}

// CHECK-LABEL: func.func @grid2_ops(
// CHECK-NEXT:    %0 = coco.add %x, %r : !coco.tensor<8x16xf16, [local, sliced<1>]>, !coco.tensor<8x16xf16> -> !coco.tensor<8x16xf16, [local, sliced<1>]>{{$}}
// CHECK-NEXT:    %1 = coco.slice %r : !coco.tensor<8x16xf16> -> !coco.tensor<8x16xf16, [replicated, sliced<0>]>{{$}}
// CHECK-NEXT:    %2 = coco.matmul %r, %w : !coco.tensor<8x16xf16>, !coco.tensor<16x32xf16, [replicated, sliced<1>]> -> !coco.tensor<8x32xf16, [replicated, sliced<1>]>{{$}}
// CHECK-NEXT:    %3 = coco.reduce sum %x : !coco.tensor<8x16xf16, [local, sliced<1>]> -> !coco.tensor<f16, [local, local]>{{$}}
// CHECK-NEXT:    %4 = coco.slice %1 : !coco.tensor<8x16xf16, [replicated, sliced<0>]> -> !coco.tensor<8x16xf16, [sliced<1>, sliced<0>]>{{$}}
// CHECK-NEXT:    func.return{{$}}

// -----

// Row-wise ops: reductions over a run of dims (keepdims keeps them as size 1, and the result
// broadcasts back in elementwise ops), a reshape; a sliced dim that is not reduced stays
// sliced (renumbered without keepdims), a reduced one gives a local partial.

func.func @row_ops(%x: !coco.tensor<8x16xf32, [replicated, sliced<0>]>, %c: !coco.tensor<4x6x8xbf16, [local, sliced<2>]>)
    attributes {coco.grid = #coco.grid<[2, 2]>} {
  %0 = coco.reduce_dims mean %x dims [1] keepdims : !coco.tensor<8x16xf32, [replicated, sliced<0>]> -> !coco.tensor<8x1xf32, [replicated, sliced<0>]>
  %1 = coco.sub %x, %0 : !coco.tensor<8x16xf32, [replicated, sliced<0>]>, !coco.tensor<8x1xf32, [replicated, sliced<0>]> -> !coco.tensor<8x16xf32, [replicated, sliced<0>]>
  %2 = coco.reduce_dims max %c dims [0, 1] : !coco.tensor<4x6x8xbf16, [local, sliced<2>]> -> !coco.tensor<8xbf16, [local, sliced<0>]>
  %3 = coco.reduce_dims sum %x dims [0] : !coco.tensor<8x16xf32, [replicated, sliced<0>]> -> !coco.tensor<16xf32, [replicated, local]>
  %4 = coco.reduce_dims min %c dims [2] keepdims : !coco.tensor<4x6x8xbf16, [local, sliced<2>]> -> !coco.tensor<4x6x1xbf16, [local, local]>
  %5 = coco.reshape %x : !coco.tensor<8x16xf32, [replicated, sliced<0>]> -> !coco.tensor<8x4x4xf32, [replicated, sliced<0>]>
  func.return
}

// CHECK-LABEL: func.func @row_ops(
// CHECK-NEXT:    %0 = coco.reduce_dims mean %x dims [1] keepdims : !coco.tensor<8x16xf32, [replicated, sliced<0>]> -> !coco.tensor<8x1xf32, [replicated, sliced<0>]>{{$}}
// CHECK-NEXT:    %1 = coco.sub %x, %0 : !coco.tensor<8x16xf32, [replicated, sliced<0>]>, !coco.tensor<8x1xf32, [replicated, sliced<0>]> -> !coco.tensor<8x16xf32, [replicated, sliced<0>]>{{$}}
// CHECK-NEXT:    %2 = coco.reduce_dims max %c dims [0, 1] : !coco.tensor<4x6x8xbf16, [local, sliced<2>]> -> !coco.tensor<8xbf16, [local, sliced<0>]>{{$}}
// CHECK-NEXT:    %3 = coco.reduce_dims sum %x dims [0] : !coco.tensor<8x16xf32, [replicated, sliced<0>]> -> !coco.tensor<16xf32, [replicated, local]>{{$}}
// CHECK-NEXT:    %4 = coco.reduce_dims min %c dims [2] keepdims : !coco.tensor<4x6x8xbf16, [local, sliced<2>]> -> !coco.tensor<4x6x1xbf16, [local, local]>{{$}}
// CHECK-NEXT:    %5 = coco.reshape %x : !coco.tensor<8x16xf32, [replicated, sliced<0>]> -> !coco.tensor<8x4x4xf32, [replicated, sliced<0>]>{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "row_ops"
// GENERIC: "coco.reduce_dims"(%{{.*}}) <{kind = #coco<dim_reduction_kind mean>, dims = array<i64: 1>, keepdims}>
// GENERIC: "coco.reduce_dims"(%{{.*}}) <{kind = #coco<dim_reduction_kind max>, dims = array<i64: 0, 1>}>

// -----

// fp8 element types, casts to and from them, and quantize / dequantize with a scale per
// tensor, per row and per element.
func.func @fp8(%x: !coco.tensor<8x16xf32, sliced<0>>, %s: !coco.tensor<f32>, %r: !coco.tensor<8x1xbf16, sliced<0>>, %q: !coco.tensor<8x16xf8E5M2>) {
  %0 = coco.cast %x : !coco.tensor<8x16xf32, sliced<0>> -> !coco.tensor<8x16xf8E4M3FN, sliced<0>>
  %1 = coco.cast %0 : !coco.tensor<8x16xf8E4M3FN, sliced<0>> -> !coco.tensor<8x16xf8E5M2, sliced<0>>
  %2 = coco.quantize %x, %s : !coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<8x16xf8E4M3FN, sliced<0>>
  %3 = coco.quantize %x, %r : !coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<8x1xbf16, sliced<0>> -> !coco.tensor<8x16xf8E5M2, sliced<0>>
  %4 = coco.dequantize %3, %r : !coco.tensor<8x16xf8E5M2, sliced<0>>, !coco.tensor<8x1xbf16, sliced<0>> -> !coco.tensor<8x16xbf16, sliced<0>>
  %5 = coco.dequantize %q, %q : !coco.tensor<8x16xf8E5M2>, !coco.tensor<8x16xf8E5M2> -> !coco.tensor<8x16xf64>
  func.return
}

// CHECK-LABEL: func.func @fp8(
// CHECK-NEXT:    %0 = coco.cast %x : !coco.tensor<8x16xf32, sliced<0>> -> !coco.tensor<8x16xf8E4M3FN, sliced<0>>{{$}}
// CHECK-NEXT:    %1 = coco.cast %0 : !coco.tensor<8x16xf8E4M3FN, sliced<0>> -> !coco.tensor<8x16xf8E5M2, sliced<0>>{{$}}
// CHECK-NEXT:    %2 = coco.quantize %x, %s : !coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<8x16xf8E4M3FN, sliced<0>>{{$}}
// CHECK-NEXT:    %3 = coco.quantize %x, %r : !coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<8x1xbf16, sliced<0>> -> !coco.tensor<8x16xf8E5M2, sliced<0>>{{$}}
// CHECK-NEXT:    %4 = coco.dequantize %3, %r : !coco.tensor<8x16xf8E5M2, sliced<0>>, !coco.tensor<8x1xbf16, sliced<0>> -> !coco.tensor<8x16xbf16, sliced<0>>{{$}}
// CHECK-NEXT:    %5 = coco.dequantize %q, %q : !coco.tensor<8x16xf8E5M2>, !coco.tensor<8x16xf8E5M2> -> !coco.tensor<8x16xf64>{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "fp8"
// GENERIC: "coco.quantize"(%x, %s) : (!coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<f32>) -> !coco.tensor<8x16xf8E4M3FN, sliced<0>>

// -----

// Block scales of rows cut over 2 ranks: one value per 1 x 4 and per 4 x 1 block (replicated
// scales, read at each element's global row), per 2 x 8 block (cut with the rows, on block
// boundaries), and a 1-D one per 4 columns broadcast over the rows.
func.func @block_scales(%x: !coco.tensor<8x16xf32, sliced<0>>, %c: !coco.tensor<8x4xf32>, %r: !coco.tensor<2x16xbf16>, %b: !coco.tensor<4x2xf32, sliced<0>>, %v: !coco.tensor<4xf16>) attributes {coco.grid = #coco.grid<[2]>} {
  %0 = coco.quantize %x, %c : !coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<8x4xf32> -> !coco.tensor<8x16xf8E4M3FN, sliced<0>>
  %1 = coco.dequantize %0, %r : !coco.tensor<8x16xf8E4M3FN, sliced<0>>, !coco.tensor<2x16xbf16> -> !coco.tensor<8x16xbf16, sliced<0>>
  %2 = coco.quantize %x, %b : !coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<4x2xf32, sliced<0>> -> !coco.tensor<8x16xf8E5M2, sliced<0>>
  %3 = coco.dequantize %2, %v : !coco.tensor<8x16xf8E5M2, sliced<0>>, !coco.tensor<4xf16> -> !coco.tensor<8x16xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: func.func @block_scales(
// CHECK-NEXT:    %0 = coco.quantize %x, %c : !coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<8x4xf32> -> !coco.tensor<8x16xf8E4M3FN, sliced<0>>{{$}}
// CHECK-NEXT:    %1 = coco.dequantize %0, %r : !coco.tensor<8x16xf8E4M3FN, sliced<0>>, !coco.tensor<2x16xbf16> -> !coco.tensor<8x16xbf16, sliced<0>>{{$}}
// CHECK-NEXT:    %2 = coco.quantize %x, %b : !coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<4x2xf32, sliced<0>> -> !coco.tensor<8x16xf8E5M2, sliced<0>>{{$}}
// CHECK-NEXT:    %3 = coco.dequantize %2, %v : !coco.tensor<8x16xf8E5M2, sliced<0>>, !coco.tensor<4xf16> -> !coco.tensor<8x16xf32, sliced<0>>{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "block_scales"
// GENERIC: "coco.quantize"(%x, %b) : (!coco.tensor<8x16xf32, sliced<0>>, !coco.tensor<4x2xf32, sliced<0>>) -> !coco.tensor<8x16xf8E5M2, sliced<0>>
