// Tensor-parallel attention scores and their row-wise softmax, with a causal ALiBi bias as a
// dense constant, for a chunk of 16 new queries attending to 40 keys (24 cached, then the
// chunk's own: chunked prefill). Built also by softmax_rows.py (Softmax from the front end's
// helper, whose intermediates are unnamed; build(F16) gives the f16 variant).
// q [16, 64] and kt [64, 40] are sliced on the head dim, so the matmul gives local partial
// scores -> all_reduce -> * 1/sqrt(64) -> + bias (slope 0.5 * (j - position of query i) for
// key j at or before it, -inf after) -> exp(x - row max) / row sum.
// Schedules: MM_AR_C (as written); MM_RS_C_AG (split along the queries: each rank's softmax
// reduces whole rows of its slice, then all_gathers the probabilities); fused, the
// reduce_scatter, scale, bias, both row reductions and the all_gather are one row kernel.

func.func @softmax_rows(
    %q: !coco.tensor<16x64xf32, sliced<1>>,
    %kt: !coco.tensor<64x40xf32, sliced<0>>
) -> !coco.tensor<16x40xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %partial = coco.matmul %q, %kt : !coco.tensor<16x64xf32, sliced<1>>, !coco.tensor<64x40xf32, sliced<0>> -> !coco.tensor<16x40xf32, local>
  %scores = comm.all_reduce sum %partial : !coco.tensor<16x40xf32, local> -> !coco.tensor<16x40xf32>
  %bias = coco.constant dense<[
      [-12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
      [-12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
      [-13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
      [-13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
      [-14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
      [-14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
      [-15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
      [-15.5, -15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
      [-16.0, -15.5, -15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
      [-16.5, -16.0, -15.5, -15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf, -inf],
      [-17.0, -16.5, -16.0, -15.5, -15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf, -inf],
      [-17.5, -17.0, -16.5, -16.0, -15.5, -15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf, -inf],
      [-18.0, -17.5, -17.0, -16.5, -16.0, -15.5, -15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf, -inf],
      [-18.5, -18.0, -17.5, -17.0, -16.5, -16.0, -15.5, -15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf, -inf],
      [-19.0, -18.5, -18.0, -17.5, -17.0, -16.5, -16.0, -15.5, -15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, -inf],
      [-19.5, -19.0, -18.5, -18.0, -17.5, -17.0, -16.5, -16.0, -15.5, -15.0, -14.5, -14.0, -13.5, -13.0, -12.5, -12.0, -11.5, -11.0, -10.5, -10.0, -9.5, -9.0, -8.5, -8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0]
    ]> : !coco.tensor<16x40xf32>
  %0 = coco.constant 0.125 : !coco.tensor<f32>
  %1 = coco.mul %scores, %0 : !coco.tensor<16x40xf32>, !coco.tensor<f32> -> !coco.tensor<16x40xf32>
  %logits = coco.add %1, %bias : !coco.tensor<16x40xf32>
  %2 = coco.reduce_dims max %logits dims [1] keepdims : !coco.tensor<16x40xf32> -> !coco.tensor<16x1xf32>
  %3 = coco.sub %logits, %2 : !coco.tensor<16x40xf32>, !coco.tensor<16x1xf32> -> !coco.tensor<16x40xf32>
  %4 = coco.exp %3 : !coco.tensor<16x40xf32>
  %5 = coco.reduce_dims sum %4 dims [1] keepdims : !coco.tensor<16x40xf32> -> !coco.tensor<16x1xf32>
  %probs = coco.div %4, %5 : !coco.tensor<16x40xf32>, !coco.tensor<16x1xf32> -> !coco.tensor<16x40xf32>
  func.return %probs : !coco.tensor<16x40xf32>
}

