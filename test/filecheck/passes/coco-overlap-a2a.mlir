// RUN: coco-opt %s --split-input-file -p coco-overlap | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// The all_to_all forms of coco-overlap (expert parallelism). Greedy mode (the CHECK lines)
// runs on every chunk; the SCRIPT run applies each chunk's own `coco.schedule` and prints
// each refusal at the op it is about.

// An expert layer: dispatch buffers [E, G, C, M] sliced by token group -> all_to_all to
// expert slices -> reshape [E, G*C, M] -> expert matmuls -> reshape back -> all_to_all back.
// Greedy: the dispatch matmul with its all_to_all (`ol(mm,a2a)`), then the expert output's
// matmul with the all_to_all back through the reshape; the chunks cut dim 2 (C), which the
// all_to_alls neither split nor gather. The expert input's all_to_all is taken by then.
// CHECK-LABEL: func.func @experts
// CHECK-NEXT:    %ein = comm.overlap chunks 4 dim 2 -> !coco.tensor<4x4x4x8xf32, sliced<0>> {
// CHECK-NEXT:      %buf = coco.matmul %d, %t
// CHECK-NEXT:      %ein_1 = comm.all_to_all %buf
// CHECK-NEXT:      comm.yield %ein_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %r = coco.reshape %ein
// CHECK-NEXT:    %up = coco.matmul %r, %w1
// CHECK-NEXT:    %back = comm.overlap chunks 4 dim 2 -> !coco.tensor<4x4x4x8xf32, sliced<1>> {
// CHECK-NEXT:      %down = coco.matmul %up, %w2
// CHECK-NEXT:      %out = coco.reshape %down
// CHECK-NEXT:      %back_1 = comm.all_to_all %out
// CHECK-NEXT:      comm.yield %back_1
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %back
// Named by the all_to_all, the expert input's all_to_all with the matmul reading it through
// the reshape (`ol(a2a,mm)`), in 2 chunks.
// SCRIPT-LABEL: func.func @experts
// SCRIPT-NEXT:    %buf = coco.matmul %d, %t
// SCRIPT-NEXT:    %up = comm.overlap chunks 2 dim 2 -> !coco.tensor<4x16x8xf32, sliced<0>> {
// SCRIPT-NEXT:      %ein = comm.all_to_all %buf
// SCRIPT-NEXT:      %r = coco.reshape %ein
// SCRIPT-NEXT:      %up_1 = coco.matmul %r, %w1
// SCRIPT-NEXT:      comm.yield %up_1
// SCRIPT-NEXT:    }
// SCRIPT-NEXT:    %down = coco.matmul %up, %w2
module attributes {coco.schedule = "coco-overlap{ops=ein chunks=2}"} {
func.func @experts(%d: !coco.tensor<4x4x4x8xf32, sliced<1>>, %t: !coco.tensor<4x4x8x8xf32, sliced<1>>, %w1: !coco.tensor<4x8x8xf32, sliced<0>>, %w2: !coco.tensor<4x8x8xf32, sliced<0>>) -> !coco.tensor<4x4x4x8xf32, sliced<1>> attributes {coco.grid = #coco.grid<[?]>} {
  %buf = coco.matmul %d, %t : !coco.tensor<4x4x4x8xf32, sliced<1>>, !coco.tensor<4x4x8x8xf32, sliced<1>> -> !coco.tensor<4x4x4x8xf32, sliced<1>>
  %ein = comm.all_to_all %buf : !coco.tensor<4x4x4x8xf32, sliced<1>> -> !coco.tensor<4x4x4x8xf32, sliced<0>>
  %r = coco.reshape %ein : !coco.tensor<4x4x4x8xf32, sliced<0>> -> !coco.tensor<4x16x8xf32, sliced<0>>
  %up = coco.matmul %r, %w1 : !coco.tensor<4x16x8xf32, sliced<0>>, !coco.tensor<4x8x8xf32, sliced<0>> -> !coco.tensor<4x16x8xf32, sliced<0>>
  %down = coco.matmul %up, %w2 : !coco.tensor<4x16x8xf32, sliced<0>>, !coco.tensor<4x8x8xf32, sliced<0>> -> !coco.tensor<4x16x8xf32, sliced<0>>
  %out = coco.reshape %down : !coco.tensor<4x16x8xf32, sliced<0>> -> !coco.tensor<4x4x4x8xf32, sliced<0>>
  %back = comm.all_to_all %out : !coco.tensor<4x4x4x8xf32, sliced<0>> -> !coco.tensor<4x4x4x8xf32, sliced<1>>
  func.return %back : !coco.tensor<4x4x4x8xf32, sliced<1>>
}
}

// -----

// The dispatch form (local tensors): dim 0's blocks go to the members, so the chunks cut
// dim 1. The round trip reads the region back.
// CHECK-LABEL: func.func @dispatch
// CHECK-NEXT:    %x = comm.overlap chunks 4 dim 1 -> !coco.tensor<4x8x8xf32, local> {
// CHECK-NEXT:      %h = coco.matmul %a, %w
// CHECK-NEXT:      %x_1 = comm.all_to_all %h
// SCRIPT-LABEL: func.func @dispatch
// SCRIPT-NEXT:    %x = comm.overlap chunks 4 dim 1 -> !coco.tensor<4x8x8xf32, local> {
module attributes {coco.schedule = "coco-overlap{ops=x}"} {
func.func @dispatch(%a: !coco.tensor<4x8x8xf32, local>, %w: !coco.tensor<8x8xf32>) -> !coco.tensor<4x8x8xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
  %h = coco.matmul %a, %w : !coco.tensor<4x8x8xf32, local>, !coco.tensor<8x8xf32> -> !coco.tensor<4x8x8xf32, local>
  %x = comm.all_to_all %h : !coco.tensor<4x8x8xf32, local> -> !coco.tensor<4x8x8xf32, local>
  func.return %x : !coco.tensor<4x8x8xf32, local>
}
}

