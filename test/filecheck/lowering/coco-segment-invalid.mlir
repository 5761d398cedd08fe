// RUN: coco-opt %s --split-input-file --verify-diagnostics -p coco-segment | filecheck %s

// Segments written by hand must be the pass's own: on ops of two-shot fused regions only
// ([segment-op]), each op in the segment the cuts give it, the updates where the pass
// moves them, each op in its segment's tensor chain ([segment]), and an integer
// ([unknown-attribute]).

// An op outside any fused region runs on its own: it has no segment.
// CHECK: coco-segment-invalid.mlir:[[# @LINE + 2]]:3: [segment-op] %r (comm.all_reduce) has a segment, but only the ops of two-shot fused regions (fused all_reduce regions but one-shot ones, send regions that do not run as one send kernel) run in segments
func.func @outside(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %r = comm.all_reduce sum %g {comm.segment = 0 : i64} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  func.return %r : !coco.tensor<64xf32>
}

// -----

// Nothing cuts this region: one segment holds it all.
// CHECK: coco-segment-invalid.mlir:[[# @LINE + 5]]:5: [segment] %w1s (coco.sub) has segment 1, the cuts give it segment 0
func.func @wrong_index(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce attributes {comm.segments = 1 : i64} {
    %rs = comm.reduce_scatter sum %g {comm.segment = 0 : i64} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w {comm.segment = 0 : i64} : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1s = coco.sub %ws, %rs {comm.segment = 1 : i64} : !coco.tensor<64xf32, sliced<0>>
    %w1 = comm.all_gather %w1s {comm.segment = 0 : i64} : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w1 {comm.segment = 0 : i64} : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}

// -----

// The update of %m belongs right after %m1, which computes it.
// CHECK: coco-segment-invalid.mlir:[[# @LINE + 5]]:5: [segment] %d (coco.mul) stands where the segmented order has coco.update: an update runs right after the op computing its value, where nothing in between reads its target
func.func @unmoved(%g: !coco.tensor<64xf32, local>, %m: !coco.tensor<64xf32, sliced<0>>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %r = comm.fused all_reduce attributes {comm.segments = 1 : i64} -> !coco.tensor<64xf32> {
    %rs = comm.reduce_scatter sum %g {comm.segment = 0 : i64} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %m1 = coco.add %m, %rs {comm.segment = 0 : i64} : !coco.tensor<64xf32, sliced<0>>
    %d = coco.mul %m1, %m1 {comm.segment = 0 : i64} : !coco.tensor<64xf32, sliced<0>>
    %r1 = comm.all_gather %d {comm.segment = 0 : i64} : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %m, %m1 {comm.segment = 0 : i64} : !coco.tensor<64xf32, sliced<0>>
    comm.yield %r1 : !coco.tensor<64xf32>
  }
  func.return %r : !coco.tensor<64xf32>
}

// -----

// A one-shot region is one kernel: it has no segments.
// CHECK: coco-segment-invalid.mlir:[[# @LINE + 2]]:3: [segment-op] comm.fused has a segment count, but only two-shot fused regions have segments
func.func @one_shot(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %r = comm.fused all_reduce one_shot attributes {comm.segments = 1 : i64} -> !coco.tensor<64xf32> {
    %s = comm.all_reduce sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
    %d = coco.mul %s, %s : !coco.tensor<64xf32>
    comm.yield %d : !coco.tensor<64xf32>
  }
  func.return %r : !coco.tensor<64xf32>
}

// -----

// CHECK: [unknown-attribute] comm.all_reduce has 'comm.segment' = "first": it is an integer: the segment of its region
func.func @not_an_integer(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %r = comm.all_reduce sum %g {comm.segment = "first"} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  func.return %r : !coco.tensor<64xf32>
}

// -----

// A segment with one tensor chain marks none; chains written by hand must be the pass's.
// CHECK: coco-segment-invalid.mlir:[[# @LINE + 3]]:5: [segment] %rs (comm.reduce_scatter) has chain 1, its segment's tensor chains give it none (its segment holds one chain)
func.func @one_chain(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %rs = comm.reduce_scatter sum %g {comm.chain = 1 : i64} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1s = coco.sub %ws, %rs : !coco.tensor<64xf32, sliced<0>>
    %w1 = comm.all_gather %w1s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w1 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}

// -----

// A chain outside any fused region: [segment-op], as a segment there.
// CHECK: coco-segment-invalid.mlir:[[# @LINE + 2]]:3: [segment-op] %r (comm.all_reduce) has a chain, but only the ops of two-shot fused regions
func.func @chain_outside(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %r = comm.all_reduce sum %g {comm.chain = 0 : i64} : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  func.return %r : !coco.tensor<64xf32>
}
