// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-equivalence --equivalence-ranks 1,2,4,8 | filecheck %s
// The same schedule as the pipeline of coconet's passes that coconet.schedule reports, given
// on the command line (its options name the values; the file's schedules are ignored):
// RUN: coco-opt %s --split-input-file -p 'coco-split-allreduce{ops=g1},coco-reorder{ops=g1},coco-as-slice{ops=m},coco-fuse{mode=all_reduce ops=g1_rs}' | filecheck %s --check-prefix=PIPELINE

// CoCoNet's data-parallel schedules (reference sec. 4.1) on a small momentum-SGD step: the
// momentum %m is optimizer state (its new value also feeds the weight update), %w the weights.
// Each chunk applies its own `coco.schedule` (coco-schedule without a name), a named schedule
// under one of its spellings, and --verify-equivalence checks it in the sim at 1, 2, 4 and 8
// ranks.

// AR_C: the all_reduce as written, then one elementwise kernel that updates m and w.
// CHECK-LABEL: func.func @momentum(
// CHECK-SAME:      %m: !coco.tensor<64xf32>,
// CHECK-NEXT:    %g1 = comm.all_reduce sum %g
// CHECK-NEXT:    comm.fused elementwise {
// CHECK-NEXT:      %mm = coco.mul %mu, %m
// CHECK-NEXT:      %m1 = coco.add %mm, %g1
// CHECK-NEXT:      coco.update %m, %m1
// CHECK-NEXT:      %step = coco.mul %lr, %m1
// CHECK-NEXT:      %w1 = coco.sub %w, %step
// CHECK-NEXT:      coco.update %w, %w1
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
module attributes {coco.schedule = "ar-c"} {
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
}

// -----

// The same, by CoCoNet's name.
// CHECK-LABEL: func.func @momentum(
// CHECK-SAME:      %m: !coco.tensor<64xf32>,
// CHECK-NEXT:    %g1 = comm.all_reduce sum %g
// CHECK-NEXT:    comm.fused elementwise {
// CHECK-NEXT:      %mm = coco.mul %mu, %m
// CHECK-NEXT:      %m1 = coco.add %mm, %g1
// CHECK-NEXT:      coco.update %m, %m1
// CHECK-NEXT:      %step = coco.mul %lr, %m1
// CHECK-NEXT:      %w1 = coco.sub %w, %step
// CHECK-NEXT:      coco.update %w, %w1
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
module attributes {coco.schedule = "AR_C"} {
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
}

// -----

// RS_C_AG: reduce_scatter, the update on this rank's slice (m is stored sliced, ZeRO-style; the
// weights stay replicated), one kernel, all_gather of the new weights.
// CHECK-LABEL: func.func @momentum(
// CHECK-SAME:      %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>,
// CHECK-NEXT:    %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %w1_s = comm.fused elementwise -> !coco.tensor<64xf32, sliced<0>> {
// CHECK-NEXT:      %mm_s = coco.mul %mu, %m
// CHECK-NEXT:      %m1_s = coco.add %mm_s, %g1_rs
// CHECK-NEXT:      coco.update %m, %m1_s
// CHECK-NEXT:      %step_s = coco.mul %lr, %m1_s
// CHECK-NEXT:      %w_s = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:      %[[W1:.*]] = coco.sub %w_s, %step_s
// CHECK-NEXT:      comm.yield %[[W1]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
// CHECK-NEXT:    coco.update %w, %w1
// CHECK-NEXT:    func.return
module attributes {coco.schedule = "rs-c-ag"} {
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
}

// -----

// fuse_RS_C_AG: reduce_scatter + sliced update + all_gather as one FusedAllReduce.
// CHECK-LABEL: func.func @momentum(
// CHECK-SAME:      %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>,
// CHECK-NEXT:    comm.fused all_reduce {
// CHECK-NEXT:      %g1_rs = comm.reduce_scatter sum %g
// CHECK-NEXT:      %mm_s = coco.mul %mu, %m
// CHECK-NEXT:      %m1_s = coco.add %mm_s, %g1_rs
// CHECK-NEXT:      coco.update %m, %m1_s
// CHECK-NEXT:      %step_s = coco.mul %lr, %m1_s
// CHECK-NEXT:      %w_s = coco.slice %w
// CHECK-NEXT:      %w1_s = coco.sub %w_s, %step_s
// CHECK-NEXT:      %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
// CHECK-NEXT:      coco.update %w, %w1
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
// PIPELINE-LABEL: func.func @momentum(
// PIPELINE-SAME:      %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>,
// PIPELINE-NEXT:    comm.fused all_reduce {
// PIPELINE-NEXT:      %g1_rs = comm.reduce_scatter sum %g
// PIPELINE-NEXT:      %mm_s = coco.mul %mu, %m
// PIPELINE-NEXT:      %m1_s = coco.add %mm_s, %g1_rs
// PIPELINE-NEXT:      coco.update %m, %m1_s
// PIPELINE-NEXT:      %step_s = coco.mul %lr, %m1_s
// PIPELINE-NEXT:      %w_s = coco.slice %w
// PIPELINE-NEXT:      %w1_s = coco.sub %w_s, %step_s
// PIPELINE-NEXT:      %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
// PIPELINE-NEXT:      coco.update %w, %w1
// PIPELINE-NEXT:      comm.yield
// PIPELINE-NEXT:    }
// PIPELINE-NEXT:    func.return
module attributes {coco.schedule = "fuse(rs-c-ag)"} {
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
}

// -----

// The same, spelt without parentheses ...
// CHECK-LABEL: func.func @momentum(
// CHECK-SAME:      %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>,
// CHECK-NEXT:    comm.fused all_reduce {
// CHECK-NEXT:      %g1_rs = comm.reduce_scatter sum %g
// CHECK-NEXT:      %mm_s = coco.mul %mu, %m
// CHECK-NEXT:      %m1_s = coco.add %mm_s, %g1_rs
// CHECK-NEXT:      coco.update %m, %m1_s
// CHECK-NEXT:      %step_s = coco.mul %lr, %m1_s
// CHECK-NEXT:      %w_s = coco.slice %w
// CHECK-NEXT:      %w1_s = coco.sub %w_s, %step_s
// CHECK-NEXT:      %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
// CHECK-NEXT:      coco.update %w, %w1
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
module attributes {coco.schedule = "fuse-rs-c-ag"} {
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
}

// -----

// ... and by CoCoNet's name.
// CHECK-LABEL: func.func @momentum(
// CHECK-SAME:      %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>,
// CHECK-NEXT:    comm.fused all_reduce {
// CHECK-NEXT:      %g1_rs = comm.reduce_scatter sum %g
// CHECK-NEXT:      %mm_s = coco.mul %mu, %m
// CHECK-NEXT:      %m1_s = coco.add %mm_s, %g1_rs
// CHECK-NEXT:      coco.update %m, %m1_s
// CHECK-NEXT:      %step_s = coco.mul %lr, %m1_s
// CHECK-NEXT:      %w_s = coco.slice %w
// CHECK-NEXT:      %w1_s = coco.sub %w_s, %step_s
// CHECK-NEXT:      %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
// CHECK-NEXT:      coco.update %w, %w1
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
module attributes {coco.schedule = "fuse_RS_C_AG"} {
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
}
