// RUN: coco-opt %s --split-input-file --verify-diagnostics -p 'coco-defer{ranks=4}' | filecheck %s
// RUN: coco-opt %s --split-input-file --verify-diagnostics -p 'coco-defer{ranks=4 ranks-per-node=2}' | filecheck %s --check-prefix=NODES

// Deferrals written by hand are the user's choice: each must be one the pass could make, and
// the pass adds none. Here only %corr is marked: %sq, which the pass would mark too, is
// computed where it stands (a launch) and %corr in the kernel reading it. On two nodes
// nothing may be deferred.
// CHECK-LABEL: func.func @subset
// CHECK:         %sq = coco.mul %beta1, %beta1 : !coco.tensor<f32>
// CHECK-NEXT:    %corr = coco.sub %sq, %lr {comm.deferral = #comm<deferral rematerialize>}
// CHECK-NOT:     comm.deferral
// NODES: coco-defer-invalid.mlir:[[# @LINE + 3]]:3: [deferral] %corr (coco.sub) cannot be deferred as rematerialize: the plan spans nodes [0, 0, 1, 1]: kernels across nodes read it from memory
func.func @subset(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %sq = coco.mul %beta1, %beta1 : !coco.tensor<f32>
  %corr = coco.sub %sq, %lr {comm.deferral = #comm<deferral rematerialize>} : !coco.tensor<f32>
  comm.fused all_reduce {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %u = coco.mul %corr, %rs : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1 = coco.sub %ws, %u : !coco.tensor<64xf32, sliced<0>>
    %w2 = comm.all_gather %w1 : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w2 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}

// -----

// A scalar something else reads from memory (the function returns %corr) is not
// rematerialized.
// CHECK: coco-defer-invalid.mlir:[[# @LINE + 2]]:3: [deferral] %corr (coco.sub) cannot be deferred as rematerialize: only scalar arithmetic on arguments that only fused all_reduce regions read, and a two-shot fused region's scalar arithmetic and slices of arguments (without row reductions) are rematerialized
func.func @returned(%g: !coco.tensor<64xf32, local>, %lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>) -> (!coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %corr = coco.sub %beta1, %lr {comm.deferral = #comm<deferral rematerialize>} : !coco.tensor<f32>
  %r = comm.fused all_reduce -> !coco.tensor<64xf32, sliced<0>> {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %u = coco.mul %corr, %rs : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    comm.yield %u : !coco.tensor<64xf32, sliced<0>>
  }
  func.return %r, %corr : !coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32>
}

// -----

// Only a cast that widens exactly rides the wire (f32 to bf16 narrows).
// CHECK: coco-defer-invalid.mlir:[[# @LINE + 2]]:3: [deferral] %g16 (coco.cast) cannot be deferred as wire: only a cast that widens exactly and that only fused reduce_scatters (or a one-shot region's all_reduce) read rides the wire
func.func @narrowing(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<64xbf16, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %g16 = coco.cast %g {comm.deferral = #comm<deferral wire>} : !coco.tensor<64xf32, local> -> !coco.tensor<64xbf16, local>
  %r = comm.fused all_reduce -> !coco.tensor<64xbf16, sliced<0>> {
    %rs = comm.reduce_scatter sum %g16 : !coco.tensor<64xbf16, local> -> !coco.tensor<64xbf16, sliced<0>>
    comm.yield %rs : !coco.tensor<64xbf16, sliced<0>>
  }
  func.return %r : !coco.tensor<64xbf16, sliced<0>>
}

// -----

// A region with row reductions reads its slices from memory: its slice is not deferred.
// CHECK: coco-defer-invalid.mlir:[[# @LINE + 4]]:5: [deferral] %residual_s (coco.slice) cannot be deferred as rematerialize
func.func @rows(%x: !coco.tensor<16x64xf16, local>, %residual: !coco.tensor<16x64xf16>) -> !coco.tensor<16x64xf16> attributes {coco.grid = #coco.grid<[?]>} {
  %normed = comm.fused all_reduce -> !coco.tensor<16x64xf16> {
    %total_rs = comm.reduce_scatter sum %x : !coco.tensor<16x64xf16, local> -> !coco.tensor<16x64xf16, sliced<0>>
    %residual_s = coco.slice %residual {comm.deferral = #comm<deferral rematerialize>} : !coco.tensor<16x64xf16> -> !coco.tensor<16x64xf16, sliced<0>>
    %hidden_s = coco.add %total_rs, %residual_s : !coco.tensor<16x64xf16, sliced<0>>
    %ms = coco.reduce_dims mean %hidden_s dims [1] keepdims : !coco.tensor<16x64xf16, sliced<0>> -> !coco.tensor<16x1xf16, sliced<0>>
    %normed_s = coco.mul %hidden_s, %ms : !coco.tensor<16x64xf16, sliced<0>>, !coco.tensor<16x1xf16, sliced<0>> -> !coco.tensor<16x64xf16, sliced<0>>
    %normed_1 = comm.all_gather %normed_s : !coco.tensor<16x64xf16, sliced<0>> -> !coco.tensor<16x64xf16>
    comm.yield %normed_1 : !coco.tensor<16x64xf16>
  }
  func.return %normed : !coco.tensor<16x64xf16>
}

// -----

// A deferral sits on an elementwise op, a constant or a slice, never on a collective.
// CHECK: comm.all_reduce in @f has attribute 'comm.deferral', which coconet does not know
func.func @f(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %s = comm.all_reduce sum %g {comm.deferral = #comm<deferral wire>} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  func.return %s : !coco.tensor<64xf32>
}
