// Adam, data parallel, fp32 gradients (CoCoNet reference sec. 4.1, with the real bias
// correction and epsilon). Built also by adam.py.
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;  mhat = m / (1 - b1^t);
//   vhat = v / (1 - b2^t);  w = w - lr mhat / (sqrt(vhat) + eps)
// Schedules: AR_C (all_reduce + one fused elementwise kernel); RS_C_AG (split, reorder the
// updates onto slices, as-slice m and v: ZeRO-style sharded state); fuse_RS_C_AG (reduce_scatter
// + sliced update + all_gather of w as one FusedAllReduce).

func.func @adam(
    %g: !coco.tensor<4096xf32, local>,
    %w: !coco.tensor<4096xf32>,
    %m: !coco.tensor<4096xf32>,
    %v: !coco.tensor<4096xf32>,
    %lr: !coco.tensor<f32>,
    %beta1: !coco.tensor<f32>,
    %beta2: !coco.tensor<f32>,
    %eps: !coco.tensor<f32>,
    %step: !coco.tensor<f32>
) attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<4096xf32, local> -> !coco.tensor<4096xf32>
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
