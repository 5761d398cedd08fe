"""AllReduce + residual + RMSNorm + fp8 quantize of the output: the inference epilogue of
TensorRT-LLM / FlashInfer (the next GEMM reads fp8 activations). Each rank's row-parallel
projection output [T, H] (local partial sums, bf16) is all_reduced, the residual added (the
new residual stream is an output too), RMSNorm'd over the hidden dim, and the normalized rows
quantized to f8E4M3FN with a static (calibrated, per tensor) scale passed in: x / scale
rounded saturating. Same IR as allreduce_rmsnorm_fp8.mlir.

Schedules: ar-c (as written: the all_reduce, then the norm and the quantize on every rank's
whole tensor); rs-c-ag (split along the tokens: each rank normalizes and quantizes whole rows
of its slice, then all_gathers the residual and the fp8 rows); fuse(rs-c-ag) (ONE kernel:
reduce_scatter, residual, RMSNorm, quantize and an all_gather that moves the output in fp8).
`build(dtype, out=None)` gives the same epilogue without the quantize (the benchmark's
baselines).
"""

from coconet import frontend
from coconet.frontend import (
    BF16,
    F8E4M3FN,
    AllReduce,
    Local,
    Quantize,
    Replicated,
    RMSNorm,
    Scalar,
    Tensor,
)

T, H = 16, 64  # tokens, hidden


def build(dtype=BF16, out=F8E4M3FN, tokens: int = T, width: int = H):
    """The epilogue in `dtype`, its output quantized to `out` (None: left in `dtype`)."""

    @frontend.program(grid=[None])
    def allreduce_rmsnorm_fp8(
        x: Tensor(dtype, [tokens, width], Local),
        residual: Tensor(dtype, [tokens, width], Replicated),
        weight: Tensor(dtype, [width], Replicated),
    ):
        total = AllReduce("+", x)
        hidden = total + residual
        normed = RMSNorm(hidden, weight, eps=1e-6)
        if out is None:
            return hidden, normed
        scale = Scalar(dtype, "scale")  # the dequantization scale: a code of 1 stands for it
        q = Quantize(normed, scale, out)
        return hidden, q

    return allreduce_rmsnorm_fp8


program = build()  # what coconet.load() picks up
