"""Adam, data parallel, f16 gradients with fp32 master weights and state (the mixed-precision
setup of CoCoNet's hand-written fused kernel). Same IR as adam_f16_grads.mlir.

The gradient is all-reduced in f16 (half the bytes of fp32), then cast to f32 for the update.
Schedules: AR_C; RS_C_AG (split, reorder the cast and the update onto slices, as-slice m, v);
fuse_RS_C_AG (one FusedAllReduce moving f16 gradients).
"""

from coconet import frontend
from coconet.frontend import (
    F16,
    F32,
    AllReduce,
    Cast,
    Local,
    Replicated,
    Scalar,
    Sqrt,
    Tensor,
    Update,
)

N = 4096


@frontend.program(grid=[None])
def adam_f16_grads(
    g: Tensor(F16, [N], Local),
    w: Tensor(F32, [N], Replicated),
    m: Tensor(F32, [N], Replicated),
    v: Tensor(F32, [N], Replicated),
    lr: Scalar(F32),
    beta1: Scalar(F32),
    beta2: Scalar(F32),
    eps: Scalar(F32),
    step: Scalar(F32),
):
    g1 = AllReduce("+", g)
    gf = Cast(F32, g1)
    m1 = beta1 * m + (1 - beta1) * gf
    v1 = beta2 * v + (1 - beta2) * gf * gf
    Update(m, m1)
    Update(v, v1)
    mhat = m1 / (1 - beta1**step)
    vhat = v1 / (1 - beta2**step)
    w1 = w - lr * mhat / (Sqrt(vhat) + eps)
    Update(w, w1)


program = adam_f16_grads  # what coconet.load() picks up
