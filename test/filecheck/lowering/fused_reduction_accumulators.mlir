// RUN: coco-opt %s -p coco-fuse-reduction -t 'cuda{ranks=2}' | filecheck %s

// A fused reduction accumulates a max (or min) of floats in float: the same bits as double,
// at twice the vector width (the amax of fp8 current scaling ran at half the speed of a
// plain read); its block partials and the exchange stay double. A sum (of squares here)
// accumulates in double.
func.func @amax_and_sum_of_squares(%w: !coco.tensor<64x32xf32, sliced<0>>) -> (!coco.tensor<f32>, !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %a = coco.abs %w : !coco.tensor<64x32xf32, sliced<0>>
  %m = coco.reduce max %a : !coco.tensor<64x32xf32, sliced<0>> -> !coco.tensor<f32, local>
  %amax = comm.all_reduce max %m : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %sq = coco.mul %w, %w : !coco.tensor<64x32xf32, sliced<0>>
  %s = coco.reduce sum %sq : !coco.tensor<64x32xf32, sliced<0>> -> !coco.tensor<f32, local>
  %total = comm.all_reduce sum %s : !coco.tensor<f32, local> -> !coco.tensor<f32>
  func.return %amax, %total : !coco.tensor<f32>, !coco.tensor<f32>
}

// CHECK-LABEL: COCO_KERNEL(k_fused_reduction,
// CHECK:         float acc0_ = -(1.0 / 0.0);
// CHECK:           float acc0_v[lanes_];
// CHECK:             acc0_v[k_] = coco_max(acc0_v[k_], (float)a);
// CHECK:         red_[coco_thread_idx()] = (double)acc0_;
// CHECK:         double a0_ = -(1.0 / 0.0);
// CHECK-LABEL: COCO_KERNEL(k_fused_reduction_1,
// CHECK:         double acc0_ = 0;
// CHECK:           double acc0_v[lanes_];
// CHECK:             acc0_v[k_] = acc0_v[k_] + (double)sq;
