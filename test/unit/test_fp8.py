"""fp8 (f8E4M3FN, f8E5M2) as element types: `coco.cast` to and from every float type is
ml_dtypes' `astype`, bit for bit, in the sim and in the host kernels (coco_device.h's
conversion), on every fp8 code, every tie between two fp8 values and the overflow, subnormal
and NaN edges; arithmetic on fp8 computes in f32 and rounds once; collectives move fp8 as
bytes and reduce it exactly (in f64, rounded once) at 2, 3, 4 and 7 ranks, on in-process ranks
and MPI ranks, as written and under every named schedule."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

import coconet
from coconet.core.program import Program, parse_module
from coconet.lowering.lower_to_plan import lower
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

FP8 = {"f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E5M2": ml_dtypes.float8_e5m2}
WIDE = {
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "f32": np.float32,
    "f64": np.float64,
}
RANKS = (2, 3, 4, 7)


@functools.cache
def cast_program(src: str, dst: str, n: int) -> Program:
    t, u = f"!coco.tensor<{n}x{src}>", f"!coco.tensor<{n}x{dst}>"
    return Program(
        parse_module(
            f"func.func @cast(%x: {t}) -> {u} {{\n"
            f"  %y = coco.cast %x : {t} -> {u}\n"
            f"  func.return %y : {u}\n}}\n"
        )
    )


def _both(program: Program, inputs: dict, ranks: int = 1) -> tuple[dict, dict]:
    sim = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
    cpu = ThreadedExecutor(lower(program, ranks)).run(inputs)
    return sim, cpu


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
    g, w = np.asarray(got).view(bits), np.asarray(want).view(bits)
    off = g != w
    assert not off.any(), f"{off.sum()} differ, e.g. {got[off][:4]} vs {want[off][:4]}"


def _same_values(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bits, except that a NaN matches any NaN of the same sign (the sign and payload
    of NaN from a conversion differ between f16 libraries)."""
    with np.errstate(invalid="ignore"):  # e5m2's signalling NaNs widen to signalling NaNs
        g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    assert (np.isnan(g) == nan).all()
    assert (np.signbit(g[nan]) == np.signbit(w[nan])).all()
    _same_bits(got[~nan], want[~nan])


def _edges(dtype: object) -> np.ndarray:
    """Every fp8 value, the ties between neighbours and the f32 values either side of each,
    beyond the largest finite value, the smallest subnormals' halves, signed zeros, inf, NaN."""
    every = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
    finite = np.sort(every[np.isfinite(every)])
    ties = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)
    near = (ties.view(np.uint32)[:, None] + np.arange(-2, 3, dtype=np.int64)).ravel()
    top = finite[-1]
    tiny = finite[finite > 0][0]
    extra = [top * 1.0625, top * 1.1, top * 2, tiny / 2, tiny / 4, tiny * 0.75, 0.0, -0.0]
    extra += [np.inf, -np.inf, np.nan, -np.nan, 1e30, -1e30, 1e-30]
    x = np.concatenate(
        [finite, ties, near.astype(np.uint32).view(np.float32), np.array(extra, np.float32)]
    ).astype(np.float32)
    return np.concatenate([x, -x])


@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("wide", list(WIDE))
def test_casts_from_fp8_are_exact(fp8: str, wide: str) -> None:
    every = np.arange(256, dtype=np.uint8).view(FP8[fp8])
    sim, cpu = _both(cast_program(fp8, wide, 256), {"x": every})
    with np.errstate(invalid="ignore"):
        want = every.astype(np.float32).astype(WIDE[wide])
    _same_values(sim["y"], want)
    _same_values(cpu["y"], want)


@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("wide", list(WIDE))
def test_casts_to_fp8_round_as_ml_dtypes(fp8: str, wide: str) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        x = _edges(FP8[fp8]).astype(WIDE[wide])
        want = x.astype(FP8[fp8])
    sim, cpu = _both(cast_program(wide, fp8, len(x)), {"x": x})
    _same_bits(sim["y"], want)
    _same_bits(cpu["y"], want)


def test_casts_between_the_two_fp8_types() -> None:
    for src, dst in (("f8E4M3FN", "f8E5M2"), ("f8E5M2", "f8E4M3FN")):
        every = np.arange(256, dtype=np.uint8).view(FP8[src])
        with np.errstate(over="ignore", invalid="ignore"):
            want = every.astype(np.float32).astype(FP8[dst])
        sim, cpu = _both(cast_program(src, dst, 256), {"x": every})
        _same_bits(sim["y"], want)
        _same_bits(cpu["y"], want)


@functools.cache
def arithmetic_program(elt: str, n: int) -> Program:
    t = f"!coco.tensor<{n}x{elt}>"
    return Program(
        parse_module(
            f"func.func @f(%a: {t}, %b: {t}) -> ({t}, {t}, {t}) {{\n"
            f"  %s = coco.add %a, %b : {t}\n"
            f"  %p = coco.mul %a, %b : {t}\n"
            f"  %e = coco.exp %a : {t}\n"
            f"  func.return %s, %p, %e : {t}, {t}, {t}\n}}\n"
        )
    )


