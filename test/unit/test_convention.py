"""The calling conventions' bookkeeping (coconet/convention.py), without ranks: which arguments
a schedule resliced, where each rank's piece lies in the caller's value (uneven cuts), what is
gathered back, and the refusals. test/mpi/test_calling_convention.py runs them on MPI ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

import coconet
from coconet.compile import apply_schedule
from coconet.convention import resliced_arguments, written_changes
from coconet.core.program import CocoError, Program, parse_module
from coconet.lowering.lower_to_plan import lower

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ADAM = (EXAMPLES / "adam.mlir").read_text().replace("4096", "1001")


def written(program):
    return (
        {a.name: a.type for a in program.arguments},
        {o.name: o.type for o in program.outputs if not o.updated_argument},
    )


def test_the_sliced_state_is_cut_unevenly_and_gathered_back():
    program = Program(parse_module(ADAM))
    plan = lower(apply_schedule(program, "rs-c-ag"), 3)
    plan.written_types = written_changes(plan, *written(program))
    assert set(plan.written_types) == {"m", "v"}
    starts = []
    for rank in range(3):
        resliced = resliced_arguments(plan, rank)
        assert set(resliced) == {"m", "v"}
        m = resliced["m"]
        assert m.shape == (1001,)  # the caller's whole value
        (region,) = m.region
        starts.append((region.start, region.stop))
        assert m.gather is not None
        assert m.gather.op == "all_gather"
        assert m.gather.axes == (0,)
    # split_range: the first 1001 % 3 ranks hold one element more
    assert starts == [(0, 334), (334, 668), (668, 1001)]


def test_a_change_other_than_slicing_a_replicated_axis_is_refused():
    program = Program(parse_module(ADAM))
    plan = lower(apply_schedule(program, "rs-c-ag"), 2)
    local = {a.name: a.type for a in program.arguments}["g"]  # !coco.tensor<1001xf32, local>
    plan.written_types = {"m": local}
    with pytest.raises(CocoError, match=r"stores argument 'm' as .*sliced<0>.* pieces=True"):
        resliced_arguments(plan, 0)


def test_the_sim_refuses_the_pieces_convention():
    with pytest.raises(CocoError, match=r"pieces=True.*sim takes and returns logical values"):
        coconet.compile(EXAMPLES / "adam.mlir", backend="sim", ranks=2, pieces=True)
