// Row reductions (coco.reduce_dims) of every kind and element type, over the last, the first
// and a middle run of dims, of sliced, replicated and local tensors, with and without
// keepdims; partial sums over a sliced dim combined by an all_reduce; a reshape.
// test_lowering.py runs it on the host kernels (bit-exact with the oracle at any block
// size: the reduction order is fixed) and compiles it with NVRTC.
func.func @rows(%x: !coco.tensor<8x70xf32, sliced<0>>, %b: !coco.tensor<4x6x40xbf16>, %h: !coco.tensor<8x33xf16, local>, %k: !coco.tensor<16x8xi32>, %c: !coco.tensor<8x64xf64, sliced<1>>) -> (!coco.tensor<8x1xf32, sliced<0>>, !coco.tensor<8xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>>, !coco.tensor<4x6xbf16>, !coco.tensor<40xbf16>, !coco.tensor<4x1x40xbf16>, !coco.tensor<8xf16, local>, !coco.tensor<16xi32>, !coco.tensor<1x8xi32>, !coco.tensor<8x1xf64>, !coco.tensor<8x7x10xf32, sliced<0>>) {
  %mean = coco.reduce_dims mean %x dims [1] keepdims : !coco.tensor<8x70xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %xmax = coco.reduce_dims max %x dims [1] : !coco.tensor<8x70xf32, sliced<0>> -> !coco.tensor<8xf32, sliced<0>>
  %xmin = coco.reduce_dims min %x dims [1] keepdims : !coco.tensor<8x70xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %bsum = coco.reduce_dims sum %b dims [2] : !coco.tensor<4x6x40xbf16> -> !coco.tensor<4x6xbf16>
  %bcol = coco.reduce_dims mean %b dims [0, 1] : !coco.tensor<4x6x40xbf16> -> !coco.tensor<40xbf16>
  %bmid = coco.reduce_dims max %b dims [1] keepdims : !coco.tensor<4x6x40xbf16> -> !coco.tensor<4x1x40xbf16>
  %hsum = coco.reduce_dims sum %h dims [1] : !coco.tensor<8x33xf16, local> -> !coco.tensor<8xf16, local>
  %ksum = coco.reduce_dims sum %k dims [1] : !coco.tensor<16x8xi32> -> !coco.tensor<16xi32>
  %kmax = coco.reduce_dims max %k dims [0] keepdims : !coco.tensor<16x8xi32> -> !coco.tensor<1x8xi32>
  %part = coco.reduce_dims sum %c dims [1] keepdims : !coco.tensor<8x64xf64, sliced<1>> -> !coco.tensor<8x1xf64, local>
  %csum = comm.all_reduce sum %part : !coco.tensor<8x1xf64, local> -> !coco.tensor<8x1xf64>
  %xr = coco.reshape %x : !coco.tensor<8x70xf32, sliced<0>> -> !coco.tensor<8x7x10xf32, sliced<0>>
  func.return %mean, %xmax, %xmin, %bsum, %bcol, %bmid, %hsum, %ksum, %kmax, %csum, %xr : !coco.tensor<8x1xf32, sliced<0>>, !coco.tensor<8xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>>, !coco.tensor<4x6xbf16>, !coco.tensor<40xbf16>, !coco.tensor<4x1x40xbf16>, !coco.tensor<8xf16, local>, !coco.tensor<16xi32>, !coco.tensor<1x8xi32>, !coco.tensor<8x1xf64>, !coco.tensor<8x7x10xf32, sliced<0>>
}
