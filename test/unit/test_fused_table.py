"""ONE fused collective over many tensors: `fuse(rs-c-ag)` of LAMB over seven parameter
tensors of odd sizes (1000, 33, 4097, 12345, 7, 65537, 999) runs as one table launch per
segment of the fused region -- reduce_scatter, the optimizer, each tensor's trust-ratio norms
(its ||w|| and ||r||, finished inside the kernel) and the all_gather -- instead of a kernel
chain per tensor, and matches the sim oracle on 1, 2 and 4 ranks (threaded ranks running the
generated CUDA C on the host; test/mpi/test_mpi_uneven.py runs it on real MPI ranks)."""

from __future__ import annotations

import functools
import itertools
import runpy
from pathlib import Path

import numpy as np
import pytest

import coconet
from coconet.core.program import Program
from coconet.lowering.lower_to_plan import LaunchConfig, lower
from coconet.lowering.plan import ArgTable, Collective, Launch, Plan, shrink_grids
from coconet.lowering.signature import ParamKind
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import Schedule
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIZES = (1000, 33, 4097, 12345, 7, 65537, 999)


@functools.cache
def lamb_odd_sizes() -> Program:
    return runpy.run_path(str(EXAMPLES / "lamb_odd_sizes.py"))["build"](SIZES)


@functools.cache
def fused(ranks: int, config: LaunchConfig = LaunchConfig()) -> tuple[Program, Plan]:
    schedule = Schedule(lamb_odd_sizes())
    schedule.named("fuse(rs-c-ag)")
    return schedule.program, lower(schedule.program, ranks, config)


def launches(plan: Plan) -> list[Launch]:
    return [s for s in plan.steps if isinstance(s, Launch)]


@pytest.mark.parametrize("ranks", [2, 4])
def test_seven_tensors_take_two_table_launches(ranks: int):
    """Both segments of the fused LAMB (up to the norms; the update and all_gather) are one
    launch each over all seven tensors: no per-tensor kernel, no reduction kernel before the
    regions (||w|| is finished in the first kernel), no scalar kernel (the bias corrections
    are computed in the kernels), no library collective."""
    program, plan = fused(ranks)
    steps = launches(plan)
    assert len(steps) <= 3, plan.format()
    assert len(steps) == 2, plan.format()
    assert not [s for s in plan.steps if isinstance(s, Collective)], plan.format()
    for step in steps:
        assert step.kernel.startswith("k_fused_all_reduce")
        assert step.kernel.endswith("_table")
        tables = [a for a in step.args if isinstance(a, ArgTable)]
        assert tables
        assert all(len(t.items) == len(SIZES) for t in tables[:-1]), step
        # Every tensor keeps at least one block; all blocks fit one co-resident grid.
        blocks = tables[-1].items
        assert len(blocks) == len(SIZES) + 1
        assert all(b > a for a, b in itertools.pairwise(blocks))
        assert step.grid == blocks[-1] <= 64
    # Each tensor's trust ratio: the first kernel finishes two reductions per tensor (a
    # table of results each), the second none.
    finished = [
        [p for p in plan.signatures[s.kernel] if p.kind == ParamKind.RED_OUT] for s in steps
    ]
    assert [len(f) for f in finished] == [2, 0]
    assert all(p.table for p in finished[0])
    regions = [op for op in program.func.body.block.ops if op.name == "comm.fused"]
    assert len(regions) == len(SIZES)


@pytest.mark.parametrize(
    ("ranks", "config"),
    [
        (1, LaunchConfig()),
        (2, LaunchConfig()),
        (4, LaunchConfig()),
        (2, LaunchConfig(block=1, max_blocks=2)),
    ],
)
def test_table_of_fused_collectives_matches_the_oracle(ranks: int, config: LaunchConfig):
    program, plan = fused(ranks, config)
    inputs = prepare_inputs(program, None, plan.grid_shape, seed=11)
    want = coconet.run(lamb_odd_sizes(), inputs, ranks=ranks, inplace=False).outputs
    # The sim of the scheduled program: the kernels reproduce it bit for bit.
    same = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
    got = ThreadedExecutor(plan).run(inputs)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], same[name], err_msg=name)
        # Against the unscheduled program, the norms are summed per slice first.
        np.testing.assert_allclose(got[name], value, rtol=2e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_plan_before_batching_runs_the_same(ranks: int):
    """Table batching is a step over the plan alone (batching.py): without it every tensor's
    segment kernels are launches of their own, fourteen where the batched plan has two,
    and the plan computes the same bits."""
    program, batched = fused(ranks)
    _, unbatched = fused(ranks, LaunchConfig(batch=False))
    # each tensor's region in program order: its two segments' kernels
    two = [s.kernel.removesuffix("_table") for s in launches(batched)]
    assert [s.kernel for s in launches(unbatched)] == two * len(SIZES), unbatched.format()
    inputs = prepare_inputs(program, None, batched.grid_shape, seed=5)
    want = ThreadedExecutor(batched).run({k: v.copy() for k, v in inputs.items()})
    got = ThreadedExecutor(unbatched).run({k: v.copy() for k, v in inputs.items()})
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_table_grids_shrink_to_stay_resident():
    assert shrink_grids([3, 5], 64) == [3, 5]
    shrunk = shrink_grids([64, 1, 64, 64, 1, 64, 64], 64)
    assert sum(shrunk) <= 64
    assert min(shrunk) >= 1
    assert shrunk[0] > shrunk[1]
    assert shrink_grids([1] * 64, 64) == [1] * 64


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_table_of_fused_collectives_compiles_with_nvrtc():
    _, plan = fused(4)
    for arch in ("sm_80", "sm_90"):
        assert len(compile_cuda(plan.cuda_source, arch, warnings_as_errors=True).binary) > 0
