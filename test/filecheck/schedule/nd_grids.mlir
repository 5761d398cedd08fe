// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-equivalence --equivalence-ranks 4,6 | filecheck %s

// Data-parallel schedules on N-D grids (issue #25 item 4): a momentum-SGD step whose gradient
// is all-reduced over the dp axis only, on grids whose other axes slice (tp) or hold their own
// values (pp). The split takes a dim the rules allow -- not one an inner axis already cuts nor
// one too small for the group -- and the momentum %m, replicated on dp whatever its layout on
// the other axes, is kept sliced (as-slice). --verify-equivalence runs each in the sim.

// [dp, tp] = [2, 2], everything sliced on tp along dim 0: the reduce_scatter over dp cuts
// dim 1 (dim 0 is tp's, an inner axis), and m is stored [sliced<1>, sliced<0>].
// CHECK-LABEL: func.func @momentum(
// CHECK-SAME:      %m: !coco.tensor<8x6xf32, [sliced<1>, sliced<0>]>,
// CHECK:         comm.fused all_reduce {
// CHECK-NEXT:      %g1_rs = comm.reduce_scatter sum %g dim 1 over [0] : !coco.tensor<8x6xf32, [local, sliced<0>]> -> !coco.tensor<8x6xf32, [sliced<1>, sliced<0>]>
// CHECK:           coco.update %m, %m1_s : !coco.tensor<8x6xf32, [sliced<1>, sliced<0>]>
// CHECK:           %w1 = comm.all_gather %w1_s over [0]
module attributes {coco.schedule = "fuse(rs-c-ag)"} {
func.func @momentum(%g: !coco.tensor<8x6xf32, [local, sliced<0>]>,
                    %w: !coco.tensor<8x6xf32, [replicated, sliced<0>]>,
                    %m: !coco.tensor<8x6xf32, [replicated, sliced<0>]>,
                    %lr: !coco.tensor<f32>, %mu: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[2, 2]>} {
  %g1 = comm.all_reduce sum %g over [0] : !coco.tensor<8x6xf32, [local, sliced<0>]> -> !coco.tensor<8x6xf32, [replicated, sliced<0>]>
  %mm = coco.mul %mu, %m : !coco.tensor<f32>, !coco.tensor<8x6xf32, [replicated, sliced<0>]> -> !coco.tensor<8x6xf32, [replicated, sliced<0>]>
  %m1 = coco.add %mm, %g1 : !coco.tensor<8x6xf32, [replicated, sliced<0>]>
  coco.update %m, %m1 : !coco.tensor<8x6xf32, [replicated, sliced<0>]>
  %step = coco.mul %lr, %m1 : !coco.tensor<f32>, !coco.tensor<8x6xf32, [replicated, sliced<0>]> -> !coco.tensor<8x6xf32, [replicated, sliced<0>]>
  %w1 = coco.sub %w, %step : !coco.tensor<8x6xf32, [replicated, sliced<0>]>
  coco.update %w, %w1 : !coco.tensor<8x6xf32, [replicated, sliced<0>]>
  func.return
}
}

// -----

