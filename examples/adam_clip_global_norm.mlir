// Global-norm gradient clipping, then Adam, over three parameter tensors (1000, 33 and 4097
// elements). Built also by adam_clip_global_norm.py, which says more. Every tensor's update
// reads clip = min(1, max_norm / (||(g0, g1, g2)|| + 1e-6)): the tensors' chains are coupled
// through scalars, and fuse(rs-c-ag) fuses them as one region (one table launch per segment).

func.func @adam_clip_global_norm(%lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>, %beta2: !coco.tensor<f32>, %eps: !coco.tensor<f32>, %step: !coco.tensor<f32>, %max_norm: !coco.tensor<f32>, %g0: !coco.tensor<1000xf32, local>, %g1: !coco.tensor<33xf32, local>, %g2: !coco.tensor<4097xf32, local>, %w0: !coco.tensor<1000xf32>, %m0: !coco.tensor<1000xf32>, %v0: !coco.tensor<1000xf32>, %w1: !coco.tensor<33xf32>, %m1: !coco.tensor<33xf32>, %v1: !coco.tensor<33xf32>, %w2: !coco.tensor<4097xf32>, %m2: !coco.tensor<4097xf32>, %v2: !coco.tensor<4097xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %gsum0 = comm.all_reduce sum %g0 : !coco.tensor<1000xf32, local> -> !coco.tensor<1000xf32>
  %gsum1 = comm.all_reduce sum %g1 : !coco.tensor<33xf32, local> -> !coco.tensor<33xf32>
  %gsum2 = comm.all_reduce sum %g2 : !coco.tensor<4097xf32, local> -> !coco.tensor<4097xf32>
  %gsq0 = coco.mul %gsum0, %gsum0 : !coco.tensor<1000xf32>
  %sumsq0 = coco.reduce sum %gsq0 : !coco.tensor<1000xf32> -> !coco.tensor<f32>
  %gsq1 = coco.mul %gsum1, %gsum1 : !coco.tensor<33xf32>
  %sumsq1 = coco.reduce sum %gsq1 : !coco.tensor<33xf32> -> !coco.tensor<f32>
  %squares = coco.add %sumsq0, %sumsq1 : !coco.tensor<f32>
  %gsq2 = coco.mul %gsum2, %gsum2 : !coco.tensor<4097xf32>
  %sumsq2 = coco.reduce sum %gsq2 : !coco.tensor<4097xf32> -> !coco.tensor<f32>
  %squares_1 = coco.add %squares, %sumsq2 : !coco.tensor<f32>
  %total_norm = coco.sqrt %squares_1 : !coco.tensor<f32>
  %0 = coco.constant 1.0e-06 : !coco.tensor<f32>
  %1 = coco.add %total_norm, %0 : !coco.tensor<f32>
  %2 = coco.div %max_norm, %1 : !coco.tensor<f32>
  %3 = coco.constant 1.0 : !coco.tensor<f32>
  %clip = coco.min %3, %2 : !coco.tensor<f32>
  %4 = coco.pow %beta1, %step : !coco.tensor<f32>
  %bias1 = coco.sub %3, %4 : !coco.tensor<f32>
  %5 = coco.pow %beta2, %step : !coco.tensor<f32>
  %bias2 = coco.sub %3, %5 : !coco.tensor<f32>
  %gclip0 = coco.mul %gsum0, %clip : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
  %6 = coco.mul %beta1, %m0 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
  %7 = coco.sub %3, %beta1 : !coco.tensor<f32>
  %8 = coco.mul %7, %gclip0 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
  %m_new0 = coco.add %6, %8 : !coco.tensor<1000xf32>
  %9 = coco.mul %beta2, %v0 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
  %10 = coco.sub %3, %beta2 : !coco.tensor<f32>
  %11 = coco.mul %10, %gclip0 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
  %12 = coco.mul %11, %gclip0 : !coco.tensor<1000xf32>
  %v_new0 = coco.add %9, %12 : !coco.tensor<1000xf32>
  coco.update %m0, %m_new0 : !coco.tensor<1000xf32>
  coco.update %v0, %v_new0 : !coco.tensor<1000xf32>
  %13 = coco.div %m_new0, %bias1 : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
  %14 = coco.mul %lr, %13 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
  %15 = coco.div %v_new0, %bias2 : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
  %16 = coco.sqrt %15 : !coco.tensor<1000xf32>
  %17 = coco.add %16, %eps : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
  %18 = coco.div %14, %17 : !coco.tensor<1000xf32>
  %w_new0 = coco.sub %w0, %18 : !coco.tensor<1000xf32>
  coco.update %w0, %w_new0 : !coco.tensor<1000xf32>
  %gclip1 = coco.mul %gsum1, %clip : !coco.tensor<33xf32>, !coco.tensor<f32> -> !coco.tensor<33xf32>
  %19 = coco.mul %beta1, %m1 : !coco.tensor<f32>, !coco.tensor<33xf32> -> !coco.tensor<33xf32>
  %20 = coco.sub %3, %beta1 : !coco.tensor<f32>
  %21 = coco.mul %20, %gclip1 : !coco.tensor<f32>, !coco.tensor<33xf32> -> !coco.tensor<33xf32>
  %m_new1 = coco.add %19, %21 : !coco.tensor<33xf32>
  %22 = coco.mul %beta2, %v1 : !coco.tensor<f32>, !coco.tensor<33xf32> -> !coco.tensor<33xf32>
  %23 = coco.sub %3, %beta2 : !coco.tensor<f32>
  %24 = coco.mul %23, %gclip1 : !coco.tensor<f32>, !coco.tensor<33xf32> -> !coco.tensor<33xf32>
  %25 = coco.mul %24, %gclip1 : !coco.tensor<33xf32>
  %v_new1 = coco.add %22, %25 : !coco.tensor<33xf32>
  coco.update %m1, %m_new1 : !coco.tensor<33xf32>
  coco.update %v1, %v_new1 : !coco.tensor<33xf32>
  %26 = coco.div %m_new1, %bias1 : !coco.tensor<33xf32>, !coco.tensor<f32> -> !coco.tensor<33xf32>
  %27 = coco.mul %lr, %26 : !coco.tensor<f32>, !coco.tensor<33xf32> -> !coco.tensor<33xf32>
  %28 = coco.div %v_new1, %bias2 : !coco.tensor<33xf32>, !coco.tensor<f32> -> !coco.tensor<33xf32>
  %29 = coco.sqrt %28 : !coco.tensor<33xf32>
  %30 = coco.add %29, %eps : !coco.tensor<33xf32>, !coco.tensor<f32> -> !coco.tensor<33xf32>
  %31 = coco.div %27, %30 : !coco.tensor<33xf32>
  %w_new1 = coco.sub %w1, %31 : !coco.tensor<33xf32>
  coco.update %w1, %w_new1 : !coco.tensor<33xf32>
  %gclip2 = coco.mul %gsum2, %clip : !coco.tensor<4097xf32>, !coco.tensor<f32> -> !coco.tensor<4097xf32>
  %32 = coco.mul %beta1, %m2 : !coco.tensor<f32>, !coco.tensor<4097xf32> -> !coco.tensor<4097xf32>
  %33 = coco.sub %3, %beta1 : !coco.tensor<f32>
  %34 = coco.mul %33, %gclip2 : !coco.tensor<f32>, !coco.tensor<4097xf32> -> !coco.tensor<4097xf32>
  %m_new2 = coco.add %32, %34 : !coco.tensor<4097xf32>
  %35 = coco.mul %beta2, %v2 : !coco.tensor<f32>, !coco.tensor<4097xf32> -> !coco.tensor<4097xf32>
  %36 = coco.sub %3, %beta2 : !coco.tensor<f32>
  %37 = coco.mul %36, %gclip2 : !coco.tensor<f32>, !coco.tensor<4097xf32> -> !coco.tensor<4097xf32>
  %38 = coco.mul %37, %gclip2 : !coco.tensor<4097xf32>
  %v_new2 = coco.add %35, %38 : !coco.tensor<4097xf32>
  coco.update %m2, %m_new2 : !coco.tensor<4097xf32>
  coco.update %v2, %v_new2 : !coco.tensor<4097xf32>
  %39 = coco.div %m_new2, %bias1 : !coco.tensor<4097xf32>, !coco.tensor<f32> -> !coco.tensor<4097xf32>
  %40 = coco.mul %lr, %39 : !coco.tensor<f32>, !coco.tensor<4097xf32> -> !coco.tensor<4097xf32>
  %41 = coco.div %v_new2, %bias2 : !coco.tensor<4097xf32>, !coco.tensor<f32> -> !coco.tensor<4097xf32>
  %42 = coco.sqrt %41 : !coco.tensor<4097xf32>
  %43 = coco.add %42, %eps : !coco.tensor<4097xf32>, !coco.tensor<f32> -> !coco.tensor<4097xf32>
  %44 = coco.div %40, %43 : !coco.tensor<4097xf32>
  %w_new2 = coco.sub %w2, %44 : !coco.tensor<4097xf32>
  coco.update %w2, %w_new2 : !coco.tensor<4097xf32>
  func.return
}
