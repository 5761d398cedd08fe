// RUN: coco-opt %s -p coco-schedule -t 'plan{ranks=3}' | filecheck %s --check-prefix=PLAN
// RUN: coco-opt %s -p coco-schedule -t 'cuda{ranks=3}' | filecheck %s --check-prefix=CUDA

// A fused all_gather assembled in an argument the caller keeps in symmetric memory
// (`{coco.symmetric}`): no staging buffer -- the peers' table of the gathered value is w's
// own -- the updated element is stored once, into w, and an exit step after the pull keeps
// the launch from ending while a peer still reads this rank's piece of w (the caller may
// write w between calls). 4096 over 3 ranks: uneven pieces, counts from a table.

builtin.module attributes {coco.schedule = "fuse(rs-c-ag)"} {
  func.func @sgd(
      %g: !coco.tensor<4096xf32, local>,
      %w: !coco.tensor<4096xf32> {coco.symmetric},
      %lr: !coco.tensor<f32>
  ) attributes {coco.grid = #coco.grid<[?]>} {
    %g1 = comm.all_reduce sum %g : !coco.tensor<4096xf32, local> -> !coco.tensor<4096xf32>
    %0 = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %w1 = coco.sub %w, %0 : !coco.tensor<4096xf32>
    coco.update %w, %w1 : !coco.tensor<4096xf32>
    func.return
  }
}

// PLAN-LABEL: plan @sgd on grid [3]
// PLAN-NEXT:    buffer %g : 4096 f32 arg symmetric
// PLAN-NEXT:    buffer %w : 4096 f32 arg symmetric
// PLAN-NEXT:    buffer %lr : scalar f32 arg
// PLAN-NEXT:    buffer %k_fused_all_reduce_flags : {{[0-9]+}} u32 scratch symmetric
// PLAN-NEXT:    launch k_fused_all_reduce<<<{{.*}}>>>(%lr, %w, peers(%g), peers(%w), [0, 1366, 2731], %w, [1366, 1365, 1365], peers(%k_fused_all_reduce_flags),
// PLAN-NEXT:    output w = %w

// CUDA-LABEL: COCO_KERNEL(k_fused_all_reduce
// CUDA-NOT:     _mine
// CUDA:         coco_peers_entry(
// CUDA:         w_out[{{.*}}] = w1_s;  // comm.all_gather, in place
// CUDA:         coco_peers_done(
// CUDA:         w_out[w1_bases[q_] + i] = ((const float*)w1_peers[q_])[w1_bases[q_] + i];
// CUDA:         coco_peers_exit(flags, me, nranks, epoch, coco_grid_dim(), coco_block_idx());
// CUDA-NEXT:      }
// CUDA-NEXT:    }
// CUDA-NEXT:    COCO_KERNEL_BODY_END