@pytest.mark.parametrize("fp8", list(FP8))
def test_arithmetic_computes_in_f32_and_rounds_once(fp8: str) -> None:
    """Every pair of fp8 values: a + b and a * b in f32 (exact for fp8 operands) rounded once
    to fp8, overflowing as a cast does; exp in f64 rounded once."""
    codes = np.arange(256, dtype=np.uint8)
    a = np.repeat(codes, 256).view(FP8[fp8])
    b = np.tile(codes, 256).view(FP8[fp8])
    sim, cpu = _both(arithmetic_program(fp8, len(a)), {"a": a, "b": b})
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    with np.errstate(all="ignore"):
        want = {
            "s": (fa + fb).astype(FP8[fp8]),
            "p": (fa * fb).astype(FP8[fp8]),
            "e": coconet.core.values.round_f64(np.exp(fa.astype(np.float64)), fp8),
        }
    for name, w in want.items():
        _same_bits(sim[name], w)
        _same_bits(cpu[name], w)


@functools.cache
def collectives_program(elt: str) -> Program:
    """An all_reduce of fp8 gradients, a reduce_scatter, an all_gather of an fp8 slice and an
    all_to_all: each over an uneven cut of 13 x 9."""
    loc, full = f"!coco.tensor<13x9x{elt}, local>", f"!coco.tensor<13x9x{elt}>"
    s0, s1 = f"!coco.tensor<13x9x{elt}, sliced<0>>", f"!coco.tensor<13x9x{elt}, sliced<1>>"
    return Program(
        parse_module(
            f"func.func @c(%g: {loc}, %h: {loc}, %w: {s0}) -> ({full}, {s0}, {full}, {s1}) "
            "attributes {coco.grid = #coco.grid<[?]>} {\n"
            f"  %r = comm.all_reduce sum %g : {loc} -> {full}\n"
            f"  %rs = comm.reduce_scatter sum %h : {loc} -> {s0}\n"
            f"  %ag = comm.all_gather %w : {s0} -> {full}\n"
            f"  %aa = comm.all_to_all %w : {s0} -> {s1}\n"
            f"  func.return %r, %rs, %ag, %aa : {full}, {s0}, {full}, {s1}\n}}\n"
        )
    )


@pytest.mark.parametrize("fp8", list(FP8))
def test_collectives_on_fp8_match_numpy_and_the_sim(fp8: str) -> None:
    program = collectives_program(fp8)
    for ranks in RANKS:
        inputs = prepare_inputs(program, None, (ranks,), seed=ranks)
        sim, cpu = _both(program, inputs, ranks)
        for name, (value, reduced) in {"r": ("g", True), "rs": ("h", True)}.items():
            stack = inputs[value].astype(np.float64)  # (ranks, 13, 9)
            want = coconet.core.values.round_f64(stack.sum(axis=0), fp8)
            _same_bits(sim[name], want)
            assert reduced
        _same_bits(sim["ag"], inputs["w"])
        _same_bits(sim["aa"], inputs["w"])
        for name in sim:  # exact combines in rank order: the kernels are the sim
            _same_bits(cpu[name], sim[name])


def _fp8_adam(elt: str) -> Program:
    from pathlib import Path

    text = (Path(__file__).parents[2] / "examples" / "adam_bf16_grads.mlir").read_text()
    return Program(parse_module(text.replace("bf16", elt)))


@pytest.mark.parametrize("fp8", list(FP8))
def test_fp8_gradients_under_every_named_schedule(fp8: str) -> None:
    """Adam with fp8 gradients (the bf16-gradient example's program in fp8): every named
    schedule, at 2, 3 and 4 ranks, on the cpu kernels, equal to the sim as written."""
    from coconet.runtime.check import compare_piece

    program = _fp8_adam(fp8)
    names = named_schedules(program)
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)"} <= set(names), names
    for ranks in (2, 3, 4):
        inputs = prepare_inputs(program, None, (ranks,), seed=ranks)
        want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
        for name in names:
            got = ThreadedExecutor(lower(apply_schedule(program, name), ranks)).run(inputs)
            for value, w in want.items():
                diff, _, _ = compare_piece(value, 0, got[value], w)
                assert diff is None, f"{name} at {ranks} ranks: {diff}"


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_fp8_kernels_compile_with_nvrtc() -> None:
    """The cuda unit of fp8 casts, arithmetic and the fused fp8-gradient Adam compiles for
    sm_80, sm_89 (the first with fp8 instructions) and sm_90 without a warning."""
    units = [
        lower(cast_program("f32", "f8E4M3FN", 64), 1).cuda_source,
        lower(arithmetic_program("f8E5M2", 64), 1).cuda_source,
        lower(apply_schedule(_fp8_adam("f8E4M3FN"), "fuse(rs-c-ag)"), 2).cuda_source,
    ]
    for source in units:
        for arch in ("sm_80", "sm_89", "sm_90"):
            assert compile_cuda(source, arch, warnings_as_errors=True).binary
