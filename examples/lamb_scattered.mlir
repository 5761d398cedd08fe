// LAMB over many parameter tensors of different sizes (CoCoNet's scattered tensors). Built
// also by lamb_scattered.py, which says more. Per-tensor trust ratios; the elementwise work of
// every tensor runs as one table-driven launch. Schedules: AR_C, RS_C_AG, fuse_RS_C_AG.

func.func @lamb_scattered(%lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>, %beta2: !coco.tensor<f32>, %eps: !coco.tensor<f32>, %weight_decay: !coco.tensor<f32>, %step: !coco.tensor<f32>, %g0: !coco.tensor<2048xf32, local>, %w0: !coco.tensor<2048xf32>, %m0: !coco.tensor<2048xf32>, %v0: !coco.tensor<2048xf32>, %g1: !coco.tensor<1024xf32, local>, %w1: !coco.tensor<1024xf32>, %m1: !coco.tensor<1024xf32>, %v1: !coco.tensor<1024xf32>, %g2: !coco.tensor<512xf32, local>, %w2: !coco.tensor<512xf32>, %m2: !coco.tensor<512xf32>, %v2: !coco.tensor<512xf32>, %g3: !coco.tensor<64xf32, local>, %w3: !coco.tensor<64xf32>, %m3: !coco.tensor<64xf32>, %v3: !coco.tensor<64xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %0 = coco.pow %beta1, %step : !coco.tensor<f32>
  %1 = coco.constant 1.0 : !coco.tensor<f32>
  %bias1 = coco.sub %1, %0 : !coco.tensor<f32>
  %2 = coco.pow %beta2, %step : !coco.tensor<f32>
  %bias2 = coco.sub %1, %2 : !coco.tensor<f32>
  %gsum0 = comm.all_reduce sum %g0 : !coco.tensor<2048xf32, local> -> !coco.tensor<2048xf32>
  %3 = coco.mul %beta1, %m0 : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %4 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %5 = coco.mul %4, %gsum0 : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %m_new0 = coco.add %3, %5 : !coco.tensor<2048xf32>
  %6 = coco.mul %beta2, %v0 : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %7 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %8 = coco.mul %7, %gsum0 : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %9 = coco.mul %8, %gsum0 : !coco.tensor<2048xf32>
  %v_new0 = coco.add %6, %9 : !coco.tensor<2048xf32>
  coco.update %m0, %m_new0 : !coco.tensor<2048xf32>
  coco.update %v0, %v_new0 : !coco.tensor<2048xf32>
  %10 = coco.div %m_new0, %bias1 : !coco.tensor<2048xf32>, !coco.tensor<f32> -> !coco.tensor<2048xf32>
  %11 = coco.div %v_new0, %bias2 : !coco.tensor<2048xf32>, !coco.tensor<f32> -> !coco.tensor<2048xf32>
  %12 = coco.sqrt %11 : !coco.tensor<2048xf32>
  %13 = coco.add %12, %eps : !coco.tensor<2048xf32>, !coco.tensor<f32> -> !coco.tensor<2048xf32>
  %14 = coco.div %10, %13 : !coco.tensor<2048xf32>
  %15 = coco.mul %weight_decay, %w0 : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %r0 = coco.add %14, %15 : !coco.tensor<2048xf32>
  %16 = coco.reduce norm %w0 : !coco.tensor<2048xf32> -> !coco.tensor<f32>
  %17 = coco.reduce norm %r0 : !coco.tensor<2048xf32> -> !coco.tensor<f32>
  %18 = coco.div %16, %17 : !coco.tensor<f32>
  %19 = coco.mul %lr, %18 : !coco.tensor<f32>
  %20 = coco.mul %19, %r0 : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %w_new0 = coco.sub %w0, %20 : !coco.tensor<2048xf32>
  coco.update %w0, %w_new0 : !coco.tensor<2048xf32>
  %gsum1 = comm.all_reduce sum %g1 : !coco.tensor<1024xf32, local> -> !coco.tensor<1024xf32>
  %21 = coco.mul %beta1, %m1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %22 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %23 = coco.mul %22, %gsum1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %m_new1 = coco.add %21, %23 : !coco.tensor<1024xf32>
  %24 = coco.mul %beta2, %v1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %25 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %26 = coco.mul %25, %gsum1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %27 = coco.mul %26, %gsum1 : !coco.tensor<1024xf32>
  %v_new1 = coco.add %24, %27 : !coco.tensor<1024xf32>
  coco.update %m1, %m_new1 : !coco.tensor<1024xf32>
  coco.update %v1, %v_new1 : !coco.tensor<1024xf32>
  %28 = coco.div %m_new1, %bias1 : !coco.tensor<1024xf32>, !coco.tensor<f32> -> !coco.tensor<1024xf32>
  %29 = coco.div %v_new1, %bias2 : !coco.tensor<1024xf32>, !coco.tensor<f32> -> !coco.tensor<1024xf32>
  %30 = coco.sqrt %29 : !coco.tensor<1024xf32>
  %31 = coco.add %30, %eps : !coco.tensor<1024xf32>, !coco.tensor<f32> -> !coco.tensor<1024xf32>
  %32 = coco.div %28, %31 : !coco.tensor<1024xf32>
  %33 = coco.mul %weight_decay, %w1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %r1 = coco.add %32, %33 : !coco.tensor<1024xf32>
  %34 = coco.reduce norm %w1 : !coco.tensor<1024xf32> -> !coco.tensor<f32>
  %35 = coco.reduce norm %r1 : !coco.tensor<1024xf32> -> !coco.tensor<f32>
  %36 = coco.div %34, %35 : !coco.tensor<f32>
  %37 = coco.mul %lr, %36 : !coco.tensor<f32>
  %38 = coco.mul %37, %r1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %w_new1 = coco.sub %w1, %38 : !coco.tensor<1024xf32>
  coco.update %w1, %w_new1 : !coco.tensor<1024xf32>
  %gsum2 = comm.all_reduce sum %g2 : !coco.tensor<512xf32, local> -> !coco.tensor<512xf32>
  %39 = coco.mul %beta1, %m2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %40 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %41 = coco.mul %40, %gsum2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %m_new2 = coco.add %39, %41 : !coco.tensor<512xf32>
  %42 = coco.mul %beta2, %v2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %43 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %44 = coco.mul %43, %gsum2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %45 = coco.mul %44, %gsum2 : !coco.tensor<512xf32>
  %v_new2 = coco.add %42, %45 : !coco.tensor<512xf32>
  coco.update %m2, %m_new2 : !coco.tensor<512xf32>
  coco.update %v2, %v_new2 : !coco.tensor<512xf32>
  %46 = coco.div %m_new2, %bias1 : !coco.tensor<512xf32>, !coco.tensor<f32> -> !coco.tensor<512xf32>
  %47 = coco.div %v_new2, %bias2 : !coco.tensor<512xf32>, !coco.tensor<f32> -> !coco.tensor<512xf32>
  %48 = coco.sqrt %47 : !coco.tensor<512xf32>
  %49 = coco.add %48, %eps : !coco.tensor<512xf32>, !coco.tensor<f32> -> !coco.tensor<512xf32>
  %50 = coco.div %46, %49 : !coco.tensor<512xf32>
  %51 = coco.mul %weight_decay, %w2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %r2 = coco.add %50, %51 : !coco.tensor<512xf32>
  %52 = coco.reduce norm %w2 : !coco.tensor<512xf32> -> !coco.tensor<f32>
  %53 = coco.reduce norm %r2 : !coco.tensor<512xf32> -> !coco.tensor<f32>
  %54 = coco.div %52, %53 : !coco.tensor<f32>
  %55 = coco.mul %lr, %54 : !coco.tensor<f32>
  %56 = coco.mul %55, %r2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %w_new2 = coco.sub %w2, %56 : !coco.tensor<512xf32>
  coco.update %w2, %w_new2 : !coco.tensor<512xf32>
  %gsum3 = comm.all_reduce sum %g3 : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  %57 = coco.mul %beta1, %m3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %58 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %59 = coco.mul %58, %gsum3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %m_new3 = coco.add %57, %59 : !coco.tensor<64xf32>
  %60 = coco.mul %beta2, %v3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %61 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %62 = coco.mul %61, %gsum3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %63 = coco.mul %62, %gsum3 : !coco.tensor<64xf32>
  %v_new3 = coco.add %60, %63 : !coco.tensor<64xf32>
  coco.update %m3, %m_new3 : !coco.tensor<64xf32>
  coco.update %v3, %v_new3 : !coco.tensor<64xf32>
  %64 = coco.div %m_new3, %bias1 : !coco.tensor<64xf32>, !coco.tensor<f32> -> !coco.tensor<64xf32>
  %65 = coco.div %v_new3, %bias2 : !coco.tensor<64xf32>, !coco.tensor<f32> -> !coco.tensor<64xf32>
  %66 = coco.sqrt %65 : !coco.tensor<64xf32>
  %67 = coco.add %66, %eps : !coco.tensor<64xf32>, !coco.tensor<f32> -> !coco.tensor<64xf32>
  %68 = coco.div %64, %67 : !coco.tensor<64xf32>
  %69 = coco.mul %weight_decay, %w3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %r3 = coco.add %68, %69 : !coco.tensor<64xf32>
  %70 = coco.reduce norm %w3 : !coco.tensor<64xf32> -> !coco.tensor<f32>
  %71 = coco.reduce norm %r3 : !coco.tensor<64xf32> -> !coco.tensor<f32>
  %72 = coco.div %70, %71 : !coco.tensor<f32>
  %73 = coco.mul %lr, %72 : !coco.tensor<f32>
  %74 = coco.mul %73, %r3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %w_new3 = coco.sub %w3, %74 : !coco.tensor<64xf32>
  coco.update %w3, %w_new3 : !coco.tensor<64xf32>
  func.return
}
