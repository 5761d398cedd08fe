// RUN: coco-opt %s --split-input-file -p coco-split-allreduce | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (the CHECK lines) runs on every chunk. The SCRIPT run applies each chunk's own
// `coco.schedule` (coco-schedule without a name) and prints each refusal at the op it is
// about: `FILE:LINE:COL: [rule] message`.

module attributes {coco.schedule = "coco-split-allreduce{ops=g1 dim=1}"} {

// Greedy: every all_reduce with a dim to slice; the uses read the all_gather, which keeps
// the all_reduce's name.
// CHECK-LABEL: func.func @sgd
// CHECK-NEXT:    %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<64x8xf32, local> -> !coco.tensor<64x8xf32, sliced<0>>
// CHECK-NEXT:    %g1 = comm.all_gather %g1_rs : !coco.tensor<64x8xf32, sliced<0>> -> !coco.tensor<64x8xf32>
// CHECK-NEXT:    %d = coco.mul %lr, %g1
// CHECK-NEXT:    %w1 = coco.sub %w, %d
// CHECK-NEXT:    coco.update %w, %w1
// CHECK-NEXT:    %sc = comm.all_reduce sum %s
// CHECK:       func.return

// Targeted, with a dim option (the script).
// SCRIPT-LABEL: func.func @sgd
// SCRIPT-NEXT:    %g1_rs = comm.reduce_scatter sum %g dim 1 : !coco.tensor<64x8xf32, local> -> !coco.tensor<64x8xf32, sliced<1>>
// SCRIPT-NEXT:    %g1 = comm.all_gather %g1_rs : !coco.tensor<64x8xf32, sliced<1>> -> !coco.tensor<64x8xf32>
// SCRIPT-LABEL: func.func @grid2
// SCRIPT-NEXT:    %y = comm.all_reduce sum %x over [1]
// SCRIPT-NEXT:    %u = comm.all_reduce max %v over [1]

func.func @sgd(%g: !coco.tensor<64x8xf32, local>, %w: !coco.tensor<64x8xf32>, %lr: !coco.tensor<f32>, %s: !coco.tensor<f32, local>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<64x8xf32, local> -> !coco.tensor<64x8xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<64x8xf32> -> !coco.tensor<64x8xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<64x8xf32>
  coco.update %w, %w1 : !coco.tensor<64x8xf32>
  %sc = comm.all_reduce sum %s : !coco.tensor<f32, local> -> !coco.tensor<f32>
  func.return %sc : !coco.tensor<f32>
}

// On a [2, 2] grid an all_reduce over axis 1 splits over axis 1 (%y: dim 0 of size 6 on 2
// ranks, 3 each). %u's dim 0 is already sliced by axis 0: 3 rows cannot be cut into 2 x 2
// parts (uneven cuts are fine, empty ones are not), so greedy mode leaves it and a targeted
// request is refused (EMPTY). %z's dim 0 is cut by axis 1, inner to the all_reduce's axis 0:
// the reduce_scatter cuts each rank's piece further, axis 1's cut outermost (levels).
// CHECK-LABEL: func.func @grid2
// CHECK-NEXT:    %y_rs = comm.reduce_scatter sum %x over [1] : !coco.tensor<6x4xf32, [local, local]> -> !coco.tensor<6x4xf32, [local, sliced<0>]>
// CHECK-NEXT:    %y = comm.all_gather %y_rs over [1] : !coco.tensor<6x4xf32, [local, sliced<0>]> -> !coco.tensor<6x4xf32, [local, replicated]>
// CHECK-NEXT:    %u = comm.all_reduce max %v over [1]
// CHECK-NEXT:    %z_rs = comm.reduce_scatter sum %zz over [0] : !coco.tensor<8x4xf32, [local, sliced<0>]> -> !coco.tensor<8x4xf32, [sliced<0, level 1>, sliced<0, level 0>]>
// CHECK-NEXT:    %z = comm.all_gather %z_rs over [0] : !coco.tensor<8x4xf32, [sliced<0, level 1>, sliced<0, level 0>]> -> !coco.tensor<8x4xf32, [replicated, sliced<0>]>
func.func @grid2(%x: !coco.tensor<6x4xf32, [local, local]>, %v: !coco.tensor<3x4xf32, [sliced<0>, local]>, %zz: !coco.tensor<8x4xf32, [local, sliced<0>]>) -> (!coco.tensor<6x4xf32, [local, replicated]>, !coco.tensor<3x4xf32, [sliced<0>, replicated]>, !coco.tensor<8x4xf32, [replicated, sliced<0>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %y = comm.all_reduce sum %x over [1] : !coco.tensor<6x4xf32, [local, local]> -> !coco.tensor<6x4xf32, [local, replicated]>
  %u = comm.all_reduce max %v over [1] : !coco.tensor<3x4xf32, [sliced<0>, local]> -> !coco.tensor<3x4xf32, [sliced<0>, replicated]>
  %z = comm.all_reduce sum %zz over [0] : !coco.tensor<8x4xf32, [local, sliced<0>]> -> !coco.tensor<8x4xf32, [replicated, sliced<0>]>
  func.return %y, %u, %z : !coco.tensor<6x4xf32, [local, replicated]>, !coco.tensor<3x4xf32, [sliced<0>, replicated]>, !coco.tensor<8x4xf32, [replicated, sliced<0>]>
}
}

// -----

// Requests the rules refuse. Only all_reduces split.
module attributes {coco.schedule = "coco-split-allreduce{ops=d}"} {
func.func @not_all_reduce(%g: !coco.tensor<64x8xf32, local>, %lr: !coco.tensor<f32>) -> !coco.tensor<64x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<64x8xf32, local> -> !coco.tensor<64x8xf32>
  // SCRIPT: coco-split-allreduce.mlir:[[# @LINE + 1]]:3: [split-allreduce-op] %d (coco.mul) is not a comm.all_reduce: only all_reduces split
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<64x8xf32> -> !coco.tensor<64x8xf32>
  func.return %d : !coco.tensor<64x8xf32>
}
}

