// RUN: coco-opt %s -p coco-split-allreduce --remarks 2>&1 >/dev/null | filecheck %s
// RUN: coco-opt %s -p 'coco-split-allreduce{dim=1}' --remarks 2>&1 >/dev/null | filecheck %s --check-prefix=DIM1
// RUN: coco-opt %s -p coco-split-allreduce 2>&1 >/dev/null | filecheck %s --check-prefix=QUIET --allow-empty
// RUN: coco-opt %s -p coco-sliced-send --remarks 2>&1 >/dev/null | filecheck %s --check-prefix=SEND

// A greedy pass leaves alone what its targeted form refuses; with --remarks coco-opt says
// what it skipped, at the op, with the refusal the targeted form gives (MLIR's `remark:`).
// Without --remarks it says nothing.

// QUIET-NOT: remark

func.func @skips(%g: !coco.tensor<64x8xf32, local>, %s: !coco.tensor<f32, local>, %t: !coco.tensor<2x8xf32, local>) attributes {coco.grid = #coco.grid<[4]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<64x8xf32, local> -> !coco.tensor<64x8xf32>
  // CHECK:     greedy-remarks.mlir:[[# @LINE + 2]]:{{[0-9]+}}: remark: coco-split-allreduce: skipped %sc (comm.all_reduce): [split-allreduce-scalar] %sc (comm.all_reduce) reduces a value of type !coco.tensor<f32, local>, which has no dim 0 to slice
  // DIM1:      greedy-remarks.mlir:[[# @LINE + 1]]:{{[0-9]+}}: remark: coco-split-allreduce: skipped %sc (comm.all_reduce): [split-allreduce-scalar]
  %sc = comm.all_reduce sum %s : !coco.tensor<f32, local> -> !coco.tensor<f32>
  // CHECK:     greedy-remarks.mlir:[[# @LINE + 2]]:{{[0-9]+}}: remark: coco-split-allreduce: skipped %t1 (comm.all_reduce): [split-allreduce-empty]
  // DIM1-NOT:  skipped %t1
  %t1 = comm.all_reduce sum %t : !coco.tensor<2x8xf32, local> -> !coco.tensor<2x8xf32>
  // CHECK-NOT: skipped %g1
  func.return
}

// The gather runs along the send's own axis: the greedy sliced send skips it, and the remark
// stands where the refusal would, at the all_gather.
func.func @across(%s0: !coco.tensor<8xf32, [sliced<0>, local]>) -> !coco.tensor<8xf32, [local, local]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  // SEND: greedy-remarks.mlir:[[# @LINE + 1]]:3: remark: coco-sliced-send: skipped %across (comm.send): [sliced-send-axes] %g0 (comm.all_gather) spans grid axis 0, the axis %across (comm.send) sends along
  %g0 = comm.all_gather %s0 over [0] : !coco.tensor<8xf32, [sliced<0>, local]> -> !coco.tensor<8xf32, [replicated, local]>
  %across = comm.send %g0 along 0 shift 1 : !coco.tensor<8xf32, [replicated, local]> -> !coco.tensor<8xf32, [local, local]>
  func.return %across : !coco.tensor<8xf32, [local, local]>
}
