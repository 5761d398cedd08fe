// RUN: coco-opt %s -p 'coco-defer{ranks=4},coco-segment' | filecheck %s
// RUN: coco-opt %s -p 'coco-defer{ranks=4},coco-segment' | coco-opt -p 'coco-segment' | filecheck %s
// RUN: coco-opt %s -p 'coco-defer{ranks=4},coco-segment' -t 'plan{ranks=4}' | filecheck %s --check-prefix=PLAN

// coco-segment cuts each two-shot fused region into the kernels it runs as. @norm_clip (a
// clipping factor from the global norm of the new momentum): segment 0 is the reduce_scatter,
// the momentum and the partial sums of squares, whose all_reduce the kernel finishes itself
// (its partials read by nothing else); %u reads the finished norm (through the scalars
// coco-defer marked, which are in no segment: each kernel computes them), so segment 1 starts
// there and runs to the all_gather. The update of %m, written after the norm, moves up to
// right after %m1 (nothing in between reads %m): segment 0 stores it. Run again, the pass
// keeps what it wrote. The plan builder reads the cuts (PLAN): two fused kernels, nothing
// between them.
// CHECK-LABEL: func.func @norm_clip
// CHECK:         comm.fused all_reduce attributes {comm.segments = 2 : i64} {
// CHECK-NEXT:      %rs = comm.reduce_scatter sum %g {comm.segment = 0 : i64}
// CHECK-NEXT:      %m1 = coco.add %m, %rs {comm.segment = 0 : i64}
// CHECK-NEXT:      coco.update %m, %m1 {comm.segment = 0 : i64}
// CHECK-NEXT:      %sq = coco.mul %m1, %m1 {comm.segment = 0 : i64}
// CHECK-NEXT:      %part = coco.reduce sum %sq {comm.segment = 0 : i64}
// CHECK-NEXT:      %sumsq = comm.all_reduce sum %part {comm.segment = 0 : i64}
// CHECK-NEXT:      %n = coco.sqrt %sumsq {comm.deferral = #comm<deferral rematerialize>}
// CHECK-NEXT:      %c = coco.mul %lr, %n {comm.deferral = #comm<deferral rematerialize>}
// CHECK-NEXT:      %u = coco.mul %c, %m1 {comm.segment = 1 : i64}
// CHECK-NEXT:      %ws = coco.slice %w {comm.deferral = #comm<deferral rematerialize>, comm.segment = 1 : i64}
// CHECK-NEXT:      %w1s = coco.sub %ws, %u {comm.segment = 1 : i64}
// CHECK-NEXT:      %w1 = comm.all_gather %w1s {comm.segment = 1 : i64}
// CHECK-NEXT:      coco.update %w, %w1 {comm.segment = 1 : i64}
// CHECK-NEXT:      comm.yield
// PLAN-LABEL:  plan @norm_clip on grid [4]
// PLAN:          launch k_fused_all_reduce<<<{{.*}}>>>(%m, %m1, %m, peers(%g), %sumsq,
// PLAN-NEXT:     launch k_fused_all_reduce_1<<<{{.*}}>>>(%sumsq, %lr, %m1, %w, peers(%w1),
// PLAN-NOT:      copy
func.func @norm_clip(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %m1 = coco.add %m, %rs : !coco.tensor<64xf32, sliced<0>>
    %sq = coco.mul %m1, %m1 : !coco.tensor<64xf32, sliced<0>>
    %part = coco.reduce sum %sq : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<f32, local>
    %sumsq = comm.all_reduce sum %part : !coco.tensor<f32, local> -> !coco.tensor<f32>
    %n = coco.sqrt %sumsq : !coco.tensor<f32>
    %c = coco.mul %lr, %n : !coco.tensor<f32>
    %u = coco.mul %c, %m1 : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1s = coco.sub %ws, %u : !coco.tensor<64xf32, sliced<0>>
    %w1 = comm.all_gather %w1s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %m, %m1 : !coco.tensor<64xf32, sliced<0>>
    coco.update %w, %w1 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}

