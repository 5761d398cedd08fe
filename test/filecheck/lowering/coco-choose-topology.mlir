// RUN: coco-opt %s -p 'coco-choose-topology{ranks=4 ranks-per-node=2}' | filecheck %s
// RUN: coco-opt %s -p 'coco-choose-topology{ranks=4 ranks-per-node=2}' | coco-opt -p 'coco-choose-topology{ranks=4 ranks-per-node=2}' | filecheck %s
// RUN: coco-opt %s -p 'coco-choose-topology{ranks=4}' | filecheck %s --check-prefix=ONE
// RUN: coco-opt %s -p 'coco-choose-topology{ranks=4 nodes=0,1,0,1}' | filecheck %s --check-prefix=COLUMNS
// RUN: coco-opt %s -p 'coco-choose-topology{ranks=4 ranks-per-node=2}' -t 'plan{ranks=4 ranks-per-node=2}' | filecheck %s --check-prefix=PLAN

// coco-choose-topology writes, on every collective a fused kernel runs, how it reaches its
// group: `flat` where every group lies within one node (one kernel over symmetric memory),
// `hierarchical` where a group spans nodes. On 4 ranks, 2 consecutive ones a node, a [?]
// grid's groups span both nodes; on a [2, 2] grid, those over axis 1 ({0, 1}, {2, 3}) are
// within a node, those over axis 0 ({0, 2}, {1, 3}) are not. Run again, the pass honours
// what it wrote (the second RUN line); the plan builder reads it (PLAN). With one node (ONE)
// everything is flat; with ranks alternating between two nodes (COLUMNS) the groups over
// axis 0 are within a node and those over axis 1 are not.

