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


def _same_values(got: np.ndarray, want: np.ndarray, *, nan_sign: bool = True) -> None:
    """Equal bits, except that a NaN matches any NaN of the same sign (the sign and payload
    of NaN from a conversion differ between f16 libraries) -- of any sign with `nan_sign`
    False: IEEE leaves the sign of NaN * NaN to the operand order a compiler picks."""
    with np.errstate(invalid="ignore"):  # e5m2's signalling NaNs widen to signalling NaNs
        g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    assert (np.isnan(g) == nan).all()
    assert not nan_sign or (np.signbit(g[nan]) == np.signbit(w[nan])).all()
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
    """The cuda unit of fp8 casts, arithmetic, quantize and dequantize compiles for sm_80,
    sm_89 (the first with fp8 instructions) and sm_90 without a warning; the fused
    fp8-gradient Adam for sm_90."""
    small = [
        lower(cast_program("f32", "f8E4M3FN", 64), 1).cuda_source,
        lower(arithmetic_program("f8E5M2", 64), 1).cuda_source,
        lower(quantize_program("f64", "f8E4M3FN", 64, (8, 1)), 1).cuda_source,
    ]
    for arch in ("sm_80", "sm_89", "sm_90"):
        assert compile_cuda("\n".join(small[:1]), arch, warnings_as_errors=True).binary
    for source in small[1:]:
        assert compile_cuda(source, "sm_89", warnings_as_errors=True).binary
    fused = lower(apply_schedule(_fp8_adam("f8E4M3FN"), "fuse(rs-c-ag)"), 2).cuda_source
    assert compile_cuda(fused, "sm_90", warnings_as_errors=True).binary


@functools.cache
def quantize_program(src: str, fp8: str, n: int, scale_shape: tuple[int, ...]) -> Program:
    """quantize x [n/8, 8] by a scale of `scale_shape` (per tensor, row or element), and
    dequantize the codes back to `src` with the same scale."""
    shape = f"{n // 8}x8x"
    t, q = f"!coco.tensor<{shape}{src}>", f"!coco.tensor<{shape}{fp8}>"
    dims = "".join(f"{d}x" for d in scale_shape)
    s = f"!coco.tensor<{dims}{src}>"
    return Program(
        parse_module(
            f"func.func @q(%x: {t}, %s: {s}) -> ({q}, {t}) {{\n"
            f"  %q = coco.quantize %x, %s : {t}, {s} -> {q}\n"
            f"  %d = coco.dequantize %q, %s : {q}, {s} -> {t}\n"
            f"  func.return %q, %d : {q}, {t}\n}}\n"
        )
    )


def _quantize_reference(x: np.ndarray, s: np.ndarray, fp8: str) -> tuple[np.ndarray, np.ndarray]:
    """ml_dtypes' saturating conversion, written independently of coconet: x / s in the
    compute type (f64 for f64, else f32), clipped to the largest finite fp8 value, rounded
    once; the codes times s, rounded once to x's type."""
    cdt = np.float64 if x.dtype == np.float64 else np.float32
    top = float(ml_dtypes.finfo(FP8[fp8]).max)
    with np.errstate(all="ignore"):
        v = np.clip(x.astype(cdt) / s.astype(cdt), -top, top)
        q = coconet.core.values.round_f64(v, fp8)
        d = q.astype(cdt) * s.astype(cdt)
        elt = {np.dtype(v): k for k, v in WIDE.items()}[np.dtype(x.dtype)]
        return q, coconet.core.values.round_f64(d, elt)


SCALES = (1.0, 0.5, 3.0, 1 / 448, 2.0**-20, 1e30, 0.0, -2.0, np.inf, np.nan)


@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("src", list(WIDE))
def test_quantize_saturates_and_dequantize_scales_back(fp8: str, src: str) -> None:
    """Per-tensor scales from ordinary to degenerate (0, negative, inf, NaN, subnormal-making),
    on every fp8 tie and edge: the sim and the host kernels equal the independent reference
    bit for bit."""
    with np.errstate(over="ignore"):  # 1e30 in f16 is inf
        x = _edges(FP8[fp8]).astype(WIDE[src])
    x = np.concatenate([x, np.zeros((-len(x)) % 8, x.dtype)])
    program = quantize_program(src, fp8, len(x), ())
    for scale in SCALES:
        with np.errstate(over="ignore"):
            s = np.array(scale, dtype=WIDE[src])
        want_q, want_d = _quantize_reference(x.reshape(-1, 8), s, fp8)
        sim, cpu = _both(program, {"x": x.reshape(-1, 8), "s": s})
        for got in (sim, cpu):
            _same_bits(got["q"], want_q)
            _same_values(got["d"], want_d, nan_sign=False)


