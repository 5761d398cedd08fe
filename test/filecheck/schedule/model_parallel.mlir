// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-equivalence --equivalence-ranks 1,2,4,8 | filecheck %s
// The overlapped schedule as the pipeline of coconet's passes, given on the command line (its
// options name the values; the file's schedules are ignored):
// RUN: coco-opt %s --split-input-file -p 'coco-split-allreduce{ops=total dim=1},coco-reorder{ops=total},coco-fuse{mode=all_reduce ops=total_rs},coco-overlap{ops=layer}' | filecheck %s --check-prefix=PIPELINE

// CoCoNet's model-parallel schedules (reference sec. 4.4) on a small Megatron output
// projection. The split slices dim 1: dim 0 (4) does not divide on 8 ranks, dim 1 (8) does.
// Each chunk applies its own `coco.schedule` (coco-schedule without a name), a named schedule
// under one of its spellings, and --verify-equivalence checks it in the sim at 1, 2, 4 and 8
// ranks.

// AR_C
// CHECK-LABEL: func.func @mlp(
// CHECK-NEXT:    %layer = coco.matmul %x, %w
// CHECK-NEXT:    %total = comm.all_reduce sum %layer
// CHECK-NEXT:    %out = comm.fused elementwise -> !coco.tensor<4x8x16xf32> {
// CHECK-NEXT:      %biased = coco.add %total, %b
// CHECK-NEXT:      %dropped = coco.dropout %biased, 1.000000e-01 seed 7
// CHECK-NEXT:      %[[OUT:.*]] = coco.add %dropped, %r
// CHECK-NEXT:      comm.yield %[[OUT]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %out
module attributes {coco.schedule = "ar-c"} {
func.func @mlp(
    %x: !coco.tensor<4x8x32xf32, sliced<2>>,
    %w: !coco.tensor<32x16xf32, sliced<0>>,
    %b: !coco.tensor<16xf32>,
    %r: !coco.tensor<4x8x16xf32>
) -> !coco.tensor<4x8x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<4x8x32xf32, sliced<2>>, !coco.tensor<32x16xf32, sliced<0>> -> !coco.tensor<4x8x16xf32, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<4x8x16xf32, local> -> !coco.tensor<4x8x16xf32>
  %biased = coco.add %total, %b : !coco.tensor<4x8x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<4x8x16xf32>
  %dropped = coco.dropout %biased, 0.1 seed 7 : !coco.tensor<4x8x16xf32>
  %out = coco.add %dropped, %r : !coco.tensor<4x8x16xf32>
  func.return %out : !coco.tensor<4x8x16xf32>
}
}

// -----

// MM_AR_C, CoCoNet's name of the same.
// CHECK-LABEL: func.func @mlp(
// CHECK-NEXT:    %layer = coco.matmul %x, %w
// CHECK-NEXT:    %total = comm.all_reduce sum %layer
// CHECK-NEXT:    %out = comm.fused elementwise -> !coco.tensor<4x8x16xf32> {
// CHECK-NEXT:      %biased = coco.add %total, %b
// CHECK-NEXT:      %dropped = coco.dropout %biased, 1.000000e-01 seed 7
// CHECK-NEXT:      %[[OUT:.*]] = coco.add %dropped, %r
// CHECK-NEXT:      comm.yield %[[OUT]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %out
module attributes {coco.schedule = "MM_AR_C"} {
func.func @mlp(
    %x: !coco.tensor<4x8x32xf32, sliced<2>>,
    %w: !coco.tensor<32x16xf32, sliced<0>>,
    %b: !coco.tensor<16xf32>,
    %r: !coco.tensor<4x8x16xf32>
) -> !coco.tensor<4x8x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<4x8x32xf32, sliced<2>>, !coco.tensor<32x16xf32, sliced<0>> -> !coco.tensor<4x8x16xf32, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<4x8x16xf32, local> -> !coco.tensor<4x8x16xf32>
  %biased = coco.add %total, %b : !coco.tensor<4x8x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<4x8x16xf32>
  %dropped = coco.dropout %biased, 0.1 seed 7 : !coco.tensor<4x8x16xf32>
  %out = coco.add %dropped, %r : !coco.tensor<4x8x16xf32>
  func.return %out : !coco.tensor<4x8x16xf32>
}
}

// -----

