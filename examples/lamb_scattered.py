"""LAMB over a model's many parameter tensors of different sizes (CoCoNet's "scattered
tensors", reference sec. 6.3). Same IR as lamb_scattered.mlir.

Every parameter tensor keeps its own trust ratio norm(w_i)/norm(r_i) (per-layer norms), but the
elementwise work of all tensors is the same computation: the lowering runs it as ONE launch over
a table of pointers and sizes instead of one launch per tensor, with no flattening copy.
Schedules: AR_C (one all_reduce per tensor, batched kernels); RS_C_AG and fuse_RS_C_AG as for
LAMB.
"""

from coconet import frontend
from coconet.frontend import F32, AllReduce, Local, Norm, Replicated, Scalar, Sqrt, Tensor, Update

# Layer sizes: an embedding, two projections and a bias, all divisible by 8 ranks.
SIZES = (2048, 1024, 512, 64)


def build(sizes=SIZES):
    @frontend.program(grid=[None])
    def lamb_scattered(
        lr: Scalar(F32),
        beta1: Scalar(F32),
        beta2: Scalar(F32),
        eps: Scalar(F32),
        weight_decay: Scalar(F32),
        step: Scalar(F32),
    ):
        bias1 = 1 - beta1**step
        bias2 = 1 - beta2**step
        for i, n in enumerate(sizes):
            g = Tensor(F32, [n], Local, f"g{i}")
            w = Tensor(F32, [n], Replicated, f"w{i}")
            m = Tensor(F32, [n], Replicated, f"m{i}")
            v = Tensor(F32, [n], Replicated, f"v{i}")
            # Per-tensor names (xDSL folds `x_1`-style suffixes, so number them plainly).
            gsum = AllReduce("+", g).named(f"gsum{i}")
            m_new = (beta1 * m + (1 - beta1) * gsum).named(f"m_new{i}")
            v_new = (beta2 * v + (1 - beta2) * gsum * gsum).named(f"v_new{i}")
            Update(m, m_new)
            Update(v, v_new)
            r = ((m_new / bias1) / (Sqrt(v_new / bias2) + eps) + weight_decay * w).named(f"r{i}")
            Update(w, (w - lr * (Norm(w) / Norm(r)) * r).named(f"w_new{i}"))

    return lamb_scattered


program = build()
