// RUN: coco-opt %s -p 'coco-schedule{name=ar-c}' --verify-equivalence --equivalence-ranks 2,4,8 | filecheck %s --check-prefix=ARC
// RUN: coco-opt %s -p 'coco-schedule{name=rs-c-ag}' --verify-equivalence --equivalence-ranks 2,4,8 | filecheck %s --check-prefix=RSCAG
// RUN: coco-opt %s -p 'coco-schedule{name=sliced-send}' --verify-equivalence --equivalence-ranks 2,4,8 | filecheck %s --check-prefix=SLICED
// RUN: coco-opt %s -p 'coco-schedule{name=RS_P2P_C_AG}' | filecheck %s --check-prefix=SLICED
// RUN: coco-opt %s -p 'coco-schedule{name="fuse(sliced-send)"}' --verify-equivalence --equivalence-ranks 2,4,8 | filecheck %s --check-prefix=FUSED
// RUN: coco-opt %s -p 'coco-schedule{name="ol(mm,rs)+fuse(sliced-send)"}' --verify-equivalence --equivalence-ranks 2,4,8 | filecheck %s --check-prefix=OL
// RUN: coco-opt %s -p 'coco-schedule{name=ol-mm-rs-fuse-sliced-send}' | filecheck %s --check-prefix=OL
// RUN: coco-opt %s -p 'coco-schedule{name="ol(mm,rs,fuse(sliced-send),ag)"}' --verify-equivalence --equivalence-ranks 2,4,8 | filecheck %s --check-prefix=THREE
// RUN: coco-opt %s -p 'coco-schedule{name=ol_RS_fuse_P2P_C_AG}' -t 'plan{ranks=4}' | filecheck %s --check-prefix=THREE-PLAN
// RUN: coco-opt %s -p 'coco-split-allreduce{ops=total dim=1},coco-reorder{ops=total},coco-sliced-send{ops=recv},coco-fuse{mode=send ops=recv_s},coco-overlap{ops=layer}' | filecheck %s --check-prefix=OL

// CoCoNet's pipeline-parallel schedules (reference secs. 4.5, 8) at a stage boundary on a
// [2, ?] grid: 2 stages x a tensor-parallel group. AR_P2P_C sends the replicated output whole;
// the sliced send sends each rank's slice only and all_gathers it on the next stage.

func.func @boundary(
    %x: !coco.tensor<4x8x32xf32, [local, sliced<2>]>,
    %w: !coco.tensor<32x16xf32, [local, sliced<0>]>,
    %b: !coco.tensor<16xf32, [local, replicated]>,
    %r: !coco.tensor<4x8x16xf32, [local, replicated]>
) -> !coco.tensor<4x8x16xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<4x8x32xf32, [local, sliced<2>]>, !coco.tensor<32x16xf32, [local, sliced<0>]> -> !coco.tensor<4x8x16xf32, [local, local]>
  %total = comm.all_reduce sum %layer over [1] : !coco.tensor<4x8x16xf32, [local, local]> -> !coco.tensor<4x8x16xf32, [local, replicated]>
  %biased = coco.add %total, %b : !coco.tensor<4x8x16xf32, [local, replicated]>, !coco.tensor<16xf32, [local, replicated]> -> !coco.tensor<4x8x16xf32, [local, replicated]>
  %out = coco.add %biased, %r : !coco.tensor<4x8x16xf32, [local, replicated]>
  %recv = comm.send %out along 0 shift 1 : !coco.tensor<4x8x16xf32, [local, replicated]>
  func.return %recv : !coco.tensor<4x8x16xf32, [local, replicated]>
}

// AR_P2P_C
// ARC-LABEL: func.func @boundary(
// ARC-NEXT:    %layer = coco.matmul %x, %w
// ARC-NEXT:    %total = comm.all_reduce sum %layer over [1]
// ARC-NEXT:    %out = comm.fused elementwise
// ARC-NEXT:      %biased = coco.add %total, %b
// ARC-NEXT:      %[[OUT:.*]] = coco.add %biased, %r
// ARC-NEXT:      comm.yield %[[OUT]]
// ARC-NEXT:    }
// ARC-NEXT:    %recv = comm.send %out along 0 shift 1 : !coco.tensor<4x8x16xf32, [local, replicated]>
// ARC-NEXT:    func.return %recv

