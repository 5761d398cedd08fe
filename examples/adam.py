"""Adam, data parallel, fp32 gradients (CoCoNet reference sec. 4.1, with the real bias
correction and epsilon). Same IR as adam.mlir.

Schedules: AR_C (as written: all_reduce + one fused elementwise kernel); RS_C_AG (split the
all_reduce, reorder m/v/w updates onto slices, as-slice m and v: ZeRO-style sharded state);
fuse_RS_C_AG (reduce_scatter + sliced update + all_gather of w as one FusedAllReduce).
"""

from coconet import frontend
from coconet.frontend import (
    F32,
    AllReduce,
    Local,
    Replicated,
    Scalar,
    Sqrt,
    Tensor,
    Update,
)

N = 4096


def build(n: int = N):
    """Adam over n parameters (benchmarks/bench_adam.py builds it at 2^24)."""

    @frontend.program(grid=[None])
    def adam(
        g: Tensor(F32, [n], Local),
        w: Tensor(F32, [n], Replicated),
        m: Tensor(F32, [n], Replicated),
        v: Tensor(F32, [n], Replicated),
        lr: Scalar(F32),
        beta1: Scalar(F32),
        beta2: Scalar(F32),
        eps: Scalar(F32),
        step: Scalar(F32),
    ):
        g1 = AllReduce("+", g)
        m1 = beta1 * m + (1 - beta1) * g1
        v1 = beta2 * v + (1 - beta2) * g1 * g1
        Update(m, m1)
        Update(v, v1)
        mhat = m1 / (1 - beta1**step)
        vhat = v1 / (1 - beta2**step)
        w1 = w - lr * mhat / (Sqrt(vhat) + eps)
        Update(w, w1)

    return adam


program = build()  # what coconet.load() picks up
