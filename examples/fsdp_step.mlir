// A training step of one FSDP / ZeRO-3 linear layer (not in CoCoNet). Built also by
// fsdp_step.py. W [K, N] is sharded by rows (sliced<0>) with its AdamW moments; each rank
// holds its own batch. Forward: all_gather W, y = x W. Backward: dW = xt dy (this rank's
// partial), reduce-scattered to the shards; AdamW on the shards.
builtin.module {
  func.func @fsdp_step(%x: !coco.tensor<16x64xf32, local>, %xt: !coco.tensor<64x16xf32, local>, %dy: !coco.tensor<16x128xf32, local>, %w: !coco.tensor<64x128xf32, sliced<0>>, %m: !coco.tensor<64x128xf32, sliced<0>>, %v: !coco.tensor<64x128xf32, sliced<0>>, %lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>, %beta2: !coco.tensor<f32>, %eps: !coco.tensor<f32>, %weight_decay: !coco.tensor<f32>, %step: !coco.tensor<f32>) -> !coco.tensor<16x128xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
    %wg = comm.all_gather %w : !coco.tensor<64x128xf32, sliced<0>> -> !coco.tensor<64x128xf32>
    %y = coco.matmul %x, %wg : !coco.tensor<16x64xf32, local>, !coco.tensor<64x128xf32> -> !coco.tensor<16x128xf32, local>
    %dw = coco.matmul %xt, %dy : !coco.tensor<64x16xf32, local>, !coco.tensor<16x128xf32, local> -> !coco.tensor<64x128xf32, local>
    %g1 = comm.reduce_scatter sum %dw : !coco.tensor<64x128xf32, local> -> !coco.tensor<64x128xf32, sliced<0>>
    %0 = coco.mul %beta1, %m : !coco.tensor<f32>, !coco.tensor<64x128xf32, sliced<0>> -> !coco.tensor<64x128xf32, sliced<0>>
    %1 = coco.constant 1.0 : !coco.tensor<f32>
    %2 = coco.sub %1, %beta1 : !coco.tensor<f32>
    %3 = coco.mul %2, %g1 : !coco.tensor<f32>, !coco.tensor<64x128xf32, sliced<0>> -> !coco.tensor<64x128xf32, sliced<0>>
    %m1 = coco.add %0, %3 : !coco.tensor<64x128xf32, sliced<0>>
    %4 = coco.mul %beta2, %v : !coco.tensor<f32>, !coco.tensor<64x128xf32, sliced<0>> -> !coco.tensor<64x128xf32, sliced<0>>
    %5 = coco.sub %1, %beta2 : !coco.tensor<f32>
    %6 = coco.mul %5, %g1 : !coco.tensor<f32>, !coco.tensor<64x128xf32, sliced<0>> -> !coco.tensor<64x128xf32, sliced<0>>
    %7 = coco.mul %6, %g1 : !coco.tensor<64x128xf32, sliced<0>>
    %v1 = coco.add %4, %7 : !coco.tensor<64x128xf32, sliced<0>>
    %8 = coco.pow %beta1, %step : !coco.tensor<f32>
    %9 = coco.sub %1, %8 : !coco.tensor<f32>
    %mhat = coco.div %m1, %9 : !coco.tensor<64x128xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<64x128xf32, sliced<0>>
    %10 = coco.pow %beta2, %step : !coco.tensor<f32>
    %11 = coco.sub %1, %10 : !coco.tensor<f32>
    %vhat = coco.div %v1, %11 : !coco.tensor<64x128xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<64x128xf32, sliced<0>>
    %12 = coco.sqrt %vhat : !coco.tensor<64x128xf32, sliced<0>>
    %13 = coco.add %12, %eps : !coco.tensor<64x128xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<64x128xf32, sliced<0>>
    %14 = coco.div %mhat, %13 : !coco.tensor<64x128xf32, sliced<0>>
    %15 = coco.mul %weight_decay, %w : !coco.tensor<f32>, !coco.tensor<64x128xf32, sliced<0>> -> !coco.tensor<64x128xf32, sliced<0>>
    %16 = coco.add %14, %15 : !coco.tensor<64x128xf32, sliced<0>>
    %17 = coco.mul %lr, %16 : !coco.tensor<f32>, !coco.tensor<64x128xf32, sliced<0>> -> !coco.tensor<64x128xf32, sliced<0>>
    %w1 = coco.sub %w, %17 : !coco.tensor<64x128xf32, sliced<0>>
    coco.update %w, %w1 : !coco.tensor<64x128xf32, sliced<0>>
    coco.update %m, %m1 : !coco.tensor<64x128xf32, sliced<0>>
    coco.update %v, %v1 : !coco.tensor<64x128xf32, sliced<0>>
    func.return %y : !coco.tensor<16x128xf32, local>
  }
}

