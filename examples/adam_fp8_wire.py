"""Adam, data parallel, fp8 (f8E4M3FN) gradients with f32 master weights and state, the sum
accumulated in f32: each rank's gradient is widened to f32 before the all_reduce (`Cast` then
`AllReduce` in f32: the all_reduce's type states the accumulation type). Same IR as
adam_fp8_wire.mlir. (The gradients' scaling is the producer's: Adam's update is invariant to
a common scale of g but for eps.)

Schedules: ar-c (as written: cast, all_reduce in f32, the update as one fused elementwise
kernel); rs-c-ag (split: cast, reduce_scatter in f32, the update on the slice with sliced m
and v, all_gather of w); fuse(rs-c-ag) (one fused collective kernel with a narrow wire: the
cast is deferred into it, peers pull the fp8 gradient -- 1 byte an element, not 4 -- and
widen it as they accumulate; no cast kernel). `build(n, grad=BF16)` or `grad=F32` gives the
same step with bf16 gradients or f32 ones (no cast): the benchmark's baselines.
"""

from coconet import frontend
from coconet.frontend import (
    F8E4M3FN,
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


def build(n: int = N, grad=F8E4M3FN):
    """Adam over n parameters whose gradients arrive as `grad` (an fp8 type, BF16, F16, F32)."""

    @frontend.program(grid=[None])
    def adam_fp8_wire(
        g: Tensor(grad, [n], Local),
        w: Tensor(F32, [n], Replicated),
        m: Tensor(F32, [n], Replicated),
        v: Tensor(F32, [n], Replicated),
        lr: Scalar(F32),
        beta1: Scalar(F32),
        beta2: Scalar(F32),
        eps: Scalar(F32),
        step: Scalar(F32),
    ):
        gw = g if grad == F32 else Cast(F32, g)
        g1 = AllReduce("+", gw)
        m1 = beta1 * m + (1 - beta1) * g1
        v1 = beta2 * v + (1 - beta2) * g1 * g1
        Update(m, m1)
        Update(v, v1)
        mhat = m1 / (1 - beta1**step)
        vhat = v1 / (1 - beta2**step)
        w1 = w - lr * mhat / (Sqrt(vhat) + eps)
        Update(w, w1)

    return adam_fp8_wire


program = build()  # what coconet.load() picks up
