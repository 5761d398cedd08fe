// RUN: coco-opt %s --split-input-file -p coco-fuse-elementwise | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (the CHECK lines) runs on every chunk. The SCRIPT run applies each chunk's
// own `coco.schedule` (coco-schedule without a name) and prints each refusal at the op it is
// about: `FILE:LINE:COL: [rule] message`.

// The script fuses exactly %c and %d of @elt; greedy mode ignores it.
module attributes {coco.schedule = "coco-fuse-elementwise{ops=c,d}"} {

// SGD after split + reorder: the sliced update is one kernel, its slice of %w with it
// (coco-fuse-all-reduce would fuse the collectives too).
// CHECK-LABEL: func.func @sgd
// CHECK-NEXT:    %g1_rs = comm.reduce_scatter sum %g
// CHECK-NEXT:    %w1_s = comm.fused elementwise -> !coco.tensor<64xf32, sliced<0>> {
// CHECK-NEXT:      %d_s = coco.mul %lr, %g1_rs
// CHECK-NEXT:      %w_s = coco.slice %w
// CHECK-NEXT:      %w1_s_1 = coco.sub %w_s, %d_s
// CHECK-NEXT:      comm.yield %w1_s_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %w1 = comm.all_gather %w1_s
func.func @sgd(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %d_s = coco.mul %lr, %g1_rs : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
  %w_s = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
  %w1_s = coco.sub %w_s, %d_s : !coco.tensor<64xf32, sliced<0>>
  %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  coco.update %w, %w1 : !coco.tensor<64xf32>
  func.return
}

// Elementwise components: one iteration space per kernel, values used outside are yielded,
// and an op that would close a cycle through a reduction starts a kernel of its own.
// CHECK-LABEL: func.func @elt
// CHECK-NEXT:    %mm = coco.matmul %x, %x
// CHECK-NEXT:    %e2 = coco.exp %x
// CHECK-NEXT:    %c, %d2 = comm.fused elementwise -> !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32> {
// CHECK-NEXT:      %c_1 = coco.add %mm, %x
// CHECK-NEXT:      %d = coco.mul %c_1, %c_1
// CHECK-NEXT:      %d2_1 = coco.relu %d
// CHECK-NEXT:      comm.yield %c_1, %d2_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %bias2 = coco.mul %bias, %bias : !coco.tensor<16xf32>
// CHECK-NEXT:    %xb = coco.add %x, %bias2
// CHECK-NEXT:    %ca = coco.add %x, %x
// CHECK-NEXT:    %sa = coco.reduce sum %ca
// CHECK-NEXT:    %cb = coco.mul %ca, %sa
// CHECK-NEXT:    func.return
// SCRIPT-LABEL: func.func @elt
// SCRIPT:         %c, %d = comm.fused elementwise -> !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32> {
// SCRIPT-NEXT:      %c_1 = coco.add %mm, %x
// SCRIPT-NEXT:      %d_1 = coco.mul %c_1, %c_1
// SCRIPT-NEXT:      comm.yield %c_1, %d_1
// SCRIPT-NEXT:    }
// SCRIPT-NEXT:    %d2 = coco.relu %d
func.func @elt(%x: !coco.tensor<16x16xf32>, %bias: !coco.tensor<16xf32>) -> (!coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>, !coco.tensor<16xf32>, !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %mm = coco.matmul %x, %x : !coco.tensor<16x16xf32>
  %c = coco.add %mm, %x : !coco.tensor<16x16xf32>
  %e2 = coco.exp %x : !coco.tensor<16x16xf32>
  %d = coco.mul %c, %c : !coco.tensor<16x16xf32>
  %d2 = coco.relu %d : !coco.tensor<16x16xf32>
  %bias2 = coco.mul %bias, %bias : !coco.tensor<16xf32>
  %xb = coco.add %x, %bias2 : !coco.tensor<16x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<16x16xf32>
  %ca = coco.add %x, %x : !coco.tensor<16x16xf32>
  %sa = coco.reduce sum %ca : !coco.tensor<16x16xf32> -> !coco.tensor<f32>
  %cb = coco.mul %ca, %sa : !coco.tensor<16x16xf32>, !coco.tensor<f32> -> !coco.tensor<16x16xf32>
  func.return %c, %e2, %bias2, %cb, %d2 : !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>, !coco.tensor<16xf32>, !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>
}
}

// -----

