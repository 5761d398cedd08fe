// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s

// The one-shot fused all_reduce: `coco-fuse-all-reduce{form=one_shot}` (the named
// schedule fuse(ar-c)) fuses an all_reduce as written and the computation on its whole result
// into `comm.fused all_reduce one_shot`, one kernel in which each rank reduces every peer's
// whole input (lowering/fused_collective.py lower_one_shot). Each chunk applies its own
// `coco.schedule`; a refusal is printed at the op it is about: `FILE:LINE:COL: [rule] message`.

// AR + residual + RMSNorm: the all_reduce, the residual add, the row reduction and its row
// values, and the normalized rows, in one region; the constant joins it.
// CHECK-LABEL: func.func @rmsnorm
// CHECK-NEXT:    %h, %out = comm.fused all_reduce one_shot -> !coco.tensor<4x8xf32>, !coco.tensor<4x8xf32> {
// CHECK-NEXT:      %t = comm.all_reduce sum %x
// CHECK-NEXT:      %h_1 = coco.add %t, %res
// CHECK-NEXT:      %sq = coco.mul %h_1, %h_1
// CHECK-NEXT:      %ms = coco.reduce_dims mean %sq dims [1] keepdims
// CHECK-NEXT:      %eps = coco.constant
// CHECK-NEXT:      %me = coco.add %ms, %eps
// CHECK-NEXT:      %inv = coco.rsqrt %me
// CHECK-NEXT:      %out_1 = coco.mul %h_1, %inv
// CHECK-NEXT:      comm.yield %h_1, %out_1
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %h, %out
module attributes {coco.schedule = "coco-fuse-all-reduce{form=one_shot}"} {
func.func @rmsnorm(%x: !coco.tensor<4x8xf32, local>, %res: !coco.tensor<4x8xf32>) -> (!coco.tensor<4x8xf32>, !coco.tensor<4x8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %t = comm.all_reduce sum %x : !coco.tensor<4x8xf32, local> -> !coco.tensor<4x8xf32>
  %h = coco.add %t, %res : !coco.tensor<4x8xf32>
  %sq = coco.mul %h, %h : !coco.tensor<4x8xf32>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<4x8xf32> -> !coco.tensor<4x1xf32>
  %eps = coco.constant 1.0e-05 : !coco.tensor<f32>
  %me = coco.add %ms, %eps : !coco.tensor<4x1xf32>, !coco.tensor<f32> -> !coco.tensor<4x1xf32>
  %inv = coco.rsqrt %me : !coco.tensor<4x1xf32>
  %out = coco.mul %h, %inv : !coco.tensor<4x8xf32>, !coco.tensor<4x1xf32> -> !coco.tensor<4x8xf32>
  func.return %h, %out : !coco.tensor<4x8xf32>, !coco.tensor<4x8xf32>
}
}

// -----

// SGD: the update storing the new weights joins the region; a full norm does not (its
// reduction finishes across blocks), nor does what waits for it.
// CHECK-LABEL: func.func @sgd_norm
// CHECK-NEXT:    %w1 = comm.fused all_reduce one_shot -> !coco.tensor<64xf32> {
// CHECK-NEXT:      %g1 = comm.all_reduce sum %g
// CHECK-NEXT:      %d = coco.mul %lr, %g1
// CHECK-NEXT:      %w1_1 = coco.sub %w, %d
// CHECK-NEXT:      coco.update %w, %w1_1
// CHECK-NEXT:      comm.yield %w1_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %n = coco.reduce norm %w1
// CHECK-NEXT:    %s = coco.mul %w1, %n
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=g1 form=one_shot}"} {
func.func @sgd_norm(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<64xf32>
  coco.update %w, %w1 : !coco.tensor<64xf32>
  %n = coco.reduce norm %w1 : !coco.tensor<64xf32> -> !coco.tensor<f32>
  %s = coco.mul %w1, %n : !coco.tensor<64xf32>, !coco.tensor<f32> -> !coco.tensor<64xf32>
  func.return %s : !coco.tensor<64xf32>
}
}

// -----

// The printed form parses back: a one-shot region in the input is verified and printed as
// it was (the schedule finds no all_reduce left in the function body to fuse).
// CHECK-LABEL: func.func @round_trip
// CHECK-NEXT:    %y = comm.fused all_reduce one_shot -> !coco.tensor<16xf32> {
// CHECK-NEXT:      %t = comm.all_reduce sum %x : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
// CHECK-NEXT:      %y_1 = coco.exp %t : !coco.tensor<16xf32>
// CHECK-NEXT:      comm.yield %y_1 : !coco.tensor<16xf32>
// CHECK-NEXT:    }
module attributes {coco.schedule = "coco-fuse-all-reduce{form=one_shot}"} {
func.func @round_trip(%x: !coco.tensor<16xf32, local>) -> !coco.tensor<16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %y = comm.fused all_reduce one_shot -> !coco.tensor<16xf32> {
    %t = comm.all_reduce sum %x : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
    %y_1 = coco.exp %t : !coco.tensor<16xf32>
    comm.yield %y_1 : !coco.tensor<16xf32>
  }
  func.return %y : !coco.tensor<16xf32>
}
}