// An all_reduce that states its accumulation is the library's to honour: the kernel does
// not finish it, so the reduction and the all_reduce run on their own (no segment) between
// segment 0 and segment 1, as unfused (the plan: the reduction's kernels, the library step).
// CHECK-LABEL: func.func @stated
// CHECK:         %sq = coco.mul %m1, %m1 {comm.segment = 0 : i64}
// CHECK-NEXT:    %part = coco.reduce sum %sq :
// CHECK-NEXT:    %sumsq = comm.all_reduce sum %part acc f64 :
// CHECK-NEXT:    %u = coco.mul %sumsq, %m1 {comm.segment = 1 : i64}
// PLAN-LABEL:  plan @stated on grid [4]
// PLAN:          launch k_fused_all_reduce<<<{{.*}}>>>(%m, %m1, %sq, peers(%g),
// PLAN-NEXT:     launch k_reduce_sum_f32_partial
// PLAN-NEXT:     launch k_reduce_sum_f32_finish
// PLAN-NEXT:     all_reduce sum %part -> %sumsq over [0] acc f64
// PLAN-NEXT:     launch k_fused_all_reduce_1<<<{{.*}}>>>(%sumsq, %m1, %w, peers(%w1),
func.func @stated(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %m1 = coco.add %m, %rs : !coco.tensor<64xf32, sliced<0>>
    %sq = coco.mul %m1, %m1 : !coco.tensor<64xf32, sliced<0>>
    %part = coco.reduce sum %sq : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<f32, local>
    %sumsq = comm.all_reduce sum %part acc f64 : !coco.tensor<f32, local> -> !coco.tensor<f32>
    %u = coco.mul %sumsq, %m1 : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1s = coco.sub %ws, %u : !coco.tensor<64xf32, sliced<0>>
    %w1 = comm.all_gather %w1s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w1 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}

// Two tensors coupled through a global norm: each segment holds one kernel per tensor
// chain, `comm.chain = j` on its ops (the scalars in between are in none; the updates
// follow their values), and the plan runs each segment's two kernels as one table launch.
// CHECK-LABEL: func.func @two_tensors
// CHECK:         %a0_rs = comm.reduce_scatter sum %g0 {comm.segment = 0 : i64, comm.chain = 0 : i64}
// CHECK-NEXT:    %a1_rs = comm.reduce_scatter sum %g1 {comm.segment = 0 : i64, comm.chain = 1 : i64}
// CHECK:         %s1 = comm.all_reduce sum %s1_part {comm.segment = 0 : i64, comm.chain = 1 : i64}
// CHECK-NEXT:    %s = coco.add %s0, %s1 {comm.deferral = #comm<deferral rematerialize>}
// CHECK-NEXT:    %n = coco.sqrt %s {comm.deferral = #comm<deferral rematerialize>}
// CHECK-NEXT:    %u0_s = coco.mul %a0_rs, %n {comm.segment = 1 : i64, comm.chain = 0 : i64}
// CHECK:         %x0 = comm.all_gather %x0_s {comm.segment = 1 : i64, comm.chain = 0 : i64}
// CHECK-NEXT:    coco.update %w0, %x0 {comm.segment = 1 : i64}
// CHECK-NEXT:    %u1_s = coco.mul %a1_rs, %n {comm.segment = 1 : i64, comm.chain = 1 : i64}
// PLAN-LABEL:  plan @two_tensors on grid [4]
// PLAN:          launch k_fused_all_reduce_table<<<{{.*}}>>>([%a0_rs, %a1_rs], [peers(%g0), peers(%g1)],
// PLAN-NEXT:     launch k_fused_all_reduce_2_table<<<{{.*}}>>>([%s0, %s0], [%s1, %s1], [%a0_rs, %a1_rs],
func.func @two_tensors(%g0: !coco.tensor<16xf32, local>, %g1: !coco.tensor<8xf32, local>, %w0: !coco.tensor<16xf32>, %w1: !coco.tensor<8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %a0_rs = comm.reduce_scatter sum %g0 : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
    %a1_rs = comm.reduce_scatter sum %g1 : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32, sliced<0>>
    %q0_s = coco.mul %a0_rs, %a0_rs : !coco.tensor<16xf32, sliced<0>>
    %s0_part = coco.reduce sum %q0_s : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<f32, local>
    %s0 = comm.all_reduce sum %s0_part : !coco.tensor<f32, local> -> !coco.tensor<f32>
    %q1_s = coco.mul %a1_rs, %a1_rs : !coco.tensor<8xf32, sliced<0>>
    %s1_part = coco.reduce sum %q1_s : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<f32, local>
    %s1 = comm.all_reduce sum %s1_part : !coco.tensor<f32, local> -> !coco.tensor<f32>
    %s = coco.add %s0, %s1 : !coco.tensor<f32>
    %n = coco.sqrt %s : !coco.tensor<f32>
    %u0_s = coco.mul %a0_rs, %n : !coco.tensor<16xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<16xf32, sliced<0>>
    %w0_s = coco.slice %w0 : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
    %x0_s = coco.sub %w0_s, %u0_s : !coco.tensor<16xf32, sliced<0>>
    %x0 = comm.all_gather %x0_s : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
    %u1_s = coco.mul %a1_rs, %n : !coco.tensor<8xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<8xf32, sliced<0>>
    %w1_s = coco.slice %w1 : !coco.tensor<8xf32> -> !coco.tensor<8xf32, sliced<0>>
    %x1_s = coco.sub %w1_s, %u1_s : !coco.tensor<8xf32, sliced<0>>
    %x1 = comm.all_gather %x1_s : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
    coco.update %w0, %x0 : !coco.tensor<16xf32>
    coco.update %w1, %x1 : !coco.tensor<8xf32>
    comm.yield
  }
  func.return
}
