// RUN: coco-opt %s -p 'coco-schedule{name=ar-c}' --verify-equivalence | filecheck %s --check-prefix=ARC
// RUN: coco-opt %s -p 'coco-schedule{name=AR_C}' | filecheck %s --check-prefix=ARC
// RUN: coco-opt %s -p 'coco-schedule{name=rs-c-ag}' --verify-equivalence --equivalence-ranks 1,2,4,8 | filecheck %s --check-prefix=RSCAG
// RUN: coco-opt %s -p 'coco-schedule{name="fuse(rs-c-ag)"}' --verify-equivalence --equivalence-ranks 1,2,4,8 | filecheck %s --check-prefix=FUSED
// RUN: coco-opt %s -p 'coco-schedule{name=fuse-rs-c-ag}' | filecheck %s --check-prefix=FUSED
// RUN: coco-opt %s -p 'coco-schedule{name=fuse_RS_C_AG}' | filecheck %s --check-prefix=FUSED
// The same schedule as the pipeline of coconet's passes that coconet.schedule reports:
// RUN: coco-opt %s -p 'coco-split-allreduce{ops=g1},coco-reorder{ops=g1},coco-as-slice{ops=m},coco-fuse{mode=all_reduce ops=g1_rs}' | filecheck %s --check-prefix=FUSED

// CoCoNet's data-parallel schedules (reference sec. 4.1) on a small momentum-SGD step: the
// momentum %m is optimizer state (its new value also feeds the weight update), %w the weights.

func.func @momentum(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>,
                    %m: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>,
                    %mu: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  %mm = coco.mul %mu, %m : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %m1 = coco.add %mm, %g1 : !coco.tensor<64xf32>
  coco.update %m, %m1 : !coco.tensor<64xf32>
  %step = coco.mul %lr, %m1 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %w1 = coco.sub %w, %step : !coco.tensor<64xf32>
  coco.update %w, %w1 : !coco.tensor<64xf32>
  func.return
}

// AR_C: the all_reduce as written, then one elementwise kernel that updates m and w.
// ARC-LABEL: func.func @momentum(
// ARC-SAME:      %m: !coco.tensor<64xf32>,
// ARC-NEXT:    %g1 = comm.all_reduce sum %g
// ARC-NEXT:    comm.fused elementwise {
// ARC-NEXT:      %mm = coco.mul %mu, %m
// ARC-NEXT:      %m1 = coco.add %mm, %g1
// ARC-NEXT:      coco.update %m, %m1
// ARC-NEXT:      %step = coco.mul %lr, %m1
// ARC-NEXT:      %w1 = coco.sub %w, %step
// ARC-NEXT:      coco.update %w, %w1
// ARC-NEXT:      comm.yield
// ARC-NEXT:    }
// ARC-NEXT:    func.return

// RS_C_AG: reduce_scatter, the update on this rank's slice (m is stored sliced, ZeRO-style; the
// weights stay replicated), one kernel, all_gather of the new weights.
// RSCAG-LABEL: func.func @momentum(
// RSCAG-SAME:      %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>,
// RSCAG-NEXT:    %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
// RSCAG-NEXT:    %w1_s = comm.fused elementwise -> !coco.tensor<64xf32, sliced<0>> {
// RSCAG-NEXT:      %mm_s = coco.mul %mu, %m
// RSCAG-NEXT:      %m1_s = coco.add %mm_s, %g1_rs
// RSCAG-NEXT:      coco.update %m, %m1_s
// RSCAG-NEXT:      %step_s = coco.mul %lr, %m1_s
// RSCAG-NEXT:      %w_s = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
// RSCAG-NEXT:      %[[W1:.*]] = coco.sub %w_s, %step_s
// RSCAG-NEXT:      comm.yield %[[W1]]
// RSCAG-NEXT:    }
// RSCAG-NEXT:    %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
// RSCAG-NEXT:    coco.update %w, %w1
// RSCAG-NEXT:    func.return

// fuse_RS_C_AG: reduce_scatter + sliced update + all_gather as one FusedAllReduce.
// FUSED-LABEL: func.func @momentum(
// FUSED-SAME:      %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>,
// FUSED-NEXT:    comm.fused all_reduce {
// FUSED-NEXT:      %g1_rs = comm.reduce_scatter sum %g
// FUSED-NEXT:      %mm_s = coco.mul %mu, %m
// FUSED-NEXT:      %m1_s = coco.add %mm_s, %g1_rs
// FUSED-NEXT:      coco.update %m, %m1_s
// FUSED-NEXT:      %step_s = coco.mul %lr, %m1_s
// FUSED-NEXT:      %w_s = coco.slice %w
// FUSED-NEXT:      %w1_s = coco.sub %w_s, %step_s
// FUSED-NEXT:      %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
// FUSED-NEXT:      coco.update %w, %w1
// FUSED-NEXT:      comm.yield
// FUSED-NEXT:    }
// FUSED-NEXT:    func.return
