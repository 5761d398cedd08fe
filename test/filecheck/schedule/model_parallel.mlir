// RUN: coco-opt %s -p 'coco-schedule{name=ar-c}' --verify-equivalence --equivalence-ranks 1,2,4,8 | filecheck %s --check-prefix=ARC
// RUN: coco-opt %s -p 'coco-schedule{name=MM_AR_C}' | filecheck %s --check-prefix=ARC
// RUN: coco-opt %s -p 'coco-schedule{name=rs-c-ag}' --verify-equivalence --equivalence-ranks 1,2,4,8 | filecheck %s --check-prefix=RSCAG
// RUN: coco-opt %s -p 'coco-schedule{name="fuse(rs-c-ag)"}' --verify-equivalence --equivalence-ranks 1,2,4,8 | filecheck %s --check-prefix=FUSED
// RUN: coco-opt %s -p 'coco-schedule{name="ol(mm,fuse(rs-c-ag))"}' --verify-equivalence --equivalence-ranks 1,2,4,8 | filecheck %s --check-prefix=OL
// RUN: coco-opt %s -p 'coco-schedule{name=ol-mm-fuse-rs-c-ag}' | filecheck %s --check-prefix=OL
// RUN: coco-opt %s -p 'coco-schedule{name=ol_MM_fuse_RS_C_AG}' | filecheck %s --check-prefix=OL
// RUN: coco-opt %s -p 'coco-split-allreduce{ops=total dim=1},coco-reorder{ops=total},coco-fuse{mode=all_reduce ops=total_rs},coco-overlap{ops=layer}' | filecheck %s --check-prefix=OL

// CoCoNet's model-parallel schedules (reference sec. 4.4) on a small Megatron output
// projection. The split slices dim 1: dim 0 (4) does not divide on 8 ranks, dim 1 (8) does.

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

// MM_AR_C
// ARC-LABEL: func.func @mlp(
// ARC-NEXT:    %layer = coco.matmul %x, %w
// ARC-NEXT:    %total = comm.all_reduce sum %layer
// ARC-NEXT:    %out = comm.fused elementwise -> !coco.tensor<4x8x16xf32> {
// ARC-NEXT:      %biased = coco.add %total, %b
// ARC-NEXT:      %dropped = coco.dropout %biased, 1.000000e-01 seed 7
// ARC-NEXT:      %[[OUT:.*]] = coco.add %dropped, %r
// ARC-NEXT:      comm.yield %[[OUT]]
// ARC-NEXT:    }
// ARC-NEXT:    func.return %out

// MM_RS_C_AG
// RSCAG-LABEL: func.func @mlp(
// RSCAG-NEXT:    %layer = coco.matmul %x, %w
// RSCAG-NEXT:    %total_rs = comm.reduce_scatter sum %layer dim 1 : !coco.tensor<4x8x16xf32, local> -> !coco.tensor<4x8x16xf32, sliced<1>>
// RSCAG-NEXT:    %out_s = comm.fused elementwise -> !coco.tensor<4x8x16xf32, sliced<1>> {
// RSCAG-NEXT:      %biased_s = coco.add %total_rs, %b
// RSCAG-NEXT:      %dropped_s = coco.dropout %biased_s, 1.000000e-01 seed 7 : !coco.tensor<4x8x16xf32, sliced<1>>
// RSCAG-NEXT:      %r_s = coco.slice %r : !coco.tensor<4x8x16xf32> -> !coco.tensor<4x8x16xf32, sliced<1>>
// RSCAG-NEXT:      %[[OUT:.*]] = coco.add %dropped_s, %r_s
// RSCAG-NEXT:      comm.yield %[[OUT]]
// RSCAG-NEXT:    }
// RSCAG-NEXT:    %out = comm.all_gather %out_s : !coco.tensor<4x8x16xf32, sliced<1>> -> !coco.tensor<4x8x16xf32>
// RSCAG-NEXT:    func.return %out

// MM_fuse_RS_C_AG
// FUSED-LABEL: func.func @mlp(
// FUSED-NEXT:    %layer = coco.matmul %x, %w
// FUSED-NEXT:    %out = comm.fused all_reduce -> !coco.tensor<4x8x16xf32> {
// FUSED-NEXT:      %total_rs = comm.reduce_scatter sum %layer
// FUSED-NEXT:      %biased_s = coco.add %total_rs, %b
// FUSED-NEXT:      %dropped_s = coco.dropout %biased_s
// FUSED-NEXT:      %r_s = coco.slice %r
// FUSED-NEXT:      %out_s = coco.add %dropped_s, %r_s
// FUSED-NEXT:      %[[OUT:.*]] = comm.all_gather %out_s
// FUSED-NEXT:      comm.yield %[[OUT]]
// FUSED-NEXT:    }
// FUSED-NEXT:    func.return %out

// ol_MM_fuse_RS_C_AG: the matmul pipelined with the fused collective, 4 chunks.
// OL-LABEL: func.func @mlp(
// OL-NEXT:    %out = comm.overlap chunks 4 -> !coco.tensor<4x8x16xf32> {
// OL-NEXT:      %layer = coco.matmul %x, %w
// OL-NEXT:      %[[F:.*]] = comm.fused all_reduce -> !coco.tensor<4x8x16xf32> {
// OL-NEXT:        %total_rs = comm.reduce_scatter sum %layer
// OL-NEXT:        %biased_s = coco.add %total_rs, %b
// OL-NEXT:        %dropped_s = coco.dropout %biased_s
// OL-NEXT:        %r_s = coco.slice %r
// OL-NEXT:        %out_s = coco.add %dropped_s, %r_s
// OL-NEXT:        %[[G:.*]] = comm.all_gather %out_s
// OL-NEXT:        comm.yield %[[G]]
// OL-NEXT:      }
// OL-NEXT:      comm.yield %[[F]]
// OL-NEXT:    }
// OL-NEXT:    func.return %out
