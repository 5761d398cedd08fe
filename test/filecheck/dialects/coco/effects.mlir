// RUN: coco-opt %s --split-input-file -p coco-schedule | filecheck %s

// Memory effects: coco.update writes its target (WritesTarget), schedule regions have their
// bodies' effects (RecursiveMemoryEffect), everything else is Pure. So xDSL's own dce and
// canonicalize erase what nobody reads (a collective, a region computing only unread values)
// and keep the updates, the regions holding one and everything they store.
// Each chunk runs one of those passes (its `coco.schedule`, which coco-schedule applies).

// xDSL's dce ...
// CHECK-LABEL: func.func @effects
// CHECK-NEXT:    %x = coco.mul %a, %a : !coco.tensor<64xf32>
// CHECK-NEXT:    comm.fused elementwise {
// CHECK-NEXT:      %n = coco.neg %x : !coco.tensor<64xf32>
// CHECK-NEXT:      coco.update %u, %n : !coco.tensor<64xf32>
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %y = coco.add %x, %a : !coco.tensor<64xf32>
// CHECK-NEXT:    coco.update %w, %y : !coco.tensor<64xf32>
// CHECK-NEXT:    func.return
module attributes {coco.schedule = "dce"} {
func.func @effects(%a: !coco.tensor<64xf32>, %w: !coco.tensor<64xf32>, %u: !coco.tensor<64xf32>,
                   %g: !coco.tensor<64xf32, local>) attributes {coco.grid = #coco.grid<[?]>} {
  %x = coco.mul %a, %a : !coco.tensor<64xf32>
  %dead = coco.exp %x : !coco.tensor<64xf32>
  %r = comm.all_reduce sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  %f = comm.fused elementwise -> !coco.tensor<64xf32> {
    %s = coco.sub %x, %a : !coco.tensor<64xf32>
    comm.yield %s : !coco.tensor<64xf32>
  }
  comm.fused elementwise {
    %n = coco.neg %x : !coco.tensor<64xf32>
    coco.update %u, %n : !coco.tensor<64xf32>
    comm.yield
  }
  %y = coco.add %x, %a : !coco.tensor<64xf32>
  coco.update %w, %y : !coco.tensor<64xf32>
  func.return
}
}

// -----

// ... its canonicalize ...
// CHECK-LABEL: func.func @effects
// CHECK-NEXT:    %x = coco.mul %a, %a : !coco.tensor<64xf32>
// CHECK-NEXT:    comm.fused elementwise {
// CHECK-NEXT:      %n = coco.neg %x : !coco.tensor<64xf32>
// CHECK-NEXT:      coco.update %u, %n : !coco.tensor<64xf32>
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %y = coco.add %x, %a : !coco.tensor<64xf32>
// CHECK-NEXT:    coco.update %w, %y : !coco.tensor<64xf32>
// CHECK-NEXT:    func.return
module attributes {coco.schedule = "canonicalize"} {
func.func @effects(%a: !coco.tensor<64xf32>, %w: !coco.tensor<64xf32>, %u: !coco.tensor<64xf32>,
                   %g: !coco.tensor<64xf32, local>) attributes {coco.grid = #coco.grid<[?]>} {
  %x = coco.mul %a, %a : !coco.tensor<64xf32>
  %dead = coco.exp %x : !coco.tensor<64xf32>
  %r = comm.all_reduce sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  %f = comm.fused elementwise -> !coco.tensor<64xf32> {
    %s = coco.sub %x, %a : !coco.tensor<64xf32>
    comm.yield %s : !coco.tensor<64xf32>
  }
  comm.fused elementwise {
    %n = coco.neg %x : !coco.tensor<64xf32>
    coco.update %u, %n : !coco.tensor<64xf32>
    comm.yield
  }
  %y = coco.add %x, %a : !coco.tensor<64xf32>
  coco.update %w, %y : !coco.tensor<64xf32>
  func.return
}
}

// -----

// ... and coco-dce, which adds the region cleanups xDSL lacks.
// CHECK-LABEL: func.func @effects
// CHECK-NEXT:    %x = coco.mul %a, %a : !coco.tensor<64xf32>
// CHECK-NEXT:    comm.fused elementwise {
// CHECK-NEXT:      %n = coco.neg %x : !coco.tensor<64xf32>
// CHECK-NEXT:      coco.update %u, %n : !coco.tensor<64xf32>
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %y = coco.add %x, %a : !coco.tensor<64xf32>
// CHECK-NEXT:    coco.update %w, %y : !coco.tensor<64xf32>
// CHECK-NEXT:    func.return
module attributes {coco.schedule = "coco-dce"} {
func.func @effects(%a: !coco.tensor<64xf32>, %w: !coco.tensor<64xf32>, %u: !coco.tensor<64xf32>,
                   %g: !coco.tensor<64xf32, local>) attributes {coco.grid = #coco.grid<[?]>} {
  %x = coco.mul %a, %a : !coco.tensor<64xf32>
  %dead = coco.exp %x : !coco.tensor<64xf32>
  %r = comm.all_reduce sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  %f = comm.fused elementwise -> !coco.tensor<64xf32> {
    %s = coco.sub %x, %a : !coco.tensor<64xf32>
    comm.yield %s : !coco.tensor<64xf32>
  }
  comm.fused elementwise {
    %n = coco.neg %x : !coco.tensor<64xf32>
    coco.update %u, %n : !coco.tensor<64xf32>
    comm.yield
  }
  %y = coco.add %x, %a : !coco.tensor<64xf32>
  coco.update %w, %y : !coco.tensor<64xf32>
  func.return
}
}
