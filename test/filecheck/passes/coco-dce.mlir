// RUN: coco-opt %s --split-input-file -p coco-dce | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (the CHECK lines) runs on every chunk. The SCRIPT run applies each chunk's own
// `coco.schedule` (coco-schedule without a name) and prints each refusal at the op it is
// about: `FILE:LINE:COL: [rule] message`.

module attributes {coco.schedule = "coco-dce{ops=dead}"} {

// Unread pure ops go (collectives too), updates and what they need stay; inside regions,
// unread results are dropped first, then their producers; a region left with nothing but
// its yield goes too. The script erases %dead alone.
// CHECK-LABEL: func.func @f
// CHECK-NEXT:    %x = coco.mul %a, %a
// CHECK-NEXT:    %f = comm.fused elementwise -> !coco.tensor<64xf32> {
// CHECK-NEXT:      %q = coco.sub %x, %a
// CHECK-NEXT:      comm.yield %q : !coco.tensor<64xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    comm.fused elementwise {
// CHECK-NEXT:      %n = coco.neg %a
// CHECK-NEXT:      coco.update %u, %n
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    coco.update %w, %f
// CHECK-NEXT:    func.return %x
// SCRIPT-LABEL: func.func @f
// SCRIPT-NEXT:    %ag = comm.all_gather
func.func @f(%a: !coco.tensor<64xf32>, %w: !coco.tensor<64xf32>, %u: !coco.tensor<64xf32>, %s: !coco.tensor<64xf32, sliced<0>>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %dead = coco.add %a, %a : !coco.tensor<64xf32>
  %ag = comm.all_gather %s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  %x = coco.mul %a, %a : !coco.tensor<64xf32>
  %f:2 = comm.fused elementwise -> !coco.tensor<64xf32>, !coco.tensor<64xf32> {
    %p = coco.add %x, %a : !coco.tensor<64xf32>
    %q = coco.sub %x, %a : !coco.tensor<64xf32>
    comm.yield %p, %q : !coco.tensor<64xf32>, !coco.tensor<64xf32>
  }
  %e = comm.fused elementwise -> !coco.tensor<64xf32> {
    %z = coco.add %a, %a : !coco.tensor<64xf32>
    comm.yield %z : !coco.tensor<64xf32>
  }
  %k = comm.fused elementwise -> !coco.tensor<64xf32> {
    %n = coco.neg %a : !coco.tensor<64xf32>
    coco.update %u, %n : !coco.tensor<64xf32>
    comm.yield %n : !coco.tensor<64xf32>
  }
  coco.update %w, %f#1 : !coco.tensor<64xf32>
  func.return %x : !coco.tensor<64xf32>
}
}

// -----

// A fused all_to_all whose exchange nothing reads loses it; the region, holding no collective,
// dissolves (comm.DissolveSpentRegion): its ops move out, the unnamed value it yielded takes
// the region's result name.
module attributes {coco.schedule = "coco-dce"} {
// CHECK-LABEL: func.func @spent
// CHECK-NEXT:    %r = coco.neg %x : !coco.tensor<4x8xf32, sliced<0>>
// CHECK-NEXT:    coco.update %x, %r
// CHECK-NEXT:    func.return %r
func.func @spent(%x: !coco.tensor<4x8xf32, sliced<0>>) -> !coco.tensor<4x8xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %r = comm.fused all_to_all -> !coco.tensor<4x8xf32, sliced<0>> {
    %0 = coco.neg %x : !coco.tensor<4x8xf32, sliced<0>>
    %h = comm.all_to_all %0 : !coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf32, sliced<1>>
    coco.update %x, %0 : !coco.tensor<4x8xf32, sliced<0>>
    comm.yield %0 : !coco.tensor<4x8xf32, sliced<0>>
  }
  func.return %r : !coco.tensor<4x8xf32, sliced<0>>
}
}

// -----

// Named, a live op is refused: one still read ...
module attributes {coco.schedule = "coco-dce{ops=x}"} {
func.func @live(%a: !coco.tensor<64xf32>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-dce.mlir:[[# @LINE + 1]]:3: [dce-live] %x (coco.mul) is still read: it is not dead
  %x = coco.mul %a, %a : !coco.tensor<64xf32>
  func.return %x : !coco.tensor<64xf32>
}
}

// -----

// ... and one with side effects (an update inside its region), though its result is unread.
module attributes {coco.schedule = "coco-dce{ops=pg}"} {
func.func @g(%u2: !coco.tensor<4xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-dce.mlir:[[# @LINE + 1]]:3: [dce-live] %pg (comm.fused) has side effects: it is not dead
  %pg = comm.fused elementwise -> !coco.tensor<4xf32> {
    %nn = coco.neg %u2 : !coco.tensor<4xf32>
    coco.update %u2, %nn : !coco.tensor<4xf32>
    comm.yield %nn : !coco.tensor<4xf32>
  }
  func.return
}
}
