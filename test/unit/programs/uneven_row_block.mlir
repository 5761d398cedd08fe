// Row-wise ops over dims no rank count (2, 3, 4, 7) divides: softmax, RMSNorm and LayerNorm of
// an all_reduced [23, 45] block (rs-c-ag cuts its rows unevenly), and a vocab-parallel
// log-sum-exp over 45 columns sliced (each rank reduces its uneven piece, all_reduce combines).
// test_uneven_rows.py runs it in every float type (the f32 here replaced) on the sim against
// NumPy and under every schedule on the cpu kernels; test_mpi_uneven.py on MPI ranks.
func.func @block(%p: !coco.tensor<23x45xf32, local>, %logits: !coco.tensor<23x45xf32, sliced<1>>) -> (!coco.tensor<23x45xf32>, !coco.tensor<23x45xf32>, !coco.tensor<23x45xf32>, !coco.tensor<23x1xf32>) {
  %h = comm.all_reduce sum %p : !coco.tensor<23x45xf32, local> -> !coco.tensor<23x45xf32>
  %mx = coco.reduce_dims max %h dims [1] keepdims : !coco.tensor<23x45xf32> -> !coco.tensor<23x1xf32>
  %e0 = coco.sub %h, %mx : !coco.tensor<23x45xf32>, !coco.tensor<23x1xf32> -> !coco.tensor<23x45xf32>
  %e = coco.exp %e0 : !coco.tensor<23x45xf32>
  %s = coco.reduce_dims sum %e dims [1] keepdims : !coco.tensor<23x45xf32> -> !coco.tensor<23x1xf32>
  %softmax = coco.div %e, %s : !coco.tensor<23x45xf32>, !coco.tensor<23x1xf32> -> !coco.tensor<23x45xf32>
  %sq = coco.mul %h, %h : !coco.tensor<23x45xf32>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<23x45xf32> -> !coco.tensor<23x1xf32>
  %eps = coco.constant 1.0e-05 : !coco.tensor<f32>
  %ms1 = coco.add %ms, %eps : !coco.tensor<23x1xf32>, !coco.tensor<f32> -> !coco.tensor<23x1xf32>
  %rs = coco.rsqrt %ms1 : !coco.tensor<23x1xf32>
  %rms = coco.mul %h, %rs : !coco.tensor<23x45xf32>, !coco.tensor<23x1xf32> -> !coco.tensor<23x45xf32>
  %mu = coco.reduce_dims mean %h dims [1] keepdims : !coco.tensor<23x45xf32> -> !coco.tensor<23x1xf32>
  %c = coco.sub %h, %mu : !coco.tensor<23x45xf32>, !coco.tensor<23x1xf32> -> !coco.tensor<23x45xf32>
  %c2 = coco.mul %c, %c : !coco.tensor<23x45xf32>
  %var = coco.reduce_dims mean %c2 dims [1] keepdims : !coco.tensor<23x45xf32> -> !coco.tensor<23x1xf32>
  %var1 = coco.add %var, %eps : !coco.tensor<23x1xf32>, !coco.tensor<f32> -> !coco.tensor<23x1xf32>
  %ri = coco.rsqrt %var1 : !coco.tensor<23x1xf32>
  %ln = coco.mul %c, %ri : !coco.tensor<23x45xf32>, !coco.tensor<23x1xf32> -> !coco.tensor<23x45xf32>
  %lmx = coco.reduce_dims max %logits dims [1] keepdims : !coco.tensor<23x45xf32, sliced<1>> -> !coco.tensor<23x1xf32, local>
  %gmx = comm.all_reduce max %lmx : !coco.tensor<23x1xf32, local> -> !coco.tensor<23x1xf32>
  %l0 = coco.sub %logits, %gmx : !coco.tensor<23x45xf32, sliced<1>>, !coco.tensor<23x1xf32> -> !coco.tensor<23x45xf32, sliced<1>>
  %l1 = coco.exp %l0 : !coco.tensor<23x45xf32, sliced<1>>
  %ls = coco.reduce_dims sum %l1 dims [1] keepdims : !coco.tensor<23x45xf32, sliced<1>> -> !coco.tensor<23x1xf32, local>
  %gs = comm.all_reduce sum %ls : !coco.tensor<23x1xf32, local> -> !coco.tensor<23x1xf32>
  %lg = coco.log %gs : !coco.tensor<23x1xf32>
  %lse = coco.add %lg, %gmx : !coco.tensor<23x1xf32>
  func.return %softmax, %rms, %ln, %lse : !coco.tensor<23x45xf32>, !coco.tensor<23x45xf32>, !coco.tensor<23x45xf32>, !coco.tensor<23x1xf32>
}