// RS_C_AG, then the replicated output is sent whole.
// RSCAG-LABEL: func.func @boundary(
// RSCAG-NEXT:    %layer = coco.matmul %x, %w
// RSCAG-NEXT:    %total_rs = comm.reduce_scatter sum %layer dim 1 over [1] : !coco.tensor<4x8x16xf32, [local, local]> -> !coco.tensor<4x8x16xf32, [local, sliced<1>]>
// RSCAG-NEXT:    %out_s = comm.fused elementwise
// RSCAG-NEXT:      %biased_s = coco.add %total_rs, %b
// RSCAG-NEXT:      %r_s = coco.slice %r
// RSCAG-NEXT:      %[[OUT:.*]] = coco.add %biased_s, %r_s
// RSCAG-NEXT:      comm.yield %[[OUT]]
// RSCAG-NEXT:    }
// RSCAG-NEXT:    %out = comm.all_gather %out_s over [1]
// RSCAG-NEXT:    %recv = comm.send %out along 0 shift 1 : !coco.tensor<4x8x16xf32, [local, replicated]>
// RSCAG-NEXT:    func.return %recv

// RS_P2P_C_AG: only this rank's slice crosses the stage boundary.
// SLICED-LABEL: func.func @boundary(
// SLICED-NEXT:    %layer = coco.matmul %x, %w
// SLICED-NEXT:    %total_rs = comm.reduce_scatter sum %layer dim 1 over [1]
// SLICED-NEXT:    %out_s = comm.fused elementwise
// SLICED-NEXT:      %biased_s = coco.add %total_rs, %b
// SLICED-NEXT:      %r_s = coco.slice %r
// SLICED-NEXT:      %[[OUT:.*]] = coco.add %biased_s, %r_s
// SLICED-NEXT:      comm.yield %[[OUT]]
// SLICED-NEXT:    }
// SLICED-NEXT:    %recv_s = comm.send %out_s along 0 shift 1 : !coco.tensor<4x8x16xf32, [local, sliced<1>]>
// SLICED-NEXT:    %recv = comm.all_gather %recv_s over [1] : !coco.tensor<4x8x16xf32, [local, sliced<1>]> -> !coco.tensor<4x8x16xf32, [local, replicated]>
// SLICED-NEXT:    func.return %recv

// The sliced computation fused into the send.
// FUSED-LABEL: func.func @boundary(
// FUSED-NEXT:    %layer = coco.matmul %x, %w
// FUSED-NEXT:    %total_rs = comm.reduce_scatter sum %layer dim 1 over [1]
// FUSED-NEXT:    %recv_s = comm.fused send -> !coco.tensor<4x8x16xf32, [local, sliced<1>]> {
// FUSED-NEXT:      %biased_s = coco.add %total_rs, %b
// FUSED-NEXT:      %r_s = coco.slice %r
// FUSED-NEXT:      %out_s = coco.add %biased_s, %r_s
// FUSED-NEXT:      %[[S:.*]] = comm.send %out_s along 0 shift 1
// FUSED-NEXT:      comm.yield %[[S]]
// FUSED-NEXT:    }
// FUSED-NEXT:    %recv = comm.all_gather %recv_s over [1]
// FUSED-NEXT:    func.return %recv

// ol(mm,rs)+fuse(sliced-send): the matmul pipelined with its reduce_scatter, then the fused
// send.
// OL-LABEL: func.func @boundary(
// OL-NEXT:    %total_rs = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32, [local, sliced<1>]> {
// OL-NEXT:      %layer = coco.matmul %x, %w
// OL-NEXT:      %[[RS:.*]] = comm.reduce_scatter sum %layer dim 1 over [1]
// OL-NEXT:      comm.yield %[[RS]]
// OL-NEXT:    }
// OL-NEXT:    %recv_s = comm.fused send
// OL-NEXT:      %biased_s = coco.add %total_rs, %b
// OL-NEXT:      %r_s = coco.slice %r
// OL-NEXT:      %out_s = coco.add %biased_s, %r_s
// OL-NEXT:      %[[S:.*]] = comm.send %out_s along 0 shift 1
// OL-NEXT:      comm.yield %[[S]]
// OL-NEXT:    }
// OL-NEXT:    %recv = comm.all_gather %recv_s over [1]
// OL-NEXT:    func.return %recv

