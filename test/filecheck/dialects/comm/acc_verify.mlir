// RUN: COCO_VERIFY

// One refusal per chunk: a stated accumulation (`acc`) the lowerings cannot honour, or that
// does not fit the data, each naming its op's [*-acc] rule.

// all-reduce-acc: narrower than the data (bf16 does not hold every f16 value)
func.func @acc_narrower_than_data(%g: !coco.tensor<8xf16, local>) {
  %0 = comm.all_reduce sum %g acc bf16 : !coco.tensor<8xf16, local> -> !coco.tensor<8xf16>
  func.return
}

// CHECK: [all-reduce-acc] comm.all_reduce of f16 values accumulating in bf16, which does not hold every f16 value: the accumulation is at least as wide as the data

// -----

// all-reduce-acc: fp8 is no accumulator
func.func @acc_fp8(%g: !coco.tensor<8xf8E4M3FN, local>) {
  %0 = comm.all_reduce sum %g acc f8E4M3FN : !coco.tensor<8xf8E4M3FN, local> -> !coco.tensor<8xf8E4M3FN>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-reduce-acc] comm.all_reduce accumulating in f8E4M3FN: no lowering accumulates in fp8 (too few mantissa bits); use one of bf16, f16, f32, f64

// -----

// reduce-scatter-acc: integers accumulate exactly and state none
func.func @acc_on_integers(%g: !coco.tensor<8xi32, local>) {
  %0 = comm.reduce_scatter sum %g acc i64 : !coco.tensor<8xi32, local> -> !coco.tensor<8xi32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reduce-scatter-acc] comm.reduce_scatter of i32 values accumulating in i64: integers accumulate exactly (int64) and state no acc; float data accumulates in a float type

// -----

// reduce-acc: an integer accumulation of float data
func.func @integer_acc_of_floats(%g: !coco.tensor<8xbf16, local>) {
  %0 = comm.reduce sum %g root 0 acc i32 : !coco.tensor<8xbf16, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reduce-acc] comm.reduce of bf16 values accumulating in i32: integers accumulate exactly (int64) and state no acc; float data accumulates in a float type

// -----

// all-reduce-acc: not an element type
func.func @acc_not_an_element_type(%g: !coco.tensor<8xf32, local>) {
  %0 = comm.all_reduce sum %g acc i8 : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-reduce-acc] comm.all_reduce accumulates in i8, which is no element type