@pytest.mark.parametrize("fp8", list(FP8))
def test_row_scales_on_sliced_rows_at_every_rank_count(fp8: str) -> None:
    """A scale per row ([R, 1], the rowwise granularity), rows sliced unevenly over 2, 3, 4
    and 7 ranks (the scale sliced with them), amax computed in the program."""
    rows = 29
    t = f"!coco.tensor<{rows}x16xf32, sliced<0>>"
    r = f"!coco.tensor<{rows}x1xf32, sliced<0>>"
    q = f"!coco.tensor<{rows}x16x{fp8}, sliced<0>>"
    top = float(ml_dtypes.finfo(FP8[fp8]).max)
    program = Program(
        parse_module(
            f"func.func @rows(%x: {t}) -> ({q}, {t}) attributes "
            "{coco.grid = #coco.grid<[?]>} {\n"
            f"  %a = coco.abs %x : {t}\n"
            f"  %m = coco.reduce_dims max %a dims [1] keepdims : {t} -> {r}\n"
            f"  %top = coco.constant {top!r} : !coco.tensor<f32>\n"
            f"  %s = coco.div %m, %top : {r}, !coco.tensor<f32> -> {r}\n"
            f"  %q = coco.quantize %x, %s : {t}, {r} -> {q}\n"
            f"  %d = coco.dequantize %q, %s : {q}, {r} -> {t}\n"
            f"  func.return %q, %d : {q}, {t}\n}}\n"
        )
    )
    for ranks in RANKS:
        x = np.random.default_rng(ranks).standard_normal((rows, 16)).astype(np.float32)
        # rows of magnitudes 2^-12 .. 2^12: one scale per row keeps each in range
        x *= np.float32(2.0) ** (np.arange(rows, dtype=np.float32)[:, None] % 7 * 4 - 12)
        s = (np.abs(x).max(axis=1, keepdims=True) / np.float32(top)).astype(np.float32)
        want_q, want_d = _quantize_reference(x, s, fp8)
        sim, cpu = _both(program, {"x": x}, ranks)
        for got in (sim, cpu):
            _same_bits(got["q"], want_q)
            _same_bits(got["d"], want_d)
        # the row's largest magnitude lands on the largest finite code, none beyond
        assert (np.abs(want_q.astype(np.float32)).max(axis=1) == top).all()


@functools.cache
def wire_program(narrow: str, wide: str, extra_reader: bool, n: int = 1003) -> Program:
    """Adam's moment update on gradients that arrive narrow and are widened before the
    all_reduce: `cast` then `all_reduce` in the wide type (the accumulation type stated by
    the all_reduce's type), over `n` elements."""
    g, gw = f"!coco.tensor<{n}x{narrow}, local>", f"!coco.tensor<{n}x{wide}, local>"
    t = f"!coco.tensor<{n}x{wide}>"
    ret = f", {gw}" if extra_reader else ""
    val = ", %gw" if extra_reader else ""
    return Program(
        parse_module(
            f"func.func @wire(%g: {g}, %m: {t}) -> ({t}{ret}) "
            "attributes {coco.grid = #coco.grid<[?]>} {\n"
            f"  %gw = coco.cast %g : {g} -> {gw}\n"
            f"  %r = comm.all_reduce sum %gw : {gw} -> {t}\n"
            f"  %h = coco.constant 0.5 : !coco.tensor<{wide}>\n"
            f"  %d = coco.mul %h, %r : !coco.tensor<{wide}>, {t} -> {t}\n"
            f"  %m1 = coco.add %m, %d : {t}\n"
            f"  func.return %m1{val} : {t}{ret}\n}}\n"
        )
    )


