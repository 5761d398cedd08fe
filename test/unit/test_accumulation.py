"""A reduction's stated accumulation (`acc`, issue #31 item 2; docs/architecture.md §3.4.3):
the sim against an independent NumPy loop, the library and fused-kernel lowerings against
the sim (bit for bit), and the equivalence checker's path tolerances (item 5)."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

import coconet
from coconet.core.program import Program, parse_module
from coconet.core.tolerances import TOLERANCES
from coconet.equivalence import check_equivalence
from coconet.lowering.lower_to_plan import lower
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule
from coconet.toolchain.nvrtc import nvrtc_available

DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f8E4M3FN": ml_dtypes.float8_e4m3fn}
ACC = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
# each data type with the accumulations that hold it (bf16 does not hold f16)
CASES = [("bf16", "f32"), ("bf16", "bf16"), ("f16", "f32"), ("f16", "f16"),
         ("f8E4M3FN", "f32"), ("f8E4M3FN", "bf16")]  # fmt: skip


@functools.cache
def program(elt: str, acc: str | None, n: int = 96) -> Program:
    stated = f" acc {acc}" if acc else ""
    loc, full = f"!coco.tensor<{n}x{elt}, local>", f"!coco.tensor<{n}x{elt}>"
    return Program(
        parse_module(
            f"func.func @r(%g: {loc}) -> {full} attributes {{coco.grid = #coco.grid<[?]>}} {{\n"
            f"  %s = comm.all_reduce sum %g{stated} : {loc} -> {full}\n"
            f"  func.return %s : {full}\n}}\n"
        )
    )


def numpy_reference(stack: np.ndarray, elt: str, acc: str) -> np.ndarray:
    """Rank-order sum, each partial rounded to `acc` by NumPy / ml_dtypes arithmetic in the
    accumulation type itself (its correctly rounded addition), then to the element type."""
    a = ACC[acc]
    total = stack[0].astype(a)
    for x in stack[1:]:
        total = (total + x.astype(a)).astype(a)
    return total.astype(np.float32).astype(DTYPES[elt])


def _signed_inputs(elt: str, ranks: int, n: int = 96) -> np.ndarray:
    # mixed signs and magnitudes: partial sums that cancel and round at every step
    rng = np.random.default_rng(ranks)
    x = rng.standard_normal((ranks, n)) * np.exp2(rng.integers(-3, 4, (ranks, n)))
    return x.astype(DTYPES[elt])


@pytest.mark.parametrize(("elt", "acc"), CASES)
def test_sim_rounds_every_step_to_the_accumulation(elt: str, acc: str) -> None:
    differs = False
    for ranks in (2, 3, 4, 7):
        g = _signed_inputs(elt, ranks)
        got = coconet.run(program(elt, acc), {"g": g}, ranks=ranks, inplace=False)["s"]
        want = numpy_reference(g, elt, acc)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (ranks, got, want)
        default = coconet.run(program(elt, None), {"g": g}, ranks=ranks, inplace=False)["s"]
        differs |= not np.array_equal(got.view(np.uint8), default.view(np.uint8))
    # a narrow accumulation is not the default (f64, rounded once) under another name (f32's
    # partials rarely round where a short sum's bf16 result would tell)
    assert differs or acc == "f32"


def test_acc_f64_is_the_default() -> None:
    g = _signed_inputs("bf16", 7)
    got = coconet.run(program("bf16", "f64"), {"g": g}, ranks=7, inplace=False)["s"]
    want = coconet.run(program("bf16", None), {"g": g}, ranks=7, inplace=False)["s"]
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


ADAM = "examples/adam_bf16_grads.mlir"


@functools.cache
def adam(elt: str, acc: str) -> Program:
    from pathlib import Path

    text = (Path(__file__).parents[2] / ADAM).read_text().replace("bf16", elt)
    return Program(parse_module(text.replace("all_reduce sum %g", f"all_reduce sum %g acc {acc}")))


@pytest.mark.parametrize(("elt", "acc"), [("bf16", "bf16"), ("f16", "f32")])
def test_schedules_honour_the_accumulation_bit_for_bit(elt: str, acc: str) -> None:
    """The library path (as written, rs-c-ag) and the fused kernel (fuse(rs-c-ag): float
    registers rounded per step) on the cpu backend equal the sim of the program as written."""
    p = adam(elt, acc)
    for ranks in (3,):  # an odd group: uneven slices, a peer batch's select
        inputs = prepare_inputs(p, None, (ranks,), seed=ranks)
        want = coconet.run(p, inputs, ranks=ranks, inplace=False).outputs
        for name in ("", "rs-c-ag", "fuse(rs-c-ag)"):
            scheduled = apply_schedule(p, name) if name else p
            plan = lower(scheduled, ranks)
            if name == "rs-c-ag":
                assert f"reduce_scatter sum %g -> %g1_rs over [0] acc {acc}" in plan.format()
            if name == "fuse(rs-c-ag)":  # float registers, rounded per step below f32
                assert "float g1_rs_acc = " in plan.cuda_source
                assert ("coco_round_bf16(g1_rs_acc" in plan.cuda_source) == (acc == "bf16")
            got = ThreadedExecutor(plan).run(inputs)
            for k, w in want.items():
                assert np.array_equal(np.asarray(got[k]).view(np.uint8), w.view(np.uint8)), (
                    name,
                    ranks,
                    k,
                )


@pytest.mark.skipif(not nvrtc_available(), reason="the cuda backend compiles with NVRTC")
@pytest.mark.parametrize(("elt", "acc"), [("bf16", "bf16"), ("f16", "f32")])
def test_the_cuda_backend_honours_the_accumulation_bit_for_bit(elt: str, acc: str) -> None:
    """On the strict GPU double (3 ranks, one GPU each): the library path's reduce_scatter
    through NCCL (rs-c-ag) and the fused kernel (fuse(rs-c-ag)) equal the sim's pieces."""
    from cuda_double import on_fake_gpus

    from coconet.core import values as V

    p, ranks = adam(elt, acc), 3
    inputs = prepare_inputs(p, None, (ranks,), seed=ranks)
    want = coconet.run(p, inputs, ranks=ranks, inplace=False).outputs
    for name in ("rs-c-ag", "fuse(rs-c-ag)"):
        plan = lower(apply_schedule(p, name), ranks)

        def body(r, runner, backend, plan=plan):
            coords = V.coords_of(r, plan.grid_shape)
            runner.set_inputs(
                {
                    n: V.piece_of(inputs[n], buf.type, coords, plan.grid_shape)
                    for n, buf in plan.arguments.items()
                }
            )
            runner.run()
            return {n: backend.read(buf) for n, buf in plan.outputs.items()}

        for r, got in enumerate(on_fake_gpus(plan, ranks, body)):
            coords = V.coords_of(r, plan.grid_shape)
            for k, buf in plan.outputs.items():
                piece = V.piece_of(want[k], buf.type, coords, plan.grid_shape)
                assert np.array_equal(
                    np.asarray(got[k]).view(np.uint8), np.asarray(piece).view(np.uint8)
                ), (name, r, k)


