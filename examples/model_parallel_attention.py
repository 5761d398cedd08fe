"""Megatron-style model parallelism, the self-attention output projection: [B, S, H/p] x [H/p, H]
(CoCoNet reference sec. 4.4; GPT-2 8.3B shapes scaled down, same aspect). Same IR as
model_parallel_attention.mlir.

The input is sliced on its hidden dim and the weight on its rows, so the matmul gives local
partial sums; all_reduce them, add the bias, dropout, add the residual. Schedules: MM_AR_C (as
written); MM_RS_C_AG (split, reorder bias/dropout/residual onto slices, all_gather the
output); ol_MM_fuse_RS_C_AG (fuse RS + computation + AG, overlap it with the matmul).
`build(F32)` gives the same program in fp32.
"""

from coconet import frontend
from coconet.frontend import (
    F16,
    AllReduce,
    Dropout,
    MatMul,
    Replicated,
    Sliced,
    Tensor,
)

B, S, H = 2, 16, 64
K = H  # the contracting dim: H


def build(dtype=F16):
    @frontend.program(grid=[None])
    def model_parallel_attention(
        x: Tensor(dtype, [B, S, K], Sliced(2)),
        w: Tensor(dtype, [K, H], Sliced(0)),
        b: Tensor(dtype, [H], Replicated),
        r: Tensor(dtype, [B, S, H], Replicated),
    ):
        layer = MatMul(x, w)
        total = AllReduce("+", layer)
        biased = total + b
        dropped = Dropout(biased, 0.1, seed=1)
        out = dropped + r
        return out

    return model_parallel_attention


program = build()  # what coconet.load() picks up
