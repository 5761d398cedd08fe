"""Mixed-precision Adam with dynamic loss scaling (torch.cuda.amp.GradScaler's recipe) over
several parameter tensors: f16 gradients of a loss multiplied by `scale` are summed over the
ranks, unscaled in f32, and checked for inf/NaN; when every one is finite the f32 master
weights and Adam's moments are updated, and the scale grows by 2 after `interval` clean steps
in a row; otherwise nothing is updated and the scale halves.

Whether the step is skipped depends on every gradient element of every tensor on every rank
(an inf on one rank reaches the others through the sum), so the found-inf flag is a global
reduction that every tensor's update reads -- like a global norm -- and the scale and its
growth counter are scalar state updated from it.
"""

from coconet import frontend
from coconet.frontend import (
    F16,
    F32,
    AllReduce,
    Cast,
    Const,
    Eq,
    Ite,
    Local,
    Max,
    ReduceMax,
    Replicated,
    Scalar,
    Sqrt,
    Tensor,
    Update,
)

# Sizes that no rank count above 1 divides, next to an even one.
SIZES = (1000, 4096)


def build(sizes=SIZES):
    @frontend.program(grid=[None])
    def adam_loss_scaling(
        lr: Scalar(F32),
        beta1: Scalar(F32),
        beta2: Scalar(F32),
        eps: Scalar(F32),
        step: Scalar(F32),
        scale: Scalar(F32),
        tracker: Scalar(F32),
        interval: Scalar(F32),
    ):
        unscaled, found = [], None
        for i, n in enumerate(sizes):
            g = Tensor(F16, [n], Local, f"g{i}")
            gsum = AllReduce("+", g).named(f"gsum{i}")
            g32 = (Cast(F32, gsum) / scale).named(f"gu{i}")
            # x - x is 0 for a finite x and NaN for inf or NaN, which equals nothing
            bad = ReduceMax(Ite(Eq(g32 - g32, 0.0), Const(F32, 0.0), 1.0)).named(f"bad{i}")
            found = bad if found is None else Max(found, bad)
            unscaled.append(g32)
        ok = Eq(found, 0.0).named("ok")
        bias1 = 1 - beta1**step
        bias2 = 1 - beta2**step
        for i, (n, g32) in enumerate(zip(sizes, unscaled)):
            w = Tensor(F32, [n], Replicated, f"w{i}")
            m = Tensor(F32, [n], Replicated, f"m{i}")
            v = Tensor(F32, [n], Replicated, f"v{i}")
            m_new = (beta1 * m + (1 - beta1) * g32).named(f"m_new{i}")
            v_new = (beta2 * v + (1 - beta2) * g32 * g32).named(f"v_new{i}")
            w_new = (w - lr * (m_new / bias1) / (Sqrt(v_new / bias2) + eps)).named(f"w_new{i}")
            Update(m, Ite(ok, m_new, m))
            Update(v, Ite(ok, v_new, v))
            Update(w, Ite(ok, w_new, w))
        clean = Ite(ok, tracker + 1, Const(F32, 0.0)).named("clean")
        grow = Eq(clean, interval).named("grow")
        Update(scale, Ite(ok, Ite(grow, scale * 2, scale), scale * 0.5))
        Update(tracker, Ite(grow, Const(F32, 0.0), clean))

    return adam_loss_scaling


program = build()
