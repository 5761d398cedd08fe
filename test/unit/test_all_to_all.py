"""comm.all_to_all (issue #28): the sim against independent NumPy references, and the cpu
backend (host kernels, in-process ranks over the MPI transport's Alltoallv) against the sim,
bit for bit: every element type, 2-D and 3-D tensors, every pair of dims (a, b) including the
innermost, uneven cuts at 1, 2, 3, 4 and 7 ranks; 2-D grids; the dispatch form on local
tensors; every named schedule of programs holding all_to_alls; the equivalence checker."""

from __future__ import annotations

import functools
import itertools

import ml_dtypes
import numpy as np
import pytest

import coconet
from coconet.compile import apply_pipeline
from coconet.core.program import CocoError, Program, parse_module
from coconet.equivalence import check_equivalence
from coconet.frontend import AllToAll, Local, Tensor, program
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules

DTYPES = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f64": np.dtype(np.float64),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
}
# Sizes no rank count above 1 divides evenly (7 ranks: one or two elements each), save 7 itself.
SHAPES = {2: (11, 9), 3: (10, 7, 9)}
RANKS = (1, 2, 3, 4, 7)
PAIRS = [(rank, a, b) for rank in SHAPES for a, b in itertools.permutations(range(rank), 2)]


def t(shape, elt, layout) -> str:
    dims = "x".join(map(str, shape))
    return f"!coco.tensor<{dims}x{elt}, {layout}>"


@functools.cache
def recut(rank: int, a: int, b: int, elt: str) -> Program:
    shape = SHAPES[rank]
    src, dst = t(shape, elt, f"sliced<{a}>"), t(shape, elt, f"sliced<{b}>")
    text = f"""
func.func @recut(%x: {src}) -> {dst} attributes {{coco.grid = #coco.grid<[?]>}} {{
  %y = comm.all_to_all %x : {src} -> {dst}
  func.return %y : {dst}
}}"""
    return Program(parse_module(text))