// -----

// Requests the rules refuse (greedy mode leaves these sites). A chunk cuts a row dim the
// all_to_all neither splits nor gathers: here there is none.
// CHECK-LABEL: func.func @no_dim
// CHECK-NEXT:    coco.matmul
module attributes {coco.schedule = "coco-overlap{ops=h1}"} {
func.func @no_dim(%a: !coco.tensor<4x8xf32, sliced<0>>, %w: !coco.tensor<8x8xf32>) -> !coco.tensor<4x8xf32, sliced<1>> attributes {coco.grid = #coco.grid<[?]>} {
  %h1 = coco.matmul %a, %w : !coco.tensor<4x8xf32, sliced<0>>, !coco.tensor<8x8xf32> -> !coco.tensor<4x8xf32, sliced<0>>
  // SCRIPT: coco-overlap-a2a.mlir:[[# @LINE + 1]]:3: [overlap-layout] %x1 (comm.all_to_all) (!coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf32, sliced<1>>) has no dim to chunk: every dim but the last is split or gathered by it or sliced on a grid axis (or is dim 0 of the dispatch form)
  %x1 = comm.all_to_all %h1 : !coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf32, sliced<1>>
  func.return %x1 : !coco.tensor<4x8xf32, sliced<1>>
}
}

// -----

// The chunks divide the dim they cut.
module attributes {coco.schedule = "coco-overlap{ops=h2}"} {
func.func @chunks(%a: !coco.tensor<4x3x8xf32, sliced<0>>, %w: !coco.tensor<8x8xf32>) -> !coco.tensor<4x3x8xf32, sliced<2>> attributes {coco.grid = #coco.grid<[?]>} {
  %h2 = coco.matmul %a, %w : !coco.tensor<4x3x8xf32, sliced<0>>, !coco.tensor<8x8xf32> -> !coco.tensor<4x3x8xf32, sliced<0>>
  // SCRIPT: coco-overlap-a2a.mlir:[[# @LINE + 1]]:3: [overlap-chunks] 4 chunks divide none of the dims %x2 (comm.all_to_all) can be chunked along (dim 1: 3)
  %x2 = comm.all_to_all %h2 : !coco.tensor<4x3x8xf32, sliced<0>> -> !coco.tensor<4x3x8xf32, sliced<2>>
  func.return %x2 : !coco.tensor<4x3x8xf32, sliced<2>>
}
}

// -----

// A reshape between them keeps the last dim, so the matmul's rows are the exchanged rows.
module attributes {coco.schedule = "coco-overlap{ops=x3}"} {
func.func @regroup(%a: !coco.tensor<4x4x2x8xf32, sliced<1>>, %w: !coco.tensor<4x16x8xf32, sliced<0>>) -> !coco.tensor<4x4x8xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %x3 = comm.all_to_all %a : !coco.tensor<4x4x2x8xf32, sliced<1>> -> !coco.tensor<4x4x2x8xf32, sliced<0>>
  // SCRIPT: coco-overlap-a2a.mlir:[[# @LINE + 1]]:3: [overlap-rows] %r3 (coco.reshape) regroups the last dim (!coco.tensor<4x4x2x8xf32, sliced<0>> -> !coco.tensor<4x4x16xf32, sliced<0>>): the matmul's rows must stay the exchanged tensor's rows
  %r3 = coco.reshape %x3 : !coco.tensor<4x4x2x8xf32, sliced<0>> -> !coco.tensor<4x4x16xf32, sliced<0>>
  %m3 = coco.matmul %r3, %w : !coco.tensor<4x4x16xf32, sliced<0>>, !coco.tensor<4x16x8xf32, sliced<0>> -> !coco.tensor<4x4x8xf32, sliced<0>>
  func.return %m3 : !coco.tensor<4x4x8xf32, sliced<0>>
}
}

// -----

// The exchanged value goes only to the matmul's left operand.
module attributes {coco.schedule = "coco-overlap{ops=m4}"} {
func.func @shared(%a: !coco.tensor<4x4x8xf32, sliced<1>>, %w: !coco.tensor<8x8xf32>) -> (!coco.tensor<4x4x8xf32, sliced<0>>, !coco.tensor<4x4x8xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-overlap-a2a.mlir:[[# @LINE + 1]]:3: [overlap-producer] %x4 (comm.all_to_all) is also read by %n4 (coco.neg): overlap exchanges a value only the matmul's left operand reads
  %x4 = comm.all_to_all %a : !coco.tensor<4x4x8xf32, sliced<1>> -> !coco.tensor<4x4x8xf32, sliced<0>>
  %m4 = coco.matmul %x4, %w : !coco.tensor<4x4x8xf32, sliced<0>>, !coco.tensor<8x8xf32> -> !coco.tensor<4x4x8xf32, sliced<0>>
  %n4 = coco.neg %x4 : !coco.tensor<4x4x8xf32, sliced<0>>
  func.return %m4, %n4 : !coco.tensor<4x4x8xf32, sliced<0>>, !coco.tensor<4x4x8xf32, sliced<0>>
}
}
