// Optimizers whose state is updated after a global norm: fused (fuse(rs-c-ag)), the norm's
// all_reduce cuts the kernel in two and m (and v) are computed in the first part but updated
// at the end. Offered by the enumerator and once refused by the lowering ("internal: no buffer
// holds m1_s"). LAMB and Adam with clipping: the update moves to the part that computes its
// value; @read_after_norm reads m again after the norm, so m1 is stored and copied at the end.
// 45 elements: uneven at 2, 4 and 7 ranks. test_late_updates.py runs every offered schedule.
func.func @lamb_late(%g: !coco.tensor<45xf32, local>, %w: !coco.tensor<45xf32>, %m: !coco.tensor<45xf32>, %v: !coco.tensor<45xf32>, %lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>, %beta2: !coco.tensor<f32>, %eps: !coco.tensor<f32>, %wd: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<45xf32, local> -> !coco.tensor<45xf32>
  %0 = coco.mul %beta1, %m : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %1 = coco.constant 1.0 : !coco.tensor<f32>
  %2 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %3 = coco.mul %2, %g1 : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %m1 = coco.add %0, %3 : !coco.tensor<45xf32>
  %4 = coco.mul %beta2, %v : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %5 = coco.sub %1, %beta2 : !coco.tensor<f32>
  %6 = coco.mul %5, %g1 : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %7 = coco.mul %6, %g1 : !coco.tensor<45xf32>
  %v1 = coco.add %4, %7 : !coco.tensor<45xf32>
  %8 = coco.sqrt %v1 : !coco.tensor<45xf32>
  %9 = coco.add %8, %eps : !coco.tensor<45xf32>, !coco.tensor<f32> -> !coco.tensor<45xf32>
  %10 = coco.div %m1, %9 : !coco.tensor<45xf32>
  %11 = coco.mul %wd, %w : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %r = coco.add %10, %11 : !coco.tensor<45xf32>
  %12 = coco.reduce norm %w : !coco.tensor<45xf32> -> !coco.tensor<f32>
  %13 = coco.reduce norm %r : !coco.tensor<45xf32> -> !coco.tensor<f32>
  %trust = coco.div %12, %13 : !coco.tensor<f32>
  %14 = coco.mul %lr, %trust : !coco.tensor<f32>
  %15 = coco.mul %14, %r : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %16 = coco.sub %w, %15 : !coco.tensor<45xf32>
  coco.update %w, %16 : !coco.tensor<45xf32>
  coco.update %m, %m1 : !coco.tensor<45xf32>
  coco.update %v, %v1 : !coco.tensor<45xf32>
  func.return
}

func.func @clip_late(%g: !coco.tensor<45xf32, local>, %w: !coco.tensor<45xf32>, %m: !coco.tensor<45xf32>, %v: !coco.tensor<45xf32>, %lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>, %beta2: !coco.tensor<f32>, %eps: !coco.tensor<f32>, %max_norm: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<45xf32, local> -> !coco.tensor<45xf32>
  %0 = coco.reduce norm %g1 : !coco.tensor<45xf32> -> !coco.tensor<f32>
  %1 = coco.constant 1.0e-06 : !coco.tensor<f32>
  %2 = coco.add %0, %1 : !coco.tensor<f32>
  %3 = coco.div %max_norm, %2 : !coco.tensor<f32>
  %4 = coco.constant 1.0 : !coco.tensor<f32>
  %coef = coco.min %4, %3 : !coco.tensor<f32>
  %gc = coco.mul %g1, %coef : !coco.tensor<45xf32>, !coco.tensor<f32> -> !coco.tensor<45xf32>
  %5 = coco.mul %beta1, %m : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %6 = coco.sub %4, %beta1 : !coco.tensor<f32>
  %7 = coco.mul %6, %gc : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %m1 = coco.add %5, %7 : !coco.tensor<45xf32>
  %8 = coco.mul %beta2, %v : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %9 = coco.sub %4, %beta2 : !coco.tensor<f32>
  %10 = coco.mul %9, %gc : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %11 = coco.mul %10, %gc : !coco.tensor<45xf32>
  %v1 = coco.add %8, %11 : !coco.tensor<45xf32>
  %12 = coco.mul %lr, %m1 : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %13 = coco.sqrt %v1 : !coco.tensor<45xf32>
  %14 = coco.add %13, %eps : !coco.tensor<45xf32>, !coco.tensor<f32> -> !coco.tensor<45xf32>
  %15 = coco.div %12, %14 : !coco.tensor<45xf32>
  %16 = coco.sub %w, %15 : !coco.tensor<45xf32>
  coco.update %w, %16 : !coco.tensor<45xf32>
  coco.update %m, %m1 : !coco.tensor<45xf32>
  coco.update %v, %v1 : !coco.tensor<45xf32>
  func.return
}

func.func @read_after_norm(%g: !coco.tensor<45xf32, local>, %w: !coco.tensor<45xf32>, %m: !coco.tensor<45xf32>, %lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<45xf32, local> -> !coco.tensor<45xf32>
  %0 = coco.mul %beta1, %m : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %1 = coco.constant 1.0 : !coco.tensor<f32>
  %2 = coco.sub %1, %beta1 : !coco.tensor<f32>
  %3 = coco.mul %2, %g1 : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %m1 = coco.add %0, %3 : !coco.tensor<45xf32>
  %4 = coco.reduce norm %w : !coco.tensor<45xf32> -> !coco.tensor<f32>
  %5 = coco.reduce norm %m1 : !coco.tensor<45xf32> -> !coco.tensor<f32>
  %6 = coco.add %5, %1 : !coco.tensor<f32>
  %trust = coco.div %4, %6 : !coco.tensor<f32>
  %7 = coco.mul %lr, %trust : !coco.tensor<f32>
  %8 = coco.add %m1, %m : !coco.tensor<45xf32>
  %9 = coco.mul %7, %8 : !coco.tensor<f32>, !coco.tensor<45xf32> -> !coco.tensor<45xf32>
  %10 = coco.sub %w, %9 : !coco.tensor<45xf32>
  coco.update %w, %10 : !coco.tensor<45xf32>
  coco.update %m, %m1 : !coco.tensor<45xf32>
  func.return
}
