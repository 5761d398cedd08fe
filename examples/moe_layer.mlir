// A GShard-style mixture-of-experts layer with expert parallelism: static capacity C=3, top-2
// routing, E=8 experts over the ranks. Built also by moe_layer.py (Softmax from the front
// end's helper; the routing loop's values are named by its variables). x [G=10, S=8, M=8]:
// token groups, sliced over the ranks; w1 [E, M, F=16], w2 [E, F, M]: each rank's experts.
// Gating matmul -> softmax over the experts -> first choice (the first expert of the row max),
// second (the best of the others), gates renormalized over the two -> each token's slot in its
// expert's buffer (the count of its group's earlier tokens choosing it, via a lower-triangular
// constant; second choices after the first choices kept; past C: dropped) -> dispatch mask
// [E, G, C, S] @ the tokens repeated per expert [E, G, S, M] = dispatch buffers [E, G, C, M],
// sliced by group -> all_to_all to expert slices -> relu(x w1) w2 per expert -> all_to_all
// back to group slices -> combine weights [E, G, S, C] (the gates at the routed slots) @ the
// buffers, summed over the experts -> + x.
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
  %expert_e = coco.constant dense<[[[[0.0]]], [[[1.0]]], [[[2.0]]], [[[3.0]]], [[[4.0]]], [[[5.0]]], [[[6.0]]], [[[7.0]]]]> : !coco.tensor<8x1x1x1xf32>
  %slot_c = coco.constant dense<[0.0, 1.0, 2.0]> : !coco.tensor<3xf32>
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
  %14 = coco.cmp eq %best, %expert_e : !coco.tensor<10x8x1xf32, sliced<0>>, !coco.tensor<8x1x1x1xf32> -> !coco.tensor<8x10x8x1xi1, sliced<1>>
  %to_expert = coco.cast %14 : !coco.tensor<8x10x8x1xi1, sliced<1>> -> !coco.tensor<8x10x8x1xf32, sliced<1>>
  %15 = coco.cmp eq %slot, %slot_c : !coco.tensor<10x8x1xf32, sliced<0>>, !coco.tensor<3xf32> -> !coco.tensor<10x8x3xi1, sliced<0>>
  %to_slot = coco.cast %15 : !coco.tensor<10x8x3xi1, sliced<0>> -> !coco.tensor<10x8x3xf32, sliced<0>>
  %route = coco.mul %to_expert, %to_slot : !coco.tensor<8x10x8x1xf32, sliced<1>>, !coco.tensor<10x8x3xf32, sliced<0>> -> !coco.tensor<8x10x8x3xf32, sliced<1>>
  %16 = coco.reshape %slot : !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x1x8xf32, sliced<0>>
  %17 = coco.reshape %slot_c : !coco.tensor<3xf32> -> !coco.tensor<3x1xf32>
  %18 = coco.cmp eq %16, %17 : !coco.tensor<10x1x8xf32, sliced<0>>, !coco.tensor<3x1xf32> -> !coco.tensor<10x3x8xi1, sliced<0>>
  %to_slot_t = coco.cast %18 : !coco.tensor<10x3x8xi1, sliced<0>> -> !coco.tensor<10x3x8xf32, sliced<0>>
  %19 = coco.reshape %to_expert : !coco.tensor<8x10x8x1xf32, sliced<1>> -> !coco.tensor<8x10x1x8xf32, sliced<1>>
  %sends = coco.mul %19, %to_slot_t : !coco.tensor<8x10x1x8xf32, sliced<1>>, !coco.tensor<10x3x8xf32, sliced<0>> -> !coco.tensor<8x10x3x8xf32, sliced<1>>
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
  %34 = coco.cmp eq %best_1, %expert_e : !coco.tensor<10x8x1xf32, sliced<0>>, !coco.tensor<8x1x1x1xf32> -> !coco.tensor<8x10x8x1xi1, sliced<1>>
  %to_expert_1 = coco.cast %34 : !coco.tensor<8x10x8x1xi1, sliced<1>> -> !coco.tensor<8x10x8x1xf32, sliced<1>>
  %35 = coco.cmp eq %slot_1, %slot_c : !coco.tensor<10x8x1xf32, sliced<0>>, !coco.tensor<3xf32> -> !coco.tensor<10x8x3xi1, sliced<0>>
  %to_slot_1 = coco.cast %35 : !coco.tensor<10x8x3xi1, sliced<0>> -> !coco.tensor<10x8x3xf32, sliced<0>>
  %route_1 = coco.mul %to_expert_1, %to_slot_1 : !coco.tensor<8x10x8x1xf32, sliced<1>>, !coco.tensor<10x8x3xf32, sliced<0>> -> !coco.tensor<8x10x8x3xf32, sliced<1>>
  %36 = coco.reshape %slot_1 : !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<10x1x8xf32, sliced<0>>
  %37 = coco.reshape %slot_c : !coco.tensor<3xf32> -> !coco.tensor<3x1xf32>
  %38 = coco.cmp eq %36, %37 : !coco.tensor<10x1x8xf32, sliced<0>>, !coco.tensor<3x1xf32> -> !coco.tensor<10x3x8xi1, sliced<0>>
  %to_slot_t_1 = coco.cast %38 : !coco.tensor<10x3x8xi1, sliced<0>> -> !coco.tensor<10x3x8xf32, sliced<0>>
  %39 = coco.reshape %to_expert_1 : !coco.tensor<8x10x8x1xf32, sliced<1>> -> !coco.tensor<8x10x1x8xf32, sliced<1>>
  %sends_1 = coco.mul %39, %to_slot_t_1 : !coco.tensor<8x10x1x8xf32, sliced<1>>, !coco.tensor<10x3x8xf32, sliced<0>> -> !coco.tensor<8x10x3x8xf32, sliced<1>>
  %40 = coco.mul %probs, %chosen_1 : !coco.tensor<10x8x8xf32, sliced<0>>
  %gate_1 = coco.reduce_dims sum %40 dims [2] keepdims : !coco.tensor<10x8x8xf32, sliced<0>> -> !coco.tensor<10x8x1xf32, sliced<0>>
  %gate_total = coco.add %gate, %gate_1 : !coco.tensor<10x8x1xf32, sliced<0>>
  %41 = coco.div %gate, %gate_total : !coco.tensor<10x8x1xf32, sliced<0>>
  %gate_2 = coco.div %gate_1, %gate_total : !coco.tensor<10x8x1xf32, sliced<0>>
  %combine_weights = coco.mul %route, %41 : !coco.tensor<8x10x8x3xf32, sliced<1>>, !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<8x10x8x3xf32, sliced<1>>
  %dispatch_mask = coco.add %sends, %sends_1 : !coco.tensor<8x10x3x8xf32, sliced<1>>
  %42 = coco.mul %route_1, %gate_2 : !coco.tensor<8x10x8x3xf32, sliced<1>>, !coco.tensor<10x8x1xf32, sliced<0>> -> !coco.tensor<8x10x8x3xf32, sliced<1>>
  %combine_weights_1 = coco.add %combine_weights, %42 : !coco.tensor<8x10x8x3xf32, sliced<1>>
  %43 = coco.constant dense<[[[[1.0]]], [[[1.0]]], [[[1.0]]], [[[1.0]]], [[[1.0]]], [[[1.0]]], [[[1.0]]], [[[1.0]]]]> : !coco.tensor<8x1x1x1xf32>
  %tokens = coco.mul %x, %43 : !coco.tensor<10x8x8xf32, sliced<0>>, !coco.tensor<8x1x1x1xf32> -> !coco.tensor<8x10x8x8xf32, sliced<1>>
  %buffers = coco.matmul %dispatch_mask, %tokens : !coco.tensor<8x10x3x8xf32, sliced<1>>, !coco.tensor<8x10x8x8xf32, sliced<1>> -> !coco.tensor<8x10x3x8xf32, sliced<1>>
  %expert_in = comm.all_to_all %buffers : !coco.tensor<8x10x3x8xf32, sliced<1>> -> !coco.tensor<8x10x3x8xf32, sliced<0>>
  %44 = coco.reshape %expert_in : !coco.tensor<8x10x3x8xf32, sliced<0>> -> !coco.tensor<8x30x8xf32, sliced<0>>
  %up = coco.matmul %44, %w1 : !coco.tensor<8x30x8xf32, sliced<0>>, !coco.tensor<8x8x16xf32, sliced<0>> -> !coco.tensor<8x30x16xf32, sliced<0>>
  %45 = coco.relu %up : !coco.tensor<8x30x16xf32, sliced<0>>
  %down = coco.matmul %45, %w2 : !coco.tensor<8x30x16xf32, sliced<0>>, !coco.tensor<8x16x8xf32, sliced<0>> -> !coco.tensor<8x30x8xf32, sliced<0>>
  %expert_out = coco.reshape %down : !coco.tensor<8x30x8xf32, sliced<0>> -> !coco.tensor<8x10x3x8xf32, sliced<0>>
  %back = comm.all_to_all %expert_out : !coco.tensor<8x10x3x8xf32, sliced<0>> -> !coco.tensor<8x10x3x8xf32, sliced<1>>
  %per_expert = coco.matmul %combine_weights_1, %back : !coco.tensor<8x10x8x3xf32, sliced<1>>, !coco.tensor<8x10x3x8xf32, sliced<1>> -> !coco.tensor<8x10x8x8xf32, sliced<1>>
  %combined = coco.reduce_dims sum %per_expert dims [0] : !coco.tensor<8x10x8x8xf32, sliced<1>> -> !coco.tensor<10x8x8xf32, sliced<0>>
  %out = coco.add %x, %combined : !coco.tensor<10x8x8xf32, sliced<0>>
  func.return %out : !coco.tensor<10x8x8xf32, sliced<0>>
}