// MM_RS_C_AG
// CHECK-LABEL: func.func @mlp(
// CHECK-NEXT:    %layer = coco.matmul %x, %w
// CHECK-NEXT:    %total_rs = comm.reduce_scatter sum %layer dim 1 : !coco.tensor<4x8x16xf32, local> -> !coco.tensor<4x8x16xf32, sliced<1>>
// CHECK-NEXT:    %out_s = comm.fused elementwise -> !coco.tensor<4x8x16xf32, sliced<1>> {
// CHECK-NEXT:      %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:      %dropped_s = coco.dropout %biased_s, 1.000000e-01 seed 7 : !coco.tensor<4x8x16xf32, sliced<1>>
// CHECK-NEXT:      %r_s = coco.slice %r : !coco.tensor<4x8x16xf32> -> !coco.tensor<4x8x16xf32, sliced<1>>
// CHECK-NEXT:      %[[OUT:.*]] = coco.add %dropped_s, %r_s
// CHECK-NEXT:      comm.yield %[[OUT]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %out = comm.all_gather %out_s : !coco.tensor<4x8x16xf32, sliced<1>> -> !coco.tensor<4x8x16xf32>
// CHECK-NEXT:    func.return %out
module attributes {coco.schedule = "rs-c-ag"} {
func.func @mlp(
    %x: !coco.tensor<4x8x32xf32, sliced<2>>,
    %w: !coco.tensor<32x16xf32, sliced<0>>,
    %b: !coco.tensor<16xf32>,
    %r: !coco.tensor<4x8x16xf32>
) -> !coco.tensor<4x8x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<4x8x32xf32, sliced<2>>, !coco.tensor<32x16xf32, sliced<0>> -> !coco.tensor<4x8x16xf32, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<4x8x16xf32, local> -> !coco.tensor<4x8x16xf32>
  %biased = coco.add %total, %b : !coco.tensor<4x8x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<4x8x16xf32>
  %dropped = coco.dropout %biased, 0.1 seed 7 : !coco.tensor<4x8x16xf32>
  %out = coco.add %dropped, %r : !coco.tensor<4x8x16xf32>
  func.return %out : !coco.tensor<4x8x16xf32>
}
}

// -----

// MM_fuse_RS_C_AG
// CHECK-LABEL: func.func @mlp(
// CHECK-NEXT:    %layer = coco.matmul %x, %w
// CHECK-NEXT:    %out = comm.fused all_reduce -> !coco.tensor<4x8x16xf32> {
// CHECK-NEXT:      %total_rs = comm.reduce_scatter sum %layer
// CHECK-NEXT:      %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:      %dropped_s = coco.dropout %biased_s
// CHECK-NEXT:      %r_s = coco.slice %r
// CHECK-NEXT:      %out_s = coco.add %dropped_s, %r_s
// CHECK-NEXT:      %[[OUT:.*]] = comm.all_gather %out_s
// CHECK-NEXT:      comm.yield %[[OUT]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %out
module attributes {coco.schedule = "fuse(rs-c-ag)"} {
func.func @mlp(
    %x: !coco.tensor<4x8x32xf32, sliced<2>>,
    %w: !coco.tensor<32x16xf32, sliced<0>>,
    %b: !coco.tensor<16xf32>,
    %r: !coco.tensor<4x8x16xf32>
) -> !coco.tensor<4x8x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<4x8x32xf32, sliced<2>>, !coco.tensor<32x16xf32, sliced<0>> -> !coco.tensor<4x8x16xf32, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<4x8x16xf32, local> -> !coco.tensor<4x8x16xf32>
  %biased = coco.add %total, %b : !coco.tensor<4x8x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<4x8x16xf32>
  %dropped = coco.dropout %biased, 0.1 seed 7 : !coco.tensor<4x8x16xf32>
  %out = coco.add %dropped, %r : !coco.tensor<4x8x16xf32>
  func.return %out : !coco.tensor<4x8x16xf32>
}
}

// -----

// ol_MM_fuse_RS_C_AG: the matmul pipelined with the fused collective, 4 chunks.
// CHECK-LABEL: func.func @mlp(
// CHECK-NEXT:    %out = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32> {
// CHECK-NEXT:      %layer = coco.matmul %x, %w
// CHECK-NEXT:      %[[F:.*]] = comm.fused all_reduce -> !coco.tensor<4x8x16xf32> {
// CHECK-NEXT:        %total_rs = comm.reduce_scatter sum %layer
// CHECK-NEXT:        %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:        %dropped_s = coco.dropout %biased_s
// CHECK-NEXT:        %r_s = coco.slice %r
// CHECK-NEXT:        %out_s = coco.add %dropped_s, %r_s
// CHECK-NEXT:        %[[G:.*]] = comm.all_gather %out_s
// CHECK-NEXT:        comm.yield %[[G]]
// CHECK-NEXT:      }
// CHECK-NEXT:      comm.yield %[[F]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %out
// PIPELINE-LABEL: func.func @mlp(
// PIPELINE-NEXT:    %out = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32> {
// PIPELINE-NEXT:      %layer = coco.matmul %x, %w
// PIPELINE-NEXT:      %[[F:.*]] = comm.fused all_reduce -> !coco.tensor<4x8x16xf32> {
// PIPELINE-NEXT:        %total_rs = comm.reduce_scatter sum %layer
// PIPELINE-NEXT:        %biased_s = coco.add %total_rs, %b
// PIPELINE-NEXT:        %dropped_s = coco.dropout %biased_s
// PIPELINE-NEXT:        %r_s = coco.slice %r
// PIPELINE-NEXT:        %out_s = coco.add %dropped_s, %r_s
// PIPELINE-NEXT:        %[[G:.*]] = comm.all_gather %out_s
// PIPELINE-NEXT:        comm.yield %[[G]]
// PIPELINE-NEXT:      }
// PIPELINE-NEXT:      comm.yield %[[F]]
// PIPELINE-NEXT:    }
// PIPELINE-NEXT:    func.return %out
module attributes {coco.schedule = "ol(mm,fuse(rs-c-ag))"} {
func.func @mlp(
    %x: !coco.tensor<4x8x32xf32, sliced<2>>,
    %w: !coco.tensor<32x16xf32, sliced<0>>,
    %b: !coco.tensor<16xf32>,
    %r: !coco.tensor<4x8x16xf32>
) -> !coco.tensor<4x8x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<4x8x32xf32, sliced<2>>, !coco.tensor<32x16xf32, sliced<0>> -> !coco.tensor<4x8x16xf32, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<4x8x16xf32, local> -> !coco.tensor<4x8x16xf32>
  %biased = coco.add %total, %b : !coco.tensor<4x8x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<4x8x16xf32>
  %dropped = coco.dropout %biased, 0.1 seed 7 : !coco.tensor<4x8x16xf32>
  %out = coco.add %dropped, %r : !coco.tensor<4x8x16xf32>
  func.return %out : !coco.tensor<4x8x16xf32>
}
}

