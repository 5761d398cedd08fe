// An SGD step on a static grid of 3 ranks over 2 elements: a split would leave a rank no
// element (uneven cuts are fine, empty ones are not), so only ar-c and the one-shot fuse(ar-c),
// which slices nothing, apply
// (test/filecheck/schedule/errors.mlir refuses the others with it).

func.func @sgd3(%g: !coco.tensor<2xf32, local>, %w: !coco.tensor<2xf32>, %lr: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[3]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<2xf32> -> !coco.tensor<2xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<2xf32>
  coco.update %w, %w1 : !coco.tensor<2xf32>
  func.return
}
