// RUN: coco-opt %s -t 'plan{ranks=4 ranks-per-node=2}' | filecheck %s
// RUN: coco-opt %s -t 'plan{ranks=4 ranks-per-node=4}' | filecheck %s --check-prefix=ONE
// RUN: coco-opt %s -t 'cuda{ranks=4 ranks-per-node=2}' | filecheck %s --check-prefix=CUDA

// A fused all_reduce over 4 ranks on 2 nodes of 2: symmetric memory reaches only a node, so
// the node's partial sums of this rank's slices across nodes (in double) come from a node
// kernel, a reduce_scatter between nodes finishes them, the computation runs on the slice,
// and an all_gather between nodes and a node kernel assemble the result in %w.
func.func @fused(%g: !coco.tensor<64xf16, local>, %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>) {
  %r = comm.fused all_reduce -> !coco.tensor<64xf32> {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf16, local> -> !coco.tensor<64xf16, sliced<0>>
    %gf = coco.cast %rs : !coco.tensor<64xf16, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    %m1 = coco.add %m, %gf : !coco.tensor<64xf32, sliced<0>>
    coco.update %m, %m1 : !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1 = coco.sub %ws, %m1 : !coco.tensor<64xf32, sliced<0>>
    %w2 = comm.all_gather %w1 : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w2 : !coco.tensor<64xf32>
    comm.yield %w2 : !coco.tensor<64xf32>
  }
  func.return
}
// CHECK-LABEL: plan @fused on grid [4] on 2 nodes [0, 0, 1, 1]
// CHECK:         buffer %rs_node : 32 f64 scratch
// CHECK:         buffer %w2_node : 32 f32 temp symmetric
// CHECK:         launch k_node_reduce_sum_f16<<<{{.*}}>>>(peers(%g on node), %rs_node, [base0[rank], base1[rank]], 16, 16, 64, 2, peers(%k_node_reduce_sum_f16_flags on node), epoch(k_node_reduce_sum_f16_flags), node_me[rank], 2, 0, 32)
// CHECK-NEXT:    reduce_scatter sum %rs_node -> %rs over [0] across nodes
// CHECK-NEXT:    launch k_fused
// CHECK-NEXT:    all_gather %w1 -> %w2_node over [0] across nodes
// CHECK-NEXT:    launch k_node_gather_f32<<<{{.*}}>>>(peers(%w2_node on node), %w, [0, 32, 16, 48], 16, 16, 64, 2, {{.*}})
// CHECK-NEXT:    output m = %m
// CHECK-NEXT:    output w = %w
// CHECK-NOT:     copy

// ONE-LABEL: plan @fused on grid [4]{{$}}
// ONE:         launch k_fused_all_reduce
// ONE-NOT:     across nodes

// CUDA:      COCO_KERNEL(k_node_reduce_sum_f16,
// CUDA:        coco_peers_entry(flags, me, nranks, epoch, coco_grid_dim(), coco_block_idx());
// CUDA:        double acc = (double)coco_to_f32(((const coco_f16*)x_peers[0])[bases[part] + at]);
// CUDA:        out[i] = acc;  // comm.reduce_scatter within the node
// CUDA:        coco_peers_done(flags, me, nranks, epoch, coco_grid_dim(), coco_block_idx());
// CUDA:      COCO_KERNEL(k_node_gather_f32,
// CUDA:        out[bases[q_ * parts + part] + at] = ((const float*)gathered_peers[q_])[i];  // comm.all_gather