def test_front_end_states_the_accumulation() -> None:
    from coconet import frontend
    from coconet.frontend import BF16, F8E4M3FN, F32, AllReduce, Local, ReduceScatter, Tensor

    @frontend.program(grid=[None])
    def f(g: Tensor(BF16, [8], Local)):
        return AllReduce("+", g, acc=F32), ReduceScatter("+", g, acc=BF16)

    text = str(f.module)
    assert "comm.all_reduce sum %g acc f32" in text
    assert "comm.reduce_scatter sum %g acc bf16" in text
    with pytest.raises(coconet.CocoError, match=r"\[all-reduce-acc\]"):

        @frontend.program(grid=[None])
        def bad(g: Tensor(BF16, [8], Local)):
            return AllReduce("+", g, acc=F8E4M3FN)


# -- the equivalence checker: tolerances from the ops on each output's path ------------------


def _cast_out(acc: str | None, elt: str = "bf16", n: int = 256) -> Program:
    """A bf16 all_reduce whose f32 cast is the output."""
    stated = f" acc {acc}" if acc else ""
    loc, full, wide = (
        f"!coco.tensor<{n}x{elt}, local>",
        f"!coco.tensor<{n}x{elt}>",
        f"!coco.tensor<{n}xf32>",
    )
    return Program(
        parse_module(
            f"func.func @c(%g: {loc}) -> {wide} attributes {{coco.grid = #coco.grid<[?]>}} {{\n"
            f"  %s = comm.all_reduce sum %g{stated} : {loc} -> {full}\n"
            f"  %y = coco.cast %s : {full} -> {wide}\n"
            f"  func.return %y : {wide}\n}}\n"
        )
    )


