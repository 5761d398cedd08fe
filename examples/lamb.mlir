// LAMB, data parallel (CoCoNet reference sec. 4.2, with bias correction and epsilon).
// Built also by lamb.py.
//   m, v, mhat, vhat as in Adam;  r = mhat / (sqrt(vhat) + eps) + weight_decay w;
//   w = w - lr (norm(w) / norm(r)) r       (norms of replicated tensors)
// Schedules: AR_C; RS_C_AG (after the reorder the norms are over slices: each becomes a partial
// sum of squares combined by a tiny all_reduce); fuse_RS_C_AG (one FusedAllReduce, two passes
// around the norm all_reduce).

func.func @lamb(
    %g: !coco.tensor<4096xf32, local>,
    %w: !coco.tensor<4096xf32>,
    %m: !coco.tensor<4096xf32>,
    %v: !coco.tensor<4096xf32>,
    %lr: !coco.tensor<f32>,
    %beta1: !coco.tensor<f32>,
    %beta2: !coco.tensor<f32>,
    %eps: !coco.tensor<f32>,
    %weight_decay: !coco.tensor<f32>,
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
  %12 = coco.sqrt %vhat : !coco.tensor<4096xf32>
  %13 = coco.add %12, %eps : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
  %14 = coco.div %mhat, %13 : !coco.tensor<4096xf32>
  %15 = coco.mul %weight_decay, %w : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
  %r = coco.add %14, %15 : !coco.tensor<4096xf32>
  %w_norm = coco.reduce norm %w : !coco.tensor<4096xf32> -> !coco.tensor<f32>
  %r_norm = coco.reduce norm %r : !coco.tensor<4096xf32> -> !coco.tensor<f32>
  %trust = coco.div %w_norm, %r_norm : !coco.tensor<f32>
  %16 = coco.mul %lr, %trust : !coco.tensor<f32>
  %17 = coco.mul %16, %r : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
  %w1 = coco.sub %w, %17 : !coco.tensor<4096xf32>
  coco.update %w, %w1 : !coco.tensor<4096xf32>
  func.return
}
