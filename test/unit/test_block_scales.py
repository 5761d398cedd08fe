"""Block scales (issue #31): coco.quantize / dequantize by one scale per bR x bC block, as
DeepSeek-V3's 1 x 128 and 128 x 128 blocks and MXFP8 use it. Scale element (i // bR, j // bC)
scales element (i, j); the sim and the host kernels equal an independent NumPy / ml_dtypes
reference bit for bit, for both fp8 types, f32, bf16 and f16 inputs, blocks along a row, a
column and both, degenerate scales (0, negative, inf, NaN, tiny, huge), on 1 to 4 ranks with
uneven cuts: a replicated scale of a sliced tensor (each kernel reads the block of the
element's global coordinate), and a scale cut with the tensor on block boundaries (any other
cut refused at launch). The verifier's refusals and the round trip are lit chunks
(test/filecheck/dialects/coco/verify.mlir, ops.mlir)."""

from __future__ import annotations

import functools
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import coconet
from coconet.core.program import CocoError, Program, parse_module
from coconet.dialects import comm
from coconet.lowering.lower_to_plan import lower
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_pipeline, apply_schedule, launch_ranks, named_schedules
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

FP8 = {"f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E5M2": ml_dtypes.float8_e5m2}
WIDE = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
# ordinary, then degenerate: zero (x / 0 saturates, 0 / 0 is NaN), negative, inf, NaN,
# tiny (quotients saturate), huge (quotients underflow to zero)
SCALES = (1.0, 0.5, 3.0, 1 / 448, 2.0**-20, 1e30, 0.0, -2.0, np.inf, np.nan, 2.0**-14)
ROWS, COLS = 16, 24
# scale shapes of x [16, 24]: blocks of 1 x 8 (along a row), 4 x 1 (along a column), 4 x 8
BLOCKS = {"row": (ROWS, 3), "column": (4, COLS), "tile": (4, 3)}