def value(shape, dtype: np.dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "i":
        return rng.integers(-1000, 1000, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------------------------
# Independent references: what each rank holds, from np.array_split
# --------------------------------------------------------------------------------------------


def ref_pieces(x: np.ndarray, ranks: int, dim: int) -> list[np.ndarray]:
    """Rank r's piece of `x` sliced along `dim` (the first size % ranks ranks hold one more)."""
    return np.array_split(x, ranks, axis=dim)


def ref_recut(x: np.ndarray, ranks: int, a: int, b: int) -> list[np.ndarray]:
    """The all_to_all written out: rank r sends rank j the columns (along b) of its rows
    (along a) that j keeps; rank j stacks what it receives along a, in rank order."""
    held = ref_pieces(x, ranks, a)
    out = []
    for j in range(ranks):
        received = [ref_pieces(piece, ranks, b)[j] for piece in held]
        out.append(np.concatenate(received, axis=a))
    return out


def ref_dispatch(pieces: list[np.ndarray]) -> list[np.ndarray]:
    """torch's all_to_all_single: block j of rank i becomes block i of rank j."""
    n = len(pieces)
    blocks = [np.split(p, n) for p in pieces]
    return [np.concatenate([blocks[i][j] for i in range(n)]) for j in range(n)]


@pytest.mark.parametrize("elt", DTYPES)
@pytest.mark.parametrize(("rank", "a", "b"), PAIRS)
def test_sim_matches_the_numpy_reference(rank, a, b, elt):
    x = value(SHAPES[rank], DTYPES[elt])
    for ranks in RANKS:
        got = sim.run(recut(rank, a, b, elt), {"x": x}, ranks=ranks)
        want = ref_recut(x, ranks, a, b)
        for r in range(ranks):
            assert np.array_equal(got.per_rank[r]["y"], want[r]), (ranks, r)
            assert np.array_equal(want[r], ref_pieces(x, ranks, b)[r])
        assert np.array_equal(got["y"], x)


@pytest.mark.parametrize("elt", DTYPES)
@pytest.mark.parametrize(("rank", "a", "b"), PAIRS)
def test_cpu_backend_matches_the_sim(rank, a, b, elt):
    p = recut(rank, a, b, elt)
    x = value(SHAPES[rank], DTYPES[elt], seed=1)
    for ranks in RANKS:
        want = sim.run(p, {"x": x}, ranks=ranks)
        plan = lower(p, ranks)
        assert [s.op for s in plan.steps if isinstance(s, Collective)] == ["all_to_all"]
        got = ThreadedExecutor(plan).run({"x": x})
        assert got["y"].dtype == want["y"].dtype
        assert np.array_equal(got["y"], want["y"]), ranks


@pytest.mark.parametrize("elt", ["f32", "bf16", "i64"])
@pytest.mark.parametrize("ranks", RANKS)
def test_kernels_compute_on_recut_pieces(ranks, elt):
    """An elementwise op before and after the exchange: kernels on uneven pieces of either
    layout (3-D, the innermost dim gathered and then re-cut)."""
    shape = SHAPES[3]
    s2, s0 = t(shape, elt, "sliced<2>"), t(shape, elt, "sliced<0>")
    text = f"""
func.func @f(%x: {s2}) -> ({s0}, {s2}) attributes {{coco.grid = #coco.grid<[?]>}} {{
  %u = coco.add %x, %x : {s2}
  %y = comm.all_to_all %u : {s2} -> {s0}
  %z = coco.mul %y, %y : {s0}
  %w = comm.all_to_all %z : {s0} -> {s2}
  func.return %z, %w : {s0}, {s2}
}}"""
    p = Program(parse_module(text))
    x = value(shape, DTYPES[elt], seed=2)
    want = sim.run(p, {"x": x}, ranks=ranks)
    got = ThreadedExecutor(lower(p, ranks)).run({"x": x})
    for k in want.outputs:
        assert np.array_equal(got[k], want[k]), k
    # independently: z = (2x)^2 computed in the compute type and rounded once
    wide = np.float32 if elt != "i64" else np.int64
    z = ((x.astype(wide) * 2).astype(x.dtype).astype(wide) ** 2).astype(x.dtype)
    assert np.array_equal(want["z"], z)


# --------------------------------------------------------------------------------------------
# 2-D grids and the dispatch form
# --------------------------------------------------------------------------------------------

GRID_CASES = [
    # (grid, over, src layouts, dst layouts)
    ("[2, ?]", "over [1]", "[sliced<0>, sliced<1>]", "[sliced<0>, sliced<2>]"),
    ("[2, ?]", "", "[sliced<0>, sliced<0>]", "[sliced<2>, sliced<2>]"),
    ("[2, ?]", "", "[sliced<0>, sliced<1>]", "[sliced<1>, sliced<0>]"),
    ("[2, ?]", "over [1]", "[sliced<0>, sliced<0>]", "[sliced<0>, sliced<1>]"),
    ("[?, 2]", "over [0]", "[sliced<2>, local]", "[sliced<1>, local]"),
    ("[2, ?]", "over [1]", "[replicated, sliced<2>]", "[replicated, sliced<0>]"),
]


@pytest.mark.parametrize(("grid", "over", "src", "dst"), GRID_CASES)
def test_two_dimensional_grids(grid, over, src, dst):
    shape = (9, 10, 7)
    a, b = t(shape, "f32", src), t(shape, "f32", dst)
    text = f"""
func.func @g(%x: {a}) -> {b} attributes {{coco.grid = #coco.grid<{grid}>}} {{
  %y = comm.all_to_all %x {over} : {a} -> {b}
  func.return %y : {b}
}}"""
    p = Program(parse_module(text))
    for ranks in (2, 4, 6):
        want = sim.run(p, None, ranks=ranks, seed=ranks)
        # the logical value does not change (local axes: each slot's own value)
        assert np.array_equal(want["y"], want.inputs["x"])
        got = ThreadedExecutor(lower(p, ranks)).run(want.inputs)
        assert np.array_equal(got["y"], want["y"]), ranks


@pytest.mark.parametrize("elt", DTYPES)
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7])
def test_dispatch_form(ranks, elt):
    @program(grid=[None])
    def dispatch(d: Tensor(getattr(coconet.frontend, elt.upper()), [ranks * 3, 5], Local)):
        return AllToAll(d)

    d = value((ranks, ranks * 3, 5), DTYPES[elt], seed=3)
    want = sim.run(dispatch, {"d": d}, ranks=ranks)
    (name,) = want.outputs
    ref = ref_dispatch(list(d))
    for r in range(ranks):
        assert np.array_equal(want.per_rank[r][name], ref[r])
    got = ThreadedExecutor(lower(dispatch, ranks)).run({"d": d})
    assert np.array_equal(got[name], want[name])


