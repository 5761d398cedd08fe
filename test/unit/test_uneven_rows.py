"""Row-wise ops over dims cut unevenly (issue #25, item 1).

`coco.reduce_dims` over a dim that does not divide by its ranks once passed every rank the
largest piece's extent as a literal, so a smaller rank read past its piece: row sums came back
wrong, with exit 0. This family runs every row-wise op -- sum/max/min/mean reductions, over the
sliced dim (partials combined by an all_reduce) and beside it (whole rows of a slice), softmax,
RMSNorm, LayerNorm and a vocab-parallel log-sum-exp -- over dims cut unevenly at 2, 3, 4 and 7
ranks, in every element type a reduction takes: the sim against independent NumPy, and the
lowered plan (every named schedule) on the cpu backend's kernels against the sim. MPI ranks run
the same programs in test/mpi/test_mpi_cpu.py."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

import coconet
from coconet.core.program import Program, parse_module
from coconet.core.values import bits_dtype
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Launch, RankValue
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules

RANKS = (2, 3, 4, 7)
UNEVEN_ROW_BLOCK = Path(__file__).parent / "programs" / "uneven_row_block.mlir"
ROWS, MID, COLS = 23, 11, 45  # no rank count above 1 divides any of them
FLOATS = ("f32", "f16", "bf16", "f64", "f8E4M3FN", "f8E5M2")
INTS = ("i32", "i64")
# the tolerance of the oracle against NumPy's own (differently ordered, f64) reductions
# fp8: two ulps at 1, as for bf16 (a sliced dim's partials round once more)
RTOL = {"f32": 1e-5, "f64": 1e-12, "f16": 2e-3, "bf16": 2e-2, "f8E4M3FN": 0.25, "f8E5M2": 0.5}


def _t(shape: tuple[int, ...], elt: str, layout: str = "") -> str:
    dims = "".join(f"{n}x" for n in shape)
    return f"!coco.tensor<{dims}{elt}{', ' + layout if layout else ''}>"


@functools.cache
def reduce_program(kind: str, elt: str, sliced: int, dims: tuple[int, ...], keep: bool) -> Program:
    """`reduce_dims kind` of x [ROWS, MID, COLS] (sliced on `sliced`) over `dims`; a reduction of
    the sliced dim gives this rank's partial, which an all_reduce combines."""
    shape = (ROWS, MID, COLS)
    xt = _t(shape, elt, f"sliced<{sliced}>")
    out_shape = (
        tuple(1 if d in dims else n for d, n in enumerate(shape))
        if keep
        else tuple(n for d, n in enumerate(shape) if d not in dims)
    )
    keepdims = " keepdims" if keep else ""
    head = f"%r = coco.reduce_dims {kind} %x dims {list(dims)}{keepdims}"
    if sliced in dims:
        partial = _t(out_shape, elt, "local")
        whole = _t(out_shape, elt)
        body = (
            f"  %p = coco.reduce_dims {kind} %x dims {list(dims)}{keepdims} : {xt} -> {partial}\n"
            f"  %r = comm.all_reduce {kind} %p : {partial} -> {whole}\n"
        )
        rt = whole
    else:
        new_dim = sliced if keep else sliced - sum(1 for d in dims if d < sliced)
        rt = _t(out_shape, elt, f"sliced<{new_dim}>")
        body = f"  {head} : {xt} -> {rt}\n"
    text = f"func.func @rows(%x: {xt}) -> {rt} {{\n{body}  func.return %r : {rt}\n}}\n"
    return Program(parse_module(text))


NUMPY = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}


def _numpy_reduce(kind: str, x: np.ndarray, dims: tuple[int, ...], keep: bool) -> np.ndarray:
    ml_float = bits_dtype(x.dtype) is not None  # bf16, fp8
    wide = x.astype(np.float64) if x.dtype.kind == "f" or ml_float else x
    if kind == "sum" and x.dtype.kind == "i":
        return np.sum(x, axis=dims, keepdims=keep, dtype=x.dtype)
    return NUMPY[kind](wide, axis=dims, keepdims=keep)


