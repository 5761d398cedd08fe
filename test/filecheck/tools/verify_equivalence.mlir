// RUN: coco-opt %s --split-input-file -p coco-split-allreduce --verify-equivalence | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-split-allreduce,coco-reorder,coco-as-slice,coco-fuse,coco-dce --verify-equivalence | filecheck %s --check-prefix=SCHED
// RUN: coco-opt %s --split-input-file -p coco-split-allreduce --verify-equivalence --equivalence-ranks 2,4 --equivalence-seeds 3 2>&1 | filecheck %s --check-prefix=QUIET

// A pipeline that keeps the program's meaning: coco-opt prints the transformed IR and
// nothing else (the check runs the sim at 1, 2 and 4 ranks, seeds 0 and 1, bit-exactly).

// CHECK-LABEL: func.func @sgd
// CHECK:         comm.reduce_scatter sum %g
// CHECK:         comm.all_gather
// CHECK-NOT:     comm.all_reduce
// CHECK:         coco.update %w
// SCHED-LABEL: func.func @sgd
// SCHED-NOT:     comm.all_reduce
// SCHED:         coco.update %w
// QUIET-NOT: equivalen
// QUIET-NOT: error
// QUIET:     func.func @sgd
func.func @sgd(%g: !coco.tensor<16xf32, local>, %w: !coco.tensor<16xf32>, %lr: !coco.tensor<f32>) {
  %g1 = comm.all_reduce sum %g : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
  %s = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %w1 = coco.sub %w, %s : !coco.tensor<16xf32>
  coco.update %w, %w1 : !coco.tensor<16xf32>
  func.return
}

// -----

// CHECK-LABEL: func.func @adam
// CHECK-NOT:     comm.all_reduce
// SCHED-LABEL: func.func @adam
// SCHED-NOT:     comm.all_reduce
// QUIET-NOT: equivalen
// QUIET:     func.func @adam
func.func @adam(%g: !coco.tensor<16xf16, local>, %w: !coco.tensor<16xf32>, %m: !coco.tensor<16xf32>, %v: !coco.tensor<16xf32>) {
  %g1 = comm.all_reduce sum %g : !coco.tensor<16xf16, local> -> !coco.tensor<16xf16>
  %gf = coco.cast %g1 : !coco.tensor<16xf16> -> !coco.tensor<16xf32>
  %b1 = coco.constant 0.9 : !coco.tensor<f32>
  %c1 = coco.constant 0.1 : !coco.tensor<f32>
  %bm = coco.mul %b1, %m : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %cg = coco.mul %c1, %gf : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %m1 = coco.add %bm, %cg : !coco.tensor<16xf32>
  %b2 = coco.constant 0.999 : !coco.tensor<f32>
  %c2 = coco.constant 0.001 : !coco.tensor<f32>
  %bv = coco.mul %b2, %v : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %g2 = coco.mul %gf, %gf : !coco.tensor<16xf32>
  %cv = coco.mul %c2, %g2 : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %v1 = coco.add %bv, %cv : !coco.tensor<16xf32>
  %r = coco.rsqrt %v1 : !coco.tensor<16xf32>
  %u = coco.mul %m1, %r : !coco.tensor<16xf32>
  %lr = coco.constant 0.001 : !coco.tensor<f32>
  %d = coco.mul %lr, %u : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<16xf32>
  coco.update %m, %m1 : !coco.tensor<16xf32>
  coco.update %v, %v1 : !coco.tensor<16xf32>
  coco.update %w, %w1 : !coco.tensor<16xf32>
  func.return
}
