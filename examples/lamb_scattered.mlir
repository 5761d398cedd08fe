// LAMB over many parameter tensors of different sizes (CoCoNet's scattered tensors). Built
// also by lamb_scattered.py, which says more. Per-tensor trust ratios; the elementwise work of
// every tensor runs as one table-driven launch. Schedules: AR_C, RS_C_AG, fuse_RS_C_AG.

func.func @lamb_scattered(%lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>, %beta2: !coco.tensor<f32>, %eps: !coco.tensor<f32>, %weight_decay: !coco.tensor<f32>, %step: !coco.tensor<f32>, %g0: !coco.tensor<2048xf32, local>, %w0: !coco.tensor<2048xf32>, %m0: !coco.tensor<2048xf32>, %v0: !coco.tensor<2048xf32>, %g1: !coco.tensor<1024xf32, local>, %w1: !coco.tensor<1024xf32>, %m1: !coco.tensor<1024xf32>, %v1: !coco.tensor<1024xf32>, %g2: !coco.tensor<512xf32, local>, %w2: !coco.tensor<512xf32>, %m2: !coco.tensor<512xf32>, %v2: !coco.tensor<512xf32>, %g3: !coco.tensor<64xf32, local>, %w3: !coco.tensor<64xf32>, %m3: !coco.tensor<64xf32>, %v3: !coco.tensor<64xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %0 = coco.pow %beta1, %step : !coco.tensor<f32>
  %1 = coco.constant 1.0 : !coco.tensor<f32>
  %bias1 = coco.sub %1, %0 : !coco.tensor<f32>
  %2 = coco.pow %beta2, %step : !coco.tensor<f32>
  %bias2 = coco.sub %1, %2 : !coco.tensor<f32>
  %gsum = comm.all_reduce sum %g0 : !coco.tensor<2048xf32, local> -> !coco.tensor<2048xf32>
  %3 = coco.mul %beta1, %m0 : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %4 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %5 = coco.mul %4, %gsum : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %m_new = coco.add %3, %5 : !coco.tensor<2048xf32>
  %6 = coco.mul %beta2, %v0 : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %7 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %8 = coco.mul %7, %gsum : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %9 = coco.mul %8, %gsum : !coco.tensor<2048xf32>
  %v_new = coco.add %6, %9 : !coco.tensor<2048xf32>
  coco.update %m0, %m_new : !coco.tensor<2048xf32>
  coco.update %v0, %v_new : !coco.tensor<2048xf32>
  %10 = coco.div %m_new, %bias1 : !coco.tensor<2048xf32>, !coco.tensor<f32> -> !coco.tensor<2048xf32>
  %11 = coco.div %v_new, %bias2 : !coco.tensor<2048xf32>, !coco.tensor<f32> -> !coco.tensor<2048xf32>
  %12 = coco.sqrt %11 : !coco.tensor<2048xf32>
  %13 = coco.add %12, %eps : !coco.tensor<2048xf32>, !coco.tensor<f32> -> !coco.tensor<2048xf32>
  %14 = coco.div %10, %13 : !coco.tensor<2048xf32>
  %15 = coco.mul %weight_decay, %w0 : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %r = coco.add %14, %15 : !coco.tensor<2048xf32>
  %16 = coco.reduce norm %w0 : !coco.tensor<2048xf32> -> !coco.tensor<f32>
  %17 = coco.reduce norm %r : !coco.tensor<2048xf32> -> !coco.tensor<f32>
  %18 = coco.div %16, %17 : !coco.tensor<f32>
  %19 = coco.mul %lr, %18 : !coco.tensor<f32>
  %20 = coco.mul %19, %r : !coco.tensor<f32>, !coco.tensor<2048xf32> -> !coco.tensor<2048xf32>
  %21 = coco.sub %w0, %20 : !coco.tensor<2048xf32>
  coco.update %w0, %21 : !coco.tensor<2048xf32>
  %gsum_1 = comm.all_reduce sum %g1 : !coco.tensor<1024xf32, local> -> !coco.tensor<1024xf32>
  %22 = coco.mul %beta1, %m1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %23 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %24 = coco.mul %23, %gsum_1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %m_new_1 = coco.add %22, %24 : !coco.tensor<1024xf32>
  %25 = coco.mul %beta2, %v1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %26 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %27 = coco.mul %26, %gsum_1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %28 = coco.mul %27, %gsum_1 : !coco.tensor<1024xf32>
  %v_new_1 = coco.add %25, %28 : !coco.tensor<1024xf32>
  coco.update %m1, %m_new_1 : !coco.tensor<1024xf32>
  coco.update %v1, %v_new_1 : !coco.tensor<1024xf32>
  %29 = coco.div %m_new_1, %bias1 : !coco.tensor<1024xf32>, !coco.tensor<f32> -> !coco.tensor<1024xf32>
  %30 = coco.div %v_new_1, %bias2 : !coco.tensor<1024xf32>, !coco.tensor<f32> -> !coco.tensor<1024xf32>
  %31 = coco.sqrt %30 : !coco.tensor<1024xf32>
  %32 = coco.add %31, %eps : !coco.tensor<1024xf32>, !coco.tensor<f32> -> !coco.tensor<1024xf32>
  %33 = coco.div %29, %32 : !coco.tensor<1024xf32>
  %34 = coco.mul %weight_decay, %w1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %r_1 = coco.add %33, %34 : !coco.tensor<1024xf32>
  %35 = coco.reduce norm %w1 : !coco.tensor<1024xf32> -> !coco.tensor<f32>
  %36 = coco.reduce norm %r_1 : !coco.tensor<1024xf32> -> !coco.tensor<f32>
  %37 = coco.div %35, %36 : !coco.tensor<f32>
  %38 = coco.mul %lr, %37 : !coco.tensor<f32>
  %39 = coco.mul %38, %r_1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %40 = coco.sub %w1, %39 : !coco.tensor<1024xf32>
  coco.update %w1, %40 : !coco.tensor<1024xf32>
  %gsum_2 = comm.all_reduce sum %g2 : !coco.tensor<512xf32, local> -> !coco.tensor<512xf32>
  %41 = coco.mul %beta1, %m2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %42 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %43 = coco.mul %42, %gsum_2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %m_new_2 = coco.add %41, %43 : !coco.tensor<512xf32>
  %44 = coco.mul %beta2, %v2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %45 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %46 = coco.mul %45, %gsum_2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %47 = coco.mul %46, %gsum_2 : !coco.tensor<512xf32>
  %v_new_2 = coco.add %44, %47 : !coco.tensor<512xf32>
  coco.update %m2, %m_new_2 : !coco.tensor<512xf32>
  coco.update %v2, %v_new_2 : !coco.tensor<512xf32>
  %48 = coco.div %m_new_2, %bias1 : !coco.tensor<512xf32>, !coco.tensor<f32> -> !coco.tensor<512xf32>
  %49 = coco.div %v_new_2, %bias2 : !coco.tensor<512xf32>, !coco.tensor<f32> -> !coco.tensor<512xf32>
  %50 = coco.sqrt %49 : !coco.tensor<512xf32>
  %51 = coco.add %50, %eps : !coco.tensor<512xf32>, !coco.tensor<f32> -> !coco.tensor<512xf32>
  %52 = coco.div %48, %51 : !coco.tensor<512xf32>
  %53 = coco.mul %weight_decay, %w2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %r_2 = coco.add %52, %53 : !coco.tensor<512xf32>
  %54 = coco.reduce norm %w2 : !coco.tensor<512xf32> -> !coco.tensor<f32>
  %55 = coco.reduce norm %r_2 : !coco.tensor<512xf32> -> !coco.tensor<f32>
  %56 = coco.div %54, %55 : !coco.tensor<f32>
  %57 = coco.mul %lr, %56 : !coco.tensor<f32>
  %58 = coco.mul %57, %r_2 : !coco.tensor<f32>, !coco.tensor<512xf32> -> !coco.tensor<512xf32>
  %59 = coco.sub %w2, %58 : !coco.tensor<512xf32>
  coco.update %w2, %59 : !coco.tensor<512xf32>
  %gsum_3 = comm.all_reduce sum %g3 : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  %60 = coco.mul %beta1, %m3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %61 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %62 = coco.mul %61, %gsum_3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %m_new_3 = coco.add %60, %62 : !coco.tensor<64xf32>
  %63 = coco.mul %beta2, %v3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %64 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %65 = coco.mul %64, %gsum_3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %66 = coco.mul %65, %gsum_3 : !coco.tensor<64xf32>
  %v_new_3 = coco.add %63, %66 : !coco.tensor<64xf32>
  coco.update %m3, %m_new_3 : !coco.tensor<64xf32>
  coco.update %v3, %v_new_3 : !coco.tensor<64xf32>
  %67 = coco.div %m_new_3, %bias1 : !coco.tensor<64xf32>, !coco.tensor<f32> -> !coco.tensor<64xf32>
  %68 = coco.div %v_new_3, %bias2 : !coco.tensor<64xf32>, !coco.tensor<f32> -> !coco.tensor<64xf32>
  %69 = coco.sqrt %68 : !coco.tensor<64xf32>
  %70 = coco.add %69, %eps : !coco.tensor<64xf32>, !coco.tensor<f32> -> !coco.tensor<64xf32>
  %71 = coco.div %67, %70 : !coco.tensor<64xf32>
  %72 = coco.mul %weight_decay, %w3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %r_3 = coco.add %71, %72 : !coco.tensor<64xf32>
  %73 = coco.reduce norm %w3 : !coco.tensor<64xf32> -> !coco.tensor<f32>
  %74 = coco.reduce norm %r_3 : !coco.tensor<64xf32> -> !coco.tensor<f32>
  %75 = coco.div %73, %74 : !coco.tensor<f32>
  %76 = coco.mul %lr, %75 : !coco.tensor<f32>
  %77 = coco.mul %76, %r_3 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %78 = coco.sub %w3, %77 : !coco.tensor<64xf32>
  coco.update %w3, %78 : !coco.tensor<64xf32>
  func.return
}
