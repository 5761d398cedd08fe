// RUN: COCO_VERIFY

// One refusal per chunk (--verify-diagnostics reports only the first error of a chunk):
// every layout rule and op verifier of the coco dialect, each naming its rule. The
// CHECK-LABEL on each chunk's separator keeps an error from being matched in another chunk.

// elementwise-layouts: two different non-replicated layouts.
func.func @local_and_sliced(%a: !coco.tensor<8xf32, local>, %b: !coco.tensor<8xf32, sliced<0>>) {
  %0 = coco.add %a, %b : !coco.tensor<8xf32, local>, !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32, local>
  func.return
}

// CHECK: [elementwise-layouts] operands %a : !coco.tensor<8xf32, local>, %b : !coco.tensor<8xf32, sliced<0>>: layouts local and sliced<0> cannot meet in one elementwise op (only replicated combines with another layout)

// -----

func.func @sliced_on_different_dims(%a: !coco.tensor<4x8xf32, sliced<0>>, %b: !coco.tensor<4x8xf32, sliced<1>>) {
  %0 = coco.mul %a, %b : !coco.tensor<4x8xf32, sliced<0>>, !coco.tensor<4x8xf32, sliced<1>> -> !coco.tensor<4x8xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [elementwise-layouts] operands %a : !coco.tensor<4x8xf32, sliced<0>>, %b : !coco.tensor<4x8xf32, sliced<1>>: layouts sliced<0> and sliced<1> cannot meet in one elementwise op (only replicated combines with another layout)

// -----

func.func @sliced_on_broadcast_dim(%a: !coco.tensor<1x8xf32, sliced<0>>, %b: !coco.tensor<4x8xf32>) {
  %0 = coco.add %a, %b : !coco.tensor<1x8xf32, sliced<0>>, !coco.tensor<4x8xf32> -> !coco.tensor<4x8xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [elementwise-layouts] operands %a : !coco.tensor<1x8xf32, sliced<0>>, %b : !coco.tensor<4x8xf32>: an operand sliced on dim 0 is broadcast along that dim

// -----

func.func @second_grid_axis(%a: !coco.tensor<8x8xf32, [local, local]>, %b: !coco.tensor<8x8xf32, [local, sliced<1>]>) attributes {coco.grid = #coco.grid<[2, 4]>} {
  %0 = coco.sub %a, %b : !coco.tensor<8x8xf32, [local, local]>, !coco.tensor<8x8xf32, [local, sliced<1>]> -> !coco.tensor<8x8xf32, [local, local]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [elementwise-layouts] operands %a : !coco.tensor<8x8xf32, [local, local]>, %b : !coco.tensor<8x8xf32, [local, sliced<1>]>: layouts local and sliced<1> cannot meet in one elementwise op (only replicated combines with another layout)

// -----

func.func @cmp_layouts(%a: !coco.tensor<8xi32, local>, %b: !coco.tensor<8xi32, sliced<0>>) {
  %0 = coco.cmp lt %a, %b : !coco.tensor<8xi32, local>, !coco.tensor<8xi32, sliced<0>> -> !coco.tensor<8xi1, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [elementwise-layouts] operands %a : !coco.tensor<8xi32, local>, %b : !coco.tensor<8xi32, sliced<0>>: layouts local and sliced<0> cannot meet in one elementwise op (only replicated combines with another layout)

// -----

func.func @select_layouts(%c: !coco.tensor<8xi1, sliced<0>>, %a: !coco.tensor<8xf32, local>) {
  %0 = coco.select %c, %a, %a : !coco.tensor<8xi1, sliced<0>>, !coco.tensor<8xf32, local>, !coco.tensor<8xf32, local> -> !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [elementwise-layouts] operands %c : !coco.tensor<8xi1, sliced<0>>, the selected values : !coco.tensor<8xf32, local>: layouts sliced<0> and local cannot meet in one elementwise op (only replicated combines with another layout)

// -----

// broadcast-shapes
func.func @shapes(%a: !coco.tensor<4x8xf32>, %b: !coco.tensor<4x7xf32>) {
  %0 = coco.add %a, %b : !coco.tensor<4x8xf32>, !coco.tensor<4x7xf32> -> !coco.tensor<4x8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [broadcast-shapes] operand shapes [4, 8], [4, 7] do not broadcast

// -----

// element-types
func.func @mixed_elements(%a: !coco.tensor<8xf32>, %b: !coco.tensor<8xf16>) {
  %0 = coco.add %a, %b : !coco.tensor<8xf32>, !coco.tensor<8xf16> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] elementwise operands have different element types f32, f16: insert a coco.cast

// -----

func.func @cmp_mixed_elements(%a: !coco.tensor<8xi32>, %b: !coco.tensor<8xi64>) {
  %0 = coco.cmp eq %a, %b : !coco.tensor<8xi32>, !coco.tensor<8xi64> -> !coco.tensor<8xi1>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] elementwise operands have different element types i32, i64: insert a coco.cast

// -----

func.func @sqrt_of_int(%a: !coco.tensor<8xi32>) {
  %0 = coco.sqrt %a : !coco.tensor<8xi32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] coco.sqrt needs a floating-point tensor, got i32

// -----

func.func @gelu_of_bool(%a: !coco.tensor<8xi1>) {
  %0 = coco.gelu %a : !coco.tensor<8xi1>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] coco.gelu needs a floating-point tensor, got i1

// -----

func.func @select_condition(%c: !coco.tensor<8xf32>, %a: !coco.tensor<8xf32>) {
  %0 = coco.select %c, %a, %a : !coco.tensor<8xf32>, !coco.tensor<8xf32>, !coco.tensor<8xf32> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] coco.select's condition must be i1, got f32

// -----

func.func @matmul_elements(%a: !coco.tensor<4x8xf32>, %b: !coco.tensor<8x16xf16>) {
  %0 = coco.matmul %a, %b : !coco.tensor<4x8xf32>, !coco.tensor<8x16xf16> -> !coco.tensor<4x16xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] matmul operands have element types f32 and f16

// -----

func.func @norm_of_int(%a: !coco.tensor<8xi32>) {
  %0 = coco.reduce norm %a : !coco.tensor<8xi32> -> !coco.tensor<i32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] norm needs a floating-point tensor, got i32

// -----

func.func @dropout_of_int(%a: !coco.tensor<8xi64>) {
  %0 = coco.dropout %a, 0.5 seed 1 : !coco.tensor<8xi64>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] coco.dropout needs a floating-point tensor, got i64

// -----

// matmul-layouts
func.func @rows_times_cols(%a: !coco.tensor<4x8xf32, sliced<0>>, %b: !coco.tensor<8x16xf32, sliced<1>>) {
  %0 = coco.matmul %a, %b : !coco.tensor<4x8xf32, sliced<0>>, !coco.tensor<8x16xf32, sliced<1>> -> !coco.tensor<4x16xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [matmul-layouts] no matmul rule takes sliced<0> x sliced<1> on grid axis 0 (!coco.tensor<4x8xf32, sliced<0>> x !coco.tensor<8x16xf32, sliced<1>>); legal: R x R, sliced(rows) x R, R x sliced(cols), sliced(K) x sliced(K), local x (local | R)

// -----

func.func @k_slice_times_replicated(%a: !coco.tensor<4x8xf32, sliced<1>>, %b: !coco.tensor<8x16xf32>) {
  %0 = coco.matmul %a, %b : !coco.tensor<4x8xf32, sliced<1>>, !coco.tensor<8x16xf32> -> !coco.tensor<4x16xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [matmul-layouts] no matmul rule takes sliced<1> x replicated on grid axis 0 (!coco.tensor<4x8xf32, sliced<1>> x !coco.tensor<8x16xf32>); legal: R x R, sliced(rows) x R, R x sliced(cols), sliced(K) x sliced(K), local x (local | R)

// -----

func.func @local_times_sliced(%a: !coco.tensor<4x8xf32, local>, %b: !coco.tensor<8x16xf32, sliced<1>>) {
  %0 = coco.matmul %a, %b : !coco.tensor<4x8xf32, local>, !coco.tensor<8x16xf32, sliced<1>> -> !coco.tensor<4x16xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [matmul-layouts] no matmul rule takes local x sliced<1> on grid axis 0 (!coco.tensor<4x8xf32, local> x !coco.tensor<8x16xf32, sliced<1>>); legal: R x R, sliced(rows) x R, R x sliced(cols), sliced(K) x sliced(K), local x (local | R)

// -----

// matmul-shapes
func.func @matmul_rank(%a: !coco.tensor<8xf32>, %b: !coco.tensor<8x16xf32>) {
  %0 = coco.matmul %a, %b : !coco.tensor<8xf32>, !coco.tensor<8x16xf32> -> !coco.tensor<16xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [matmul-shapes] matmul needs operands of rank >= 2, got !coco.tensor<8xf32> and !coco.tensor<8x16xf32>

// -----

func.func @matmul_contracting(%a: !coco.tensor<4x8xf32>, %b: !coco.tensor<7x16xf32>) {
  %0 = coco.matmul %a, %b : !coco.tensor<4x8xf32>, !coco.tensor<7x16xf32> -> !coco.tensor<4x16xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [matmul-shapes] contracting dims differ: [4, 8] x [7, 16] (8 != 7)

// -----

func.func @matmul_batch(%a: !coco.tensor<2x4x8xf32>, %b: !coco.tensor<3x8x16xf32>) {
  %0 = coco.matmul %a, %b : !coco.tensor<2x4x8xf32>, !coco.tensor<3x8x16xf32> -> !coco.tensor<2x4x16xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [matmul-shapes] a batched right operand must share the left one's batch dims: [2, 4, 8] x [3, 8, 16]

// -----

// A batch slice of A times all of B's batch (each rank would multiply its slice by every batch).
func.func @matmul_batch_slice_by_replicated_batch(%a: !coco.tensor<2x4x8xf32, sliced<0>>, %b: !coco.tensor<2x8x16xf32>) {
  %0 = coco.matmul %a, %b : !coco.tensor<2x4x8xf32, sliced<0>>, !coco.tensor<2x8x16xf32> -> !coco.tensor<2x4x16xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [matmul-layouts] the left operand is sliced on batch dim 0 but the batched right operand is replicated on grid axis 0

// -----

// norm-of-slice
func.func @norm_of_slice(%a: !coco.tensor<8xf32, sliced<0>>) {
  %0 = coco.reduce norm %a : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<f32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [norm-of-slice] the norm of a tensor sliced on grid axis 0 (!coco.tensor<8xf32, sliced<0>>) would be a partial norm that no collective combines: compute sqrt(all_reduce(sum(x * x)))

// -----

// reduction layouts: over a slice, sum/max/min give a partial (local) scalar.
func.func @partial_sum_is_local(%a: !coco.tensor<8xf32, sliced<0>>) {
  %0 = coco.reduce sum %a : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<f32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.reduce produces !coco.tensor<f32, local> from its operands by the layout rules, but its result is declared as !coco.tensor<f32>

// -----

func.func @reduction_of_local_stays_local(%a: !coco.tensor<8xf32, local>) {
  %0 = coco.reduce max %a : !coco.tensor<8xf32, local> -> !coco.tensor<f32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.reduce produces !coco.tensor<f32, local> from its operands by the layout rules, but its result is declared as !coco.tensor<f32>

// -----

func.func @reduction_is_scalar(%a: !coco.tensor<8xf32>) {
  %0 = coco.reduce min %a : !coco.tensor<8xf32> -> !coco.tensor<1xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.reduce produces !coco.tensor<f32> from its operands by the layout rules, but its result is declared as !coco.tensor<1xf32>

// -----

func.func @reduction_kind(%a: !coco.tensor<8xf32>) {
  %0 = "coco.reduce"(%a) <{kind = "avg"}> : (!coco.tensor<8xf32>) -> !coco.tensor<f32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: "avg" should be of base attribute coco.reduction_kind

// -----

// slice-layouts / slice-type
func.func @slice_of_local(%a: !coco.tensor<8xf32, local>) {
  %0 = coco.slice %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [slice-layouts] coco.slice of %a takes a replicated axis to sliced, but grid axis 0 goes local -> sliced<0>

// -----

func.func @slice_cannot_gather(%a: !coco.tensor<8xf32, sliced<0>>) {
  %0 = coco.slice %a : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [slice-layouts] coco.slice of %a takes a replicated axis to sliced, but grid axis 0 goes sliced<0> -> replicated

// -----

func.func @slice_keeps_element_type(%a: !coco.tensor<8xf32>) {
  %0 = coco.slice %a : !coco.tensor<8xf32> -> !coco.tensor<8xf16, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [slice-type] coco.slice keeps shape and element type: !coco.tensor<8xf32> -> !coco.tensor<8xf16, sliced<0>>

// -----

func.func @slice_keeps_shape(%a: !coco.tensor<8xf32>) {
  %0 = coco.slice %a : !coco.tensor<8xf32> -> !coco.tensor<4xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [slice-type] coco.slice keeps shape and element type: !coco.tensor<8xf32> -> !coco.tensor<4xf32, sliced<0>>

// -----

// update-target / update-type / update-once / update-last-use
func.func @update_non_argument(%a: !coco.tensor<8xf32>) {
  %t = coco.neg %a : !coco.tensor<8xf32>
  coco.update %t, %a : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [update-target] coco.update writes into %t, which is not an argument of the enclosing function: only the caller's buffers can be updated

// -----

func.func @update_type(%a: !coco.tensor<8xf32>, %b: !coco.tensor<8xf32, sliced<0>>) {
  coco.update %a, %b : !coco.tensor<8xf32>, !coco.tensor<8xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [update-type] coco.update of %a : !coco.tensor<8xf32> with a value of type !coco.tensor<8xf32, sliced<0>>: the types must match (gather or slice the value first)

// -----

func.func @update_twice(%a: !coco.tensor<8xf32>, %b: !coco.tensor<8xf32>) {
  coco.update %a, %b : !coco.tensor<8xf32>
  coco.update %a, %b : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [update-once] %a is updated more than once

// -----

func.func @read_after_update(%a: !coco.tensor<8xf32>, %b: !coco.tensor<8xf32>) {
  coco.update %a, %b : !coco.tensor<8xf32>
  %0 = coco.neg %a : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [update-last-use] coco.neg reads %a after its coco.update: read the updated value instead

// -----

func.func @return_after_update(%a: !coco.tensor<8xf32>, %b: !coco.tensor<8xf32>) -> !coco.tensor<8xf32> {
  coco.update %a, %b : !coco.tensor<8xf32>
  func.return %a : !coco.tensor<8xf32>
}

// CHECK-LABEL: // {{-----}}
// CHECK: [update-last-use] func.return reads %a after its coco.update: read the updated value instead

// -----

func.func @read_after_update_in_region(%a: !coco.tensor<8xf32>, %b: !coco.tensor<8xf32>) {
  comm.fused elementwise {
    coco.update %a, %b : !coco.tensor<8xf32>
    comm.yield
  }
  %0 = coco.exp %a : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [update-last-use] coco.exp reads %a after its coco.update: read the updated value instead

// -----

// constant-replicated / constant-type
func.func @local_constant() {
  %0 = coco.constant 1.0 : !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [constant-replicated] a constant is the same on every rank, so its type must be replicated, not local

// -----

func.func @constant_type() {
  %0 = "coco.constant"() <{value = 1 : i64}> : () -> !coco.tensor<f32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [constant-type] constant 1 does not match element type f32

// -----

func.func @constant_does_not_fit_i1() {
  %0 = coco.constant 2 : !coco.tensor<i1>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [constant-type] constant 2 does not fit element type i1

// -----

func.func @constant_does_not_fit_i32() {
  %0 = coco.constant 4294967296 : !coco.tensor<8xi32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [constant-type] constant 4294967296 does not fit element type i32

// -----

func.func @dense_constant_local() {
  %0 = coco.constant dense<[1.0, 2.0]> : !coco.tensor<2xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [constant-replicated] a constant is the same on every rank, so its type must be replicated, not local

// -----

func.func @dense_constant_shape() {
  %0 = coco.constant dense<[1.0, 2.0, 3.0]> : !coco.tensor<4xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [constant-shape] dense constant of shape [3] does not match the result shape [4]

// -----

func.func @dense_constant_rank() {
  %0 = coco.constant dense<[[1.0, 2.0]]> : !coco.tensor<2xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [constant-shape] dense constant of shape [1, 2] does not match the result shape [2]

// -----

func.func @dense_constant_type() {
  %0 = "coco.constant"() <{value = dense<[1, 2]> : tensor<2xi64>}> : () -> !coco.tensor<2xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [constant-type] dense constant of i64 values does not match element type f32

// -----

func.func @dense_constant_does_not_fit_i32() {
  %0 = coco.constant dense<[1, 4294967296]> : !coco.tensor<2xi32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [constant-type] constant 4294967296 does not fit element type i32

// -----

// dropout-probability
func.func @dropout_one(%a: !coco.tensor<8xf32>) {
  %0 = coco.dropout %a, 1.0 seed 1 : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [dropout-probability] dropout probability must be in [0, 1), got 1.0

// -----

func.func @dropout_negative(%a: !coco.tensor<8xf32>) {
  %0 = coco.dropout %a, -0.1 seed 1 : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [dropout-probability] dropout probability must be in [0, 1), got -0.1

// -----

// result-type: a declared result type that the rules do not produce.
func.func @add_result(%a: !coco.tensor<8xf32>) {
  %0 = coco.add %a, %a : !coco.tensor<8xf32>, !coco.tensor<8xf32> -> !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.add produces !coco.tensor<8xf32> from its operands by the layout rules, but its result is declared as !coco.tensor<8xf32, local>

// -----

func.func @cast_keeps_layout(%a: !coco.tensor<8xf32>) {
  %0 = coco.cast %a : !coco.tensor<8xf32> -> !coco.tensor<8xf16, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.cast produces !coco.tensor<8xf16> from its operands by the layout rules, but its result is declared as !coco.tensor<8xf16, local>

// -----

func.func @unary_keeps_shape(%a: !coco.tensor<8xf32>) {
  %0 = coco.neg %a : !coco.tensor<8xf32> -> !coco.tensor<4xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.neg produces !coco.tensor<8xf32> from its operands by the layout rules, but its result is declared as !coco.tensor<4xf32>

// -----

func.func @cmp_result(%a: !coco.tensor<8xf32>) {
  %0 = coco.cmp eq %a, %a : !coco.tensor<8xf32>, !coco.tensor<8xf32> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.cmp produces !coco.tensor<8xi1> from its operands by the layout rules, but its result is declared as !coco.tensor<8xf32>

// -----

func.func @matmul_result(%a: !coco.tensor<4x8xf32, sliced<1>>, %b: !coco.tensor<8x16xf32, sliced<0>>) {
  %0 = coco.matmul %a, %b : !coco.tensor<4x8xf32, sliced<1>>, !coco.tensor<8x16xf32, sliced<0>> -> !coco.tensor<4x16xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.matmul produces !coco.tensor<4x16xf32, local> from its operands by the layout rules, but its result is declared as !coco.tensor<4x16xf32>

// -----

func.func @dropout_result(%a: !coco.tensor<8xf32>) {
  %0 = coco.dropout %a, 0.5 seed 1 : !coco.tensor<8xf32> -> !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.dropout produces !coco.tensor<8xf32> from its operands by the layout rules, but its result is declared as !coco.tensor<8xf32, local>

// -----

// empty-slice (static grids): a dim that does not divide is cut unevenly, one smaller than
// its parts would leave a rank nothing
func.func @empty(%a: !coco.tensor<1xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[2]>} {
  %0 = coco.neg %a : !coco.tensor<1xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [empty-slice] operand #0 (%a) of coco.neg of type !coco.tensor<1xf32, sliced<0>>: dim 0 of size 1 cannot be cut into 2 parts (grid [2]): some rank would hold no element of it

// -----

func.func @empty_two_axes(%a: !coco.tensor<8x3xf32, [sliced<0>, sliced<0>]>) attributes {coco.grid = #coco.grid<[4, 4]>} {
  %0 = coco.neg %a : !coco.tensor<8x3xf32, [sliced<0>, sliced<0>]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [empty-slice] operand #0 (%a) of coco.neg of type !coco.tensor<8x3xf32, [sliced<0>, sliced<0>]>: dim 0 of size 8 cannot be cut into 16 parts (grid [4, 4]): some rank would hold no element of it

// -----

func.func @empty_result(%a: !coco.tensor<3xf32>) attributes {coco.grid = #coco.grid<[4]>} {
  %0 = coco.slice %a : !coco.tensor<3xf32> -> !coco.tensor<3xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [empty-slice] result #0 of coco.slice of type !coco.tensor<3xf32, sliced<0>>: dim 0 of size 3 cannot be cut into 4 parts (grid [4]): some rank would hold no element of it

// -----

// layouts-per-axis
func.func @too_few_layouts(%a: !coco.tensor<8xf32, [local]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %0 = coco.neg %a : !coco.tensor<8xf32, [local]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [layouts-per-axis] operand #0 (%a) of coco.neg has type !coco.tensor<8xf32, local> with 1 layout(s), but the grid [2, 2] has 2 axis(es): write one layout per axis

// -----

func.func @too_many_layouts(%a: !coco.tensor<8xf32, [local, local]>) {
  %0 = coco.neg %a : !coco.tensor<8xf32, [local, local]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [layouts-per-axis] operand #0 (%a) of coco.neg has type !coco.tensor<8xf32, [local, local]> with 2 layout(s), but the grid [?] has 1 axis(es): write one layout per axis

// -----

// sliced-dim-in-range
func.func @sliced_dim(%a: !coco.tensor<8xf32, sliced<1>>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [sliced-dim-in-range] sliced<1> names a dim that a rank-1 tensor of shape [8] does not have

// -----

func.func @sliced_scalar(%a: !coco.tensor<f32, sliced<0>>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [sliced-dim-in-range] sliced<0> names a dim that a rank-0 tensor of shape [] does not have

// -----

// unsupported element types and shapes
func.func @i8(%a: !coco.tensor<8xi8>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [unsupported-element-type] unsupported element type i8: coco tensors hold one of f16, bf16, f32, f64, f8E4M3FN, f8E5M2, i32, i64, i1

// -----

func.func @unsigned(%a: !coco.tensor<8xui32>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [unsupported-element-type] unsupported element type ui32: coco tensors hold one of f16, bf16, f32, f64, f8E4M3FN, f8E5M2, i32, i64, i1

// -----

func.func @index(%a: !coco.tensor<8xindex>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [unsupported-element-type] unsupported element type index: coco tensors hold one of f16, bf16, f32, f64, f8E4M3FN, f8E5M2, i32, i64, i1

// -----

func.func @zero_dim(%a: !coco.tensor<0x4xf32>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [tensor-shape] tensor dims must be positive, got shape [0, 4]

// -----

// grid errors
func.func @empty_grid() attributes {coco.grid = #coco.grid<[]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [grid] a process grid needs at least one axis

// -----

func.func @zero_grid() attributes {coco.grid = #coco.grid<[4, 0]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [grid] grid axis sizes must be positive or '?', got 0

// -----

func.func @two_dynamic_axes() attributes {coco.grid = #coco.grid<[?, ?]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [grid] at most one grid axis may be sized at launch ('?')

// -----

// grid-size: at most 2^16 ranks (coco.MAX_RANKS). 2^40 ranks used to hang the lowering and
// 2^64 to fail in NumPy.
func.func @huge_grid() attributes {coco.grid = #coco.grid<[1099511627776]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [grid-size] the grid [1099511627776] has 1099511627776 ranks: at most 65536 (2^16) ranks are supported

// -----

func.func @grid_beyond_int64() attributes {coco.grid = #coco.grid<[18446744073709551616]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [grid-size] the grid [18446744073709551616] has 18446744073709551616 ranks: at most 65536 (2^16) ranks are supported

// -----

func.func @grid_axes_multiply(%a: !coco.tensor<8xf32>) attributes {coco.grid = #coco.grid<[512, 256]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [grid-size] the grid [512, 256] has 131072 ranks: at most 65536 (2^16) ranks are supported

// -----

func.func @grid_fixed_part_too_big(%a: !coco.tensor<8xf32>) attributes {coco.grid = #coco.grid<[131072, ?]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [grid-size] the grid [131072, ?] has 131072 ranks before its '?' axis is sized: at most 65536 (2^16) ranks are supported

// -----

// The largest grid is fine.
func.func @largest_grid(%a: !coco.tensor<65536xf32, [sliced<0>, sliced<0>]>) attributes {coco.grid = #coco.grid<[256, 256]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: func.func @largest_grid
// CHECK-NOT: error

// -----

// tensor-size: element counts are int64 in the sim and the kernels.
func.func @dim_beyond_int64(%a: !coco.tensor<9223372036854775808xf32>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [tensor-size] a tensor of shape [9223372036854775808] has 9223372036854775808 elements, more than int64 can count (at most 2^63 - 1)

// -----

func.func @element_count_beyond_int64(%a: !coco.tensor<4294967296x4294967296xf32>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [tensor-size] a tensor of shape [4294967296, 4294967296] has 18446744073709551616 elements, more than int64 can count (at most 2^63 - 1)

// -----

func.func @not_a_grid(%a: !coco.tensor<8xf32>) attributes {coco.grid = 8} {
  %0 = coco.neg %a : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [grid] 'coco.grid' must be a #coco.grid<[...]>, got 8 : i64

// -----

// a predicate is a #coco<cmp_predicate ...>, not a string
func.func @predicate(%a: !coco.tensor<8xi32>) {
  %0 = "coco.cmp"(%a, %a) <{predicate = "lol"}> : (!coco.tensor<8xi32>, !coco.tensor<8xi32>) -> !coco.tensor<8xi1>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: "lol" should be of base attribute coco.cmp_predicate

// -----

// operands and results are !coco.tensor
func.func @not_a_tensor(%a: f32) {
  %0 = coco.neg %a : f32
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: f32 should be of base attribute coco.tensor

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] coco.sub does not compute on i1 tensors
func.func @boolean_arithmetic(%a: !coco.tensor<8xi1>, %b: !coco.tensor<8xi1>) {
  %c = coco.sub %a, %b : !coco.tensor<8xi1>
  func.return
}

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [mixed-radix-order] coco.slice changes the slicing of dim 0 of !coco.tensor<8xf32, [sliced<0>, sliced<0>]> along grid axes [0], but that dim is cut by axes [0, 1] (outermost first): only the innermost cutting axes can be gathered, scattered or sliced; to cut each piece of the others further, state the nesting: axis 1: sliced<0, level 0>, axis 0: sliced<0, level 1>
func.func @slice_outer_axis(%x: !coco.tensor<8xf32, [replicated, sliced<0>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %y = coco.slice %x : !coco.tensor<8xf32, [replicated, sliced<0>]> -> !coco.tensor<8xf32, [sliced<0>, sliced<0>]>
  func.return
}

// -----

// An argument no op reads still has to fit the grid.
func.func @unused_empty(%a: !coco.tensor<3xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[4]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [empty-slice] argument %a of @unused_empty of type !coco.tensor<3xf32, sliced<0>>: dim 0 of size 3 cannot be cut into 4 parts

// -----

// reduce-dims: the reduced dims are a non-empty increasing run of consecutive dims.
func.func @reduce_dims_gap(%x: !coco.tensor<4x6x8xf32>) {
  %0 = coco.reduce_dims sum %x dims [0, 2] : !coco.tensor<4x6x8xf32> -> !coco.tensor<6xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reduce-dims] coco.reduce_dims of %x : !coco.tensor<4x6x8xf32> over dims [0, 2]: the dims must be a non-empty increasing run of consecutive dims of a rank-3 tensor

// -----

func.func @reduce_dims_out_of_range(%x: !coco.tensor<4x6xf32>) {
  %0 = coco.reduce_dims max %x dims [2] : !coco.tensor<4x6xf32> -> !coco.tensor<4xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reduce-dims] coco.reduce_dims of %x : !coco.tensor<4x6xf32> over dims [2]: the dims must be a non-empty increasing run of consecutive dims of a rank-2 tensor

// -----

// reduce-dims-layouts: a mean over the sliced dim would be a partial mean.
func.func @mean_of_slice(%x: !coco.tensor<4x8xf32, sliced<1>>) {
  %0 = coco.reduce_dims mean %x dims [1] keepdims : !coco.tensor<4x8xf32, sliced<1>> -> !coco.tensor<4x1xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reduce-dims-layouts] the mean of %x : !coco.tensor<4x8xf32, sliced<1>> over dims [1] reduces dim 1, which grid axis 0 slices: a mean of a slice is not a partial of the mean; reduce with sum, all_reduce the partial sums, then divide by the count

// -----

// A sum over the sliced dim is this rank's partial (local), not still sliced.
func.func @row_sum_of_slice_is_partial(%x: !coco.tensor<4x8xf32, sliced<1>>) {
  %0 = coco.reduce_dims sum %x dims [1] keepdims : !coco.tensor<4x8xf32, sliced<1>> -> !coco.tensor<4x1xf32, sliced<1>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.reduce_dims produces !coco.tensor<4x1xf32, local> from its operands by the layout rules, but its result is declared as !coco.tensor<4x1xf32, sliced<1>>

// -----

func.func @row_sum_declared_replicated(%x: !coco.tensor<4x8xf32, sliced<1>>) {
  %0 = coco.reduce_dims sum %x dims [1] : !coco.tensor<4x8xf32, sliced<1>> -> !coco.tensor<4xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] coco.reduce_dims produces !coco.tensor<4xf32, local> from its operands by the layout rules, but its result is declared as !coco.tensor<4xf32>

// -----

func.func @mean_of_integers(%x: !coco.tensor<4x8xi32>) {
  %0 = coco.reduce_dims mean %x dims [1] : !coco.tensor<4x8xi32> -> !coco.tensor<4xi32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [element-types] a mean needs a floating-point tensor, got i32

// -----

// reshape-layouts: a sliced tensor keeps its dims up to the sliced one.
func.func @reshape_regroups_sliced_dim(%x: !coco.tensor<8x16xf32, sliced<0>>) {
  %0 = coco.reshape %x : !coco.tensor<8x16xf32, sliced<0>> -> !coco.tensor<2x4x16xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reshape-layouts] coco.reshape of %x : !coco.tensor<8x16xf32, sliced<0>> to !coco.tensor<2x4x16xf32, sliced<0>>: grid axis 0 slices dim 0, so the result must keep dims 0..0 ([8]) and be sliced<0> there; only the dims after it may regroup

// -----

func.func @reshape_count(%x: !coco.tensor<8x16xf32>) {
  %0 = coco.reshape %x : !coco.tensor<8x16xf32> -> !coco.tensor<8x15xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reshape-layouts] coco.reshape of %x from [8, 16] to [8, 15] changes the element count

// -----

func.func @reshape_changes_layout(%x: !coco.tensor<8x16xf32, local>) {
  %0 = coco.reshape %x : !coco.tensor<8x16xf32, local> -> !coco.tensor<128xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reshape-layouts] coco.reshape of %x : !coco.tensor<8x16xf32, local> to !coco.tensor<128xf32> changes grid axis 0 from local to replicated: a reshape moves no data

// -----

func.func @quantize_to_a_wide_type(%x: !coco.tensor<8xf32>, %s: !coco.tensor<f32>) {
  %0 = coco.quantize %x, %s : !coco.tensor<8xf32>, !coco.tensor<f32> -> !coco.tensor<8xbf16>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [quantize-types] coco.quantize: the result is an fp8 type, got bf16

// -----

func.func @quantize_integers(%x: !coco.tensor<8xi32>, %s: !coco.tensor<f32>) {
  %0 = coco.quantize %x, %s : !coco.tensor<8xi32>, !coco.tensor<f32> -> !coco.tensor<8xf8E4M3FN>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [quantize-types] coco.quantize: the input and the scale are floats, got i32 and f32

// -----

func.func @dequantize_a_wide_type(%x: !coco.tensor<8xf16>, %s: !coco.tensor<f32>) {
  %0 = coco.dequantize %x, %s : !coco.tensor<8xf16>, !coco.tensor<f32> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [quantize-types] coco.dequantize: the input is an fp8 type, got f16

// -----

// a scale per block must divide the tensor into whole blocks
func.func @block_scale_does_not_divide(%x: !coco.tensor<8x16xf32>, %s: !coco.tensor<3x4xf32>) {
  %0 = coco.quantize %x, %s : !coco.tensor<8x16xf32>, !coco.tensor<3x4xf32> -> !coco.tensor<8x16xf8E4M3FN>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [quantize-block] coco.quantize of %x : !coco.tensor<8x16xf32> by %s : !coco.tensor<3x4xf32>: scale dim 0 of size 3 does not divide the input's 8

// -----

func.func @block_scale_larger_than_the_input(%q: !coco.tensor<8x16xf8E4M3FN>, %s: !coco.tensor<8x32xf32>) {
  %0 = coco.dequantize %q, %s : !coco.tensor<8x16xf8E4M3FN>, !coco.tensor<8x32xf32> -> !coco.tensor<8x16xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [quantize-block] coco.dequantize of %q : !coco.tensor<8x16xf8E4M3FN> by %s : !coco.tensor<8x32xf32>: scale dim 1 of size 32 does not divide the input's 16

// -----

// only quantize and dequantize read a scale per block: other elementwise ops broadcast
func.func @block_operand_of_a_mul(%x: !coco.tensor<8x16xf32>, %s: !coco.tensor<2x4xf32>) {
  %0 = coco.mul %x, %s : !coco.tensor<8x16xf32>, !coco.tensor<2x4xf32> -> !coco.tensor<8x16xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [broadcast-shapes] operand shapes [8, 16], [2, 4] do not broadcast

// -----

// 3 blocks of 4 rows cannot be cut into 2 parts on block boundaries (rows 0..5, 6..11)
func.func @block_scale_cut_inside_a_block(%x: !coco.tensor<12x16xf32, sliced<0>>, %s: !coco.tensor<3x4xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[2]>} {
  %0 = coco.quantize %x, %s : !coco.tensor<12x16xf32, sliced<0>>, !coco.tensor<3x4xf32, sliced<0>> -> !coco.tensor<12x16xf8E4M3FN, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [quantize-block-slices] coco.quantize of %s : !coco.tensor<3x4xf32, sliced<0>>: its 3 blocks of 4 along dim 0 cannot be cut into 2 parts on block boundaries

// -----

// the tensor's rows are cut by both axes, its block scale's by axis 0 alone
func.func @block_scale_cut_by_other_axes(%x: !coco.tensor<16x16xf32, [sliced<0>, sliced<0>]>, %s: !coco.tensor<4x4xf32, [sliced<0>, replicated]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %0 = coco.quantize %x, %s : !coco.tensor<16x16xf32, [sliced<0>, sliced<0>]>, !coco.tensor<4x4xf32, [sliced<0>, replicated]> -> !coco.tensor<16x16xf8E5M2, [sliced<0>, sliced<0>]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [quantize-block-slices] coco.quantize of %s : !coco.tensor<4x4xf32, [sliced<0>, replicated]>: the scale's block dim 0 is cut by grid axes [0], the result's dim 0 by [0, 1]: a block scale is replicated or cut by the same axes as the tensor it scales

// -----

// Levels (`sliced<DIM, level L>`) number every axis cutting a dim, 0 outermost, and are
// written only for a nesting other than grid order.
// CHECK-LABEL: // {{-----}}
// CHECK: [sliced-level] dim 0 of a tensor of shape [8] is cut by grid axes [0, 1] with levels [1, '-']: every axis cutting a dim states its level, numbered 0 (outermost) to 1, or none does (grid order)
func.func @partial_levels(%x: !coco.tensor<8xf32, [sliced<0, level 1>, sliced<0>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  func.return
}

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [sliced-level] dim 0 of a tensor of shape [8] is cut by grid axes [0, 1] with levels [1, 1]
func.func @duplicate_levels(%x: !coco.tensor<8xf32, [sliced<0, level 1>, sliced<0, level 1>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  func.return
}

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [sliced-level] dim 0 of a tensor of shape [8] is cut by grid axes [0, 1] in grid order: write it without levels (sliced<0>)
func.func @grid_order_levels(%x: !coco.tensor<8xf32, [sliced<0, level 0>, sliced<0, level 1>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  func.return
}

// -----

// A tp piece of the whole (%a) does not hold the dp-then-tp piece of %b: no rank could
// compute its part of the sum from its parts of the operands.
// CHECK-LABEL: // {{-----}}
// CHECK: [elementwise-layouts] operands %a : !coco.tensor<8xf32, [replicated, sliced<0>]>, %b : !coco.tensor<8xf32, [sliced<0>, sliced<0>]>: the operands cut dim 0 by grid axes [1] and [0, 1] (outermost first), so no rank's piece of one holds its piece of the other
func.func @pieces_not_nested(%a: !coco.tensor<8xf32, [replicated, sliced<0>]>, %b: !coco.tensor<8xf32, [sliced<0>, sliced<0>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %c = coco.add %a, %b : !coco.tensor<8xf32, [replicated, sliced<0>]>, !coco.tensor<8xf32, [sliced<0>, sliced<0>]> -> !coco.tensor<8xf32, [sliced<0>, sliced<0>]>
  func.return
}

// -----

// A slice cuts each piece further: the cuts it keeps nest as before.
// CHECK-LABEL: // {{-----}}
// CHECK: [mixed-radix-order] coco.slice keeps grid axes [1, 0] cutting dim 0, but !coco.tensor<8xf32, [sliced<0, level 1>, sliced<0, level 0>, sliced<0, level 2>]> nests them as [1, 0] and !coco.tensor<8xf32, [sliced<0>, sliced<0>, replicated]> as [0, 1] (outermost first)
func.func @slice_reorders_kept_cuts(%x: !coco.tensor<8xf32, [sliced<0>, sliced<0>, replicated]>) attributes {coco.grid = #coco.grid<[2, 2, 2]>} {
  %y = coco.slice %x : !coco.tensor<8xf32, [sliced<0>, sliced<0>, replicated]> -> !coco.tensor<8xf32, [sliced<0, level 1>, sliced<0, level 0>, sliced<0, level 2>]>
  func.return
}

// -----

// A batch both operands slice by two axes, nested otherwise in each: other batches.
// CHECK-LABEL: // {{-----}}
// CHECK: [matmul-layouts] the operands slice batch dim 0 on grid axis 0 as sliced<0, level 1> and sliced<0>
func.func @batch_nested_apart(%a: !coco.tensor<8x4x4xf32, [sliced<0, level 1>, sliced<0, level 0>]>, %b: !coco.tensor<8x4x4xf32, [sliced<0>, sliced<0>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %c = coco.matmul %a, %b : !coco.tensor<8x4x4xf32, [sliced<0, level 1>, sliced<0, level 0>]>, !coco.tensor<8x4x4xf32, [sliced<0>, sliced<0>]> -> !coco.tensor<8x4x4xf32, [sliced<0, level 1>, sliced<0, level 0>]>
  func.return
}