// -----

// The same, spelt without parentheses ...
// CHECK-LABEL: func.func @mlp(
// CHECK-NEXT:    %out = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32> {
// CHECK-NEXT:      %layer = coco.matmul %x, %w
// CHECK-NEXT:      %[[F:.*]] = comm.fused all_reduce -> !coco.tensor<4x8x16xf32> {
// CHECK-NEXT:        %total_rs = comm.reduce_scatter sum %layer
// CHECK-NEXT:        %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:        %dropped_s = coco.dropout %biased_s
// CHECK-NEXT:        %r_s = coco.slice %r
// CHECK-NEXT:        %out_s = coco.add %dropped_s, %r_s
// CHECK-NEXT:        %[[G:.*]] = comm.all_gather %out_s
// CHECK-NEXT:        comm.yield %[[G]]
// CHECK-NEXT:      }
// CHECK-NEXT:      comm.yield %[[F]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %out
module attributes {coco.schedule = "ol-mm-fuse-rs-c-ag"} {
func.func @mlp(
    %x: !coco.tensor<4x8x32xf32, sliced<2>>,
    %w: !coco.tensor<32x16xf32, sliced<0>>,
    %b: !coco.tensor<16xf32>,
    %r: !coco.tensor<4x8x16xf32>
) -> !coco.tensor<4x8x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<4x8x32xf32, sliced<2>>, !coco.tensor<32x16xf32, sliced<0>> -> !coco.tensor<4x8x16xf32, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<4x8x16xf32, local> -> !coco.tensor<4x8x16xf32>
  %biased = coco.add %total, %b : !coco.tensor<4x8x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<4x8x16xf32>
  %dropped = coco.dropout %biased, 0.1 seed 7 : !coco.tensor<4x8x16xf32>
  %out = coco.add %dropped, %r : !coco.tensor<4x8x16xf32>
  func.return %out : !coco.tensor<4x8x16xf32>
}
}

// -----

// ... and by CoCoNet's name.
// CHECK-LABEL: func.func @mlp(
// CHECK-NEXT:    %out = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32> {
// CHECK-NEXT:      %layer = coco.matmul %x, %w
// CHECK-NEXT:      %[[F:.*]] = comm.fused all_reduce -> !coco.tensor<4x8x16xf32> {
// CHECK-NEXT:        %total_rs = comm.reduce_scatter sum %layer
// CHECK-NEXT:        %biased_s = coco.add %total_rs, %b
// CHECK-NEXT:        %dropped_s = coco.dropout %biased_s
// CHECK-NEXT:        %r_s = coco.slice %r
// CHECK-NEXT:        %out_s = coco.add %dropped_s, %r_s
// CHECK-NEXT:        %[[G:.*]] = comm.all_gather %out_s
// CHECK-NEXT:        comm.yield %[[G]]
// CHECK-NEXT:      }
// CHECK-NEXT:      comm.yield %[[F]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %out
module attributes {coco.schedule = "ol_MM_fuse_RS_C_AG"} {
func.func @mlp(
    %x: !coco.tensor<4x8x32xf32, sliced<2>>,
    %w: !coco.tensor<32x16xf32, sliced<0>>,
    %b: !coco.tensor<16xf32>,
    %r: !coco.tensor<4x8x16xf32>
) -> !coco.tensor<4x8x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<4x8x32xf32, sliced<2>>, !coco.tensor<32x16xf32, sliced<0>> -> !coco.tensor<4x8x16xf32, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<4x8x16xf32, local> -> !coco.tensor<4x8x16xf32>
  %biased = coco.add %total, %b : !coco.tensor<4x8x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<4x8x16xf32>
  %dropped = coco.dropout %biased, 0.1 seed 7 : !coco.tensor<4x8x16xf32>
  %out = coco.add %dropped, %r : !coco.tensor<4x8x16xf32>
  func.return %out : !coco.tensor<4x8x16xf32>
}
}
