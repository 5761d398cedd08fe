"""Tensor-parallel attention scores and their row-wise softmax, with a causal ALiBi bias as a
dense constant (Press et al., "Train Short, Test Long"), for a chunk of 16 new queries
attending to 40 keys (24 cached ones, then the chunk's own: chunked prefill). Each rank holds
a slice of the head dim of the queries q [16, D/p] and of the transposed keys kt [D/p, 40],
so q @ kt gives local partial scores; all_reduce them, scale by 1/sqrt(D), add the bias
(slope * (j - i) for key j at or before query i's position, -inf after it: the causal mask),
then softmax over the keys (subtract the row max, exp, divide by the row sum). Same IR as
softmax_rows.mlir.

Schedules: MM_AR_C (as written); MM_RS_C_AG (split along the queries, so each rank's
softmax reduces whole rows of its slice, then all_gather the probabilities); fused, the
reduce_scatter, scale, bias, both row reductions and the all_gather are one row kernel.
`build(F16)` gives the f16 variant.
"""

import numpy as np

from coconet import frontend
from coconet.frontend import F32, AllReduce, Constant, MatMul, Sliced, Softmax, Tensor

QUERIES, KEYS, D = 16, 40, 64  # new queries, keys (cached + new), head dim
SLOPE = 0.5  # the head's ALiBi slope


def alibi_causal_bias(queries: int = QUERIES, keys: int = KEYS, slope: float = SLOPE):
    """bias[i, j] = slope * (j - p) for key j <= p, -inf after, where p = keys - queries + i
    is query i's position."""
    i, j = np.indices((queries, keys))
    position = keys - queries + i
    return np.where(j <= position, slope * (j - position), -np.inf)


def build(dtype=F32):
    @frontend.program(grid=[None])
    def softmax_rows(
        q: Tensor(dtype, [QUERIES, D], Sliced(1)),
        kt: Tensor(dtype, [D, KEYS], Sliced(0)),
    ):
        partial = MatMul(q, kt)
        scores = AllReduce("+", partial)
        bias = Constant(alibi_causal_bias(), dtype)
        logits = scores * (1 / np.sqrt(D)) + bias
        probs = Softmax(logits)
        return probs

    return softmax_rows


program = build()  # what coconet.load() picks up
