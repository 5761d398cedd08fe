// Megatron-LM's distributed optimizer on a [dp, tp] grid (not in CoCoNet). Built also by
// megatron_dist_optimizer.py. The flat gradient buffer is local on dp and sliced on tp; the
// step all-reduces it over dp and applies AdamW to parameters and moments sliced on tp.
// rs-c-ag / fuse(rs-c-ag) reduce-scatter each tp piece over dp: [sliced<0, level 1>,
// sliced<0, level 0>] (tp's cut outermost), and keep m and v sliced so.
builtin.module {
  func.func @megatron_dist_optimizer(%g: !coco.tensor<4096xf32, [local, sliced<0>]>, %w: !coco.tensor<4096xf32, [replicated, sliced<0>]>, %m: !coco.tensor<4096xf32, [replicated, sliced<0>]>, %v: !coco.tensor<4096xf32, [replicated, sliced<0>]>, %lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>, %beta2: !coco.tensor<f32>, %eps: !coco.tensor<f32>, %weight_decay: !coco.tensor<f32>, %step: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?, 2]>} {
    %g1 = comm.all_reduce sum %g over [0] : !coco.tensor<4096xf32, [local, sliced<0>]> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %0 = coco.mul %beta1, %m : !coco.tensor<f32>, !coco.tensor<4096xf32, [replicated, sliced<0>]> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %1 = coco.constant 1.0 : !coco.tensor<f32>
    %2 = coco.sub %1, %beta1 : !coco.tensor<f32>
    %3 = coco.mul %2, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32, [replicated, sliced<0>]> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %m1 = coco.add %0, %3 : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %4 = coco.mul %beta2, %v : !coco.tensor<f32>, !coco.tensor<4096xf32, [replicated, sliced<0>]> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %5 = coco.sub %1, %beta2 : !coco.tensor<f32>
    %6 = coco.mul %5, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32, [replicated, sliced<0>]> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %7 = coco.mul %6, %g1 : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %v1 = coco.add %4, %7 : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %8 = coco.pow %beta1, %step : !coco.tensor<f32>
    %9 = coco.sub %1, %8 : !coco.tensor<f32>
    %mhat = coco.div %m1, %9 : !coco.tensor<4096xf32, [replicated, sliced<0>]>, !coco.tensor<f32> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %10 = coco.pow %beta2, %step : !coco.tensor<f32>
    %11 = coco.sub %1, %10 : !coco.tensor<f32>
    %vhat = coco.div %v1, %11 : !coco.tensor<4096xf32, [replicated, sliced<0>]>, !coco.tensor<f32> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %12 = coco.sqrt %vhat : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %13 = coco.add %12, %eps : !coco.tensor<4096xf32, [replicated, sliced<0>]>, !coco.tensor<f32> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %14 = coco.div %mhat, %13 : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %15 = coco.mul %weight_decay, %w : !coco.tensor<f32>, !coco.tensor<4096xf32, [replicated, sliced<0>]> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %16 = coco.add %14, %15 : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %17 = coco.mul %lr, %16 : !coco.tensor<f32>, !coco.tensor<4096xf32, [replicated, sliced<0>]> -> !coco.tensor<4096xf32, [replicated, sliced<0>]>
    %w1 = coco.sub %w, %17 : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    coco.update %w, %w1 : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    coco.update %m, %m1 : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    coco.update %v, %v1 : !coco.tensor<4096xf32, [replicated, sliced<0>]>
    func.return
  }
}