// [dp, tp] = [3, 2], 2x12x5 sliced on tp along dim 1: dim 0 (2 elements) cannot be cut into 3,
// dim 1 is tp's, so the split cuts dim 2 (5 over 3 ranks, unevenly).
// CHECK-LABEL: func.func @momentum(
// CHECK-SAME:      %m: !coco.tensor<2x12x5xf32, [sliced<2>, sliced<1>]>,
// CHECK-NEXT:    %g1_rs = comm.reduce_scatter sum %g dim 2 over [0] : !coco.tensor<2x12x5xf32, [local, sliced<1>]> -> !coco.tensor<2x12x5xf32, [sliced<2>, sliced<1>]>
// CHECK:         coco.update %m, %m1_s : !coco.tensor<2x12x5xf32, [sliced<2>, sliced<1>]>
// CHECK:         %w1 = comm.all_gather %w1_s over [0]
module attributes {coco.schedule = "rs-c-ag"} {
func.func @momentum(%g: !coco.tensor<2x12x5xf32, [local, sliced<1>]>,
                    %w: !coco.tensor<2x12x5xf32, [replicated, sliced<1>]>,
                    %m: !coco.tensor<2x12x5xf32, [replicated, sliced<1>]>,
                    %lr: !coco.tensor<f32>, %mu: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[3, 2]>} {
  %g1 = comm.all_reduce sum %g over [0] : !coco.tensor<2x12x5xf32, [local, sliced<1>]> -> !coco.tensor<2x12x5xf32, [replicated, sliced<1>]>
  %mm = coco.mul %mu, %m : !coco.tensor<f32>, !coco.tensor<2x12x5xf32, [replicated, sliced<1>]> -> !coco.tensor<2x12x5xf32, [replicated, sliced<1>]>
  %m1 = coco.add %mm, %g1 : !coco.tensor<2x12x5xf32, [replicated, sliced<1>]>
  coco.update %m, %m1 : !coco.tensor<2x12x5xf32, [replicated, sliced<1>]>
  %step = coco.mul %lr, %m1 : !coco.tensor<f32>, !coco.tensor<2x12x5xf32, [replicated, sliced<1>]> -> !coco.tensor<2x12x5xf32, [replicated, sliced<1>]>
  %w1 = coco.sub %w, %step : !coco.tensor<2x12x5xf32, [replicated, sliced<1>]>
  coco.update %w, %w1 : !coco.tensor<2x12x5xf32, [replicated, sliced<1>]>
  func.return
}
}

// -----

// [pp, dp, tp] = [1, 2, 2]: everything local on pp (each stage its own), the all_reduce over
// dp (axis 1); m keeps pp's and tp's layouts and is sliced on dp along dim 1.
// CHECK-LABEL: func.func @momentum(
// CHECK-SAME:      %m: !coco.tensor<8x6xf32, [local, sliced<1>, sliced<0>]>,
// CHECK:         %g1_rs = comm.reduce_scatter sum %g dim 1 over [1]
// CHECK:         coco.update %m, %m1_s : !coco.tensor<8x6xf32, [local, sliced<1>, sliced<0>]>
module attributes {coco.schedule = "fuse(rs-c-ag)"} {
func.func @momentum(%g: !coco.tensor<8x6xf32, [local, local, sliced<0>]>,
                    %w: !coco.tensor<8x6xf32, [local, replicated, sliced<0>]>,
                    %m: !coco.tensor<8x6xf32, [local, replicated, sliced<0>]>,
                    %lr: !coco.tensor<f32>, %mu: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[1, 2, 2]>} {
  %g1 = comm.all_reduce sum %g over [1] : !coco.tensor<8x6xf32, [local, local, sliced<0>]> -> !coco.tensor<8x6xf32, [local, replicated, sliced<0>]>
  %mm = coco.mul %mu, %m : !coco.tensor<f32>, !coco.tensor<8x6xf32, [local, replicated, sliced<0>]> -> !coco.tensor<8x6xf32, [local, replicated, sliced<0>]>
  %m1 = coco.add %mm, %g1 : !coco.tensor<8x6xf32, [local, replicated, sliced<0>]>
  coco.update %m, %m1 : !coco.tensor<8x6xf32, [local, replicated, sliced<0>]>
  %step = coco.mul %lr, %m1 : !coco.tensor<f32>, !coco.tensor<8x6xf32, [local, replicated, sliced<0>]> -> !coco.tensor<8x6xf32, [local, replicated, sliced<0>]>
  %w1 = coco.sub %w, %step : !coco.tensor<8x6xf32, [local, replicated, sliced<0>]>
  coco.update %w, %w1 : !coco.tensor<8x6xf32, [local, replicated, sliced<0>]>
  func.return
}
}
