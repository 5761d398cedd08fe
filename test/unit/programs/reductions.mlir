// Full reductions of every kind: max inside a fused collective kernel (finished there), min
// after it (its own kernels), integer max/min outside; test_lowering.py compiles and runs it.
func.func @red(%g: !coco.tensor<64xf32, local>, %h: !coco.tensor<64xi32>) -> (!coco.tensor<f32>, !coco.tensor<f32>, !coco.tensor<i32>, !coco.tensor<i32>, !coco.tensor<64xf32, sliced<0>>) {
  %x, %mx, %mn = comm.fused all_reduce -> !coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32>, !coco.tensor<f32> {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %sq = coco.mul %rs, %rs : !coco.tensor<64xf32, sliced<0>>
    %p1 = coco.reduce max %sq : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<f32, local>
    %a1 = comm.all_reduce max %p1 : !coco.tensor<f32, local> -> !coco.tensor<f32>
    %p2 = coco.reduce min %rs : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<f32, local>
    %a2 = comm.all_reduce min %p2 : !coco.tensor<f32, local> -> !coco.tensor<f32>
    comm.yield %rs, %a1, %a2 : !coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32>, !coco.tensor<f32>
  }
  %imax = coco.reduce max %h : !coco.tensor<64xi32> -> !coco.tensor<i32>
  %imin = coco.reduce min %h : !coco.tensor<64xi32> -> !coco.tensor<i32>
  func.return %mx, %mn, %imax, %imin, %x : !coco.tensor<f32>, !coco.tensor<f32>, !coco.tensor<i32>, !coco.tensor<i32>, !coco.tensor<64xf32, sliced<0>>
}
