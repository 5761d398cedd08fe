// A GShard-style mixture-of-experts layer with expert parallelism: static capacity C=3, top-2
// routing, E=8 experts over the ranks. Built also by moe_layer.py (Softmax from the front
// end's helper; the routing loop's values are named by its variables). x [G=10, S=8, M=8]:
// token groups, sliced over the ranks; w1 [E, M, F=16], w2 [E, F, M]: each rank's experts.
// Gating matmul -> softmax over the experts -> first choice (the first expert of the row max),
// second (the best of the others), gates renormalized over the two -> each token's slot in its
// expert's buffer (the count of its group's earlier tokens choosing it, via a lower-triangular
// constant; second choices after the first choices kept; past C: dropped) -> dispatch mask
// [E, G, C, S] -> dispatch buffers [E, G, C, M] (mask * x summed over the tokens), sliced by
// group -> all_to_all to expert slices -> relu(x w1) w2 per expert -> all_to_all back to group
// slices -> sum of the experts' outputs times the gates -> + x.
// Schedules: as written (library all_to_alls: MPI Alltoallv, NCCL grouped send/recv, gloo)
// and the enumerator's others.

func.func @moe_layer(
    %x: !coco.tensor<10x8x8xf32, sliced<0>>,
    %wg: !coco.tensor<8x8xf32>,
    %w1: !coco.tensor<8x8x16xf32, sliced<0>>,
    %w2: !coco.tensor<8x16x8xf32, sliced<0>>
) -> !coco.tensor<10x8x8xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %logits = coco.matmul %x, %wg : !coco.tensor<10x8x8xf32, sliced<0>>, !coco.tensor<8x8xf32> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %0 = coco.reduce_dims max %logits dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %1 = coco.sub %logits, %0 : !coco.tensor<10x8x8xf32, sliced<0>>, !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %2 = coco.exp %1 : !coco.tensor<10x8x8xf32, sliced<0>>
  %3 = coco.reduce_dims sum %2 dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %probs = coco.div %2, %3 : !coco.tensor<10x8x8xf32, sliced<0>>, !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %expert = coco.constant dense<[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]> : !coco.tensor<8xf32>
  %earlier = coco.constant dense<[[[1.0], [0.0], [0.0], [0.0], [0.0], [0.0], [0.0], [0.0]], [[1.0], [1.0], [0.0], [0.0], [0.0], [0.0], [0.0], [0.0]], [[1.0], [1.0], [1.0], [0.0], [0.0], [0.0], [0.0], [0.0]], [[1.0], [1.0], [1.0], [1.0], [0.0], [0.0], [0.0], [0.0]], [[1.0], [1.0], [1.0], [1.0], [1.0], [0.0], [0.0], [0.0]], [[1.0], [1.0], [1.0], [1.0], [1.0], [1.0], [0.0], [0.0]], [[1.0], [1.0], [1.0], [1.0], [1.0], [1.0], [1.0], [0.0]], [[1.0], [1.0], [1.0], [1.0], [1.0], [1.0], [1.0], [1.0]]]> : !coco.tensor<8x8x1xf32>
  %expert_of_mask = coco.constant dense<[[[[[0.0]]]], [[[[1.0]]]], [[[[2.0]]]], [[[[3.0]]]], [[[[4.0]]]], [[[[5.0]]]], [[[[6.0]]]], [[[[7.0]]]]]> : !coco.tensor<8x1x1x1x1xf32>
  %slot_of_mask = coco.constant dense<[[[0.0]], [[1.0]], [[2.0]]]> : !coco.tensor<3x1x1xf32>
  %never = coco.constant -inf : !coco.tensor<f32>
  %4 = coco.reduce_dims max %logits dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %5 = coco.cmp eq %logits, %4 : !coco.tensor<10x8x8xf32, sliced<0>>, !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x8x8xi1, sliced<0>>
  %6 = coco.constant 8.0 : !coco.tensor<f32>
  %7 = coco.select %5, %expert, %6 : !coco.tensor<10x8x8xi1, sliced<0>>, !coco.tensor<8xf32>, !coco.tensor<f32> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %best = coco.reduce_dims min %7 dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %8 = coco.cmp eq %best, %expert : !coco.tensor<10x8x1xf32, sliced<0>>, !coco.tensor<8xf32> -> !coco.tensor<10x8x8xi1, sliced<0>>
  %chosen = coco.cast %8 : !coco.tensor<10x8x8xi1, sliced<0>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %9 = coco.reshape %chosen : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x1x8x8xf32, sliced<0>>
  %10 = coco.mul %9, %earlier : !coco.tensor<10x1x8x8xf32, sliced<0>>, !coco.tensor<8x8x1xf32> -> !coco.tensor<10x8x8x8xf32, sliced<0>>
  %position = coco.reduce_dims sum %10 dims [2] : !coco.tensor<10x8x8x8xf32, sliced<0>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %11 = coco.mul %chosen, %position : !coco.tensor<10x8x8xf32, sliced<0>>
  %12 = coco.reduce_dims sum %11 dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %13 = coco.constant 1.0 : !coco.tensor<f32>
  %slot = coco.sub %12, %13 : !coco.tensor<10x8x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %14 = coco.reshape %best : !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x1x8x1xf32, sliced<0>>
  %15 = coco.cmp eq %14, %expert_of_mask : !coco.tensor<10x1x8x1xf32, sliced<0>>, !coco.tensor<8x1x1x1x1xf32> -> !coco.tensor<8x10x1x8x1xi1, sliced<1>>
  %16 = coco.cast %15 : !coco.tensor<8x10x1x8x1xi1, sliced<1>> -> !coco.tensor<8x10x1x8x1xf32, sliced<1>>
  %17 = coco.reshape %slot : !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x1x8x1xf32, sliced<0>>
  %18 = coco.cmp eq %17, %slot_of_mask : !coco.tensor<10x1x8x1xf32, sliced<0>>, !coco.tensor<3x1x1xf32> -> !coco.tensor<10x3x8x1xi1, sliced<0>>
  %19 = coco.cast %18 : !coco.tensor<10x3x8x1xi1, sliced<0>> -> !coco.tensor<10x3x8x1xf32, sliced<0>>
  %within = coco.mul %16, %19 : !coco.tensor<8x10x1x8x1xf32, sliced<1>>, !coco.tensor<10x3x8x1xf32, sliced<0>> -> !coco.tensor<8x10x3x8x1xf32, sliced<1>>
  %20 = coco.mul %probs, %chosen : !coco.tensor<10x8x8xf32, sliced<0>>
  %gate = coco.reduce_dims sum %20 dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %21 = coco.constant 4.0 : !coco.tensor<f32>
  %22 = coco.cmp lt %position, %21 : !coco.tensor<10x8x8xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<10x8x8xi1, sliced<0>>
  %23 = coco.cast %22 : !coco.tensor<10x8x8xi1, sliced<0>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %24 = coco.mul %chosen, %23 : !coco.tensor<10x8x8xf32, sliced<0>>
  %taken = coco.reduce_dims sum %24 dims [1] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x1x8xf32, sliced<0>>
  %25 = coco.cmp eq %chosen, %13 : !coco.tensor<10x8x8xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<10x8x8xi1, sliced<0>>
  %left = coco.select %25, %never, %logits : !coco.tensor<10x8x8xi1, sliced<0>>, !coco.tensor<f32>, !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %26 = coco.reduce_dims max %left dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %27 = coco.cmp eq %left, %26 : !coco.tensor<10x8x8xf32, sliced<0>>, !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x8x8xi1, sliced<0>>
  %28 = coco.select %27, %expert, %6 : !coco.tensor<10x8x8xi1, sliced<0>>, !coco.tensor<8xf32>, !coco.tensor<f32> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %best_1 = coco.reduce_dims min %28 dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %29 = coco.cmp eq %best_1, %expert : !coco.tensor<10x8x1xf32, sliced<0>>, !coco.tensor<8xf32> -> !coco.tensor<10x8x8xi1, sliced<0>>
  %chosen_1 = coco.cast %29 : !coco.tensor<10x8x8xi1, sliced<0>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %30 = coco.reshape %chosen_1 : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x1x8x8xf32, sliced<0>>
  %31 = coco.mul %30, %earlier : !coco.tensor<10x1x8x8xf32, sliced<0>>, !coco.tensor<8x8x1xf32> -> !coco.tensor<10x8x8x8xf32, sliced<0>>
  %position_1 = coco.reduce_dims sum %31 dims [2] : !coco.tensor<10x8x8x8xf32, sliced<0>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %position_2 = coco.add %position_1, %taken : !coco.tensor<10x8x8xf32, sliced<0>>, !coco.tensor<10x1x8xf32, sliced<0>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %32 = coco.mul %chosen_1, %position_2 : !coco.tensor<10x8x8xf32, sliced<0>>
  %33 = coco.reduce_dims sum %32 dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %slot_1 = coco.sub %33, %13 : !coco.tensor<10x8x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %34 = coco.reshape %best_1 : !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x1x8x1xf32, sliced<0>>
  %35 = coco.cmp eq %34, %expert_of_mask : !coco.tensor<10x1x8x1xf32, sliced<0>>, !coco.tensor<8x1x1x1x1xf32> -> !coco.tensor<8x10x1x8x1xi1, sliced<1>>
  %36 = coco.cast %35 : !coco.tensor<8x10x1x8x1xi1, sliced<1>> -> !coco.tensor<8x10x1x8x1xf32, sliced<1>>
  %37 = coco.reshape %slot_1 : !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x1x8x1xf32, sliced<0>>
  %38 = coco.cmp eq %37, %slot_of_mask : !coco.tensor<10x1x8x1xf32, sliced<0>>, !coco.tensor<3x1x1xf32> -> !coco.tensor<10x3x8x1xi1, sliced<0>>
  %39 = coco.cast %38 : !coco.tensor<10x3x8x1xi1, sliced<0>> -> !coco.tensor<10x3x8x1xf32, sliced<0>>
  %within_1 = coco.mul %36, %39 : !coco.tensor<8x10x1x8x1xf32, sliced<1>>, !coco.tensor<10x3x8x1xf32, sliced<0>> -> !coco.tensor<8x10x3x8x1xf32, sliced<1>>
  %40 = coco.mul %probs, %chosen_1 : !coco.tensor<10x8x8xf32, sliced<0>>
  %gate_1 = coco.reduce_dims sum %40 dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %chosen_total = coco.add %gate, %gate_1 : !coco.tensor<10x8x1xf32, sliced<0>>
  %41 = coco.div %gate, %chosen_total : !coco.tensor<10x8x1xf32, sliced<0>>
  %gate_2 = coco.div %gate_1, %chosen_total : !coco.tensor<10x8x1xf32, sliced<0>>
  %42 = coco.reshape %41 : !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x1x8x1xf32, sliced<0>>
  %weights = coco.mul %within, %42 : !coco.tensor<8x10x3x8x1xf32, sliced<1>>, !coco.tensor<10x1x8x1xf32, sliced<0>> -> !coco.tensor<8x10x3x8x1xf32, sliced<1>>
  %dispatch = coco.add %within, %within_1 : !coco.tensor<8x10x3x8x1xf32, sliced<1>>
  %43 = coco.reshape %gate_2 : !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x1x8x1xf32, sliced<0>>
  %44 = coco.mul %within_1, %43 : !coco.tensor<8x10x3x8x1xf32, sliced<1>>, !coco.tensor<10x1x8x1xf32, sliced<0>> -> !coco.tensor<8x10x3x8x1xf32, sliced<1>>
  %weights_1 = coco.add %weights, %44 : !coco.tensor<8x10x3x8x1xf32, sliced<1>>
  %45 = coco.reshape %x : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x1x8x8xf32, sliced<0>>
  %46 = coco.mul %dispatch, %45 : !coco.tensor<8x10x3x8x1xf32, sliced<1>>, !coco.tensor<10x1x8x8xf32, sliced<0>> -> !coco.tensor<8x10x3x8x8xf32, sliced<1>>
  %buffers = coco.reduce_dims sum %46 dims [3] : !coco.tensor<8x10x3x8x8xf32, sliced<1>> -> !coco.tensor<8x10x3x8xf32, sliced<1>>
  %expert_in = comm.all_to_all %buffers : !coco.tensor<8x10x3x8xf32, sliced<1>> -> !coco.tensor<8x10x3x8xf32, sliced<0>>
  %47 = coco.reshape %expert_in : !coco.tensor<8x10x3x8xf32, sliced<0>> -> !coco.tensor<8x30x8xf32, sliced<0>>
  %up = coco.matmul %47, %w1 : !coco.tensor<8x30x8xf32, sliced<0>>, !coco.tensor<8x8x16xf32, sliced<0>> -> !coco.tensor<8x30x16xf32, sliced<0>>
  %48 = coco.relu %up : !coco.tensor<8x30x16xf32, sliced<0>>
  %down = coco.matmul %48, %w2 : !coco.tensor<8x30x16xf32, sliced<0>>, !coco.tensor<8x16x8xf32, sliced<0>> -> !coco.tensor<8x30x8xf32, sliced<0>>
  %expert_out = coco.reshape %down : !coco.tensor<8x30x8xf32, sliced<0>> -> !coco.tensor<8x10x3x8xf32, sliced<0>>
  %back = comm.all_to_all %expert_out : !coco.tensor<8x10x3x8xf32, sliced<0>> -> !coco.tensor<8x10x3x8xf32, sliced<1>>
  %49 = coco.reshape %back : !coco.tensor<8x10x3x8xf32, sliced<1>> -> !coco.tensor<8x10x3x1x8xf32, sliced<1>>
  %50 = coco.mul %weights_1, %49 : !coco.tensor<8x10x3x8x1xf32, sliced<1>>, !coco.tensor<8x10x3x1x8xf32, sliced<1>> -> !coco.tensor<8x10x3x8x8xf32, sliced<1>>
  %51 = coco.reduce_dims sum %50 dims [2] : !coco.tensor<8x10x3x8x8xf32, sliced<1>> -> !coco.tensor<8x10x8x8xf32, sliced<1>>
  %combined = coco.reduce_dims sum %51 dims [0] : !coco.tensor<8x10x8x8xf32, sliced<1>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %out = coco.add %x, %combined : !coco.tensor<10x8x8xf32, sliced<0>>
  func.return %out : !coco.tensor<10x8x8xf32, sliced<0>>
}
