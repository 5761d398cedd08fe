"""Vocab-parallel cross-entropy as Megatron-LM computes it (`_VocabParallelCrossEntropy`): the
logits of 8 tokens over a 1003-word vocabulary (uneven at most rank counts, as GPT-2's 50257
is) are sliced on the vocab over the tensor-parallel ranks, so every row statistic is a
partial per rank and an all_reduce: the row max (all_reduce max), the sum of exp(logit - max)
(all_reduce +) and the target's logit, picked by a one-hot mask as a masked sum (all_reduce
+). Per token, loss = log(sum) - (target logit - max); the step's loss is their mean. Same
IR as vocab_parallel_cross_entropy.mlir.

Schedules: AR_C (as written: three library all_reduces); RS_C_AG (split on the tokens, the
loss computed on each rank's slice of them, then all_gathered); fused, the max's all_reduce
is one kernel, and the two sums' all_reduces meet in the loss: ONE kernel reads both from
the peers, computes the loss, gathers it and finishes the mean. `build(BF16, vocab=50257)`
gives other variants.
"""

from coconet import frontend
from coconet.frontend import F32, AllReduce, AMax, Exp, Log, ReduceSum, Sliced, Sum, Tensor

ROWS, VOCAB = 8, 1003  # tokens, vocabulary


def build(dtype=F32, rows: int = ROWS, vocab: int = VOCAB):
    @frontend.program(grid=[None])
    def vocab_parallel_cross_entropy(
        logits: Tensor(dtype, [rows, vocab], Sliced(1)),
        target_mask: Tensor(dtype, [rows, vocab], Sliced(1)),
    ):
        row_max = AllReduce("max", AMax(logits, -1, keepdims=True))
        sum_exp = AllReduce("+", Sum(Exp(logits - row_max), -1, keepdims=True))
        target = AllReduce("+", Sum(logits * target_mask, -1, keepdims=True))
        loss = Log(sum_exp) - (target - row_max)
        mean = ReduceSum(loss) * (1 / rows)
        return loss, mean

    return vocab_parallel_cross_entropy


program = build()  # what coconet.load() picks up
