// Ulysses sequence parallelism (DeepSpeed-Ulysses): causal self-attention over a sequence the
// ranks hold in slices. Built also by ulysses_attention.py (Softmax from the front end's
// helper, whose intermediates are unnamed). q, v [H=10, S=14, D=16] are sliced on the sequence
// (sliced<1>), the transposed keys kt [H, D, S] too (sliced<2>): all_to_all each to head
// slices (sliced<0>) -> scores q @ kt per head -> * 1/sqrt(16) -> + causal mask (0 at or
// before the query, -inf after) -> softmax over the keys -> @ v -> all_to_all back to
// sequence slices -> output projection: sum over the heads of head_h @ wo[h] (wo [H, D, E=32]
// holds the heads' rows of the [H*D, E] matrix) -> out [S, E], sliced on the sequence.
// The sequence and the heads need not divide by the rank count (np.array_split cuts).
// Schedules: as written (library all_to_alls: MPI Alltoallv, NCCL grouped send/recv, gloo;
// a kernel per elementwise op and row reduction between them) and the enumerator's others.

func.func @ulysses_attention(
    %q: !coco.tensor<10x14x16xf32, sliced<1>>,
    %kt: !coco.tensor<10x16x14xf32, sliced<2>>,
    %v: !coco.tensor<10x14x16xf32, sliced<1>>,
    %wo: !coco.tensor<10x16x32xf32>
) -> !coco.tensor<14x32xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %qh = comm.all_to_all %q : !coco.tensor<10x14x16xf32, sliced<1>> -> !coco.tensor<10x14x16xf32, sliced<0>>
  %kh = comm.all_to_all %kt : !coco.tensor<10x16x14xf32, sliced<2>> -> !coco.tensor<10x16x14xf32, sliced<0>>
  %vh = comm.all_to_all %v : !coco.tensor<10x14x16xf32, sliced<1>> -> !coco.tensor<10x14x16xf32, sliced<0>>
  %qk = coco.matmul %qh, %kh : !coco.tensor<10x14x16xf32, sliced<0>>, !coco.tensor<10x16x14xf32, sliced<0>> -> !coco.tensor<10x14x14xf32, sliced<0>>
  %0 = coco.constant 0.25 : !coco.tensor<f32>
  %1 = coco.mul %qk, %0 : !coco.tensor<10x14x14xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<10x14x14xf32, sliced<0>>
  %2 = coco.constant dense<[[0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf], [0.0, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -inf, -inf, -inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -inf, -inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]> : !coco.tensor<14x14xf32>
  %scores = coco.add %1, %2 : !coco.tensor<10x14x14xf32, sliced<0>>, !coco.tensor<14x14xf32> -> !coco.tensor<10x14x14xf32, sliced<0>>
  %3 = coco.reduce_dims max %scores dims [2] keepdims : !coco.tensor<10x14x14xf32, sliced<0>> -> !coco.tensor<10x14x1xf32, sliced<0>>
  %4 = coco.sub %scores, %3 : !coco.tensor<10x14x14xf32, sliced<0>>, !coco.tensor<10x14x1xf32, sliced<0>> -> !coco.tensor<10x14x14xf32, sliced<0>>
  %5 = coco.exp %4 : !coco.tensor<10x14x14xf32, sliced<0>>
  %6 = coco.reduce_dims sum %5 dims [2] keepdims : !coco.tensor<10x14x14xf32, sliced<0>> -> !coco.tensor<10x14x1xf32, sliced<0>>
  %7 = coco.div %5, %6 : !coco.tensor<10x14x14xf32, sliced<0>>, !coco.tensor<10x14x1xf32, sliced<0>> -> !coco.tensor<10x14x14xf32, sliced<0>>
  %heads = coco.matmul %7, %vh : !coco.tensor<10x14x14xf32, sliced<0>>, !coco.tensor<10x14x16xf32, sliced<0>> -> !coco.tensor<10x14x16xf32, sliced<0>>
  %back = comm.all_to_all %heads : !coco.tensor<10x14x16xf32, sliced<0>> -> !coco.tensor<10x14x16xf32, sliced<1>>
  %per_head = coco.matmul %back, %wo : !coco.tensor<10x14x16xf32, sliced<1>>, !coco.tensor<10x16x32xf32> -> !coco.tensor<10x14x32xf32, sliced<1>>
  %out = coco.reduce_dims sum %per_head dims [0] : !coco.tensor<10x14x32xf32, sliced<1>> -> !coco.tensor<14x32xf32, sliced<0>>
  func.return %out : !coco.tensor<14x32xf32, sliced<0>>
}