// Requests the rules refuse (greedy mode leaves these sites, as in @elt above).
// An elementwise fusion holds elementwise ops only.
module attributes {coco.schedule = "coco-fuse-elementwise{ops=c,mm}"} {
func.func @not_elementwise(%x: !coco.tensor<16x16xf32>) -> !coco.tensor<16x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-fuse-elementwise.mlir:[[# @LINE + 1]]:3: [fuse-elementwise] %mm (coco.matmul) is not elementwise: an elementwise fusion holds elementwise ops only (use mode=all_reduce for a reduce_scatter chain)
  %mm = coco.matmul %x, %x : !coco.tensor<16x16xf32>
  %c = coco.add %mm, %x : !coco.tensor<16x16xf32>
  func.return %c : !coco.tensor<16x16xf32>
}
}

// -----

// The named ops must be connected through their own values (%x is an argument).
// SCRIPT: {{^}}[fuse-connected] the named ops are not connected through their own values: they form 2 separate groups
module attributes {coco.schedule = "coco-fuse-elementwise{ops=c,e2}"} {
func.func @unconnected(%x: !coco.tensor<16x16xf32>) -> (!coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %mm = coco.matmul %x, %x : !coco.tensor<16x16xf32>
  %c = coco.add %mm, %x : !coco.tensor<16x16xf32>
  %e2 = coco.exp %x : !coco.tensor<16x16xf32>
  func.return %c, %e2 : !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>
}
}

// -----

// A reduction between two named ops would have to run both before and after the region.
module attributes {coco.schedule = "coco-fuse-elementwise{ops=ca,cb}"} {
func.func @cycle(%x: !coco.tensor<16x16xf32>) -> !coco.tensor<16x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %ca = coco.add %x, %x : !coco.tensor<16x16xf32>
  // SCRIPT: coco-fuse-elementwise.mlir:[[# @LINE + 1]]:3: [fuse-cycle] fusing {%ca (coco.add), %cb (coco.mul)} would form a cycle: %sa (coco.reduce) depends on the set and %cb (coco.mul) in the set depends on it
  %sa = coco.reduce sum %ca : !coco.tensor<16x16xf32> -> !coco.tensor<f32>
  %cb = coco.mul %ca, %sa : !coco.tensor<16x16xf32>, !coco.tensor<f32> -> !coco.tensor<16x16xf32>
  func.return %cb : !coco.tensor<16x16xf32>
}
}

// -----

// One kernel runs one iteration space.
module attributes {coco.schedule = "coco-fuse-elementwise{ops=xb,bias2}"} {
func.func @sizes(%x: !coco.tensor<16x16xf32>, %bias: !coco.tensor<16xf32>) -> !coco.tensor<16x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %bias2 = coco.mul %bias, %bias : !coco.tensor<16xf32>
  // SCRIPT: coco-fuse-elementwise.mlir:[[# @LINE + 1]]:3: [fuse-sizes] %xb (coco.add) computes over a different iteration space than the rest of the fused set (one kernel runs one space)
  %xb = coco.add %x, %bias2 : !coco.tensor<16x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<16x16xf32>
  func.return %xb : !coco.tensor<16x16xf32>
}
}

// -----

// Scalar arithmetic alone stays out of regions (kernels reading it compute it themselves:
// coco-defer), unless it updates scalar state (a loss scale, its growth counter): one kernel
// of one element then, not a launch per op.
// CHECK-LABEL: func.func @scalar_state
// CHECK-NEXT:    %r = comm.all_reduce max %f
// CHECK-NEXT:    %u = coco.mul %lr, %r
// CHECK-NEXT:    comm.fused elementwise {
// CHECK-NEXT:      %c = coco.constant 0.5
// CHECK-NEXT:      %h = coco.mul %s, %c
// CHECK-NEXT:      %s1 = coco.select %ok, %s, %h
// CHECK-NEXT:      coco.update %s, %s1
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
func.func @scalar_state(%f: !coco.tensor<f32, local>, %lr: !coco.tensor<f32>, %s: !coco.tensor<f32>, %ok: !coco.tensor<i1>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  %r = comm.all_reduce max %f : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %u = coco.mul %lr, %r : !coco.tensor<f32>
  %c = coco.constant 0.5 : !coco.tensor<f32>
  %h = coco.mul %s, %c : !coco.tensor<f32>
  %s1 = coco.select %ok, %s, %h : !coco.tensor<i1>, !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<f32>
  coco.update %s, %s1 : !coco.tensor<f32>
  func.return %u : !coco.tensor<f32>
}
