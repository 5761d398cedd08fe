"""Dimension coalescing in the kernel generator (lowering/kernels/spec.py `dim_groups`).

A kernel reads operands through per-dim coordinates only where some operand's index map
differs from the iteration's; adjacent dims that every mapped operand walks alike collapse
into one coordinate, extents the types fix are literals, and the vector loop computes a
vector's coordinates once (its lanes add k along the innermost collapsed dim). The tests
inspect the kernel IR the lowering builds and run the kernels on in-process ranks against
the sim, bit for bit, at 1, 2 and 4 ranks."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import pytest

import coconet
from coconet.core.program import Program, parse_module
from coconet.lowering.kernel_ir import (
    Binary,
    BlockStrideLoop,
    Kernel,
    LaneLoop,
    Param,
    PeerVecIn,
    Stmt,
    Unused,
    Var,
    VecIn,
    rewrite,
)
from coconet.lowering.lower_to_plan import LaunchConfig, Lowering
from coconet.lowering.signature import ParamKind
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

GRID = "attributes {coco.grid = #coco.grid<[?]>}"

# all_reduce + residual over an N-D tensor (issue 13's repro, the model-parallel block's tail)
RESIDUAL = f"""
func.func @residual(%g: !coco.tensor<4x256x256xf32, local>, %r: !coco.tensor<4x256x256xf32>) -> !coco.tensor<4x256x256xf32> {GRID} {{
  %t = comm.all_reduce sum %g : !coco.tensor<4x256x256xf32, local> -> !coco.tensor<4x256x256xf32>
  %o = coco.add %t, %r : !coco.tensor<4x256x256xf32>
  func.return %o : !coco.tensor<4x256x256xf32>
}}
"""

# a value of rank 3 over a rank-4 iteration with a leading dim of 1: contiguous, one coordinate
LEADING_ONE = f"""
func.func @leading(%a: !coco.tensor<1x4x8x32xf32>, %b: !coco.tensor<4x8x32xf32>) -> !coco.tensor<1x4x8x32xf32> {GRID} {{
  %o = coco.add %a, %b : !coco.tensor<1x4x8x32xf32>, !coco.tensor<4x8x32xf32> -> !coco.tensor<1x4x8x32xf32>
  func.return %o : !coco.tensor<1x4x8x32xf32>
}}
"""


def middle_broadcast(rows: int, cols: int) -> str:
    """all_reduce, then a bias broadcast along the middle dim: three coordinates."""
    big = f"!coco.tensor<4x{rows}x{cols}xf32>"
    bias = f"!coco.tensor<4x1x{cols}xf32>"
    return f"""
