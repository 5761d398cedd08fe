// RUN: coco-opt %s --split-input-file -t 'plan{ranks=4 batch=false}' | filecheck %s --check-prefix=BEFORE
// RUN: coco-opt %s --split-input-file -t 'plan{ranks=4}' | filecheck %s --check-prefix=AFTER

// Table batching, the plan builder's last step (lowering/batching.py), printed both ways.
// Before it (batch=false), the plan as the builder made it, a launch per tensor -- two fused
// collective kernels of one text over w0 (64) and w1 (96), two k_mul over x and y. After it
// each pair folds into ONE launch of its kernel's table form: every parameter a per-tensor table, the
// blocks of the tensors one after another ([0, 1, 2]: a block each), each tensor's flags
// its own.
// BEFORE-LABEL: plan @two_tensors on grid [4]
// BEFORE:         launch k_fused_all_reduce<<<1, 256, 0>>>(%lr, %w0, peers(%g0), peers(%a0), [0, 16, 32, 48], %w0, [16, 16, 16, 16], peers(%k_fused_all_reduce_flags),
// BEFORE-NEXT:    launch k_fused_all_reduce<<<1, 256, 0>>>(%lr, %w1, peers(%g1), peers(%a1), [0, 24, 48, 72], %w1, [24, 24, 24, 24], peers(%k_fused_all_reduce_1_flags),
// BEFORE-NEXT:    output w0 = %w0
// AFTER-LABEL:  plan @two_tensors on grid [4]
// AFTER:          launch k_fused_all_reduce_table<<<2, 256, 0>>>([%lr, %lr], [%w0, %w1], [peers(%g0), peers(%g1)], [peers(%a0), peers(%a1)], [{{\[}}0, 16, 32, 48], [0, 24, 48, 72]], [%w0, %w1],
// AFTER-SAME:     [peers(%k_fused_all_reduce_flags), peers(%k_fused_all_reduce_1_flags)], [epoch(k_fused_all_reduce_flags), epoch(k_fused_all_reduce_1_flags)]
// AFTER-SAME:     [0, 1, 2], 2)
// AFTER-NEXT:     output w0 = %w0
func.func @two_tensors(%g0: !coco.tensor<64xf32, local>, %w0: !coco.tensor<64xf32>, %g1: !coco.tensor<96xf32, local>, %w1: !coco.tensor<96xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %rs0 = comm.reduce_scatter sum %g0 : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %u0 = coco.mul %lr, %rs0 : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    %ws0 = coco.slice %w0 : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %n0 = coco.sub %ws0, %u0 : !coco.tensor<64xf32, sliced<0>>
    %a0 = comm.all_gather %n0 : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w0, %a0 : !coco.tensor<64xf32>
    comm.yield
  }
  comm.fused all_reduce {
    %rs1 = comm.reduce_scatter sum %g1 : !coco.tensor<96xf32, local> -> !coco.tensor<96xf32, sliced<0>>
    %u1 = coco.mul %lr, %rs1 : !coco.tensor<f32>, !coco.tensor<96xf32, sliced<0>> -> !coco.tensor<96xf32, sliced<0>>
    %ws1 = coco.slice %w1 : !coco.tensor<96xf32> -> !coco.tensor<96xf32, sliced<0>>
    %n1 = coco.sub %ws1, %u1 : !coco.tensor<96xf32, sliced<0>>
    %a1 = comm.all_gather %n1 : !coco.tensor<96xf32, sliced<0>> -> !coco.tensor<96xf32>
    coco.update %w1, %a1 : !coco.tensor<96xf32>
    comm.yield
  }
  func.return
}

// -----

// Elementwise kernels of one text fold the same way (k_mul over 64 and 96 elements).
// BEFORE-LABEL: plan @scaled on grid [4]
// BEFORE:         launch k_mul<<<1, 256, 0>>>(%lr, %x, %sx, 0, 64)
// BEFORE-NEXT:    launch k_mul<<<1, 256, 0>>>(%lr, %y, %sy, 0, 96)
// AFTER-LABEL:  plan @scaled on grid [4]
// AFTER:          launch k_mul_table<<<2, 256, 0>>>([%lr, %lr], [%x, %y], [%sx, %sy], [0, 0], [64, 96], [0, 1, 2], 2)
// AFTER-NEXT:     output sx = %sx
func.func @scaled(%x: !coco.tensor<64xf32>, %y: !coco.tensor<96xf32>, %lr: !coco.tensor<f32>) -> (!coco.tensor<64xf32>, !coco.tensor<96xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %sx = coco.mul %lr, %x : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %sy = coco.mul %lr, %y : !coco.tensor<f32>, !coco.tensor<96xf32> -> !coco.tensor<96xf32>
  func.return %sx, %sy : !coco.tensor<64xf32>, !coco.tensor<96xf32>
}