def test_dispatch_blocks_are_checked_at_launch():
    @program(grid=[None])
    def dispatch(d: Tensor(coconet.frontend.F32, [8, 5], Local)):
        return AllToAll(d)

    sim.run(dispatch, None, ranks=4)
    with pytest.raises(CocoError, match=r"\[all-to-all-local\].*8 does not cut into 3 equal"):
        sim.run(dispatch, None, ranks=3)
    with pytest.raises(CocoError, match=r"\[all-to-all-local\]"):
        lower(dispatch, 3)


def test_empty_slices_are_refused_at_launch():
    p = recut(2, 0, 1, "f32")  # 11 x 9: dim 1 has 9 elements
    with pytest.raises(CocoError, match=r"\[empty-slice\]"):
        sim.run(p, None, ranks=10)


# --------------------------------------------------------------------------------------------
# Passes, schedules and the equivalence checker
# --------------------------------------------------------------------------------------------

# Programs where every pass has something to do beside all_to_alls: a model-parallel all_reduce
# of a matmul (ar-c, rs-c-ag, fuse(rs-c-ag), ol(mm,...)); sequence parallelism (ol(ag,mm),
# ol(mm,rs)); a pipeline send of an all_reduce (sliced-send); the dispatch form after a matmul.
SCHEDULED = {
    "mix": """
func.func @mix(%x: !coco.tensor<16x8xf32, sliced<0>>, %w1: !coco.tensor<8x8xf32>,
               %w2: !coco.tensor<8x6xf32, sliced<0>>, %r: !coco.tensor<16x6xf32>)
    -> !coco.tensor<16x6xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %a = coco.matmul %x, %w1 : !coco.tensor<16x8xf32, sliced<0>>, !coco.tensor<8x8xf32> -> !coco.tensor<16x8xf32, sliced<0>>
  %b = comm.all_to_all %a : !coco.tensor<16x8xf32, sliced<0>> -> !coco.tensor<16x8xf32, sliced<1>>
  %c = coco.mul %b, %b : !coco.tensor<16x8xf32, sliced<1>>
  %p = coco.matmul %c, %w2 : !coco.tensor<16x8xf32, sliced<1>>, !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<16x6xf32, local>
  %s = comm.all_reduce sum %p : !coco.tensor<16x6xf32, local> -> !coco.tensor<16x6xf32>
  %u = coco.add %s, %r : !coco.tensor<16x6xf32>
  %v = coco.relu %u : !coco.tensor<16x6xf32>
  func.return %v : !coco.tensor<16x6xf32>
}""",
    "sequence_parallel": """
func.func @sp(%x: !coco.tensor<16x6xf32, sliced<0>>, %w: !coco.tensor<6x4xf32, sliced<1>>,
              %v: !coco.tensor<4x6xf32, sliced<0>>) -> !coco.tensor<16x6xf32, sliced<1>>
    attributes {coco.grid = #coco.grid<[?]>} {
  %g = comm.all_gather %x : !coco.tensor<16x6xf32, sliced<0>> -> !coco.tensor<16x6xf32>
  %h = coco.matmul %g, %w : !coco.tensor<16x6xf32>, !coco.tensor<6x4xf32, sliced<1>> -> !coco.tensor<16x4xf32, sliced<1>>
  %k = coco.matmul %h, %v : !coco.tensor<16x4xf32, sliced<1>>, !coco.tensor<4x6xf32, sliced<0>> -> !coco.tensor<16x6xf32, local>
  %s = comm.reduce_scatter sum %k : !coco.tensor<16x6xf32, local> -> !coco.tensor<16x6xf32, sliced<0>>
  %e = coco.exp %s : !coco.tensor<16x6xf32, sliced<0>>
  %y = comm.all_to_all %e : !coco.tensor<16x6xf32, sliced<0>> -> !coco.tensor<16x6xf32, sliced<1>>
  func.return %y : !coco.tensor<16x6xf32, sliced<1>>
}""",
    "pipeline": """
func.func @pipe(%g: !coco.tensor<8x6xf32, [replicated, local]>, %t: !coco.tensor<8x6xf32, [replicated, sliced<0>]>)
    -> (!coco.tensor<8x6xf32, [local, replicated]>, !coco.tensor<8x6xf32, [replicated, sliced<1>]>)
    attributes {coco.grid = #coco.grid<[2, ?]>} {
  %s = comm.all_reduce sum %g over [1] : !coco.tensor<8x6xf32, [replicated, local]> -> !coco.tensor<8x6xf32>
  %d = coco.mul %s, %s : !coco.tensor<8x6xf32>
  %o = comm.send %d along 0 shift 1 : !coco.tensor<8x6xf32> -> !coco.tensor<8x6xf32, [local, replicated]>
  %y = comm.all_to_all %t over [1] : !coco.tensor<8x6xf32, [replicated, sliced<0>]> -> !coco.tensor<8x6xf32, [replicated, sliced<1>]>
  func.return %o, %y : !coco.tensor<8x6xf32, [local, replicated]>, !coco.tensor<8x6xf32, [replicated, sliced<1>]>
}""",
    "moe": """
func.func @moe(%x: !coco.tensor<8x6xf32, local>, %w: !coco.tensor<6x6xf32>, %g: !coco.tensor<8x6xf32, local>)
    -> (!coco.tensor<8x6xf32, local>, !coco.tensor<8x6xf32, sliced<1>>) attributes {coco.grid = #coco.grid<[?]>} {
  %h = coco.matmul %x, %w : !coco.tensor<8x6xf32, local>, !coco.tensor<6x6xf32> -> !coco.tensor<8x6xf32, local>
  %d = comm.all_to_all %h : !coco.tensor<8x6xf32, local>
  %e = coco.mul %d, %d : !coco.tensor<8x6xf32, local>
  %s = comm.all_reduce sum %g : !coco.tensor<8x6xf32, local> -> !coco.tensor<8x6xf32>
  %t = coco.exp %s : !coco.tensor<8x6xf32>
  %q = coco.slice %t : !coco.tensor<8x6xf32> -> !coco.tensor<8x6xf32, sliced<0>>
  %y = comm.all_to_all %q : !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<8x6xf32, sliced<1>>
  %z = coco.add %y, %y : !coco.tensor<8x6xf32, sliced<1>>
  func.return %e, %z : !coco.tensor<8x6xf32, local>, !coco.tensor<8x6xf32, sliced<1>>
}""",
}


