// RUN: coco-opt %s --split-input-file --verify-diagnostics -p 'coco-choose-topology{ranks=4 ranks-per-node=2}' | filecheck %s
// RUN: coco-opt %s --split-input-file --verify-diagnostics -p 'coco-choose-topology{ranks=4}' | filecheck %s --check-prefix=ONE
// RUN: coco-opt %s --split-input-file --verify-diagnostics -p 'coco-choose-topology{ranks=4 ranks-per-node=2 nodes=0,0,1,1}' | filecheck %s --check-prefix=BOTH
// RUN: coco-opt %s --split-input-file --verify-diagnostics -p 'coco-choose-topology{ranks=3}' | filecheck %s --check-prefix=RANKS

// A topology written by hand is honoured where the machine gives it, refused otherwise:
// flat where a group spans nodes (2 nodes of 2 ranks), hierarchical where every group is one
// node's (the ONE run: a single node).
// CHECK: coco-choose-topology-invalid.mlir:[[# @LINE + 4]]:5: [topology-across-nodes] %rs (comm.reduce_scatter) asks for a flat topology, but its group [0, 1, 2, 3] spans nodes (node map [0, 0, 1, 1]): symmetric memory reaches only the ranks of one node
// ONE-LABEL: func.func @flat
func.func @flat(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %rs = comm.reduce_scatter sum %g {comm.topology = #comm<topology flat>} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1 = coco.sub %ws, %rs : !coco.tensor<64xf32, sliced<0>>
    %w2 = comm.all_gather %w1 : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w2 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}

// -----

// CHECK-LABEL: func.func @hierarchical
// ONE: coco-choose-topology-invalid.mlir:[[# @LINE + 3]]:5: [topology-one-node] %rs (comm.reduce_scatter) asks for a hierarchical topology, but every group it works in lies within one node (the plan's 4 rank(s) on one node): there is nothing to run between nodes
func.func @hierarchical(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %rs = comm.reduce_scatter sum %g {comm.topology = #comm<topology hierarchical>} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1 = coco.sub %ws, %rs : !coco.tensor<64xf32, sliced<0>>
    %w2 = comm.all_gather %w1 : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w2 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}

// -----

// On a [2, 2] grid with 2 ranks a node, the groups over axis 1 are within a node: hierarchical
// is refused there even though the plan spans two nodes.
// CHECK: coco-choose-topology-invalid.mlir:[[# @LINE + 3]]:5: [topology-one-node] %rs (comm.reduce_scatter) asks for a hierarchical topology, but every group it works in lies within one node (the plan's 4 rank(s) on nodes [0, 0, 1, 1]): there is nothing to run between nodes
func.func @within(%g: !coco.tensor<64xf32, [local, local]>) -> !coco.tensor<64xf32, [local, sliced<0>]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %r = comm.fused all_reduce -> !coco.tensor<64xf32, [local, sliced<0>]> {
    %rs = comm.reduce_scatter sum %g over [1] {comm.topology = #comm<topology hierarchical>} : !coco.tensor<64xf32, [local, local]> -> !coco.tensor<64xf32, [local, sliced<0>]>
    %h = coco.tanh %rs : !coco.tensor<64xf32, [local, sliced<0>]>
    comm.yield %h : !coco.tensor<64xf32, [local, sliced<0>]>
  }
  func.return %r : !coco.tensor<64xf32, [local, sliced<0>]>
}

// -----

// Only the collectives a fused kernel runs have a topology: not a library all_reduce.
// CHECK: coco-choose-topology-invalid.mlir:[[# @LINE + 3]]:3: [topology-op] %s (comm.all_reduce) has a topology, but only the collectives a fused kernel runs choose one
// ONE: [topology-op] %s (comm.all_reduce) has a topology
func.func @library(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %s = comm.all_reduce sum %g {comm.topology = #comm<topology flat>} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  func.return %s : !coco.tensor<64xf32>
}

// -----

// Nor the all_reduce that finishes a norm in a two-shot region.
// CHECK: coco-choose-topology-invalid.mlir:[[# @LINE + 6]]:5: [topology-op] %sumsq (comm.all_reduce) has a topology
func.func @finisher(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  %n = comm.fused all_reduce -> !coco.tensor<f32> {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %sq = coco.mul %rs, %rs : !coco.tensor<64xf32, sliced<0>>
    %part = coco.reduce sum %sq : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<f32, local>
    %sumsq = comm.all_reduce sum %part {comm.topology = #comm<topology flat>} : !coco.tensor<f32, local> -> !coco.tensor<f32>
    comm.yield %sumsq : !coco.tensor<f32>
  }
  func.return %n : !coco.tensor<f32>
}

// -----

// What a topology holds: flat or hierarchical (checked with the program, before any pass).
// CHECK: [unknown-attribute] comm.all_reduce has 'comm.topology' = 1 : i64: it is #comm<topology flat> or #comm<topology hierarchical>
func.func @value(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %s = comm.all_reduce sum %g {comm.topology = 1} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  func.return %s : !coco.tensor<64xf32>
}

// -----

// The machine: the nodes given once (BOTH), the ranks a count the grid can take (RANKS).
// BOTH: [machine] give the nodes as ranks-per-node or as a node map (nodes=...), not both
// RANKS: coco-choose-topology-invalid.mlir:[[# @LINE + 1]]:1: [machine] @grid: 3 ranks do not fill the grid [2, ?]: the rank count must be a multiple of 2
func.func @grid(%g: !coco.tensor<64xf32, [local, local]>) attributes {coco.grid = #coco.grid<[2, ?]>} {
  func.return
}
