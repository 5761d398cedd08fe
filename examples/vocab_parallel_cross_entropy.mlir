// Vocab-parallel cross-entropy as Megatron-LM computes it: the logits of 8 tokens over a
// 1003-word vocabulary (uneven at most rank counts, as GPT-2's 50257 is) sliced on the vocab
// over the tensor-parallel ranks. Built also by vocab_parallel_cross_entropy.py.
// Each row statistic is a partial per rank and an all_reduce: the row max (max), the sum of
// exp(logit - max) (+) and the target's logit, picked by the one-hot %target_mask as a masked
// sum (+). Per token, loss = log(sum) - (target - max); %mean is the step's loss.
// Schedules: AR_C (as written: three library all_reduces); RS_C_AG (split on the tokens: the
// loss on each rank's slice of them, then all_gathered); fused, the max's all_reduce is one
// kernel and the two sums' all_reduces, which meet in the loss, ONE kernel reading both from
// the peers, computing the loss, gathering it and finishing the mean.

func.func @vocab_parallel_cross_entropy(%logits: !coco.tensor<8x1003xf32, sliced<1>>, %target_mask: !coco.tensor<8x1003xf32, sliced<1>>) -> (!coco.tensor<8x1xf32>, !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %0 = coco.reduce_dims max %logits dims [1] keepdims : !coco.tensor<8x1003xf32, sliced<1>> -> !coco.tensor<8x1xf32, local>
  %row_max = comm.all_reduce max %0 : !coco.tensor<8x1xf32, local> -> !coco.tensor<8x1xf32>
  %1 = coco.sub %logits, %row_max : !coco.tensor<8x1003xf32, sliced<1>>, !coco.tensor<8x1xf32> -> !coco.tensor<8x1003xf32, sliced<1>>
  %2 = coco.exp %1 : !coco.tensor<8x1003xf32, sliced<1>>
  %3 = coco.reduce_dims sum %2 dims [1] keepdims : !coco.tensor<8x1003xf32, sliced<1>> -> !coco.tensor<8x1xf32, local>
  %sum_exp = comm.all_reduce sum %3 : !coco.tensor<8x1xf32, local> -> !coco.tensor<8x1xf32>
  %4 = coco.mul %logits, %target_mask : !coco.tensor<8x1003xf32, sliced<1>>
  %5 = coco.reduce_dims sum %4 dims [1] keepdims : !coco.tensor<8x1003xf32, sliced<1>> -> !coco.tensor<8x1xf32, local>
  %target = comm.all_reduce sum %5 : !coco.tensor<8x1xf32, local> -> !coco.tensor<8x1xf32>
  %6 = coco.log %sum_exp : !coco.tensor<8x1xf32>
  %7 = coco.sub %target, %row_max : !coco.tensor<8x1xf32>
  %loss = coco.sub %6, %7 : !coco.tensor<8x1xf32>
  %8 = coco.reduce sum %loss : !coco.tensor<8x1xf32> -> !coco.tensor<f32>
  %9 = coco.constant 0.125 : !coco.tensor<f32>
  %mean = coco.mul %8, %9 : !coco.tensor<f32>
  func.return %loss, %mean : !coco.tensor<8x1xf32>, !coco.tensor<f32>
}
