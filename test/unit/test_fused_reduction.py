"""`coco-fuse{mode=reduction}`: a full reduction, the elementwise computation of its input and
the all_reduce of its partial as ONE kernel (lowering/fused_collective.py
`lower_fused_reduction`): the kernel computes every element, stores what is read after it,
and finishes the reduction -- across the all_reduce's group, the ranks' partials exchanged
through symmetric memory (an fp8 scale's amax, a global norm's sum of squares), or on the
rank (a clipping's norm of a replicated gradient).

A family against the sim: every float element type, every full reduction kind, a tensor cut
by rows or columns on a 1-D grid and on either axis of [2, ?], uneven cuts (64 rows at 3 and
7 ranks), on the cpu backend's threads and on strict fake GPUs; max/min bit for bit (a NaN
wins on every rank), sums and norms within the reductions' tolerance (the partials combine
in double, rounded once)."""

from __future__ import annotations

import numpy as np
import pytest
from test_fp8_examples import load
from test_runtime_cuda import run_fake

from coconet.core.program import Program, parse_module
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective, Launch
from coconet.runtime import sim
from coconet.runtime.check import compare_outputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_pipeline

GLOBAL = """
builtin.module {
  func.func @global(%w: !coco.tensor<64x24xELT, LAYOUT>, %s: !coco.tensor<ELT>) -> !coco.tensor<ELT, OUTLAYOUT> attributes {coco.grid = #coco.grid<GRID>} {
    %a = coco.mul %w, %s : !coco.tensor<64x24xELT, LAYOUT>, !coco.tensor<ELT> -> !coco.tensor<64x24xELT, LAYOUT>
    %b = coco.abs %a : !coco.tensor<64x24xELT, LAYOUT>
    %p = coco.reduce KIND %b : !coco.tensor<64x24xELT, LAYOUT> -> !coco.tensor<ELT, PARTIAL>
    %t = comm.all_reduce KIND %p AXES: !coco.tensor<ELT, PARTIAL> -> !coco.tensor<ELT, OUTLAYOUT>
    func.return %t : !coco.tensor<ELT, OUTLAYOUT>
  }
}
"""

# (grid, layout of the tensor, its partial's, axes all_reduced, the total's, rank counts)
PLACES = [
    ("[?]", "sliced<0>", "local", "", "replicated", (1, 2, 3, 4, 7)),
    ("[?]", "sliced<1>", "local", "", "replicated", (2, 3, 4)),
    ("[2, ?]", "[replicated, sliced<0>]", "[replicated, local]", "over [1] ", "[replicated, replicated]", (2, 4, 6)),
    ("[2, ?]", "[sliced<0>, sliced<1>]", "[local, local]", "over [0] ", "[replicated, local]", (2, 4, 6)),
]  # fmt: skip

FLOATS = ["f32", "f64", "bf16", "f16", "f8E4M3FN"]


def _global(elt: str, kind: str, place: tuple) -> Program:
    grid, layout, partial, axes, total, _ = place
    text = (
        GLOBAL.replace("OUTLAYOUT", total)
        .replace("LAYOUT", layout)
        .replace("PARTIAL", partial)
        .replace("GRID", grid)
        .replace("AXES", axes)
        .replace("KIND", kind)
        .replace("ELT", elt)
    )
    return Program(parse_module(text))


def _fused_plan_of(fused: Program, ranks: int):
    plan = lower(fused, ranks)
    kernels = [s.kernel for s in plan.steps if isinstance(s, Launch)]
    assert len(kernels) == 1, kernels
    assert kernels[0].startswith("k_fused_reduction"), kernels
    assert not any(isinstance(s, Collective) for s in plan.steps), "no library all_reduce"
    return plan


def _check(got_per_rank, want, kind: str, what: str) -> None:
    result = compare_outputs(got_per_rank, want.per_rank)
    assert result.ok, (what, result.differences)
    if kind in ("max", "min"):
        assert result.bit_exact, what


def _per_rank(plan, inputs, ranks: int) -> list[dict]:
    """Every rank's outputs from the cpu backend's threads: the logical value, which the
    executor assembles only where the ranks agree (a replicated total)."""
    got = ThreadedExecutor(plan).run(inputs)
    return [got] * ranks


@pytest.mark.parametrize("place", PLACES, ids=lambda p: f"{p[0]}{p[1]}")
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("elt", FLOATS)
def test_a_global_reduction_is_one_kernel_and_computes_what_the_program_does(elt, kind, place):
    program = _global(elt, kind, place)
    fused = apply_pipeline(program, "coco-fuse{mode=reduction}")
    for ranks in place[5]:
        want = sim.run(program, ranks=ranks, seed=ranks, inplace=False)
        plan = _fused_plan_of(fused, ranks)
        if place[3]:  # a total replicated over one axis only: compare each rank's piece
            _plan, per_rank, _ = run_fake(fused, ranks, want.inputs)
            _check(per_rank, want, kind, f"{elt} {kind} at {ranks} ranks (fake GPUs)")
            continue
        _check(_per_rank(plan, want.inputs, ranks), want, kind, f"{elt} {kind} at {ranks} ranks")
        if ranks in (2, 3):  # strict fake GPUs: the same plan through the cuda executor
            _plan, per_rank, _ = run_fake(fused, ranks, want.inputs)
            _check(per_rank, want, kind, f"{elt} {kind} at {ranks} ranks (fake GPUs)")


