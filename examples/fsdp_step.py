"""A training step of one FSDP / ZeRO-3 linear layer (not in CoCoNet): the weight W [K, N] is
sharded by rows over the ranks (`sliced<0>`) with its AdamW moments; each rank holds its own
batch. Forward: the weight all-gathered and multiplied (y = x W); backward: the weight's
gradient from the saved input (xt = x^T) and the output's gradient (dW = xt dy, this rank's
partial sum), reduce-scattered to the shards; then AdamW on the shards. Same IR as
fsdp_step.mlir.

Schedules: as written (library all_gather and reduce_scatter, a kernel per op); ol(ag,mm)
(the weight gathered in chunks of rows, each multiplied as it lands), ol(mm,rs) (the
gradient's matmul in chunks, each reduce-scattered while the next multiplies), both; fuse(rs-c)
(the reduce_scatter and the sharded AdamW as one fused collective kernel).
"""

from coconet import frontend
from coconet.frontend import (
    F32,
    AllGather,
    Local,
    MatMul,
    ReduceScatter,
    Scalar,
    Sliced,
    Sqrt,
    Tensor,
    Update,
)

B, K, N = 16, 64, 128


def build(b: int = B, k: int = K, n: int = N, dtype=F32):
    """The step over a batch of b rows per rank, W [k, n]."""

    @frontend.program(grid=[None])
    def fsdp_step(
        x: Tensor(dtype, [b, k], Local),
        xt: Tensor(dtype, [k, b], Local),
        dy: Tensor(dtype, [b, n], Local),
        w: Tensor(dtype, [k, n], Sliced(0)),
        m: Tensor(dtype, [k, n], Sliced(0)),
        v: Tensor(dtype, [k, n], Sliced(0)),
        lr: Scalar(dtype),
        beta1: Scalar(dtype),
        beta2: Scalar(dtype),
        eps: Scalar(dtype),
        weight_decay: Scalar(dtype),
        step: Scalar(dtype),
    ):
        wg = AllGather(w)
        y = MatMul(x, wg)
        dw = MatMul(xt, dy)
        g1 = ReduceScatter("+", dw, dim=0)
        m1 = beta1 * m + (1 - beta1) * g1
        v1 = beta2 * v + (1 - beta2) * g1 * g1
        mhat = m1 / (1 - beta1**step)
        vhat = v1 / (1 - beta2**step)
        w1 = w - lr * (mhat / (Sqrt(vhat) + eps) + weight_decay * w)
        Update(w, w1)
        Update(m, m1)
        Update(v, v1)
        return y

    return fsdp_step


program = build()  # what coconet.load() picks up
