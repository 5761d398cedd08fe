"""A pipeline-stage boundary of a tensor-parallel transformer (CoCoNet reference secs. 4.5
and 8: GPT-3 175B across nodes; shapes scaled down). Same IR as pipeline_boundary.mlir.

The grid is [2, ?]: 2 stages x the tensor-parallel group of each. Every tensor is local on the
stage axis (each stage has its own). Within a stage: matmul of sliced operands, all_reduce over
axis 1, bias, dropout, residual; then each rank sends the stage's output to the same rank of
the next stage (CoCoNet's Send(out, GroupRank(GROUP + 1, RANK))) and returns what it
received (stage 0 receives zeros). Schedules: AR_P2P_C; RS_P2P_C_AG (split the all_reduce,
reorder computation onto slices, sliced send: each rank sends only its slice and the next
stage all_gathers it); ol_RS_fuse_P2P_C_AG (fuse the computation into the send, overlap RS,
send and AG).
"""

from coconet import frontend
from coconet.frontend import (
    F16,
    GROUP,
    RANK,
    AllReduce,
    Dropout,
    GroupRank,
    Local,
    MatMul,
    Replicated,
    Send,
    Sliced,
    Tensor,
)

B, S, H = 2, 16, 64


def build(dtype=F16):
    @frontend.program(grid=[2, None])
    def pipeline_boundary(
        x: Tensor(dtype, [B, S, H], [Local, Sliced(2)]),
        w: Tensor(dtype, [H, H], [Local, Sliced(0)]),
        b: Tensor(dtype, [H], [Local, Replicated]),
        r: Tensor(dtype, [B, S, H], [Local, Replicated]),
    ):
        layer = MatMul(x, w)
        total = AllReduce("+", layer, over=[1])
        biased = total + b
        dropped = Dropout(biased, 0.1, seed=3)
        out = dropped + r
        recv = Send(out, GroupRank(GROUP + 1, RANK))
        return recv

    return pipeline_boundary


program = build()  # what coconet.load() picks up
