// RUN: coco-opt %s --split-input-file -p coco-fuse-send | filecheck %s
// RUN: coco-opt %s --split-input-file -p 'coco-fuse{mode=send}' | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (the CHECK lines) runs on every chunk; the SCRIPT run applies each chunk's own
// `coco.schedule` and prints each refusal at the op it is about.

// Computation feeding a send fuses with it (CoCoNet's fused computation + P2P).
// CHECK-LABEL: func.func @send
// CHECK-NEXT:    %y = comm.fused send -> !coco.tensor<8x8xf32, [local, replicated]> {
// CHECK-NEXT:      %t = coco.tanh %a
// CHECK-NEXT:      %t2 = coco.add %t, %a
// CHECK-NEXT:      %y_1 = comm.send %t2 along 0 shift 1
// CHECK-NEXT:      comm.yield %y_1
// Named (the send), the same region.
// SCRIPT-LABEL: func.func @send
// SCRIPT-NEXT:    %y = comm.fused send -> !coco.tensor<8x8xf32, [local, replicated]> {
// SCRIPT-NEXT:      %t = coco.tanh %a
// SCRIPT-NEXT:      %t2 = coco.add %t, %a
// SCRIPT-NEXT:      %y_1 = comm.send %t2 along 0 shift 1
module attributes {coco.schedule = "coco-fuse-send{ops=y}"} {
func.func @send(%a: !coco.tensor<8x8xf32, [local, replicated]>) -> !coco.tensor<8x8xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %t = coco.tanh %a : !coco.tensor<8x8xf32, [local, replicated]>
  %t2 = coco.add %t, %a : !coco.tensor<8x8xf32, [local, replicated]>
  %y = comm.send %t2 along 0 shift 1 : !coco.tensor<8x8xf32, [local, replicated]>
  func.return %y : !coco.tensor<8x8xf32, [local, replicated]>
}
}

// -----

// A fused send holds one send: the exact set names two.
// SCRIPT: {{^}}[fuse-chain] a fused send holds exactly one comm.send; the named ops hold 2
module attributes {coco.schedule = "coco-fuse-send{ops=t,y,z}"} {
func.func @two_sends(%a: !coco.tensor<8x8xf32, [local, replicated]>) -> (!coco.tensor<8x8xf32, [local, replicated]>, !coco.tensor<8x8xf32, [local, replicated]>) attributes {coco.grid = #coco.grid<[2, ?]>} {
  %t = coco.tanh %a : !coco.tensor<8x8xf32, [local, replicated]>
  %y = comm.send %t along 0 shift 1 : !coco.tensor<8x8xf32, [local, replicated]>
  %z = comm.send %t along 0 shift 1 : !coco.tensor<8x8xf32, [local, replicated]>
  func.return %y, %z : !coco.tensor<8x8xf32, [local, replicated]>, !coco.tensor<8x8xf32, [local, replicated]>
}
}

// -----

// A send of an argument has no computation to fuse: named, refused; greedy mode leaves it.
// CHECK-LABEL: func.func @bare
// CHECK-NEXT:    %b = comm.send %a along 0 shift 1
module attributes {coco.schedule = "coco-fuse-send{ops=b}"} {
func.func @bare(%a: !coco.tensor<8x8xf32, [local, replicated]>) -> !coco.tensor<8x8xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  // SCRIPT: coco-fuse-send.mlir:[[# @LINE + 1]]:3: [fuse-chain] the input of %b (comm.send) is not computed by an elementwise op: there is no computation to fuse into the send
  %b = comm.send %a along 0 shift 1 : !coco.tensor<8x8xf32, [local, replicated]>
  func.return %b : !coco.tensor<8x8xf32, [local, replicated]>
}
}
