"""Megatron-LM's distributed optimizer on a [dp, tp] grid (not in CoCoNet): the gradients of a
tensor-parallel model live in one flat buffer that each tp rank holds its piece of
(`[local, sliced<0>]`: local on dp, where every data-parallel replica computed its own); the
step all-reduces that buffer over dp and applies AdamW to the parameters and moments, sliced
on tp as the model is. Same IR as megatron_dist_optimizer.mlir.

Schedules: as written (the library all_reduce over dp, then one elementwise kernel); rs-c-ag
and fuse(rs-c-ag) split the all_reduce inside each tp piece -- each tp piece of the flat
buffer reduce-scattered over dp, a mixed-radix cut the types state as
`[sliced<0, level 1>, sliced<0, level 0>]` (tp's cut outermost) -- and keep m and v sliced so
(ZeRO-1 within each tensor-parallel group, as Megatron's distributed optimizer does);
fuse(rs-c-ag) runs the step as one fused collective kernel.
"""

from coconet import frontend
from coconet.frontend import (
    F32,
    AllReduce,
    Local,
    Replicated,
    Scalar,
    Sliced,
    Sqrt,
    Tensor,
    Update,
)

N = 4096
TP = 2


def build(n: int = N, tp: int = TP):
    """AdamW over a flat buffer of n parameters on a [dp, tp] grid, dp sized at launch."""
    tp_piece = [Replicated, Sliced(0)]

    @frontend.program(grid=[None, tp])
    def megatron_dist_optimizer(
        g: Tensor(F32, [n], [Local, Sliced(0)]),
        w: Tensor(F32, [n], tp_piece),
        m: Tensor(F32, [n], tp_piece),
        v: Tensor(F32, [n], tp_piece),
        lr: Scalar(F32),
        beta1: Scalar(F32),
        beta2: Scalar(F32),
        eps: Scalar(F32),
        weight_decay: Scalar(F32),
        step: Scalar(F32),
    ):
        g1 = AllReduce("+", g, over=[0])
        m1 = beta1 * m + (1 - beta1) * g1
        v1 = beta2 * v + (1 - beta2) * g1 * g1
        mhat = m1 / (1 - beta1**step)
        vhat = v1 / (1 - beta2**step)
        w1 = w - lr * (mhat / (Sqrt(vhat) + eps) + weight_decay * w)
        Update(w, w1)
        Update(m, m1)
        Update(v, v1)

    return megatron_dist_optimizer


program = build()  # what coconet.load() picks up
