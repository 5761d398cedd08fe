// RUN: coco-opt %s --split-input-file -p coco-sliced-send | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (the CHECK lines) runs on every chunk. The SCRIPT run applies each chunk's own
// `coco.schedule` (coco-schedule without a name) and prints each refusal at the op it is
// about: `FILE:LINE:COL: [rule] message`.

module attributes {coco.schedule = "coco-sliced-send{ops=recv}"} {

// Pipeline boundary on a [2, ?] grid: each rank sends only its slice to the next stage,
// which gathers over its own axis 1. The gather's other reader keeps it alive.
// CHECK-LABEL: func.func @boundary
// CHECK-NEXT:    %og = comm.all_gather %o over [1]
// CHECK-NEXT:    %recv_s = comm.send %o along 0 shift 1 : !coco.tensor<2x8x32xf32, [local, sliced<2>]>
// CHECK-NEXT:    %recv = comm.all_gather %recv_s over [1] : !coco.tensor<2x8x32xf32, [local, sliced<2>]> -> !coco.tensor<2x8x32xf32, [local, replicated]>
// CHECK-NEXT:    %recv2_s = comm.send %o along 0 shift 1
// CHECK-NEXT:    %recv2 = comm.all_gather %recv2_s over [1]
// CHECK-NEXT:    %keep = coco.neg %og
// CHECK-NEXT:    func.return %recv, %recv2, %keep
// SCRIPT-LABEL: func.func @boundary
// SCRIPT-NEXT:    %og = comm.all_gather %o over [1]
// SCRIPT-NEXT:    %recv_s = comm.send %o along 0 shift 1
// SCRIPT-NEXT:    %recv = comm.all_gather %recv_s over [1]
// SCRIPT-NEXT:    %recv2 = comm.send %og along 0 shift 1
func.func @boundary(%o: !coco.tensor<2x8x32xf32, [local, sliced<2>]>) -> (!coco.tensor<2x8x32xf32, [local, replicated]>, !coco.tensor<2x8x32xf32, [local, replicated]>, !coco.tensor<2x8x32xf32, [local, replicated]>) attributes {coco.grid = #coco.grid<[2, ?]>} {
  %og = comm.all_gather %o over [1] : !coco.tensor<2x8x32xf32, [local, sliced<2>]> -> !coco.tensor<2x8x32xf32, [local, replicated]>
  %recv = comm.send %og along 0 shift 1 : !coco.tensor<2x8x32xf32, [local, replicated]>
  %recv2 = comm.send %og along 0 shift 1 : !coco.tensor<2x8x32xf32, [local, replicated]>
  %keep = coco.neg %og : !coco.tensor<2x8x32xf32, [local, replicated]>
  func.return %recv, %recv2, %keep : !coco.tensor<2x8x32xf32, [local, replicated]>, !coco.tensor<2x8x32xf32, [local, replicated]>, !coco.tensor<2x8x32xf32, [local, replicated]>
}
}

// -----

// A send of a computed value: left alone; named, refused.
// CHECK-LABEL: func.func @plain
// CHECK-NEXT:    %n = coco.neg %x
// CHECK-NEXT:    %plain = comm.send %n along 0 shift 1
module attributes {coco.schedule = "coco-sliced-send{ops=plain}"} {
func.func @plain(%x: !coco.tensor<8xf32, [local, replicated]>) -> !coco.tensor<8xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %n = coco.neg %x : !coco.tensor<8xf32, [local, replicated]>
  // SCRIPT: coco-sliced-send.mlir:[[# @LINE + 1]]:3: [sliced-send-gather] the input of %plain (comm.send) is not the result of a comm.all_gather: there is no gather to move to the receiving stage
  %plain = comm.send %n along 0 shift 1 : !coco.tensor<8xf32, [local, replicated]>
  func.return %plain : !coco.tensor<8xf32, [local, replicated]>
}
}

// -----

// A gather along the send's own axis: left alone; named, refused.
// CHECK-LABEL: func.func @across
// CHECK-NEXT:    %g0 = comm.all_gather %s0 over [0]
// CHECK-NEXT:    %across = comm.send %g0 along 0 shift 1
module attributes {coco.schedule = "coco-sliced-send{ops=across}"} {
func.func @across(%s0: !coco.tensor<8xf32, [sliced<0>, local]>) -> !coco.tensor<8xf32, [local, local]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  // SCRIPT: coco-sliced-send.mlir:[[# @LINE + 1]]:3: [sliced-send-axes] %g0 (comm.all_gather) spans grid axis 0, the axis %across (comm.send) sends along: the receivers could not gather the slices
  %g0 = comm.all_gather %s0 over [0] : !coco.tensor<8xf32, [sliced<0>, local]> -> !coco.tensor<8xf32, [replicated, local]>
  %across = comm.send %g0 along 0 shift 1 : !coco.tensor<8xf32, [replicated, local]> -> !coco.tensor<8xf32, [local, local]>
  func.return %across : !coco.tensor<8xf32, [local, local]>
}
}

// -----

// The gathered argument is updated before the send: the send keeps its gathered copy;
// named, it is refused.
// CHECK-LABEL: func.func @after_update
// CHECK-NEXT:    %lg = comm.all_gather %la over [1]
// CHECK-NEXT:    coco.update %la, %ln
// CHECK-NEXT:    %late = comm.send %lg along 0 shift 1
module attributes {coco.schedule = "coco-sliced-send{ops=late}"} {
func.func @after_update(%la: !coco.tensor<8xf32, [local, sliced<0>]>, %ln: !coco.tensor<8xf32, [local, sliced<0>]>) -> !coco.tensor<8xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %lg = comm.all_gather %la over [1] : !coco.tensor<8xf32, [local, sliced<0>]> -> !coco.tensor<8xf32, [local, replicated]>
  coco.update %la, %ln : !coco.tensor<8xf32, [local, sliced<0>]>
  // SCRIPT: coco-sliced-send.mlir:[[# @LINE + 1]]:3: [sliced-send-update] %late (comm.send) runs after the update of %la: sending the slice itself would read the overwritten buffer
  %late = comm.send %lg along 0 shift 1 : !coco.tensor<8xf32, [local, replicated]>
  func.return %late : !coco.tensor<8xf32, [local, replicated]>
}
}

// -----

// Named ops are sends.
module attributes {coco.schedule = "coco-sliced-send{ops=og}"} {
func.func @not_a_send(%o: !coco.tensor<2x8x32xf32, [local, sliced<2>]>) -> !coco.tensor<2x8x32xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  // SCRIPT: coco-sliced-send.mlir:[[# @LINE + 1]]:3: [sliced-send-op] %og (comm.all_gather) is not a comm.send
  %og = comm.all_gather %o over [1] : !coco.tensor<2x8x32xf32, [local, sliced<2>]> -> !coco.tensor<2x8x32xf32, [local, replicated]>
  func.return %og : !coco.tensor<2x8x32xf32, [local, replicated]>
}
}
