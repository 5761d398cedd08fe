// Adam, data parallel, fp8 (f8E4M3FN) gradients with f32 master weights and state, the sum
// accumulated in f32. Built also by adam_fp8_wire.py (build(n, grad=BF16 or F32): the same
// step with bf16 or f32 gradients). Each rank's gradient is widened to f32 before the
// all_reduce: the all_reduce's type states the accumulation type.
// Schedules: ar-c (as written: cast, all_reduce in f32, the update as one fused elementwise
// kernel); rs-c-ag (cast, reduce_scatter in f32, the update on the slice with sliced m and v,
// all_gather of w); fuse(rs-c-ag) (one fused collective kernel with a narrow wire: the cast is
// deferred into it, peers pull the fp8 gradient -- 1 byte an element -- and widen it as they
// accumulate; no cast kernel).

func.func @adam_fp8_wire(
    %g: !coco.tensor<4096xf8E4M3FN, local>,
    %w: !coco.tensor<4096xf32>,
    %m: !coco.tensor<4096xf32>,
    %v: !coco.tensor<4096xf32>,
    %lr: !coco.tensor<f32>,
    %beta1: !coco.tensor<f32>,
    %beta2: !coco.tensor<f32>,
    %eps: !coco.tensor<f32>,
    %step: !coco.tensor<f32>
) attributes {coco.grid = #coco.grid<[?]>} {
  %gw = coco.cast %g : !coco.tensor<4096xf8E4M3FN, local> -> !coco.tensor<4096xf32, local>
  %g1 = comm.all_reduce sum %gw : !coco.tensor<4096xf32, local> -> !coco.tensor<4096xf32>
  %0 = coco.mul %beta1, %m : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
  %1 = coco.constant 1.0 : !coco.tensor<f32>
  %2 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %3 = coco.mul %2, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
  %m1 = coco.add %0, %3 : !coco.tensor<4096xf32>
  %4 = coco.mul %beta2, %v : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
  %5 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %6 = coco.mul %5, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
  %7 = coco.mul %6, %g1 : !coco.tensor<4096xf32>
  %v1 = coco.add %4, %7 : !coco.tensor<4096xf32>
  coco.update %m, %m1 : !coco.tensor<4096xf32>
  coco.update %v, %v1 : !coco.tensor<4096xf32>
  %8 = coco.pow %beta1, %step : !coco.tensor<f32>
  %9 = coco.sub %1, %8 : !coco.tensor<f32>
  %mhat = coco.div %m1, %9 : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
  %10 = coco.pow %beta2, %step : !coco.tensor<f32>
  %11 = coco.sub %1, %10 : !coco.tensor<f32>
  %vhat = coco.div %v1, %11 : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
  %12 = coco.mul %lr, %mhat : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
  %13 = coco.sqrt %vhat : !coco.tensor<4096xf32>
  %14 = coco.add %13, %eps : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
  %15 = coco.div %12, %14 : !coco.tensor<4096xf32>
  %w1 = coco.sub %w, %15 : !coco.tensor<4096xf32>
  coco.update %w, %w1 : !coco.tensor<4096xf32>
  func.return
}
