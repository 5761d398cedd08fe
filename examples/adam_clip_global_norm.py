"""Global-norm gradient clipping, then Adam, over several parameter tensors (the usual
`clip_grad_norm_(params, max_norm)` before `optimizer.step()`). Same IR as
adam_clip_global_norm.mlir.

The norms are coupled across tensors: every tensor's update reads the clipping factor
min(1, max_norm / (||(g_0, ..., g_k)|| + 1e-6)), which needs the summed gradient of every
tensor. Each tensor keeps its own program values (no flattening by hand); under
fuse(rs-c-ag) each tensor's chain is one fused collective whose first kernel finishes its
slice's sum of squares, and the kernels of all tensors run as one table launch per segment.
"""

from coconet import frontend
from coconet.frontend import (
    F32,
    AllReduce,
    Local,
    Min,
    Replicated,
    Scalar,
    Sqrt,
    Tensor,
    Update,
)

# Sizes that no rank count above 1 divides, next to even ones.
SIZES = (1000, 33, 4097)


def build(sizes=SIZES):
    @frontend.program(grid=[None])
    def adam_clip_global_norm(
        lr: Scalar(F32),
        beta1: Scalar(F32),
        beta2: Scalar(F32),
        eps: Scalar(F32),
        step: Scalar(F32),
        max_norm: Scalar(F32),
    ):
        grads = []
        for i, n in enumerate(sizes):
            g = Tensor(F32, [n], Local, f"g{i}")
            grads.append(AllReduce("+", g).named(f"gsum{i}"))
        squares = None
        for i, gsum in enumerate(grads):
            sq = (gsum * gsum).named(f"gsq{i}")
            part = frontend.ReduceSum(sq).named(f"sumsq{i}")
            squares = part if squares is None else squares + part
        total = Sqrt(squares).named("total_norm")
        clip = Min(1.0, max_norm / (total + 1e-6)).named("clip")
        bias1 = 1 - beta1**step
        bias2 = 1 - beta2**step
        for i, (n, gsum) in enumerate(zip(sizes, grads)):
            w = Tensor(F32, [n], Replicated, f"w{i}")
            m = Tensor(F32, [n], Replicated, f"m{i}")
            v = Tensor(F32, [n], Replicated, f"v{i}")
            gc = (gsum * clip).named(f"gclip{i}")
            m_new = (beta1 * m + (1 - beta1) * gc).named(f"m_new{i}")
            v_new = (beta2 * v + (1 - beta2) * gc * gc).named(f"v_new{i}")
            Update(m, m_new)
            Update(v, v_new)
            Update(w, (w - lr * (m_new / bias1) / (Sqrt(v_new / bias2) + eps)).named(f"w_new{i}"))

    return adam_clip_global_norm


program = build()
