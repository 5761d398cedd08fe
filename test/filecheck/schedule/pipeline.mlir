// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-equivalence --equivalence-ranks 2,4,8 | filecheck %s
// The command line's schedule (CoCoNet's name), lowered; and the second overlapped schedule
// as the pipeline of coconet's passes, whose options name the values (both ignore the file's
// schedules):
// RUN: coco-opt %s --split-input-file -p 'coco-schedule{name=ol_RS_fuse_P2P_C_AG}' -t 'plan{ranks=4}' | filecheck %s --check-prefix=THREE-PLAN
// RUN: coco-opt %s --split-input-file -p 'coco-split-allreduce{ops=total dim=1},coco-reorder{ops=total},coco-sliced-send{ops=recv},coco-fuse{mode=send ops=recv_s},coco-overlap{ops=layer}' | filecheck %s --check-prefix=PIPELINE

// CoCoNet's pipeline-parallel schedules (reference secs. 4.5, 8) at a stage boundary on a
// [2, ?] grid: 2 stages x a tensor-parallel group. AR_P2P_C sends the replicated output whole;
// the sliced send sends each rank's slice only and all_gathers it on the next stage.
// Each chunk applies its own `coco.schedule` (coco-schedule without a name), a named schedule
// under one of its spellings, and --verify-equivalence checks it in the sim at 2, 4 and 8
// ranks.

// AR_P2P_C
// CHECK-LABEL: func.func @boundary(
// CHECK-NEXT:    %layer = coco.matmul %x, %w
// CHECK-NEXT:    %total = comm.all_reduce sum %layer over [1]
// CHECK-NEXT:    %out = comm.fused elementwise
// CHECK-NEXT:      %biased = coco.add %total, %b
// CHECK-NEXT:      %[[OUT:.*]] = coco.add %biased, %r
// CHECK-NEXT:      comm.yield %[[OUT]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %recv = comm.send %out along 0 shift 1 : !coco.tensor<4x8x16xf32, [local, replicated]>
// CHECK-NEXT:    func.return %recv
module attributes {coco.schedule = "ar-c"} {
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
}

// -----

// RS_C_AG, then the replicated output is sent whole.
// CHECK-LABEL: func.func @boundary(
// CHECK-NEXT:    %layer = coco.matmul %x, %w
// CHECK-NEXT:    %total_rs = comm.reduce_scatter sum %layer dim 1 over [1] : !coco.tensor<4x8x16xf32, [local, local]> -> !coco.tensor<4x8x16xf32, [local, sliced<1>]>
// CHECK-NEXT:    %out_s = comm.fused elementwise
// CHECK-NEXT:      %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:      %r_s = coco.slice %r
// CHECK-NEXT:      %[[OUT:.*]] = coco.add %biased_s, %r_s
// CHECK-NEXT:      comm.yield %[[OUT]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %out = comm.all_gather %out_s over [1]
// CHECK-NEXT:    %recv = comm.send %out along 0 shift 1 : !coco.tensor<4x8x16xf32, [local, replicated]>
// CHECK-NEXT:    func.return %recv
module attributes {coco.schedule = "rs-c-ag"} {
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
}

// -----

// RS_P2P_C_AG: only this rank's slice crosses the stage boundary.
// CHECK-LABEL: func.func @boundary(
// CHECK-NEXT:    %layer = coco.matmul %x, %w
// CHECK-NEXT:    %total_rs = comm.reduce_scatter sum %layer dim 1 over [1]
// CHECK-NEXT:    %out_s = comm.fused elementwise
// CHECK-NEXT:      %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:      %r_s = coco.slice %r
// CHECK-NEXT:      %[[OUT:.*]] = coco.add %biased_s, %r_s
// CHECK-NEXT:      comm.yield %[[OUT]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %recv_s = comm.send %out_s along 0 shift 1 : !coco.tensor<4x8x16xf32, [local, sliced<1>]>
// CHECK-NEXT:    %recv = comm.all_gather %recv_s over [1] : !coco.tensor<4x8x16xf32, [local, sliced<1>]> -> !coco.tensor<4x8x16xf32, [local, replicated]>
// CHECK-NEXT:    func.return %recv
module attributes {coco.schedule = "sliced-send"} {
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
}

// -----

// The same, by CoCoNet's name.
// CHECK-LABEL: func.func @boundary(
// CHECK-NEXT:    %layer = coco.matmul %x, %w
// CHECK-NEXT:    %total_rs = comm.reduce_scatter sum %layer dim 1 over [1]
// CHECK-NEXT:    %out_s = comm.fused elementwise
// CHECK-NEXT:      %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:      %r_s = coco.slice %r
// CHECK-NEXT:      %[[OUT:.*]] = coco.add %biased_s, %r_s
// CHECK-NEXT:      comm.yield %[[OUT]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %recv_s = comm.send %out_s along 0 shift 1 : !coco.tensor<4x8x16xf32, [local, sliced<1>]>
// CHECK-NEXT:    %recv = comm.all_gather %recv_s over [1] : !coco.tensor<4x8x16xf32, [local, sliced<1>]> -> !coco.tensor<4x8x16xf32, [local, replicated]>
// CHECK-NEXT:    func.return %recv
module attributes {coco.schedule = "RS_P2P_C_AG"} {
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
}