def expand(s: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Each scale value repeated over its block of `shape`."""
    for d, n in enumerate(shape):
        s = np.repeat(s, n // s.shape[d], axis=d)
    return s


def reference(x: np.ndarray, s: np.ndarray, fp8: str) -> tuple[np.ndarray, np.ndarray]:
    """The codes and the dequantized values, from ml_dtypes alone: x / s in f32, clipped to
    the largest finite fp8 value (NaN stays), rounded once to fp8; the codes times s in f32,
    rounded once to x's type."""
    top = np.float32(ml_dtypes.finfo(FP8[fp8]).max)
    full = expand(s, x.shape).astype(np.float32)
    with np.errstate(all="ignore"):
        q = np.clip(x.astype(np.float32) / full, -top, top).astype(FP8[fp8])
        d = (q.astype(np.float32) * full).astype(x.dtype)
    return q, d


def same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[want.dtype.itemsize]
    g, w = np.asarray(got).view(bits), np.asarray(want).view(bits)
    g_nan, w_nan = np.isnan(np.asarray(got, np.float32)), np.isnan(want.astype(np.float32))
    # a NaN matches any NaN (the sign of NaN * NaN is the operand order a compiler picks)
    off = (g != w) & ~(g_nan & w_nan)
    assert not off.any(), f"{what}: {off.sum()} differ, e.g. {got[off][:4]} vs {want[off][:4]}"


def both(program: Program, inputs: dict, ranks: int) -> list[dict]:
    """The sim's outputs and the host kernels' on `ranks` in-process ranks."""
    sim = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
    return [sim, ThreadedExecutor(lower(program, ranks)).run(inputs)]


def scaled_program(src: str, fp8: str, scales: dict[str, str], x_layout: str) -> Program:
    """x [16, 24] (of layout `x_layout`, grid sized at launch) quantized and dequantized back
    by each scale of `scales` (name -> its type's shape and layout)."""
    t, q = (
        f"!coco.tensor<{ROWS}x{COLS}x{src}{x_layout}>",
        f"!coco.tensor<{ROWS}x{COLS}x{fp8}{x_layout}>",
    )
    args = [f"%x: {t}"] + [f"%{n}: !coco.tensor<{st}>" for n, st in scales.items()]
    body, outs = [], []
    for n, st in scales.items():
        s = f"!coco.tensor<{st}>"
        body += [
            f"  %q_{n} = coco.quantize %x, %{n} : {t}, {s} -> {q}",
            f"  %d_{n} = coco.dequantize %q_{n}, %{n} : {q}, {s} -> {t}",
        ]
        outs += [(f"%q_{n}", q), (f"%d_{n}", t)]
    return Program(
        parse_module(
            f"func.func @blocks({', '.join(args)}) -> ({', '.join(ty for _, ty in outs)}) "
            "attributes {coco.grid = #coco.grid<[?]>} {\n" + "\n".join(body) + "\n"
            f"  func.return {', '.join(v for v, _ in outs)} : {', '.join(ty for _, ty in outs)}\n}}\n"
        )
    )


def edges(fp8: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` values among every fp8 value, the ties between neighbours and the f32 values next
    to them, beyond the largest finite value, signed zeros, infinities and NaN."""
    every = np.arange(256, dtype=np.uint8).view(FP8[fp8]).astype(np.float32)
    finite = np.sort(every[np.isfinite(every)])
    ties = (finite[:-1] + finite[1:]) / 2
    near = np.concatenate([np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
    top = finite[-1]
    extra = np.array([top * 1.1, top * 4, 0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    pool = np.concatenate([finite, ties, near, extra])
    return rng.choice(np.concatenate([pool, -pool]), n)


def scale_values(shape: tuple[int, ...], src: str, rng: np.random.Generator) -> np.ndarray:
    """Every SCALES value on some block, the rest ordinary powers of two and fractions."""
    n = int(np.prod(shape))
    values = np.concatenate([SCALES, rng.choice([0.25, 1.5, 2.0**-7, 96.0], n)])[:n]
    with np.errstate(over="ignore"):  # 1e30 is inf in f16
        return rng.permutation(values).reshape(shape).astype(WIDE[src])


@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("src", list(WIDE))
def test_replicated_block_scales_of_sliced_rows(fp8: str, src: str) -> None:
    """A scale per 1 x 8, 4 x 1 and 4 x 8 block, replicated, of rows sliced over 1 to 4 ranks
    (16 rows: 6, 5, 5 at 3 ranks, so blocks of 4 rows straddle the cuts)."""
    shapes = {n: "x".join(map(str, s)) + f"x{src}" for n, s in BLOCKS.items()}
    program = scaled_program(src, fp8, shapes, ", sliced<0>")
    rng = np.random.default_rng(len(src) + len(fp8))
    with np.errstate(over="ignore"):
        x = edges(fp8, ROWS * COLS, rng).reshape(ROWS, COLS).astype(WIDE[src])
    inputs = {"x": x} | {n: scale_values(s, src, rng) for n, s in BLOCKS.items()}
    for ranks in (1, 2, 3, 4):
        for got in both(program, inputs, ranks):
            for n in BLOCKS:
                want_q, want_d = reference(x, inputs[n], fp8)
                same_bits(got[f"q_{n}"], want_q, f"q by {n} blocks at {ranks} ranks")
                same_bits(got[f"d_{n}"], want_d, f"d by {n} blocks at {ranks} ranks")


def test_block_scales_cut_with_the_tensor_on_block_boundaries() -> None:
    """A scale sliced with the rows: 4 blocks of 4 rows run where the ranks divide 4 and are
    refused at launch elsewhere ([quantize-block-slices]); a scale per 1 x 8 block (a block
    of one row: every cut is on its boundaries) runs at every rank count, 7 included."""
    fp8, src = "f8E4M3FN", "f32"
    program = scaled_program(
        src, fp8, {"tile": "4x3xf32, sliced<0>", "row": f"{ROWS}x3xf32, sliced<0>"}, ", sliced<0>"
    )
    assert launch_ranks(program, (1, 2, 3, 4, 7)) == (1, 2, 4)
    with pytest.raises(CocoError, match=r"\[quantize-block-slices\].*4 blocks of 4 along dim 0"):
        coconet.run(program, ranks=3)
    rows = scaled_program(src, fp8, {"row": f"{ROWS}x3xf32, sliced<0>"}, ", sliced<0>")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32) * 64
    inputs = {"x": x, "tile": scale_values((4, 3), src, rng)}
    inputs["row"] = scale_values((ROWS, 3), src, rng)
    for p, ranks in [(program, 2), (program, 4), (rows, 3), (rows, 7)]:
        for got in both(
            p, {k: inputs[k] for k in ("x", *(a.name for a in p.arguments[1:]))}, ranks
        ):
            for n in ("tile", "row") if p is program else ("row",):
                want_q, want_d = reference(x, inputs[n], fp8)
                same_bits(got[f"q_{n}"], want_q, f"q by {n} at {ranks} ranks")
                same_bits(got[f"d_{n}"], want_d, f"d by {n} at {ranks} ranks")


def test_block_scales_on_a_two_axis_grid() -> None:
    """x [16, 20] cut by both axes of a [2, ?] grid, its 4 x 4 blocks' scale cut with the rows
    by axis 0 (on block boundaries) and replicated on axis 1, whose uneven cuts of the
    columns (7, 7, 6 at 3) the kernels cross by the elements' global columns."""
    t = "!coco.tensor<16x20xbf16, [sliced<0>, sliced<1>]>"
    q = "!coco.tensor<16x20xf8E5M2, [sliced<0>, sliced<1>]>"
    s = "!coco.tensor<4x5xf32, [sliced<0>, replicated]>"
    program = Program(
        parse_module(
            f"func.func @grid2(%x: {t}, %s: {s}) -> ({q}, {t}) attributes "
            "{coco.grid = #coco.grid<[2, ?]>} {\n"
            f"  %q = coco.quantize %x, %s : {t}, {s} -> {q}\n"
            f"  %d = coco.dequantize %q, %s : {q}, {s} -> {t}\n"
            f"  func.return %q, %d : {q}, {t}\n}}\n"
        )
    )
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 20)) * 1000).astype(ml_dtypes.bfloat16)
    scale = scale_values((4, 5), "f32", rng)
    want_q, want_d = reference(x, scale, "f8E5M2")
    for ranks in (2, 6):
        for got in both(program, {"x": x, "s": scale}, ranks):
            same_bits(got["q"], want_q, f"q at {ranks} ranks")
            same_bits(got["d"], want_d, f"d at {ranks} ranks")


def blockwise_current_scaling(block: int = 8):
    """The front end's block scale: the amax of each 1 x `block` block of the rows (a reshape
    and a max over its last dim), over 448, DeepSeek-V3's activation scaling."""
    from coconet import frontend
    from coconet.frontend import (
        F8E4M3FN,
        F32,
        Abs,
        AMax,
        Dequantize,
        Quantize,
        Reshape,
        Sliced,
        Tensor,
    )

    @frontend.program(grid=[None])
    def blockwise(x: Tensor(F32, [ROWS, COLS], Sliced(0))):
        scale = AMax(Abs(Reshape(x, [ROWS, COLS // block, block])), dims=2) / 448.0
        codes = Quantize(x, scale, F8E4M3FN)
        values = Dequantize(codes, scale, F32)
        return codes, values

    return blockwise


def test_front_end_block_scales_from_the_blocks_amax() -> None:
    fn = blockwise_current_scaling()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    x *= np.float32(2.0) ** (
        np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3) % 9 * 3 - 12
    ).repeat(8, 1)
    amax = np.abs(x).reshape(ROWS, 3, 8).max(axis=2)
    scale = (amax / np.float32(448.0)).astype(np.float32)
    want_q, want_d = reference(x, scale, "f8E4M3FN")
    # every block's largest magnitude lands on the largest finite code
    assert (np.abs(want_q.astype(np.float32)).reshape(ROWS, 3, 8).max(axis=2) == 448).all()
    for ranks in (1, 3):
        for got in both(fn, {"x": x}, ranks):
            same_bits(got["codes"], want_q, f"codes at {ranks} ranks")
            same_bits(got["values"], want_d, f"values at {ranks} ranks")


@functools.cache
def epilogue(scale_shape: str) -> Program:
    """examples/allreduce_rmsnorm_fp8 (all_reduce, residual, RMSNorm, e4m3 quantize) with a
    block scale of `scale_shape` instead of its per-tensor one."""
    text = (Path(__file__).parents[2] / "examples" / "allreduce_rmsnorm_fp8.mlir").read_text()
    block = f"!coco.tensor<{scale_shape}xbf16>"
    text = text.replace("%scale: !coco.tensor<bf16>", f"%scale: {block}")
    text = text.replace(
        "!coco.tensor<bf16> -> !coco.tensor<16x64xf8E4M3FN>",
        f"{block} -> !coco.tensor<16x64xf8E4M3FN>",
    )
    return Program(parse_module(text))


def _schedules_match_the_sim(scale_shape: str, ranks: tuple[int, ...]) -> None:
    from coconet.runtime.sim import prepare_inputs

    program = epilogue(scale_shape)
    names = named_schedules(program)
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)"} <= set(names), names
    for n in ranks:
        inputs = prepare_inputs(program, None, (n,), seed=n)
        inputs["scale"] = (np.abs(inputs["scale"].astype(np.float32)) + 0.01).astype(
            ml_dtypes.bfloat16
        )
        want = coconet.run(program, inputs, ranks=n, inplace=False).outputs
        for name in names:
            got = ThreadedExecutor(lower(apply_schedule(program, name), n)).run(inputs)
            for value, w in want.items():
                same_bits(got[value], w, f"{value} under {name} at {n} ranks")


def test_block_scales_under_the_named_schedules() -> None:
    """The fused epilogue (ONE kernel under fuse(rs-c-ag), the row form) and the split one
    read a replicated 4 x 8 block scale, and a 16 x 8 one sliced with the rows inside the
    kernel, at rows cut unevenly (16 over 3 ranks); split, the quantize moves onto the slices,
    so the all_gather still moves fp8."""
    for shape in ("4x8", "16x8"):
        _schedules_match_the_sim(shape, (3,))
        split = apply_schedule(epilogue(shape), "rs-c-ag")
        gathers = [op for op in split.func.walk() if isinstance(op, comm.AllGatherOp)]
        assert "f8E4M3FN" in {op.result.type.elt for op in gathers}, split


def test_a_dense_constant_block_scale_fused_into_its_kernel() -> None:
    """A block scale written as a dense constant: `coco-fuse{mode=elementwise}` takes it into
    the quantize's kernel (a feeder), which reads its values at each element's block."""
    t = "!coco.tensor<8x16xf32, sliced<0>>"
    q = "!coco.tensor<8x16xf8E4M3FN, sliced<0>>"
    c = "!coco.tensor<2x4xf32>"
    values = np.array([[0.5, 2.0, 3.0, 0.0], [-1.0, np.inf, 1 / 448, 1e-9]], np.float32)
    program = Program(
        parse_module(
            f"func.func @dense(%x: {t}) -> {q} attributes {{coco.grid = #coco.grid<[?]>}} {{\n"
            f"  %s = coco.constant dense<[[0.5, 2.0, 3.0, 0.0], [-1.0, 0x7F800000, "
            f"{float(np.float32(1 / 448))!r}, 1.0e-09]]> : {c}\n"
            f"  %y = coco.mul %x, %x : {t}\n"
            f"  %q = coco.quantize %y, %s : {t}, {c} -> {q}\n"
            f"  func.return %q : {q}\n}}\n"
        )
    )
    fused = apply_pipeline(program, "coco-fuse{mode=elementwise}")
    assert any(isinstance(op, comm.FusedOp) for op in fused.func.walk()), fused
    x = np.random.default_rng(2).standard_normal((8, 16)).astype(np.float32) * 8
    want_q, _ = reference(x * x, values, "f8E4M3FN")
    for ranks in (1, 3):
        for p in (program, fused):
            got = ThreadedExecutor(lower(p, ranks)).run({"x": x})
            same_bits(got["q"], want_q, f"q at {ranks} ranks")
        same_bits(coconet.run(program, {"x": x}, ranks=ranks)["q"], want_q, "the sim's q")


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["1x8", "16x8", "4x1", "2x64", "8x32", "64"])
def test_block_scales_under_the_named_schedules_sweep(shape: str) -> None:
    _schedules_match_the_sim(shape, (1, 2, 3, 4))


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_block_scale_kernels_compile_with_nvrtc() -> None:
    """The block-scaled quantize and dequantize kernels (a per-rank block offset, a scale cut
    with the tensor) and the fused epilogue compile for sm_90 without a warning."""
    shapes = {"tile": "4x3xf32, sliced<0>", "row": f"{ROWS}x3xbf16", "column": "4x24xf32"}
    sources = [
        lower(scaled_program("f32", "f8E4M3FN", shapes, ", sliced<0>"), 2).cuda_source,
        lower(apply_schedule(epilogue("4x8"), "fuse(rs-c-ag)"), 3).cuda_source,
    ]
    for source in sources:
        assert compile_cuda(source, "sm_90", warnings_as_errors=True).binary
