"""FSDP-style fp8 parameter all_gather (FSDP2's float8 all_gather, torchao's current scaling):
each rank keeps an f32 master slice of the weight (`sliced<0>`); before the forward the
slices are quantized to f8E4M3FN with one scale per tensor computed in the program (amax =
the all_reduced max of |w|, scale = amax / 448, the largest e4m3 value), gathered in fp8 (1
byte an element on the wire instead of 4), dequantized and multiplied with the replicated
activations. Same IR as fp8_allgather_matmul.mlir.

Schedules: as written (abs, the partial max, an all_reduce max of one scalar, the scale
and quantize kernels, a library all_gather of the fp8 slices, dequantize, the GEMM; ar-c's
pipeline `coco-fuse{mode=elementwise}` folds the scale into the quantize kernel) and
`fuse(ag)`: the quantize (on each rank's slice, staged once), the fp8 exchange and the
dequantize (on each pulled element) as one kernel. The split and fused all_reduce schedules
need an all_reduce of a tensor (this one's is a scalar), and `ol(ag,mm)` needs a matmul
reading the all_gather itself, where here it reads the dequantized weight. `build(F32)` and
`build(BF16)` give the same GEMM with the weight gathered in f32 or cast to bf16 (the
benchmark's baselines).
"""

from coconet import frontend
from coconet.frontend import (
    BF16,
    F8E4M3FN,
    F8E5M2,
    F32,
    Abs,
    AllGather,
    AllReduce,
    Cast,
    Dequantize,
    MatMul,
    Quantize,
    ReduceMax,
    Replicated,
    Sliced,
    Tensor,
)

T, K, N = 16, 64, 32  # tokens, in features (the sliced dim), out features

FP8_MAX = {F8E4M3FN: 448.0, F8E5M2: 57344.0}  # the largest finite value of each fp8 type


def build(wire=F8E4M3FN, tokens: int = T, k: int = K, n: int = N):
    """The weight on the wire as `wire`: an fp8 type (current scaling), BF16 or F32."""

    @frontend.program(grid=[None])
    def fp8_allgather_matmul(
        w: Tensor(F32, [k, n], Sliced(0)),
        x: Tensor(F32, [tokens, k], Replicated),
    ):
        if wire == F32:
            wd = AllGather(w)
        elif wire == BF16:
            wd = Cast(F32, AllGather(Cast(BF16, w)))
        else:
            amax = AllReduce("max", ReduceMax(Abs(w)))
            scale = amax / FP8_MAX[wire]
            wq = Quantize(w, scale, wire)
            wg = AllGather(wq)
            wd = Dequantize(wg, scale, F32)
        y = MatMul(x, wd)
        return y

    return fp8_allgather_matmul


program = build()  # what coconet.load() picks up