def _check_reference(
    kind: str, elt: str, got: np.ndarray, want: np.ndarray, magnitude: np.ndarray | float = 1.0
) -> None:
    """`magnitude`: the sum of the |terms| behind each result where per-rank partials are
    rounded before they are added (the usual error bound of a sum whose partials round: a
    few ulps of it, which matters for fp8's 3 or 2 mantissa bits)."""
    if elt in INTS or kind in ("max", "min"):
        assert np.array_equal(got.astype(want.dtype), want)
    else:
        got = got.astype(np.float64)
        bound = RTOL[elt] * (np.maximum(magnitude, 1.0) + np.abs(want))
        off = ~(np.abs(got - want) <= bound)
        assert not off.any(), f"{off.sum()} off: {got[off][:4]} vs {want[off][:4]}"


def _run_everywhere(program: Program, ranks: int, seed: int) -> tuple[dict, dict]:
    """The sim's outputs and the cpu backend's (plan on in-process ranks) for one input."""
    plan = lower(program, ranks)
    inputs = prepare_inputs(program, None, plan.grid_shape, seed=seed)
    want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
    got = ThreadedExecutor(plan).run(inputs)
    return inputs, {"sim": want, "cpu": got}


CASES = [
    # (kind, sliced dim, reduced dims, keepdims)
    ("sum", 0, (2,), True),  # whole rows of an uneven row slice
    ("max", 0, (1, 2), False),
    ("mean", 2, (0,), True),  # reduce beside the uneven slice
    ("min", 1, (0,), False),
    ("sum", 2, (2,), True),  # the uneven dim itself: partials + all_reduce
    ("max", 2, (1, 2), False),
    ("min", 0, (0, 1), True),
    ("sum", 1, (0, 1, 2), False),
]


@pytest.mark.parametrize(
    ("case", "elt"),
    [
        pytest.param(c, elt, id=f"{c[0]}-s{c[1]}-d{''.join(map(str, c[2]))}-{elt}")
        for c in CASES
        for elt in FLOATS + INTS
        if c[0] != "mean" or elt in FLOATS  # a mean of integers is refused: [element-types]
    ],
)
def test_row_reductions_over_uneven_cuts(case, elt):
    kind, sliced, dims, keep = case
    program = reduce_program(kind, elt, sliced, dims, keep)
    for ranks in RANKS:
        inputs, out = _run_everywhere(program, ranks, seed=ranks)
        want = _numpy_reduce(kind, inputs["x"], dims, keep)
        partials = sliced in dims and kind in ("sum", "mean")
        magnitude = (
            _numpy_reduce(kind, np.abs(inputs["x"].astype(np.float64)), dims, keep)
            if partials
            else 1.0
        )
        _check_reference(kind, elt, out["sim"]["r"], want, magnitude)
        exact = sliced not in dims or kind != "sum" or elt in INTS
        if exact:  # rank order is the oracle's: the kernels reproduce it exactly
            assert np.array_equal(out["cpu"]["r"], out["sim"]["r"]), f"{ranks} ranks"
        else:  # MPI's f32 sum of the partials reassociates
            _check_reference(kind, elt, out["cpu"]["r"], want, magnitude)


def test_the_plan_passes_each_rank_its_own_extents():
    """The row kernel's counts are per-rank tables where pieces differ: a literal of the
    largest piece is what made smaller ranks read past theirs."""
    plan = lower(reduce_program("sum", "f32", 2, (2,), True), 2)
    (launch,) = [s for s in plan.steps if isinstance(s, Launch) and "reduce_dims" in s.kernel]
    _, _, rows, count, inner = launch.args
    assert isinstance(count, RankValue)
    assert count.table == (23, 22)
    assert rows == ROWS * MID
    assert inner == 1
    plan = lower(reduce_program("sum", "f32", 0, (2,), True), 7)
    (launch,) = [s for s in plan.steps if isinstance(s, Launch) and "reduce_dims" in s.kernel]
    _, _, rows, count, _ = launch.args
    assert isinstance(rows, RankValue)
    assert rows.table == (44, 44, 33, 33, 33, 33, 33)
    assert count == COLS


def _row_block(elt: str) -> str:
    """Softmax, RMSNorm and LayerNorm of an all_reduced [ROWS, COLS] block, and a
    vocab-parallel log-sum-exp over COLS sliced: every row-wise op the examples use."""
    return UNEVEN_ROW_BLOCK.read_text().replace("f32", elt)