WIRES = [("bf16", "f32"), ("f16", "f32"), ("f8E4M3FN", "f32"), ("f8E5M2", "f32")]
WIRES += [("f8E4M3FN", "bf16"), ("f8E5M2", "f16"), ("f32", "f64")]


@pytest.mark.parametrize(("narrow", "wide"), WIRES)
def test_fused_reduce_scatters_pull_the_narrow_type_through_an_exact_widening(narrow, wide):
    """Under fuse(rs-c-ag), peers read the gradient in its narrow type (the wire carries 1 or
    2 bytes an element, not 4) and widen it as they accumulate: no cast kernel, the narrow
    argument symmetric, and every rank's result the sim's bit for bit at 2, 3, 4 and 7
    ranks."""
    program = wire_program(narrow, wide, extra_reader=False)
    fused = apply_schedule(program, "fuse(rs-c-ag)")
    for ranks in RANKS:
        plan = lower(fused, ranks)
        text = plan.format()
        assert "k_cast" not in text, text
        assert "peers(%g)" in text, text
        assert "peers(%gw)" not in text, text
        assert plan.arguments["g"].symmetric
        inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
        want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
        got = ThreadedExecutor(plan).run(inputs)
        _same_bits(got["m1"], want["m1"])


def test_a_widening_read_elsewhere_or_a_rounding_cast_stays_a_kernel():
    """The narrow wire needs a cast that changes no value and that only the fused
    reduce_scatter reads; otherwise the cast is computed and its result is what peers read."""
    read_too = lower(
        apply_schedule(wire_program("bf16", "f32", extra_reader=True), "fuse(rs-c-ag)"), 2
    )
    assert "k_cast" in read_too.format()
    assert "peers(%gw)" in read_too.format()
    rounding = lower(
        apply_schedule(wire_program("f32", "bf16", extra_reader=False), "fuse(rs-c-ag)"), 2
    )
    assert "k_cast" in rounding.format()
    assert "peers(%gw)" in rounding.format()
    across = lower(
        apply_schedule(wire_program("bf16", "f32", False, 1024), "fuse(rs-c-ag)"),
        4,
        nodes=(0, 0, 1, 1),
    )
    assert "peers(%g)" not in across.format()


def _scaled_program(scale_op: str, reduce_in: str) -> Program:
    """Quantize a gradient that is all_reduced in `reduce_in` (f32 after a widening cast, or
    fp8 itself), by a per-tensor scale `scale_op` applies to %s."""
    loc8, loc32 = "!coco.tensor<64xf8E4M3FN, local>", "!coco.tensor<64xf32, local>"
    t32, t8, s = "!coco.tensor<64xf32>", "!coco.tensor<64xf8E4M3FN>", "!coco.tensor<f32>"
    if reduce_in == "f32":
        reduce = (
            f"  %gw = coco.cast %g : {loc8} -> {loc32}\n"
            f"  %r = comm.all_reduce sum %gw : {loc32} -> {t32}\n"
        )
    else:
        reduce = (
            f"  %r8 = comm.all_reduce sum %g : {loc8} -> {t8}\n"
            f"  %r = coco.cast %r8 : {t8} -> {t32}\n"
        )
    return Program(
        parse_module(
            f"func.func @p(%g: {loc8}, %s: {s}) -> {t8} "
            "attributes {coco.grid = #coco.grid<[?]>} {\n"
            f"{reduce}"
            f"  %k = coco.constant 1.0625 : {s}\n"
            f"  %s2 = {scale_op} : {s}\n"
            f"  %q = coco.quantize %r, %s2 : {t32}, {s} -> {t8}\n"
            f"  func.return %q : {t8}\n}}\n"
        )
    )


def test_the_equivalence_checker_catches_a_wrong_scale_or_accumulation():
    """Translation validation knows fp8: a rewrite that scales by 1/16 more, or that
    accumulates in fp8 instead of f32, is reported; the program itself is equivalent."""
    from coconet.equivalence import check_equivalence

    right = _scaled_program("coco.max %s, %s", "f32")
    assert check_equivalence(right, right, ranks=(2, 4)).ok
    wrong_scale = _scaled_program("coco.mul %s, %k", "f32")
    report = check_equivalence(right, wrong_scale, ranks=(2, 4))
    assert not report.ok, str(report)
    wrong_accumulation = _scaled_program("coco.max %s, %s", "f8E4M3FN")
    report = check_equivalence(right, wrong_accumulation, ranks=(2, 4))
    assert not report.ok, str(report)