LOCAL = """
builtin.module {
  func.func @local(%g: !coco.tensor<1000xELT>, %k: !coco.tensor<ELT>) -> (!coco.tensor<1000xELT>, !coco.tensor<ELT>) attributes {coco.grid = #coco.grid<[?]>} {
    %gs = coco.mul %g, %k : !coco.tensor<1000xELT>, !coco.tensor<ELT> -> !coco.tensor<1000xELT>
    %sq = coco.reduce KIND %gs : !coco.tensor<1000xELT> -> !coco.tensor<ELT>
    func.return %gs, %sq : !coco.tensor<1000xELT>, !coco.tensor<ELT>
  }
}
"""


@pytest.mark.parametrize("kind", ["sum", "max", "min", "norm"])
@pytest.mark.parametrize("elt", FLOATS)
def test_a_local_reduction_stores_its_input_and_finishes_on_the_rank(elt, kind):
    """A clipping's norm of a replicated gradient (ar-c's): the scaled gradient stored for
    the update after it and its norm, in one kernel and no collective."""
    program = Program(parse_module(LOCAL.replace("KIND", kind).replace("ELT", elt)))
    fused = apply_pipeline(program, "coco-fuse{mode=reduction}")
    for ranks in (1, 2, 3):
        want = sim.run(program, ranks=ranks, seed=ranks, inplace=False)
        plan = _fused_plan_of(fused, ranks)
        _check(_per_rank(plan, want.inputs, ranks), want, kind, f"{elt} {kind} at {ranks}")
    want = sim.run(program, ranks=2, seed=2, inplace=False)
    _plan, per_rank, _ = run_fake(fused, 2, want.inputs)
    _check(per_rank, want, kind, f"{elt} {kind} on fake GPUs")


@pytest.mark.parametrize("kind", ["max", "min", "sum"])
def test_a_nan_on_one_rank_reaches_every_rank(kind):
    """NumPy's max/min (a NaN wins) and a sum through a NaN: the rank holding it exchanges a
    NaN partial, and every rank's total is NaN, as the sim's."""
    program = _global("f32", kind, PLACES[0])
    fused = apply_pipeline(program, "coco-fuse{mode=reduction}")
    w = np.linspace(-3, 3, 64 * 24, dtype=np.float32).reshape(64, 24)
    w[50, 7] = np.nan  # on the last rank's rows at 3 ranks
    inputs = {"w": w, "s": np.float32(1.5)}
    want = sim.run(program, ranks=3, inputs=inputs, inplace=False)
    assert np.isnan(want.outputs["t"])
    got = ThreadedExecutor(_fused_plan_of(fused, 3)).run(inputs)
    assert np.isnan(got["t"])


def test_an_fp8_amax_reads_the_master_slice_once():
    """examples/fp8_allgather_matmul's amax under `coco-fuse{mode=reduction}`: no |w| buffer,
    no library all_reduce, and the program's output bit for bit the sim's at 1-4 ranks."""
    program = load("fp8_allgather_matmul")
    fused = apply_pipeline(program, "coco-fuse{mode=reduction}")
    for ranks in (1, 2, 3, 4):
        plan = lower(fused, ranks)
        assert [s.op for s in plan.steps if isinstance(s, Collective)] == ["all_gather"]
        kernels = [s.kernel for s in plan.steps if isinstance(s, Launch)]
        assert kernels[0].startswith("k_fused_reduction")
        assert "k_abs" not in kernels
        want = sim.run(program, ranks=ranks, seed=ranks, inplace=False)
        got = ThreadedExecutor(plan).run(want.inputs)
        np.testing.assert_array_equal(got["y"], want.outputs["y"])


def test_across_nodes_the_kernel_computes_and_the_library_all_reduces():
    """A group spanning nodes has no symmetric memory to exchange the partials in: the fused
    reduction lowers op by op -- one kernel of the computation, the reduction's kernels and
    the library all_reduce -- and computes what the sim does."""
    from coconet.core import values as V

    program = _global("f32", "max", PLACES[0])
    fused = apply_pipeline(program, "coco-fuse{mode=reduction}")
    plan = lower(fused, 4, None, V.nodes_of(4, 2))
    assert [s.op for s in plan.steps if isinstance(s, Collective)] == ["all_reduce"]
    kernels = [s.kernel for s in plan.steps if isinstance(s, Launch)]
    assert not any(k.startswith("k_fused_reduction") for k in kernels), kernels
    want = sim.run(program, ranks=4, seed=4, inplace=False)
    got = ThreadedExecutor(plan).run(want.inputs)
    np.testing.assert_array_equal(got["t"], want.outputs["t"])
