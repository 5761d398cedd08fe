"""Megatron-style model parallelism, the MLP output projection: [B, S, 4H/p] x [4H/p, H]
(CoCoNet reference sec. 4.4; GPT-2 8.3B shapes scaled down, same aspect). Same IR as
model_parallel_mlp.mlir.

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
K = 4 * H  # the contracting dim: 4H


def build(dtype=F16, batch=B, seq=S, hidden=H):
    """The layer at other sizes too (benchmarks/bench_suite.py's overlap table)."""
    k = 4 * hidden

    @frontend.program(grid=[None])
    def model_parallel_mlp(
        x: Tensor(dtype, [batch, seq, k], Sliced(2)),
        w: Tensor(dtype, [k, hidden], Sliced(0)),
        b: Tensor(dtype, [hidden], Replicated),
        r: Tensor(dtype, [batch, seq, hidden], Replicated),
    ):
        layer = MatMul(x, w)
        total = AllReduce("+", layer)
        biased = total + b
        dropped = Dropout(biased, 0.1, seed=2)
        out = dropped + r
        return out

    return model_parallel_mlp


program = build()  # what coconet.load() picks up
