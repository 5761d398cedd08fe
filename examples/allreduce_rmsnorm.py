"""AllReduce + residual + RMSNorm, the fused kernel of inference engines (vLLM, FlashInfer,
TensorRT-LLM): each rank's row-parallel projection output [T, H] (local partial sums) is
all_reduced, the residual added (the new residual stream is an output too), then RMSNorm
over the hidden dim with a learned weight. Same IR as allreduce_rmsnorm.mlir.

Schedules: AR_C (as written: all_reduce, then the norm on every rank's whole tensor); RS_C_AG
(split along the tokens, so each rank normalizes whole rows of its slice, then all_gathers
the residual and the normalized rows). `build(F32)` gives the same program in fp32.
"""

from coconet import frontend
from coconet.frontend import F16, AllReduce, Local, Replicated, RMSNorm, Tensor

T, H = 16, 64  # tokens, hidden


def build(dtype=F16):
    @frontend.program(grid=[None])
    def allreduce_rmsnorm(
        x: Tensor(dtype, [T, H], Local),
        residual: Tensor(dtype, [T, H], Replicated),
        weight: Tensor(dtype, [H], Replicated),
    ):
        total = AllReduce("+", x)
        hidden = total + residual
        normed = RMSNorm(hidden, weight, eps=1e-6)
        return hidden, normed

    return allreduce_rmsnorm


program = build()  # what coconet.load() picks up