// -----

// A scalar's all_reduce (an amax, a norm's partials) is not a one-shot fused all_reduce.
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=a form=one_shot}"} {
func.func @scalar(%p: !coco.tensor<f32, local>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  // CHECK: coco-fuse-all-reduce-one-shot.mlir:[[# @LINE + 1]]:3: [fuse-one-shot] %a (comm.all_reduce) reduces a scalar (a norm's partials): a one-shot fused all_reduce reduces a tensor
  %a = comm.all_reduce max %p : !coco.tensor<f32, local> -> !coco.tensor<f32>
  func.return %a : !coco.tensor<f32>
}
}

// -----

// CHECK: [fuse-form] unknown form 'three_shot': use one of two_shot, one_shot
module attributes {coco.schedule = "coco-fuse-all-reduce{form=three_shot}"} {
func.func @form_unknown(%x: !coco.tensor<16xf32, local>) -> !coco.tensor<16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %t = comm.all_reduce sum %x : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
  func.return %t : !coco.tensor<16xf32>
}
}

// -----

// A named set holds one all_reduce and computation in its space: a matmul is neither.
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=t,m form=one_shot}"} {
func.func @matmul_in_set(%x: !coco.tensor<8x8xf32, local>, %w: !coco.tensor<8x8xf32>) -> !coco.tensor<8x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %t = comm.all_reduce sum %x : !coco.tensor<8x8xf32, local> -> !coco.tensor<8x8xf32>
  // CHECK: coco-fuse-all-reduce-one-shot.mlir:[[# @LINE + 1]]:3: [fuse-one-shot] %m (coco.matmul) cannot be part of a one-shot fused all_reduce (its all_reduce, elementwise computation, row reductions over the last dim)
  %m = coco.matmul %t, %w : !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32> -> !coco.tensor<8x8xf32>
  func.return %m : !coco.tensor<8x8xf32>
}
}

// -----

// Sliced values never join: each rank computes the whole tensor (a sliced result is the
// two-shot form's, after coco-split-allreduce and coco-reorder).
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=t,s form=one_shot}"} {
func.func @sliced_in_set(%x: !coco.tensor<8x8xf32, local>, %p: !coco.tensor<8x8xf32, sliced<0>>) -> !coco.tensor<8x8xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %t = comm.all_reduce sum %x : !coco.tensor<8x8xf32, local> -> !coco.tensor<8x8xf32>
  // CHECK: coco-fuse-all-reduce-one-shot.mlir:[[# @LINE + 1]]:3: [fuse-one-shot] %s (coco.add) computes over a different iteration space than the all_reduce's result (each rank computes the whole tensor)
  %s = coco.add %t, %p : !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32, sliced<0>>
  func.return %s : !coco.tensor<8x8xf32, sliced<0>>
}
}

// -----

// Two all_reduces in one named set: one region fuses one.
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=a,b,c form=one_shot}"} {
func.func @two_reduces(%x: !coco.tensor<8xf32, local>, %y: !coco.tensor<8xf32, local>) -> !coco.tensor<8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %a = comm.all_reduce sum %x : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  %b = comm.all_reduce sum %y : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  %c = coco.add %a, %b : !coco.tensor<8xf32>
  func.return %c : !coco.tensor<8xf32>
}
}
// CHECK: [fuse-one-shot] a one-shot fused all_reduce holds exactly one comm.all_reduce; the named ops hold 2

// -----

// The verifier: a one-shot region holds one tensor all_reduce and its computation.
module attributes {coco.schedule = "coco-fuse-all-reduce{form=one_shot}"} {
func.func @verify_kind(%x: !coco.tensor<16xf32, local>) -> !coco.tensor<16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %y = comm.fused elementwise one_shot -> !coco.tensor<16xf32> {
    %t = comm.all_reduce sum %x : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
    comm.yield %t : !coco.tensor<16xf32>
  }
  func.return %y : !coco.tensor<16xf32>
}
}
// CHECK: [fuse-one-shot] one_shot is a form of a fused all_reduce, not of a fused elementwise

// -----

module attributes {coco.schedule = "coco-fuse-all-reduce{form=one_shot}"} {
func.func @verify_scatter(%x: !coco.tensor<16xf32, local>) -> !coco.tensor<16xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %y = comm.fused all_reduce one_shot -> !coco.tensor<16xf32, sliced<0>> {
    %t = comm.reduce_scatter sum %x : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
    comm.yield %t : !coco.tensor<16xf32, sliced<0>>
  }
  func.return %y : !coco.tensor<16xf32, sliced<0>>
}
}
// CHECK: [fuse-one-shot] a one-shot fused all_reduce holds exactly one comm.all_reduce and no other collective, this one holds comm.reduce_scatter

