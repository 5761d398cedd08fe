// RUN: coco-opt %s -p coco-dce | filecheck %s
// RUN: coco-opt %s -p 'coco-dce{ops=dead}' | filecheck %s --check-prefix=TARGET
// RUN: not coco-opt %s -p 'coco-dce{ops=x}' 2>&1 | filecheck %s --check-prefix=LIVE
// RUN: not coco-opt %s -p 'coco-dce{ops=pg}' 2>&1 | filecheck %s --check-prefix=EFFECT

// Unread pure ops go (collectives too), updates and what they need stay; inside regions,
// unread results are dropped first, then their producers; a region left with nothing but
// its yield goes too.
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
// TARGET-LABEL: func.func @f
// TARGET-NEXT:    %ag = comm.all_gather
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

// LIVE:   coco-opt: error: [dce-live] %x (coco.mul) is still read: it is not dead
// LIVE-NOT: {{.}}
// EFFECT: coco-opt: error: [dce-live] %pg (comm.fused) has side effects: it is not dead
func.func @g(%u2: !coco.tensor<4xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %pg = comm.fused elementwise -> !coco.tensor<4xf32> {
    %nn = coco.neg %u2 : !coco.tensor<4xf32>
    coco.update %u2, %nn : !coco.tensor<4xf32>
    comm.yield %nn : !coco.tensor<4xf32>
  }
  func.return
}