// -----

// A scalar has no dim to slice.
module attributes {coco.schedule = "coco-split-allreduce{ops=sc}"} {
func.func @scalar(%s: !coco.tensor<f32, local>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-split-allreduce.mlir:[[# @LINE + 1]]:3: [split-allreduce-scalar] %sc (comm.all_reduce) reduces a value of type !coco.tensor<f32, local>, which has no dim 0 to slice for a reduce_scatter
  %sc = comm.all_reduce sum %s : !coco.tensor<f32, local> -> !coco.tensor<f32>
  func.return %sc : !coco.tensor<f32>
}
}

// -----

// 3 rows (already cut by axis 0) cannot be cut into 2 x 2 parts (as %u of @grid2).
module attributes {coco.schedule = "coco-split-allreduce{ops=u}"} {
func.func @empty(%v: !coco.tensor<3x4xf32, [sliced<0>, local]>) -> !coco.tensor<3x4xf32, [sliced<0>, replicated]> attributes {coco.grid = #coco.grid<[2, 2]>} {
  // SCRIPT: coco-split-allreduce.mlir:[[# @LINE + 1]]:3: [split-allreduce-empty] the reduce_scatter of %u (comm.all_reduce) of type !coco.tensor<3x4xf32, [sliced<0>, sliced<0>]>: dim 0 of size 3 cannot be cut into 4 parts (grid [2, 2]): some rank would hold no element of it
  %u = comm.all_reduce max %v over [1] : !coco.tensor<3x4xf32, [sliced<0>, local]> -> !coco.tensor<3x4xf32, [sliced<0>, replicated]>
  func.return %u : !coco.tensor<3x4xf32, [sliced<0>, replicated]>
}
}

// -----

// Dim 0 of %zz is cut by axis 1, inner to the all_reduce's axis 0 (Megatron's flat buffer
// sliced on tp, reduced over dp): the split nests its cut inside each tp piece.
module attributes {coco.schedule = "coco-split-allreduce{ops=z}"} {
// SCRIPT-LABEL: func.func @nested
// SCRIPT-NEXT:    %z_rs = comm.reduce_scatter sum %zz over [0] : !coco.tensor<8x4xf32, [local, sliced<0>]> -> !coco.tensor<8x4xf32, [sliced<0, level 1>, sliced<0, level 0>]>
// SCRIPT-NEXT:    %z = comm.all_gather %z_rs over [0]
func.func @nested(%zz: !coco.tensor<8x4xf32, [local, sliced<0>]>) -> !coco.tensor<8x4xf32, [replicated, sliced<0>]> attributes {coco.grid = #coco.grid<[2, 2]>} {
  %z = comm.all_reduce sum %zz over [0] : !coco.tensor<8x4xf32, [local, sliced<0>]> -> !coco.tensor<8x4xf32, [replicated, sliced<0>]>
  func.return %z : !coco.tensor<8x4xf32, [replicated, sliced<0>]>
}
}

// -----

// Refusals with no one op to point at: a name found nowhere; a dim no all_reduce has, which
// greedy mode refuses rather than do nothing (found by the fuzzer), negative too.
// SCRIPT: {{^}}[split-allreduce-op] no all_reduce named %nope in the program
module attributes {coco.schedule = "coco-split-allreduce{ops=nope}"} {
func.func @missing(%g: !coco.tensor<64x8xf32, local>) -> !coco.tensor<64x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<64x8xf32, local> -> !coco.tensor<64x8xf32>
  func.return %g1 : !coco.tensor<64x8xf32>
}
}

// -----

// SCRIPT: {{^}}[split-allreduce-dim] dim=9: no comm.all_reduce in the module has a tensor dim 9 (their values have 0, 2 dim(s)); nothing would be split
module attributes {coco.schedule = "coco-split-allreduce{dim=9}"} {
func.func @no_dim(%g: !coco.tensor<64x8xf32, local>, %s: !coco.tensor<f32, local>) -> (!coco.tensor<64x8xf32>, !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<64x8xf32, local> -> !coco.tensor<64x8xf32>
  %sc = comm.all_reduce sum %s : !coco.tensor<f32, local> -> !coco.tensor<f32>
  func.return %g1, %sc : !coco.tensor<64x8xf32>, !coco.tensor<f32>
}
}

// -----

// SCRIPT: {{^}}[split-allreduce-dim] dim=-1: no comm.all_reduce in the module has a tensor dim -1 (their values have 2 dim(s)); nothing would be split
module attributes {coco.schedule = "coco-split-allreduce{dim=-1}"} {
func.func @negative_dim(%g: !coco.tensor<64x8xf32, local>) -> !coco.tensor<64x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<64x8xf32, local> -> !coco.tensor<64x8xf32>
  func.return %g1 : !coco.tensor<64x8xf32>
}
}
