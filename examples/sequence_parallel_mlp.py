"""Megatron-LM sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", 2022), the MLP block of a transformer layer, scaled down to B=2,
S=16, H=64. Same IR as sequence_parallel_mlp.mlir.

Between tensor-parallel regions the activations are sliced along the sequence (dim 1) instead
of replicated: the block all_gathers its input, multiplies by the column-parallel first
weight (each rank its 4H/p columns), applies GeLU on its columns, multiplies by the
row-parallel second weight (partial sums) and reduce_scatters the sum back onto sequence
slices, where the residual is added. Both collectives sit next to a GEMM, the two halves of
async tensor parallelism. Schedules: as written; ol(ag,mm) (the all_gather pipelined with the
column-parallel GEMM: chunk k multiplies while chunk k+1 is gathered); ol(mm,rs) (the
row-parallel GEMM pipelined with its reduce_scatter); ol(ag,mm)+ol(mm,rs) (both).
`build(F32)` gives the same program in fp32.
"""

from coconet import frontend
from coconet.frontend import (
    F16,
    AllGather,
    Gelu,
    MatMul,
    ReduceScatter,
    Sliced,
    Tensor,
)

B, S, H = 2, 16, 64


def build(dtype=F16, batch=B, seq=S, hidden=H):
    """The block at other sizes too (benchmarks/bench_suite.py's overlap table)."""
    f = 4 * hidden  # the MLP's hidden width

    @frontend.program(grid=[None])
    def sequence_parallel_mlp(
        x: Tensor(dtype, [batch, seq, hidden], Sliced(1)),
        w1: Tensor(dtype, [hidden, f], Sliced(1)),
        w2: Tensor(dtype, [f, hidden], Sliced(0)),
        r: Tensor(dtype, [batch, seq, hidden], Sliced(1)),
    ):
        xg = AllGather(x)
        h = MatMul(xg, w1)
        a = Gelu(h)
        y = MatMul(a, w2)
        ys = ReduceScatter("+", y, dim=1)
        out = ys + r
        return out

    return sequence_parallel_mlp


program = build()  # what coconet.load() picks up