def _block_reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    h = inputs["p"].astype(np.float64).sum(axis=0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    mu = h.mean(axis=1, keepdims=True)
    lg = inputs["logits"].astype(np.float64)
    m = lg.max(axis=1, keepdims=True)
    return {
        "softmax": e / e.sum(axis=1, keepdims=True),
        "rms": h / np.sqrt((h * h).mean(axis=1, keepdims=True) + 1e-5),
        "ln": (h - mu) / np.sqrt(((h - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5),
        "lse": np.log(np.exp(lg - m).sum(axis=1, keepdims=True)) + m,
    }


BLOCK_TOL = {
    "f32": 1e-4,
    "f64": 1e-10,
    "f16": 3e-2,
    "bf16": 1e-1,
    # LayerNorm's h - mean cancels: fp8's rounding of h shows (measured 0.27 and 0.76)
    "f8E4M3FN": 0.5,
    "f8E5M2": 1.0,
}


@pytest.mark.parametrize("elt", FLOATS)
def test_softmax_and_norms_over_uneven_rows_under_every_schedule(elt):
    """The row block as written and under every named schedule (rs-c-ag cuts the rows
    unevenly; fuse(rs-c-ag) runs them in the fused row kernel) at 2, 3, 4 and 7 ranks: the
    sim against NumPy, each schedule's plan on the cpu kernels against the sim."""
    from coconet.runtime.check import compare_piece

    program = Program(parse_module(_row_block(elt)))
    schedules = {"as written": program} | {
        name: apply_schedule(program, name) for name in named_schedules(program)
    }
    assert len(schedules) >= 3, list(schedules)
    for ranks in RANKS:
        inputs, out = _run_everywhere(program, ranks, seed=10 + ranks)
        for name, want in _block_reference(inputs).items():
            got = out["sim"][name].astype(np.float64)
            np.testing.assert_allclose(got, want, rtol=BLOCK_TOL[elt], atol=BLOCK_TOL[elt])
        for name, scheduled in schedules.items():
            got = ThreadedExecutor(lower(scheduled, ranks)).run(inputs)
            for value, want in out["sim"].items():
                diff, _, _ = compare_piece(value, 0, got[value], want)
                assert diff is None, f"{name} at {ranks} ranks: {diff}"


@pytest.mark.parametrize("elt", ["f32", "bf16", "f64", "f8E4M3FN", "i32"])
def test_thread_and_block_per_row_forms_give_the_same_bits(elt, monkeypatch):
    """`coco.reduce_dims` lowers to a block per row or a thread per row (short or strided
    rows); both walk the oracle's lanes in its order, so each form, forced on rows of 70
    (two or three elements a lane, the last lanes short), strided (inner 45) and contiguous,
    over an uneven row slice at 3 and 7 ranks, gives the sim's bits for every kind."""
    import coconet.lowering.lower_to_plan as lowering

    xt = _t((23, 70, 45), elt, "sliced<0>")
    lines, results = [], []
    kinds = ("sum", "max", "min") if elt in INTS else ("sum", "max", "min", "mean")
    shapes = (((1,), (23, 1, 45)), ((2,), (23, 70, 1)), ((1, 2), (23, 1, 1)))
    for kind in kinds:
        for i, (dims, out) in enumerate(shapes):
            rt = _t(out, elt, "sliced<0>")
            d = ", ".join(map(str, dims))
            r = f"%{kind}{i}"
            lines.append(f"  {r} = coco.reduce_dims {kind} %x dims [{d}] keepdims : {xt} -> {rt}")
            results.append((r, rt))
    names, types = ", ".join(n for n, _ in results), ", ".join(t for _, t in results)
    text = "\n".join(
        [
            f"func.func @rows(%x: {xt}) -> ({types}) {{",
            *lines,
            f"  func.return {names} : {types}",
            "}",
        ]
    )
    program = Program(parse_module(text))
    for ranks in (3, 7):
        sources = set()
        for column in (True, False):
            monkeypatch.setattr(lowering, "column_form", lambda *_a, c=column: c)
            plan = lower(program, ranks)
            sources.add(plan.cuda_source)
            inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
            want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
            got = ThreadedExecutor(plan).run(inputs)
            assert set(got) == set(want)
            assert len(want) == len(results)
            for name, value in want.items():
                assert np.array_equal(got[name], value, equal_nan=True), (name, ranks, column)
        assert len(sources) == 2  # the two forms, each checked
