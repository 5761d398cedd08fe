// RUN: coco-opt %s --split-input-file -t plan | filecheck %s

// Fused elementwise regions the fuzzer (test/fuzz) found crashing the lowering: one that
// computes nothing (max() of an empty sequence) and one that yields or updates values from
// outside it (a KeyError). Their results are the outside values' buffers and updates from
// outside are copies; test/unit/test_fuzz_regressions.py runs them against the sim.

func.func @empty(%w: !coco.tensor<8xf32>) {
  comm.fused elementwise {
    comm.yield
  }
  func.return
}

// CHECK-LABEL: plan @empty on grid [1]
// CHECK-NEXT:    buffer %w : 8 f32 arg
// CHECK-NOT:     launch

// -----

func.func @yields_outer(%a: !coco.tensor<8xf32>) -> !coco.tensor<8xf32> {
  %n = coco.neg %a : !coco.tensor<8xf32>
  %r = comm.fused elementwise -> !coco.tensor<8xf32> {
    comm.yield %n : !coco.tensor<8xf32>
  }
  func.return %r : !coco.tensor<8xf32>
}

// CHECK-LABEL: plan @yields_outer on grid [1]
// CHECK:         launch k_neg<<<1, 256, 0>>>(%a, %n, 0, 8)
// CHECK-NOT:     launch
// CHECK:         output r = %n

// -----

func.func @updates_from_outer(%w: !coco.tensor<8xf32>, %v: !coco.tensor<8xf32>) -> !coco.tensor<8xf32> {
  %n = coco.neg %v : !coco.tensor<8xf32>
  %r = comm.fused elementwise -> !coco.tensor<8xf32> {
    %e = coco.exp %v : !coco.tensor<8xf32>
    coco.update %w, %n : !coco.tensor<8xf32>
    comm.yield %e : !coco.tensor<8xf32>
  }
  func.return %r : !coco.tensor<8xf32>
}

// CHECK-LABEL: plan @updates_from_outer on grid [1]
// CHECK-DAG:     launch k_neg<<<1, 256, 0>>>(%v, %n, 0, 8)
// CHECK-DAG:     copy %n -> %w
// CHECK-DAG:     launch k_fused<<<1, 256, 0>>>(%v, %e, 0, 8)
// CHECK:         output w = %w
// CHECK-NEXT:    output r = %e
