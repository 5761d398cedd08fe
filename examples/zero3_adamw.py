"""AdamW, ZeRO-3 / FSDP style (not in CoCoNet): each rank keeps only its slice of the weights
and of both moments (`sliced<0>`), reduce-scatters the full local gradient to its slice and
updates that slice; no all_gather (the forward gathers the weights it needs). Same IR as
zero3_adamw.mlir.

Schedules: as written (the library reduce_scatter, then one fused elementwise kernel);
fuse(rs-c) (the reduce_scatter and the sliced update as one fused collective kernel: one
launch pulls the peers' pieces of the gradient and stores w, m and v).
"""

from coconet import frontend
from coconet.frontend import (
    F32,
    Local,
    ReduceScatter,
    Scalar,
    Sliced,
    Sqrt,
    Tensor,
    Update,
)

N = 4096


def build(n: int = N):
    """AdamW over n parameters, sliced over the ranks."""

    @frontend.program(grid=[None])
    def zero3_adamw(
        g: Tensor(F32, [n], Local),
        w: Tensor(F32, [n], Sliced(0)),
        m: Tensor(F32, [n], Sliced(0)),
        v: Tensor(F32, [n], Sliced(0)),
        lr: Scalar(F32),
        beta1: Scalar(F32),
        beta2: Scalar(F32),
        eps: Scalar(F32),
        weight_decay: Scalar(F32),
        step: Scalar(F32),
    ):
        g1 = ReduceScatter("+", g, dim=0)
        m1 = beta1 * m + (1 - beta1) * g1
        v1 = beta2 * v + (1 - beta2) * g1 * g1
        mhat = m1 / (1 - beta1**step)
        vhat = v1 / (1 - beta2**step)
        w1 = w - lr * (mhat / (Sqrt(vhat) + eps) + weight_decay * w)
        Update(w, w1)
        Update(m, m1)
        Update(v, v1)

    return zero3_adamw


program = build()  # what coconet.load() picks up
