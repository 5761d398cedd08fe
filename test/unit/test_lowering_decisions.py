"""The lowering's decisions as IR (lowering/decisions.py, lowering/segments.py, issue #27 item 1):
`coco-choose-topology`, `coco-defer`, `coco-segment` and `coco-table-form` write on the scheduled
program what the plan builder used to decide inline, and the builder reads it.

Checked here: the plan of a program the passes annotated (as `coco-opt -p` prints it) is the
plan of the program as scheduled, for every example and named schedule, on one node and on
several; `lower()` leaves its caller's program untouched (it decides on a copy) unless told
the program is its own (`in_place`); annotations written for another machine, or that the
builder could not honour, are refused with their rule; a hand-written choice the rules allow
(a subset of the deferrals) is honoured and computes what the oracle does. The FileCheck
tests (test/filecheck/lowering/coco-choose-topology*.mlir, coco-defer*.mlir,
coco-segment*.mlir, coco-table-form*.mlir) show each decision printed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from xdsl.dialects.builtin import IntegerAttr, i64

import coconet
from coconet.compile import apply_schedule
from coconet.core import values as V
from coconet.core.program import CocoError, Program, make_context, parse_module
from coconet.dialects import comm
from coconet.lowering.decisions import (
    ChooseTopologyPass,
    DeferPass,
    TableFormPass,
    choose_deferrals,
    choose_table_form,
    choose_topology,
    decided,
)
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Launch
from coconet.lowering.segments import SegmentPass, choose_segments
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import named_schedules

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (example, ranks, ranks per node: 0 for one node)
MACHINES = [(1, 0), (4, 0), (4, 2), (4, 1), (8, 4)]
NAMES = [
    "adam",
    "lamb",
    "adam_bf16_grads",
    "pipeline_boundary",
    "ulysses_attention",
    "sgd",
    "adam_clip_global_norm",
    "lamb_scattered",
]


def decisions(p: Program) -> dict[str, str]:
    """Every decision attribute of the program, by op (`%name` of its first result, or its
    op name and position)."""
    out: dict[str, str] = {}
    for i, op in enumerate(p.func.walk()):
        for key in (
            comm.TOPOLOGY_ATTR_NAME,
            comm.DEFERRAL_ATTR_NAME,
            comm.SEGMENT_ATTR_NAME,
            comm.SEGMENTS_ATTR_NAME,
            comm.CHAIN_ATTR_NAME,
            comm.TABLE_READY_ATTR_NAME,
        ):
            if key in op.attributes:
                hint = op.results[0].name_hint if op.results else None
                out[f"{f'%{hint}' if hint else f'{op.name}#{i}'} {key}"] = str(op.attributes[key])
    return out


def annotated(p: Program, ranks: int, per_node: int) -> Program:
    """`p` with the decisions written as coco-opt's `-p` writes them."""
    q = p.clone()
    options = {"ranks": ranks, "ranks_per_node": per_node}
    for cls in (ChooseTopologyPass, DeferPass):
        cls(**options).apply(make_context(), q.module)
    SegmentPass().apply(make_context(), q.module)
    TableFormPass().apply(make_context(), q.module)
    return q


@pytest.mark.parametrize("name", NAMES)
def test_annotated_programs_lower_to_the_same_plans(name: str):
    program = coconet.load(EXAMPLES / f"{name}.mlir")
    for schedule in named_schedules(program):
        scheduled = apply_schedule(program, schedule)
        for ranks, per_node in MACHINES:
            try:
                scheduled.grid.bind(ranks)
            except ValueError:
                continue
            nodes = V.nodes_of(ranks, per_node) if per_node else ()
            try:
                want = lower(scheduled, ranks, None, nodes)
            except CocoError as e:
                with pytest.raises(CocoError, match=re.escape(str(e))):
                    lower(annotated(scheduled, ranks, per_node), ranks, None, nodes)
                continue
            got = lower(annotated(scheduled, ranks, per_node), ranks, None, nodes)
            context = f"{name} {schedule} on {ranks} ranks, {per_node or 'all'} a node"
            assert got.format() == want.format(), context
            assert got.cuda_source == want.cuda_source, context


def test_lower_decides_on_a_copy_unless_the_program_is_its_own():
    scheduled = apply_schedule(coconet.load(EXAMPLES / "adam_fp8_wire.mlir"), "fuse(rs-c-ag)")
    before = str(scheduled)
    plan = lower(scheduled, 4)
    assert str(scheduled) == before
    assert decisions(scheduled) == {}
    own = scheduled.clone()
    assert lower(own, 4, in_place=True).format() == plan.format()
    made = decisions(own)
    assert made.pop("%gw comm.deferral") == "#comm<deferral wire>"
    assert {v for k, v in made.items() if "topology" in k} == {"#comm<topology flat>"}
    # the wire cast: peers pull the fp8 gradient, no launch computes the cast
    assert "k_cast" not in plan.format()


