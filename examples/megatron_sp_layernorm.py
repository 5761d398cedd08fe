"""A Megatron sequence-parallel block boundary with LayerNorm: the row-parallel MLP output
projection [B, S, 4H/p] x [4H/p, H] gives local partial sums; all_reduce, bias, dropout,
residual, then LayerNorm over the hidden dim (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models": the all_reduce becomes a reduce_scatter along
the sequence, dropout/residual/LayerNorm run on each rank's sequence slice, and an
all_gather feeds the next column-parallel layer). Same IR as megatron_sp_layernorm.mlir.

Schedules: MM_AR_C (as written); MM_RS_C_AG (split along the sequence dim S, so LayerNorm
reduces whole rows of each slice: the Megatron-SP layout); the overlap schedules when the
fused chain applies. `build(F32)` gives the same program in fp32.
"""

from coconet import frontend
from coconet.frontend import (
    F16,
    AllReduce,
    Dropout,
    LayerNorm,
    MatMul,
    Replicated,
    Sliced,
    Tensor,
)

B, S, H = 2, 16, 64
K = 4 * H  # the contracting dim: 4H


def build(dtype=F16, *, batch=B, seq=S, k=K, hidden=H):
    """The block in `dtype`; the sizes default to the .mlir file's (benchmarks/bench_suite.py
    takes the attention output projection's: k = hidden, H = 4096)."""

    @frontend.program(grid=[None])
    def megatron_sp_layernorm(
        x: Tensor(dtype, [batch, seq, k], Sliced(2)),
        w: Tensor(dtype, [k, hidden], Sliced(0)),
        b: Tensor(dtype, [hidden], Replicated),
        r: Tensor(dtype, [batch, seq, hidden], Replicated),
        gamma: Tensor(dtype, [hidden], Replicated),
        beta: Tensor(dtype, [hidden], Replicated),
    ):
        layer = MatMul(x, w)
        total = AllReduce("+", layer)
        biased = total + b
        dropped = Dropout(biased, 0.1, seed=4)
        hidden = dropped + r
        out = LayerNorm(hidden, gamma, beta)
        return hidden, out

    return megatron_sp_layernorm


program = build()  # what coconet.load() picks up
