// RUN: coco-opt %s -p coco-sliced-send | filecheck %s
// RUN: coco-opt %s -p 'coco-sliced-send{ops=recv}' | filecheck %s --check-prefix=TARGET
// RUN: not coco-opt %s -p 'coco-sliced-send{ops=plain}' 2>&1 | filecheck %s --check-prefix=GATHER
// RUN: not coco-opt %s -p 'coco-sliced-send{ops=across}' 2>&1 | filecheck %s --check-prefix=AXES
// RUN: not coco-opt %s -p 'coco-sliced-send{ops=og}' 2>&1 | filecheck %s --check-prefix=OP
// RUN: not coco-opt %s -p 'coco-sliced-send{ops=late}' 2>&1 | filecheck %s --check-prefix=UPDATE

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
// TARGET-LABEL: func.func @boundary
// TARGET-NEXT:    %og = comm.all_gather %o over [1]
// TARGET-NEXT:    %recv_s = comm.send %o along 0 shift 1
// TARGET-NEXT:    %recv = comm.all_gather %recv_s over [1]
// TARGET-NEXT:    %recv2 = comm.send %og along 0 shift 1
func.func @boundary(%o: !coco.tensor<2x8x32xf32, [local, sliced<2>]>) -> (!coco.tensor<2x8x32xf32, [local, replicated]>, !coco.tensor<2x8x32xf32, [local, replicated]>, !coco.tensor<2x8x32xf32, [local, replicated]>) attributes {coco.grid = #coco.grid<[2, ?]>} {
  %og = comm.all_gather %o over [1] : !coco.tensor<2x8x32xf32, [local, sliced<2>]> -> !coco.tensor<2x8x32xf32, [local, replicated]>
  %recv = comm.send %og along 0 shift 1 : !coco.tensor<2x8x32xf32, [local, replicated]>
  %recv2 = comm.send %og along 0 shift 1 : !coco.tensor<2x8x32xf32, [local, replicated]>
  %keep = coco.neg %og : !coco.tensor<2x8x32xf32, [local, replicated]>
  func.return %recv, %recv2, %keep : !coco.tensor<2x8x32xf32, [local, replicated]>, !coco.tensor<2x8x32xf32, [local, replicated]>, !coco.tensor<2x8x32xf32, [local, replicated]>
}

// A send of a computed value, and a gather along the send's own axis: left alone.
// CHECK-LABEL: func.func @refused
// CHECK-NEXT:    %n = coco.neg %x
// CHECK-NEXT:    %plain = comm.send %n along 0 shift 1
// CHECK-NEXT:    %g0 = comm.all_gather %s0 over [0]
// CHECK-NEXT:    %across = comm.send %g0 along 0 shift 1
func.func @refused(%x: !coco.tensor<8xf32, [local, replicated]>, %s0: !coco.tensor<8xf32, [sliced<0>, local]>) -> (!coco.tensor<8xf32, [local, replicated]>, !coco.tensor<8xf32, [local, local]>) attributes {coco.grid = #coco.grid<[2, ?]>} {
  %n = coco.neg %x : !coco.tensor<8xf32, [local, replicated]>
  %plain = comm.send %n along 0 shift 1 : !coco.tensor<8xf32, [local, replicated]>
  %g0 = comm.all_gather %s0 over [0] : !coco.tensor<8xf32, [sliced<0>, local]> -> !coco.tensor<8xf32, [replicated, local]>
  %across = comm.send %g0 along 0 shift 1 : !coco.tensor<8xf32, [replicated, local]> -> !coco.tensor<8xf32, [local, local]>
  func.return %plain, %across : !coco.tensor<8xf32, [local, replicated]>, !coco.tensor<8xf32, [local, local]>
}

// GATHER: coco-opt: error: [sliced-send-gather] the input of %plain (comm.send) is not the result of a comm.all_gather: there is no gather to move to the receiving stage
// GATHER-NOT: {{.}}
// AXES:   coco-opt: error: [sliced-send-axes] %g0 (comm.all_gather) spans grid axis 0, the axis %across (comm.send) sends along: the receivers could not gather the slices
// AXES-NOT: {{.}}
// OP:     coco-opt: error: [sliced-send-op] %og (comm.all_gather) is not a comm.send

// The gathered argument is updated before the send: the send keeps its gathered copy.
// CHECK-LABEL: func.func @after_update
// CHECK-NEXT:    %lg = comm.all_gather %la over [1]
// CHECK-NEXT:    coco.update %la, %ln
// CHECK-NEXT:    %late = comm.send %lg along 0 shift 1
// UPDATE: coco-opt: error: [sliced-send-update] %late (comm.send) runs after the update of %la: sending the slice itself would read the overwritten buffer
// UPDATE-NOT: {{.}}
func.func @after_update(%la: !coco.tensor<8xf32, [local, sliced<0>]>, %ln: !coco.tensor<8xf32, [local, sliced<0>]>) -> !coco.tensor<8xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %lg = comm.all_gather %la over [1] : !coco.tensor<8xf32, [local, sliced<0>]> -> !coco.tensor<8xf32, [local, replicated]>
  coco.update %la, %ln : !coco.tensor<8xf32, [local, sliced<0>]>
  %late = comm.send %lg along 0 shift 1 : !coco.tensor<8xf32, [local, replicated]>
  func.return %late : !coco.tensor<8xf32, [local, replicated]>
}
