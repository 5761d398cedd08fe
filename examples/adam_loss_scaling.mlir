// Mixed-precision Adam with dynamic loss scaling (torch.cuda.amp.GradScaler's recipe) over two
// parameter tensors (1000 and 4096 elements). Built also by adam_loss_scaling.py, which says
// more: f16 gradients summed over the ranks, unscaled, checked for inf/NaN (x - x == 0 holds
// for finite x only); the step applied or skipped as a whole, the scale grown after `interval`
// clean steps or halved.
// Schedules: ar-c, rs-c-ag, fuse(rs-c-ag) (each tensor's chain a fused collective, the scale's
// update one kernel after them), fuse(ar-c).
builtin.module {
  func.func @adam_loss_scaling(%lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>, %beta2: !coco.tensor<f32>, %eps: !coco.tensor<f32>, %step: !coco.tensor<f32>, %scale: !coco.tensor<f32>, %tracker: !coco.tensor<f32>, %interval: !coco.tensor<f32>, %g0: !coco.tensor<1000xf16, local>, %g1: !coco.tensor<4096xf16, local>, %w0: !coco.tensor<1000xf32>, %m0: !coco.tensor<1000xf32>, %v0: !coco.tensor<1000xf32>, %w1: !coco.tensor<4096xf32>, %m1: !coco.tensor<4096xf32>, %v1: !coco.tensor<4096xf32>) attributes {coco.grid = #coco.grid<[?]>} {
    %gsum0 = comm.all_reduce sum %g0 : !coco.tensor<1000xf16, local> -> !coco.tensor<1000xf16>
    %0 = coco.cast %gsum0 : !coco.tensor<1000xf16> -> !coco.tensor<1000xf32>
    %gu0 = coco.div %0, %scale : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
    %1 = coco.sub %gu0, %gu0 : !coco.tensor<1000xf32>
    %2 = coco.constant 0.0 : !coco.tensor<f32>
    %3 = coco.cmp eq %1, %2 : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xi1>
    %4 = coco.constant 0.0 : !coco.tensor<f32>
    %5 = coco.constant 1.0 : !coco.tensor<f32>
    %6 = coco.select %3, %4, %5 : !coco.tensor<1000xi1>, !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
    %bad0 = coco.reduce max %6 : !coco.tensor<1000xf32> -> !coco.tensor<f32>
    %gsum1 = comm.all_reduce sum %g1 : !coco.tensor<4096xf16, local> -> !coco.tensor<4096xf16>
    %7 = coco.cast %gsum1 : !coco.tensor<4096xf16> -> !coco.tensor<4096xf32>
    %gu1 = coco.div %7, %scale : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
    %8 = coco.sub %gu1, %gu1 : !coco.tensor<4096xf32>
    %9 = coco.cmp eq %8, %2 : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xi1>
    %10 = coco.constant 0.0 : !coco.tensor<f32>
    %11 = coco.select %9, %10, %5 : !coco.tensor<4096xi1>, !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
    %bad1 = coco.reduce max %11 : !coco.tensor<4096xf32> -> !coco.tensor<f32>
    %found = coco.max %bad0, %bad1 : !coco.tensor<f32>
    %ok = coco.cmp eq %found, %2 : !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<i1>
    %12 = coco.pow %beta1, %step : !coco.tensor<f32>
    %bias1 = coco.sub %5, %12 : !coco.tensor<f32>
    %13 = coco.pow %beta2, %step : !coco.tensor<f32>
    %bias2 = coco.sub %5, %13 : !coco.tensor<f32>
    %14 = coco.mul %beta1, %m0 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
    %15 = coco.sub %5, %beta1 : !coco.tensor<f32>
    %16 = coco.mul %15, %gu0 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
    %m_new0 = coco.add %14, %16 : !coco.tensor<1000xf32>
    %17 = coco.mul %beta2, %v0 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
    %18 = coco.sub %5, %beta2 : !coco.tensor<f32>
    %19 = coco.mul %18, %gu0 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
    %20 = coco.mul %19, %gu0 : !coco.tensor<1000xf32>
    %v_new0 = coco.add %17, %20 : !coco.tensor<1000xf32>
    %21 = coco.div %m_new0, %bias1 : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
    %22 = coco.mul %lr, %21 : !coco.tensor<f32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
    %23 = coco.div %v_new0, %bias2 : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
    %24 = coco.sqrt %23 : !coco.tensor<1000xf32>
    %25 = coco.add %24, %eps : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
    %26 = coco.div %22, %25 : !coco.tensor<1000xf32>
    %w_new0 = coco.sub %w0, %26 : !coco.tensor<1000xf32>
    %27 = coco.select %ok, %m_new0, %m0 : !coco.tensor<i1>, !coco.tensor<1000xf32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
    coco.update %m0, %27 : !coco.tensor<1000xf32>
    %28 = coco.select %ok, %v_new0, %v0 : !coco.tensor<i1>, !coco.tensor<1000xf32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
    coco.update %v0, %28 : !coco.tensor<1000xf32>
    %29 = coco.select %ok, %w_new0, %w0 : !coco.tensor<i1>, !coco.tensor<1000xf32>, !coco.tensor<1000xf32> -> !coco.tensor<1000xf32>
    coco.update %w0, %29 : !coco.tensor<1000xf32>
    %30 = coco.mul %beta1, %m1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %31 = coco.sub %5, %beta1 : !coco.tensor<f32>
    %32 = coco.mul %31, %gu1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %m_new1 = coco.add %30, %32 : !coco.tensor<4096xf32>
    %33 = coco.mul %beta2, %v1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %34 = coco.sub %5, %beta2 : !coco.tensor<f32>
    %35 = coco.mul %34, %gu1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %36 = coco.mul %35, %gu1 : !coco.tensor<4096xf32>
    %v_new1 = coco.add %33, %36 : !coco.tensor<4096xf32>
    %37 = coco.div %m_new1, %bias1 : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
    %38 = coco.mul %lr, %37 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %39 = coco.div %v_new1, %bias2 : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
    %40 = coco.sqrt %39 : !coco.tensor<4096xf32>
    %41 = coco.add %40, %eps : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
    %42 = coco.div %38, %41 : !coco.tensor<4096xf32>
    %w_new1 = coco.sub %w1, %42 : !coco.tensor<4096xf32>
    %43 = coco.select %ok, %m_new1, %m1 : !coco.tensor<i1>, !coco.tensor<4096xf32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    coco.update %m1, %43 : !coco.tensor<4096xf32>
    %44 = coco.select %ok, %v_new1, %v1 : !coco.tensor<i1>, !coco.tensor<4096xf32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    coco.update %v1, %44 : !coco.tensor<4096xf32>
    %45 = coco.select %ok, %w_new1, %w1 : !coco.tensor<i1>, !coco.tensor<4096xf32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    coco.update %w1, %45 : !coco.tensor<4096xf32>
    %46 = coco.add %tracker, %5 : !coco.tensor<f32>
    %47 = coco.constant 0.0 : !coco.tensor<f32>
    %clean = coco.select %ok, %46, %47 : !coco.tensor<i1>, !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<f32>
    %grow = coco.cmp eq %clean, %interval : !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<i1>
    %48 = coco.constant 2.0 : !coco.tensor<f32>
    %49 = coco.mul %scale, %48 : !coco.tensor<f32>
    %50 = coco.select %grow, %49, %scale : !coco.tensor<i1>, !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<f32>
    %51 = coco.constant 0.5 : !coco.tensor<f32>
    %52 = coco.mul %scale, %51 : !coco.tensor<f32>
    %53 = coco.select %ok, %50, %52 : !coco.tensor<i1>, !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<f32>
    coco.update %scale, %53 : !coco.tensor<f32>
    %54 = coco.constant 0.0 : !coco.tensor<f32>
    %55 = coco.select %grow, %54, %clean : !coco.tensor<i1>, !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<f32>
    coco.update %tracker, %55 : !coco.tensor<f32>
    func.return
  }
}

