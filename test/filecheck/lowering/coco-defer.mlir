// RUN: coco-opt %s -p 'coco-defer{ranks=4}' | filecheck %s
// RUN: coco-opt %s -p 'coco-defer{ranks=4}' | coco-opt -p 'coco-defer{ranks=4}' | filecheck %s
// RUN: coco-opt %s -p 'coco-defer{ranks=4 ranks-per-node=2}' | filecheck %s --check-prefix=NODES
// RUN: coco-opt %s -p 'coco-defer{ranks=4}' -t 'plan{ranks=4}' | filecheck %s --check-prefix=PLAN

// coco-defer marks the ops the plan builder does not compute where they stand. Rematerialized:
// scalar arithmetic on arguments that only fused all_reduce regions read (%sq, %corr; not
// %one, %b1t, %bc1: %seen, which the function returns, reads %bc1), and, inside a two-shot
// region without row reductions, its scalar arithmetic (%c) and slices of arguments (%ws).
// On the wire: an exact widening (%g32, bf16 to f32) that only reduce_scatters read. Run
// again, the pass keeps what it wrote and adds nothing. On two nodes nothing is deferred
// (NODES). The plan builder reads the marks (PLAN): no launch computes a marked op, the
// fused kernel reads %beta1 and %lr (%sq, %corr, %c computed in it), %w (for %ws), and its
// peers' bf16 %g.
// CHECK-LABEL: func.func @adam
// CHECK:         %one = coco.constant 1.0 : !coco.tensor<f32>
// CHECK-NEXT:    %b1t = coco.pow %beta1, %step :
// CHECK-NEXT:    %bc1 = coco.sub %one, %b1t :
// CHECK-NEXT:    %seen = coco.mul %lr, %bc1 :
// CHECK-NEXT:    %sq = coco.mul %beta1, %beta1 {comm.deferral = #comm<deferral rematerialize>}
// CHECK-NEXT:    %corr = coco.sub %sq, %lr {comm.deferral = #comm<deferral rematerialize>}
// CHECK-NEXT:    %g32 = coco.cast %g {comm.deferral = #comm<deferral wire>}
// CHECK-NEXT:    comm.fused all_reduce {
// CHECK-NEXT:      %rs = comm.reduce_scatter sum %g32 :
// CHECK-NEXT:      %c = coco.sub %one, %beta1 {comm.deferral = #comm<deferral rematerialize>}
// CHECK-NEXT:      %d = coco.mul %c, %rs :
// CHECK:           %ws = coco.slice %w {comm.deferral = #comm<deferral rematerialize>}
// CHECK-NEXT:      %u = coco.mul %corr, %mh :
// NODES-LABEL: func.func @adam
// NODES-NOT:     comm.deferral
// NODES-LABEL: func.func @rows
// PLAN-LABEL:  plan @adam on grid [4]
// PLAN-NOT:      launch k_mul<<<{{.*}}>>>(%beta1
// PLAN-NOT:      launch k_cast
// PLAN:          launch k_mul<<<{{.*}}>>>(%lr, %bc1, %seen
// PLAN-NEXT:     launch k_fused_all_reduce<<<{{.*}}>>>(%beta1, %lr, %one, %m, %bc1, %w, %m, peers(%g),
func.func @adam(%g: !coco.tensor<64xbf16, local>, %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>, %lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>, %step: !coco.tensor<f32>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  %one = coco.constant 1.0 : !coco.tensor<f32>
  %b1t = coco.pow %beta1, %step : !coco.tensor<f32>
  %bc1 = coco.sub %one, %b1t : !coco.tensor<f32>
  %seen = coco.mul %lr, %bc1 : !coco.tensor<f32>
  %sq = coco.mul %beta1, %beta1 : !coco.tensor<f32>
  %corr = coco.sub %sq, %lr : !coco.tensor<f32>
  %g32 = coco.cast %g : !coco.tensor<64xbf16, local> -> !coco.tensor<64xf32, local>
  comm.fused all_reduce {
    %rs = comm.reduce_scatter sum %g32 : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %c = coco.sub %one, %beta1 : !coco.tensor<f32>
    %d = coco.mul %c, %rs : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    %m1 = coco.add %m, %d : !coco.tensor<64xf32, sliced<0>>
    coco.update %m, %m1 : !coco.tensor<64xf32, sliced<0>>
    %mh = coco.div %m1, %bc1 : !coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %u = coco.mul %corr, %mh : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    %w1 = coco.sub %ws, %u : !coco.tensor<64xf32, sliced<0>>
    %w2 = comm.all_gather %w1 : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w2 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return %seen : !coco.tensor<f32>
}

// With row reductions the region's kernel reads scalars from memory: nothing in it is marked
// (the constant %eps_c, the slice %residual_s).
// CHECK-LABEL: func.func @rows
// CHECK-NOT:     comm.deferral
// CHECK:         func.return
func.func @rows(%x: !coco.tensor<16x64xf16, local>, %residual: !coco.tensor<16x64xf16>) -> !coco.tensor<16x64xf16> attributes {coco.grid = #coco.grid<[?]>} {
  %normed = comm.fused all_reduce -> !coco.tensor<16x64xf16> {
    %total_rs = comm.reduce_scatter sum %x : !coco.tensor<16x64xf16, local> -> !coco.tensor<16x64xf16, sliced<0>>
    %residual_s = coco.slice %residual : !coco.tensor<16x64xf16> -> !coco.tensor<16x64xf16, sliced<0>>
    %hidden_s = coco.add %total_rs, %residual_s : !coco.tensor<16x64xf16, sliced<0>>
    %sq = coco.mul %hidden_s, %hidden_s : !coco.tensor<16x64xf16, sliced<0>>
    %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<16x64xf16, sliced<0>> -> !coco.tensor<16x1xf16, sliced<0>>
    %eps_c = coco.constant 1.0e-06 : !coco.tensor<f16>
    %me = coco.add %ms, %eps_c : !coco.tensor<16x1xf16, sliced<0>>, !coco.tensor<f16> -> !coco.tensor<16x1xf16, sliced<0>>
    %inv = coco.rsqrt %me : !coco.tensor<16x1xf16, sliced<0>>
    %normed_s = coco.mul %hidden_s, %inv : !coco.tensor<16x64xf16, sliced<0>>, !coco.tensor<16x1xf16, sliced<0>> -> !coco.tensor<16x64xf16, sliced<0>>
    %normed_1 = comm.all_gather %normed_s : !coco.tensor<16x64xf16, sliced<0>> -> !coco.tensor<16x64xf16>
    comm.yield %normed_1 : !coco.tensor<16x64xf16>
  }
  func.return %normed : !coco.tensor<16x64xf16>
}

// A one-shot region: the cast of its all_reduce's input rides the wire; the scalar
// arithmetic inside stays where it stands (the one-shot kernel computes it with the rest).
// CHECK-LABEL: func.func @one_shot
// CHECK:         %g32 = coco.cast %g {comm.deferral = #comm<deferral wire>}
// CHECK:         %c = coco.sub %one, %beta1 : !coco.tensor<f32>
func.func @one_shot(%g: !coco.tensor<64xf16, local>, %w: !coco.tensor<64xf32>, %beta1: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g32 = coco.cast %g : !coco.tensor<64xf16, local> -> !coco.tensor<64xf32, local>
  comm.fused all_reduce one_shot {
    %g1 = comm.all_reduce sum %g32 : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
    %one = coco.constant 1.0 : !coco.tensor<f32>
    %c = coco.sub %one, %beta1 : !coco.tensor<f32>
    %d = coco.mul %c, %g1 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
    %w1 = coco.sub %w, %d : !coco.tensor<64xf32>
    coco.update %w, %w1 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}