// -----

module attributes {coco.schedule = "coco-fuse-all-reduce{form=one_shot}"} {
func.func @verify_reduce(%x: !coco.tensor<16xf32, local>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  %y = comm.fused all_reduce one_shot -> !coco.tensor<f32> {
    %t = comm.all_reduce sum %x : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
    %n = coco.reduce sum %t : !coco.tensor<16xf32> -> !coco.tensor<f32>
    comm.yield %n : !coco.tensor<f32>
  }
  func.return %y : !coco.tensor<f32>
}
}
// CHECK: [fuse-one-shot] a one-shot fused all_reduce holds its all_reduce, elementwise ops, constants, slices, row reductions and updates, but this one holds coco.reduce

// -----

// What computes the all_reduce's input stays before the region: every peer reads that input
// whole from memory, so it is stored before the kernel starts (the greedy form used to pull
// %d in, which no kernel can compute -- a lowering that failed internally).
// CHECK-LABEL: func.func @input_computed
// CHECK-NEXT:    %d = coco.sub %w, %x
// CHECK-NEXT:    %y = comm.fused all_reduce one_shot -> !coco.tensor<16xf32> {
// CHECK-NEXT:      %t = comm.all_reduce sum %d
// CHECK-NEXT:      %y_1 = coco.mul %t, %t
module attributes {coco.schedule = "coco-fuse-all-reduce{form=one_shot}"} {
func.func @input_computed(%x: !coco.tensor<16xf32>, %w: !coco.tensor<16xf32>) -> !coco.tensor<16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %d = coco.sub %w, %x : !coco.tensor<16xf32>
  %t = comm.all_reduce sum %d : !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %y = coco.mul %t, %t : !coco.tensor<16xf32>
  func.return %y : !coco.tensor<16xf32>
}
}

// -----

module attributes {coco.schedule = "coco-fuse-all-reduce{ops=d,t,y form=one_shot}"} {
func.func @input_computed_in_set(%x: !coco.tensor<16xf32>, %w: !coco.tensor<16xf32>) -> !coco.tensor<16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  // CHECK: coco-fuse-all-reduce-one-shot.mlir:[[# @LINE + 1]]:3: [fuse-one-shot] %d (coco.sub) computes the input of %t (comm.all_reduce), which peers read from memory: it is computed before a one-shot fused all_reduce, not in it
  %d = coco.sub %w, %x : !coco.tensor<16xf32>
  %t = comm.all_reduce sum %d : !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %y = coco.mul %t, %t : !coco.tensor<16xf32>
  func.return %y : !coco.tensor<16xf32>
}
}

// -----

module attributes {coco.schedule = "coco-fuse-all-reduce{form=one_shot}"} {
func.func @verify_input_inside(%x: !coco.tensor<16xf32>, %w: !coco.tensor<16xf32>) -> !coco.tensor<16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %y = comm.fused all_reduce one_shot -> !coco.tensor<16xf32> {
    %d = coco.sub %w, %x : !coco.tensor<16xf32>
    %t = comm.all_reduce sum %d : !coco.tensor<16xf32> -> !coco.tensor<16xf32>
    comm.yield %t : !coco.tensor<16xf32>
  }
  func.return %y : !coco.tensor<16xf32>
}
}
// CHECK: [fuse-one-shot] a one-shot fused all_reduce reads its all_reduce's input from memory (every peer reads it whole): the input is computed before the region, not in it

// -----

// coco-overlap pipelines the two-shot form's reduce_scatter by chunks of rows; the one-shot
// kernel reduces the whole tensor in one step.
module attributes {coco.schedule = "coco-fuse-all-reduce{form=one_shot},coco-overlap{ops=mm}"} {
func.func @overlap(%x: !coco.tensor<8x8xf32, sliced<1>>, %w: !coco.tensor<8x8xf32, sliced<0>>) -> !coco.tensor<8x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %mm = coco.matmul %x, %w : !coco.tensor<8x8xf32, sliced<1>>, !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32, local>
  %t = comm.all_reduce sum %mm : !coco.tensor<8x8xf32, local> -> !coco.tensor<8x8xf32>
  %y = coco.relu %t : !coco.tensor<8x8xf32>
  func.return %y : !coco.tensor<8x8xf32>
}
}
// CHECK: [overlap-consumer] %y (comm.fused) is a one-shot fused all_reduce: its kernel reduces the whole tensor in one step, with no chunk of rows to pipeline (the two-shot fuse(rs-c-ag) overlaps)