// A two-shot region: its reduce_scatter and all_gather; not the all_reduce that finishes a
// norm (a library all_reduce, or the kernel's own finish: no topology of its own).
// CHECK-LABEL: func.func @two_shot
// CHECK:         %rs = comm.reduce_scatter sum %g {comm.topology = #comm<topology hierarchical>}
// CHECK:         %sumsq = comm.all_reduce sum %part :
// CHECK:         %w2 = comm.all_gather %w1 {comm.topology = #comm<topology hierarchical>}
// ONE-LABEL:   func.func @two_shot
// ONE:           %rs = comm.reduce_scatter sum %g {comm.topology = #comm<topology flat>}
// ONE:           %w2 = comm.all_gather %w1 {comm.topology = #comm<topology flat>}
// PLAN-LABEL:  plan @two_shot on grid [4] on 2 nodes [0, 0, 1, 1]
// PLAN:          launch k_node_reduce_sum_f32
// PLAN-NEXT:     reduce_scatter sum %rs_node -> %rs over [0] across nodes
func.func @two_shot(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  %n = comm.fused all_reduce -> !coco.tensor<f32> {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %sq = coco.mul %rs, %rs : !coco.tensor<64xf32, sliced<0>>
    %part = coco.reduce sum %sq : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<f32, local>
    %sumsq = comm.all_reduce sum %part : !coco.tensor<f32, local> -> !coco.tensor<f32>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1 = coco.sub %ws, %rs : !coco.tensor<64xf32, sliced<0>>
    %w2 = comm.all_gather %w1 : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w2 : !coco.tensor<64xf32>
    comm.yield %sumsq : !coco.tensor<f32>
  }
  func.return %n : !coco.tensor<f32>
}
// CHECK-LABEL: func.func @stages
// CHECK:         %rs = comm.reduce_scatter sum %g over [1] {comm.topology = #comm<topology flat>}
// CHECK:         %w2 = comm.all_gather %w1 over [1] {comm.topology = #comm<topology flat>}
// COLUMNS-LABEL: func.func @stages
// COLUMNS:       %rs = comm.reduce_scatter sum %g over [1] {comm.topology = #comm<topology hierarchical>}
// COLUMNS:       %w2 = comm.all_gather %w1 over [1] {comm.topology = #comm<topology hierarchical>}
// PLAN-LABEL:  plan @stages on grid [2, 2] on 2 nodes [0, 0, 1, 1]
// PLAN-NOT:      across nodes
// PLAN:          launch k_fused_all_reduce
func.func @stages(%g: !coco.tensor<64xf32, [local, local]>, %w: !coco.tensor<64xf32, [local, replicated]>) attributes {coco.grid = #coco.grid<[2, ?]>} {
  comm.fused all_reduce {
    %rs = comm.reduce_scatter sum %g over [1] : !coco.tensor<64xf32, [local, local]> -> !coco.tensor<64xf32, [local, sliced<0>]>
    %ws = coco.slice %w : !coco.tensor<64xf32, [local, replicated]> -> !coco.tensor<64xf32, [local, sliced<0>]>
    %w1 = coco.sub %ws, %rs : !coco.tensor<64xf32, [local, sliced<0>]>
    %w2 = comm.all_gather %w1 over [1] : !coco.tensor<64xf32, [local, sliced<0>]> -> !coco.tensor<64xf32, [local, replicated]>
    coco.update %w, %w2 : !coco.tensor<64xf32, [local, replicated]>
    comm.yield
  }
  func.return
}
// The one-shot form: its all_reduce (across nodes, the region lowers op by op).
// CHECK-LABEL: func.func @one_shot
// CHECK:         %g1 = comm.all_reduce sum %g {comm.topology = #comm<topology hierarchical>}
// PLAN-LABEL:  plan @one_shot
// PLAN:          all_reduce sum %g -> %g1 over [0]
// PLAN-NEXT:     launch k_mul
func.func @one_shot(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce one_shot {
    %g1 = comm.all_reduce sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
    %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
    %w1 = coco.sub %w, %d : !coco.tensor<64xf32>
    coco.update %w, %w1 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}
// A send region run as one kernel: its send, flat where every sender and its receiver
// share a node.
// CHECK-LABEL: func.func @sends
// CHECK:         %y_1 = comm.send %t along 0 shift 1 {comm.topology = #comm<topology hierarchical>}
// CHECK:         %z_1 = comm.send %u along 1 shift 1 {comm.topology = #comm<topology flat>}
// COLUMNS-LABEL: func.func @sends
// COLUMNS:       %y_1 = comm.send %t along 0 shift 1 {comm.topology = #comm<topology flat>}
// COLUMNS:       %z_1 = comm.send %u along 1 shift 1 {comm.topology = #comm<topology hierarchical>}
// PLAN-LABEL:  plan @sends
// PLAN:          launch k_fused_send
// PLAN:          send %t -> %y along 0 shift 1
func.func @sends(%a: !coco.tensor<8x8xf32, [local, replicated]>) -> (!coco.tensor<8x8xf32, [local, replicated]>, !coco.tensor<8x8xf32, [local, local]>) attributes {coco.grid = #coco.grid<[2, ?]>} {
  %y = comm.fused send -> !coco.tensor<8x8xf32, [local, replicated]> {
    %t = coco.tanh %a : !coco.tensor<8x8xf32, [local, replicated]>
    %y_1 = comm.send %t along 0 shift 1 : !coco.tensor<8x8xf32, [local, replicated]>
    comm.yield %y_1 : !coco.tensor<8x8xf32, [local, replicated]>
  }
  %z = comm.fused send -> !coco.tensor<8x8xf32, [local, local]> {
    %u = coco.tanh %a : !coco.tensor<8x8xf32, [local, replicated]>
    %z_1 = comm.send %u along 1 shift 1 : !coco.tensor<8x8xf32, [local, replicated]> -> !coco.tensor<8x8xf32, [local, local]>
    comm.yield %z_1 : !coco.tensor<8x8xf32, [local, local]>
  }
  func.return %y, %z : !coco.tensor<8x8xf32, [local, replicated]>, !coco.tensor<8x8xf32, [local, local]>
}
// An all_to_all region: its all_to_all.
// CHECK-LABEL: func.func @exchange
// CHECK:         %qh_1 = comm.all_to_all %q {comm.topology = #comm<topology hierarchical>}
// PLAN-LABEL:  plan @exchange
// PLAN:          all_to_all %q -> %qh over [0]
func.func @exchange(%q: !coco.tensor<8x8xf32, sliced<1>>) -> !coco.tensor<8x8xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %qh = comm.fused all_to_all -> !coco.tensor<8x8xf32, sliced<0>> {
    %qh_1 = comm.all_to_all %q : !coco.tensor<8x8xf32, sliced<1>> -> !coco.tensor<8x8xf32, sliced<0>>
    comm.yield %qh_1 : !coco.tensor<8x8xf32, sliced<0>>
  }
  func.return %qh : !coco.tensor<8x8xf32, sliced<0>>
}
