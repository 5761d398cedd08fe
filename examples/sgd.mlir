// SGD, data parallel (CoCoNet's README example; reference sec. 4.3). Built also by sgd.py.
// Each rank holds its own gradient %g (local); the all-reduced gradient updates the replicated
// weights in place.
// Schedules: AR_C (as written); RS_C_AG (split the all_reduce into reduce_scatter + all_gather
// and reorder the update onto the slices); fuse_RS_C_AG (one FusedAllReduce).

func.func @sgd(
    %g: !coco.tensor<4096xf32, local>,
    %w: !coco.tensor<4096xf32>,
    %lr: !coco.tensor<f32>
) attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<4096xf32, local> -> !coco.tensor<4096xf32>
  %0 = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
  %w1 = coco.sub %w, %0 : !coco.tensor<4096xf32>
  coco.update %w, %w1 : !coco.tensor<4096xf32>
  func.return
}