def test_a_reassociated_fp8_sum_is_compared_within_fp8_tolerance():
    """coco-reorder turns a sum of an fp8 all_gather's squares into per-slice partials (each
    rounded to fp8) and an all_reduce: translation validation compares what follows within
    fp8's tolerance, as for bf16 (the fuzzer found it compared fp8 exactly: NumPy calls
    ml_dtypes' types kind 'V', not 'f')."""
    from coconet.equivalence import check_equivalence
    from coconet.schedule import apply_pipeline

    loc, s, t = (f"!coco.tensor<16xf8E4M3FN{lay}>" for lay in (", local", ", sliced<0>", ""))
    one = "!coco.tensor<f8E4M3FN>"
    program = Program(
        parse_module(
            f"func.func @r(%g: {loc}, %w: {t}) -> ({t}, {one}) "
            "attributes {coco.grid = #coco.grid<[?]>} {\n"
            f"  %rs = comm.reduce_scatter sum %g : {loc} -> {s}\n"
            f"  %ag = comm.all_gather %rs : {s} -> {t}\n"
            f"  %sq = coco.mul %ag, %ag : {t}\n"
            f"  %n = coco.reduce sum %sq : {t} -> {one}\n"
            f"  %r = coco.sqrt %n : {one}\n"
            f"  %u = coco.div %ag, %r : {t}, {one} -> {t}\n"
            f"  %w1 = coco.sub %w, %u : {t}\n"
            f"  func.return %w1, %n : {t}, {one}\n}}\n"
        )
    )
    reordered = apply_pipeline(program, "coco-reorder")
    assert "_part" in str(reordered.module)  # the sum was reassociated
    report = check_equivalence(program, reordered, ranks=(2, 4), seeds=(0, 1, 2))
    assert report.ok, str(report)
    assert report.reassociated, str(report)


def test_peer_sums_accumulate_in_float_only_where_float_is_exact() -> None:
    """A fused kernel sums a group's e4m3 codes in float up to EXACT_E4M3_TERMS members, and
    takes the max or min of any float in float: the bits the oracle's double gives. The premise
    checked on the worst codes (the largest, the smallest subnormal, mixed signs): every
    partial float sum of 64 of them equals the double one; past 73 terms a float sum rounds."""
    from coconet.dialects.reduction import Reduction
    from coconet.lowering.kernels.elements import EXACT_E4M3_TERMS, peer_accumulator
    from coconet.lowering.signature import F32, F64

    assert peer_accumulator("f8E4M3FN", None, Reduction.SUM, EXACT_E4M3_TERMS) == F32
    assert peer_accumulator("f8E4M3FN", None, Reduction.SUM, EXACT_E4M3_TERMS + 1) == F64
    assert peer_accumulator("f8E5M2", None, Reduction.SUM, 2) == F64  # 2^-16 .. 57344: no
    assert peer_accumulator("bf16", None, Reduction.SUM, 2) == F64
    for elt in ("f32", "bf16", "f16", "f8E5M2"):
        assert peer_accumulator(elt, None, Reduction.MAX, 1000) == F32
    assert peer_accumulator("f64", None, Reduction.MAX, 2) == F64

    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    finite = codes[np.isfinite(codes)]
    rng = np.random.default_rng(0)
    worst = [448.0, -448.0, 2.0**-9, -(2.0**-9), 0.875 * 2**-6]
    for _ in range(200):
        terms = rng.choice(np.concatenate([finite, worst * 20]), EXACT_E4M3_TERMS)
        if rng.random() < 0.5:
            terms[: EXACT_E4M3_TERMS // 2] = 448.0  # the largest partial sums
        single = np.cumsum(terms.astype(np.float32), dtype=np.float32)
        assert np.array_equal(single.astype(np.float64), np.cumsum(terms))
    many = np.array([448.0] * 74 + [2.0**-9])
    assert np.float32(many.astype(np.float32).sum(dtype=np.float32)) != many.sum()