// -----

// The sliced computation fused into the send.
// CHECK-LABEL: func.func @boundary(
// CHECK-NEXT:    %layer = coco.matmul %x, %w
// CHECK-NEXT:    %total_rs = comm.reduce_scatter sum %layer dim 1 over [1]
// CHECK-NEXT:    %recv_s = comm.fused send -> !coco.tensor<4x8x16xf32, [local, sliced<1>]> {
// CHECK-NEXT:      %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:      %r_s = coco.slice %r
// CHECK-NEXT:      %out_s = coco.add %biased_s, %r_s
// CHECK-NEXT:      %[[S:.*]] = comm.send %out_s along 0 shift 1
// CHECK-NEXT:      comm.yield %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %recv = comm.all_gather %recv_s over [1]
// CHECK-NEXT:    func.return %recv
module attributes {coco.schedule = "fuse(sliced-send)"} {
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
}

// -----

// ol(mm,rs)+fuse(sliced-send): the matmul pipelined with its reduce_scatter, then the fused
// send.
// CHECK-LABEL: func.func @boundary(
// CHECK-NEXT:    %total_rs = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32, [local, sliced<1>]> {
// CHECK-NEXT:      %layer = coco.matmul %x, %w
// CHECK-NEXT:      %[[RS:.*]] = comm.reduce_scatter sum %layer dim 1 over [1]
// CHECK-NEXT:      comm.yield %[[RS]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %recv_s = comm.fused send
// CHECK-NEXT:      %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:      %r_s = coco.slice %r
// CHECK-NEXT:      %out_s = coco.add %biased_s, %r_s
// CHECK-NEXT:      %[[S:.*]] = comm.send %out_s along 0 shift 1
// CHECK-NEXT:      comm.yield %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %recv = comm.all_gather %recv_s over [1]
// CHECK-NEXT:    func.return %recv
// PIPELINE-LABEL: func.func @boundary(
// PIPELINE-NEXT:    %total_rs = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32, [local, sliced<1>]> {
// PIPELINE-NEXT:      %layer = coco.matmul %x, %w
// PIPELINE-NEXT:      %[[RS:.*]] = comm.reduce_scatter sum %layer dim 1 over [1]
// PIPELINE-NEXT:      comm.yield %[[RS]]
// PIPELINE-NEXT:    }
// PIPELINE-NEXT:    %recv_s = comm.fused send
// PIPELINE-NEXT:      %biased_s = coco.add %total_rs, %b
// PIPELINE-NEXT:      %r_s = coco.slice %r
// PIPELINE-NEXT:      %out_s = coco.add %biased_s, %r_s
// PIPELINE-NEXT:      %[[S:.*]] = comm.send %out_s along 0 shift 1
// PIPELINE-NEXT:      comm.yield %[[S]]
// PIPELINE-NEXT:    }
// PIPELINE-NEXT:    %recv = comm.all_gather %recv_s over [1]
// PIPELINE-NEXT:    func.return %recv
module attributes {coco.schedule = "ol(mm,rs)+fuse(sliced-send)"} {
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
}

// -----

// The same, spelt without parentheses.
// CHECK-LABEL: func.func @boundary(
// CHECK-NEXT:    %total_rs = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32, [local, sliced<1>]> {
// CHECK-NEXT:      %layer = coco.matmul %x, %w
// CHECK-NEXT:      %[[RS:.*]] = comm.reduce_scatter sum %layer dim 1 over [1]
// CHECK-NEXT:      comm.yield %[[RS]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %recv_s = comm.fused send
// CHECK-NEXT:      %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:      %r_s = coco.slice %r
// CHECK-NEXT:      %out_s = coco.add %biased_s, %r_s
// CHECK-NEXT:      %[[S:.*]] = comm.send %out_s along 0 shift 1
// CHECK-NEXT:      comm.yield %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %recv = comm.all_gather %recv_s over [1]
// CHECK-NEXT:    func.return %recv
module attributes {coco.schedule = "ol-mm-rs-fuse-sliced-send"} {
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
}

// -----

// ol_RS_fuse_P2P_C_AG: the matmul, its reduce_scatter, the fused send and the next stage's
// all_gather in one overlap region ...
// CHECK-LABEL: func.func @boundary(
// CHECK-NEXT:    %recv = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32, [local, replicated]> {
// CHECK-NEXT:      %layer = coco.matmul %x, %w
// CHECK-NEXT:      %total_rs = comm.reduce_scatter sum %layer dim 1 over [1]
// CHECK-NEXT:      %recv_s = comm.fused send
// CHECK-NEXT:        %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:        %r_s = coco.slice %r
// CHECK-NEXT:        %out_s = coco.add %biased_s, %r_s
// CHECK-NEXT:        %[[S:.*]] = comm.send %out_s along 0 shift 1
// CHECK-NEXT:        comm.yield %[[S]]
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[G:.*]] = comm.all_gather %recv_s over [1]
// CHECK-NEXT:      comm.yield %[[G]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %recv
module attributes {coco.schedule = "ol(mm,rs,fuse(sliced-send),ag)"} {
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
}

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