func.func @middle(%g: !coco.tensor<4x{rows}x{cols}xf32, local>, %b: {bias}) -> {big} {GRID} {{
  %t = comm.all_reduce sum %g : !coco.tensor<4x{rows}x{cols}xf32, local> -> {big}
  %o = coco.add %t, %b : {big}, {bias} -> {big}
  %s = coco.mul %o, %o : {big}
  func.return %s : {big}
}}
"""


@functools.cache
def program(text: str) -> Program:
    return Program(parse_module(text))


def kernels(p: Program, ranks: int) -> list[Kernel]:
    grid_shape = p.grid.bind(ranks)
    lowering = Lowering(p, grid_shape, LaunchConfig(), ())
    lowering.run()
    return list(lowering.kernels)


def statements(node: object, inside: tuple[Stmt, ...] = ()) -> Iterator[tuple[Stmt, tuple]]:
    """Every statement under `node`, with the statements enclosing it."""
    if isinstance(node, tuple):
        for x in node:
            yield from statements(x, inside)
        return
    if not isinstance(node, Stmt):
        return
    yield node, inside
    for value in vars(node).values():
        if isinstance(value, tuple | Stmt):
            yield from statements(value, (*inside, node))


def element_coordinates(kernel: Kernel) -> list[tuple[Var, ...]]:
    """The coordinates each element loop of the kernel declares (its `Unused` list), in
    order; loops reading no coordinates have none."""
    found = []
    for st, inside in statements(kernel.body):
        in_lanes = any(isinstance(x, LaneLoop) for x in inside)
        if isinstance(st, Unused) and inside and isinstance(inside[-1], BlockStrideLoop):
            if not in_lanes:
                found.append(st.vars)
    return found


def divisions(node: object) -> list[Binary]:
    out: list[Binary] = []

    def visit(x: object) -> None:
        if isinstance(x, Binary) and x.op in ("/", "%"):
            out.append(x)

    rewrite(node, visit)
    return out


def run_against_sim(p: Program, ranks: int, context: str) -> None:
    plan = Lowering(p, p.grid.bind(ranks), LaunchConfig(), ()).run()
    inputs = prepare_inputs(p, None, plan.grid_shape, seed=ranks)
    want = coconet.run(p, inputs, ranks=ranks, inplace=False).outputs
    got = ThreadedExecutor(plan).run(inputs)
    assert set(got) == set(want), context
    for name in want:
        assert np.array_equal(got[name], want[name], equal_nan=True), f"{context}: {name}"


def test_contiguous_nd_operands_read_through_one_coordinate() -> None:
    (kernel,) = kernels(program(LEADING_ONE), 1)
    coords = element_coordinates(kernel)
    # one coordinate (the element's index) in every loop: no div or mod in any
    assert coords
    assert {len(c) for c in coords} == {1}
    assert not [p for p in kernel.params if p.kind in (ParamKind.DIM, ParamKind.STRIDE)]
    loops = [st for st, _ in statements(kernel.body) if isinstance(st, BlockStrideLoop)]
    assert all(not divisions(loop.body) for loop in loops)
    run_against_sim(program(LEADING_ONE), 1, "leading dim of 1")


def test_fused_residual_over_a_sliced_middle_dim_collapses_to_two_coordinates() -> None:
    """fuse(rs-c-ag) over [4,256,256]: each rank's piece is 4 runs of whole rows of the
    sliced dim, so dims 1 and 2 collapse (one coordinate, extent a launch argument spanning
    both dims), dim 0 keeps its own (its stride, a literal, is not the piece's)."""
    p = apply_schedule(program(RESIDUAL), "fuse(rs-c-ag)")
    (kernel,) = kernels(p, 2)
    dims = [x for x in kernel.params if x.kind == ParamKind.DIM]
    assert [(x.dim, x.span) for x in dims] == [(1, 2)]
    assert not [x for x in kernel.params if x.kind == ParamKind.STRIDE]
    # the element loops (the body's tail and the pull's) walk two coordinates
    assert {len(c) for c in element_coordinates(kernel)} == {2}
    # the lanes of a vector add k along the inner coordinate: no div or mod per lane
    lanes = [st for st, _ in statements(kernel.body) if isinstance(st, LaneLoop)]
    assert lanes
    assert all(not divisions(lane.body) for lane in lanes)
    # the peers' pieces are read and pulled as vectors
    peer_tables = {x for x in kernel.params if x.kind in (ParamKind.PEERS_IN, ParamKind.PEERS_OUT)}
    vector_sources: set[Param] = set()

    def table(x: object) -> None:
        if isinstance(x, Param) and x in peer_tables:
            vector_sources.add(x)

    for st, _ in statements(kernel.body):
        if isinstance(st, VecIn):  # a pull: one peer's piece at a time
            rewrite(st.src, table)
        elif isinstance(st, PeerVecIn):  # the reduce_scatter: a batch of peers' pieces at once
            rewrite(st.table, table)
    assert vector_sources == peer_tables


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_fused_residual_matches_the_sim(ranks: int) -> None:
    for name in ("ar-c", "rs-c-ag", "fuse(rs-c-ag)"):
        run_against_sim(apply_schedule(program(RESIDUAL), name), ranks, f"{name} at {ranks}")


@pytest.mark.parametrize("cols", [256, 40])
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_broadcast_along_a_middle_dim_keeps_its_coordinates(ranks: int, cols: int) -> None:
    """A bias broadcast along the middle dim reads through three coordinates (no two dims
    walk it alike), in the vector loop (256 columns: whole host vectors) and in the element
    loop (40: none), under every schedule."""
    p = program(middle_broadcast(8, cols))
    for name in ["as written", *named_schedules(p)]:
        scheduled = p if name == "as written" else apply_schedule(p, name)
        if name == "fuse(rs-c-ag)":
            widest = max(len(c) for k in kernels(scheduled, ranks) for c in element_coordinates(k))
            assert widest == 3
        run_against_sim(scheduled, ranks, f"{name} at {ranks} ranks, {cols} columns")


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_collapsed_kernels_compile_with_nvrtc() -> None:
    for text in (RESIDUAL, middle_broadcast(8, 40), LEADING_ONE):
        p = program(text)
        for name in ["as written", *named_schedules(p)]:
            scheduled = p if name == "as written" else apply_schedule(p, name)
            plan = Lowering(scheduled, scheduled.grid.bind(2), LaunchConfig(), ()).run()
            assert compile_cuda(plan.cuda_source, "sm_90", warnings_as_errors=True).binary