def test_nothing_to_decide_is_no_copy():
    program = coconet.load(EXAMPLES / "sgd.mlir")  # no fused region
    assert decided(program, (4,), ()) is program


def test_a_program_annotated_for_another_machine_is_refused():
    scheduled = apply_schedule(coconet.load(EXAMPLES / "adam.mlir"), "fuse(rs-c-ag)")
    two_nodes = annotated(scheduled, 4, 2)
    assert lower(two_nodes, 4, None, (0, 0, 1, 1)).nodes == (0, 0, 1, 1)
    with pytest.raises(CocoError, match=r"@adam: \[topology-one-node\]"):
        lower(two_nodes, 4)
    one_node = annotated(scheduled, 4, 0)
    assert lower(one_node, 8).size == 8  # flat at 8 ranks too
    with pytest.raises(CocoError, match=r"\[topology-across-nodes\].*node map \[0, 0, 1, 1\]"):
        lower(one_node, 4, None, (0, 0, 1, 1))


ADAM_SUBSET = """
func.func @subset(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>, %beta1: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %sq = coco.mul %beta1, %beta1 : !coco.tensor<f32>
  %corr = coco.sub %sq, %lr {comm.deferral = #comm<deferral rematerialize>} : !coco.tensor<f32>
  comm.fused all_reduce {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %c = coco.sub %corr, %beta1 : !coco.tensor<f32>
    %u = coco.mul %c, %rs : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1 = coco.sub %ws, %u : !coco.tensor<64xf32, sliced<0>>
    %w2 = comm.all_gather %w1 : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w2 : !coco.tensor<64xf32>
    comm.yield
  }
  func.return
}
"""


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_a_hand_written_subset_of_deferrals_is_honoured(ranks: int):
    program = Program(parse_module(ADAM_SUBSET))
    plan = lower(program, ranks)
    kernels = [s.kernel for s in plan.steps if isinstance(s, Launch)]
    assert len(kernels) == len(plan.steps)
    # %sq, unmarked, is launched; %corr (marked) and %c, %ws (the pass adds none) are not
    assert len(kernels) == 2
    assert kernels[0] == "k_mul"
    assert kernels[1].startswith("k_fused_all_reduce")
    inputs = sim.prepare_inputs(program, None, plan.grid_shape, seed=ranks)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
    got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
    for out, value in want.outputs.items():
        assert np.array_equal(got[out], value), out


def test_the_passes_honour_their_own_annotations():
    scheduled = apply_schedule(coconet.load(EXAMPLES / "lamb.mlir"), "fuse(rs-c-ag)")
    once = annotated(scheduled, 4, 2)
    twice = once.clone()
    choose_topology(twice.func, (4,), (0, 0, 1, 1))
    choose_deferrals(twice.func, (0, 0, 1, 1))
    choose_segments(twice.func)
    choose_table_form(twice.func)
    assert str(twice) == str(once)
    assert decisions(once)
    assert all("hierarchical" in v for k, v in decisions(once).items() if "topology" in k)
    assert not any("deferral" in k for k in decisions(once))  # nothing deferred on 2 nodes


def test_lamb_runs_two_segments_around_its_norms():
    """LAMB under fuse(rs-c-ag): segment 0 holds the update of m and v and the sliced norms,
    whose all_reduces its kernel finishes; the trust ratio (rematerialized, in no segment)
    starts segment 1, which updates and gathers w. Written by hand otherwise, the cuts are
    refused, not lowered."""
    scheduled = apply_schedule(coconet.load(EXAMPLES / "lamb.mlir"), "fuse(rs-c-ag)")
    once = annotated(scheduled, 4, 0)
    made = decisions(once)
    assert made["comm.fused#1 comm.segments"] == "2 : i64"
    assert made["%w_norm_sumsq comm.segment"] == made["%r_norm_sumsq comm.segment"] == "0 : i64"
    assert made["%w1 comm.segment"] == "1 : i64"
    assert not any(k.startswith("%trust comm.segment") for k in made)
    bad = once.clone()
    (w1,) = [op for op in bad.func.walk() if op.results and op.results[0].name_hint == "w1"]
    w1.attributes[comm.SEGMENT_ATTR_NAME] = IntegerAttr(0, i64)
    with pytest.raises(
        CocoError, match=r"@lamb: \[segment\] %w1 \(comm.all_gather\) has segment 0"
    ):
        lower(bad, 4)