// ol_RS_fuse_P2P_C_AG: the matmul, its reduce_scatter, the fused send and the next stage's
// all_gather in one overlap region ...
// THREE-LABEL: func.func @boundary(
// THREE-NEXT:    %recv = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32, [local, replicated]> {
// THREE-NEXT:      %layer = coco.matmul %x, %w
// THREE-NEXT:      %total_rs = comm.reduce_scatter sum %layer dim 1 over [1]
// THREE-NEXT:      %recv_s = comm.fused send
// THREE-NEXT:        %biased_s = coco.add %total_rs, %b
// THREE-NEXT:        %r_s = coco.slice %r
// THREE-NEXT:        %out_s = coco.add %biased_s, %r_s
// THREE-NEXT:        %[[S:.*]] = comm.send %out_s along 0 shift 1
// THREE-NEXT:        comm.yield %[[S]]
// THREE-NEXT:      }
// THREE-NEXT:      %[[G:.*]] = comm.all_gather %recv_s over [1]
// THREE-NEXT:      comm.yield %[[G]]
// THREE-NEXT:    }
// THREE-NEXT:    func.return %recv

// ... run one chunk apart: with chunk k+1's matmul, chunk k is sent (the fused kernel on its
// range of the slice, on the compute stream, once chunk k's reduce_scatter is done), then on
// the communication stream chunk k+1 is reduce-scattered and chunk k gathered (once sent).
// THREE-PLAN:      matmul %x, %w -> %layer rows [0, 8)
// THREE-PLAN-NEXT: record layer_chunk0
// THREE-PLAN-NEXT: [stream 1] wait layer_chunk0
// THREE-PLAN-NEXT: [stream 1] reduce_scatter sum %layer -> %total_rs over [1] rows [0, 4)
// THREE-PLAN-NEXT: [stream 1] record total_rs_chunk0
// THREE-PLAN-NEXT: matmul %x, %w -> %layer rows [8, 16)
// THREE-PLAN-NEXT: record layer_chunk1
// THREE-PLAN-NEXT: wait total_rs_chunk0
// THREE-PLAN-NEXT: launch k_fused_send<<<{{.*}}>>>({{.*}}, 0, 64, {{.*}})
// THREE-PLAN-NEXT: record recv_s_chunk0
// THREE-PLAN-NEXT: [stream 1] wait layer_chunk1
// THREE-PLAN-NEXT: [stream 1] reduce_scatter sum %layer -> %total_rs over [1] rows [4, 8)
// THREE-PLAN-NEXT: [stream 1] record total_rs_chunk1
// THREE-PLAN-NEXT: [stream 1] wait recv_s_chunk0
// THREE-PLAN-NEXT: [stream 1] all_gather %recv_s -> %recv over [1] rows [0, 4)
// THREE-PLAN-NEXT: [stream 1] record recv_s_gathered0
// THREE-PLAN-NEXT: matmul %x, %w -> %layer rows [16, 24)
// THREE-PLAN:      wait total_rs_chunk3
// THREE-PLAN-NEXT: launch k_fused_send<<<{{.*}}>>>({{.*}}, 192, 256, {{.*}})
// THREE-PLAN-NEXT: record recv_s_chunk3
// THREE-PLAN-NEXT: [stream 1] wait recv_s_chunk3
// THREE-PLAN-NEXT: [stream 1] all_gather %recv_s -> %recv over [1] rows [12, 16)
// THREE-PLAN-NEXT: [stream 1] record recv_s_gathered3
// THREE-PLAN-NEXT: [stream 1] record layer_done
// THREE-PLAN-NEXT: wait layer_done