def test_a_wrong_accumulation_is_caught_where_the_dtype_tolerance_misses_it() -> None:
    """acc f32 turned into acc bf16 moves a bf16 sum by an ulp or two: within bf16's
    per-dtype tolerance, so a tolerant comparison by dtype would pass it. Both programs state
    their accumulation, which every lowering honours bit for bit: the path is exact."""
    before, after = program("bf16", "f32", 256), program("bf16", "bf16", 256)
    ranks = (4, 7)
    report = check_equivalence(before, after, ranks=ranks, seeds=(0,), exact=False)
    assert report.mismatched_outputs() == ["s"]
    # ... where the per-dtype tolerance alone does not see it:
    bf16 = TOLERANCES["bf16"]
    for n in ranks:
        g = prepare_inputs(before, None, (n,), 0)["g"]
        a = coconet.run(before, {"g": g}, ranks=n, inplace=False)["s"].astype(np.float64)
        b = coconet.run(after, {"g": g}, ranks=n, inplace=False)["s"].astype(np.float64)
        assert not np.array_equal(a, b)
        assert (np.abs(a - b) <= bf16.atol + bf16.rtol * np.abs(a)).all()
    # dropping a stated accumulation (a pass that loses it) is caught too
    dropped = check_equivalence(after, program("bf16", None, 256), ranks=ranks, exact=False)
    assert dropped.mismatched_outputs() == ["s"]


def test_an_f32_output_of_a_bf16_reduction_takes_bf16s_tolerance() -> None:
    """`coco-run --check` of a backend whose library sums a default (unstated) bf16
    all_reduce in bf16 (NCCL's ring rounds at every hop; here acc bf16 plays it): the f32
    output's per-dtype tolerance flags the bf16 rounding (an ulp of bf16 is 65536 of f32),
    the path's bf16 sum bounds it. Where the program states its accumulation, the path is
    exact and the same result is a mismatch."""
    from coconet.core.path_tolerances import path_tolerances
    from coconet.runtime.check import compare_outputs

    unstated, ring = _cast_out(None), _cast_out("bf16")
    g = prepare_inputs(unstated, None, (7,), 0)["g"]
    want = coconet.run(unstated, {"g": g}, ranks=7, inplace=False).per_rank
    got = coconet.run(ring, {"g": g}, ranks=7, inplace=False).per_rank
    assert not compare_outputs(got, want).ok  # per dtype: f32's, mis-flagged
    paths = path_tolerances(unstated, TOLERANCES)
    assert paths == {"y": TOLERANCES["bf16"]}
    assert compare_outputs(got, want, paths).ok
    # the program states f32 accumulation: honoured bit for bit, so a backend's bf16 sum is
    # caught (exact mode of the checker too)
    stated = _cast_out("f32")
    assert path_tolerances(stated, TOLERANCES)["y"].exact
    assert not compare_outputs(got, want, path_tolerances(stated, TOLERANCES)).ok
    assert check_equivalence(stated, ring, ranks=(7,), seeds=(0,)).mismatched_outputs() == ["y"]


def test_a_wrong_scale_is_caught_on_a_tolerant_path() -> None:
    """A scale off by one bf16 ulp after an accumulation the program states: no reduction on
    the path may move, so the comparison is exact even when tolerant."""
    before = _cast_out("f32")
    text = str(before.module).replace(
        "func.return %y",
        "%k = coco.constant 1.0078125 : !coco.tensor<f32>\n"
        "    %z = coco.mul %y, %k : !coco.tensor<256xf32>, !coco.tensor<f32> -> "
        "!coco.tensor<256xf32>\n    func.return %z",
    )
    after = Program(parse_module(text))
    report = check_equivalence(before, after, ranks=(2,), seeds=(0,), exact=False)
    assert report.mismatched_outputs() == ["y"]