@functools.cache
def scheduled_program(name: str) -> Program:
    return Program(parse_module(SCHEDULED[name]))


def _schedule_cases() -> list[tuple[str, str]]:
    return [(p, s) for p in SCHEDULED for s in named_schedules(scheduled_program(p))]


def test_every_program_is_offered_schedules():
    offered = {p: list(named_schedules(scheduled_program(p))) for p in SCHEDULED}
    assert all(offered.values()), offered
    assert {"ol(ag,mm)", "ol(mm,rs)"} <= set(offered["sequence_parallel"])
    assert "sliced-send" in offered["pipeline"]


@pytest.mark.parametrize(("name", "schedule"), _schedule_cases())
def test_every_named_schedule_matches_the_sim(name, schedule):
    p = scheduled_program(name)
    q = apply_schedule(p, schedule)
    assert any(op.name == "comm.all_to_all" for op in q.func.walk())
    # overlap chunks only even pieces; the dispatch buffer holds 8 rows
    even = "ol(" in schedule or name == "moe"
    ranks_list = (2, 4, 6) if name == "pipeline" else (1, 2, 4) if even else (1, 2, 3, 4)
    for ranks in ranks_list:
        want = sim.run(p, None, ranks=ranks, seed=ranks)
        got = sim.run(q, want.inputs, ranks=ranks, inplace=False)
        cpu = ThreadedExecutor(lower(q, ranks)).run(want.inputs)
        for k, w in want.outputs.items():
            # schedules may reassociate the all_reduce (f32 tolerance, §3.4)
            np.testing.assert_allclose(got.outputs[k], w, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(cpu[k], w, rtol=1e-5, atol=1e-6)


def test_equivalence_checker_runs_programs_with_all_to_all():
    p = scheduled_program("moe")
    report = check_equivalence(p, apply_schedule(p, "fuse(rs-c-ag)"), ranks=(1, 2, 3, 4))
    assert report.ok, report
    # 3 ranks cannot cut the dispatch buffer's 8 rows: skipped with the reason, not failed
    assert "all-to-all-local" in str(report)


def test_overlap_refuses_an_all_to_all_it_cannot_chunk_with_its_rule():
    """A dispatch-form exchange of [8, 6] has no dim to chunk (dim 0 holds the blocks, the
    last is the matmul's): refused naming the rule (test_overlap_all_to_all.py: the forms
    that chunk)."""
    with pytest.raises(CocoError, match=r"\[overlap-layout\].*comm.all_to_all.*no dim to chunk"):
        apply_pipeline(scheduled_program("moe"), "coco-overlap{ops=h}")


@pytest.mark.parametrize("name", ["mix", "moe"])
def test_every_enumerated_schedule_matches_the_sim(name):
    """The autotuner's space (splits of every dim, reorders, as-slice subsets, fusions,
    overlaps) around all_to_alls, each scheduled program run by the sim and the cpu backend."""
    from coconet.schedule import enumerate_scheduled_programs

    p = scheduled_program(name)
    space = enumerate_scheduled_programs(p)
    assert len(space) > 3
    want = sim.run(p, None, ranks=2, seed=9)
    for label, _pipeline, q in space:
        assert any(op.name == "comm.all_to_all" for op in q.func.walk()), label
        got = sim.run(q, want.inputs, ranks=2, inplace=False)
        cpu = ThreadedExecutor(lower(q, 2)).run(want.inputs)
        for k, w in want.outputs.items():
            np.testing.assert_allclose(got.outputs[k], w, rtol=1e-5, atol=1e-6, err_msg=label)
            np.testing.assert_allclose(cpu[k], w, rtol=1e-5, atol=1e-6, err_msg=label)


def test_the_autotuner_prices_every_candidate_around_all_to_alls():
    from coconet.tune.autotune import rank_schedules
    from coconet.tune.cost_model import PUBLISHED_PROFILES

    profile = next(iter(PUBLISHED_PROFILES.values()))
    ranking = rank_schedules(scheduled_program("moe"), 4, profile)
    assert ranking.ranked
    assert not ranking.refused, [c.refused for c in ranking.refused]
