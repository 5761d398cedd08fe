"""LAMB, data parallel (CoCoNet reference sec. 4.2, with bias correction and epsilon). Same IR
as lamb.mlir.

The trust ratio norm(w)/norm(r) is taken over replicated tensors here. Schedules: AR_C;
RS_C_AG (after the reorder the norms are over slices: each becomes a partial sum of squares
that a tiny all_reduce combines); fuse_RS_C_AG (one FusedAllReduce, two passes around the
norm all_reduce).
"""

from coconet import frontend
from coconet.frontend import (
    F32,
    AllReduce,
    Local,
    Norm,
    Replicated,
    Scalar,
    Sqrt,
    Tensor,
    Update,
)

N = 4096


def build(n: int = N):
    """LAMB over n parameters (benchmarks/bench_suite.py builds it at 2^24)."""

    @frontend.program(grid=[None])
    def lamb(
        g: Tensor(F32, [n], Local),
        w: Tensor(F32, [n], Replicated),
        m: Tensor(F32, [n], Replicated),
        v: Tensor(F32, [n], Replicated),
        lr: Scalar(F32),
        beta1: Scalar(F32),
        beta2: Scalar(F32),
        eps: Scalar(F32),
        weight_decay: Scalar(F32),
        step: Scalar(F32),
    ):
        g1 = AllReduce("+", g)
        m1 = beta1 * m + (1 - beta1) * g1
        v1 = beta2 * v + (1 - beta2) * g1 * g1
        Update(m, m1)
        Update(v, v1)
        mhat = m1 / (1 - beta1**step)
        vhat = v1 / (1 - beta2**step)
        r = mhat / (Sqrt(vhat) + eps) + weight_decay * w
        w_norm = Norm(w)
        r_norm = Norm(r)
        trust = w_norm / r_norm
        w1 = w - lr * trust * r
        Update(w, w1)

    return lamb


program = build()  # what coconet.load() picks up
