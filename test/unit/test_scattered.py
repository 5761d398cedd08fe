"""CoCoNet's scattered tensors: LAMB over many parameter tensors of different sizes.

The oracle matches an independent per-tensor NumPy reference, and the lowering folds the
per-tensor kernels into table launches (one launch for all tensors) that still match the
oracle on 1, 2 and 4 ranks."""

from pathlib import Path

import numpy as np
import numpy_references as ref
import pytest

import coconet
from coconet.lowering.lower_to_plan import LaunchConfig, lower
from coconet.lowering.plan import ArgTable, Launch
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import Schedule
from coconet.tools.coco_run import apply_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIZES = (2048, 1024, 512, 64)


def load(form: str) -> coconet.Program:
    return coconet.load(EXAMPLES / f"lamb_scattered.{form}")


def test_python_form_builds_the_mlir_form():
    assert load("py").print() == load("mlir").print()


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_oracle_matches_per_tensor_reference(ranks: int):
    program = load("mlir")
    result = coconet.run(program, None, ranks=ranks, seed=ranks, inplace=False)
    given = result.inputs
    scalars = {k: given[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "step")}
    for i in range(len(SIZES)):
        mine = {k: given[f"{k}{i}"] for k in "gwmv"}
        want = ref.lamb(mine | scalars, ranks)
        for k in "wmv":
            assert np.array_equal(result.outputs[f"{k}{i}"], want[k]), f"{k}{i} at {ranks} ranks"


@pytest.mark.parametrize("pipeline", ["", "coco-fuse"])
def test_one_table_launch_serves_every_tensor(pipeline: str):
    program = apply_pipeline(load("mlir"), pipeline) if pipeline else load("mlir")
    plan = lower(program, 2)
    tables = [s for s in plan.steps if isinstance(s, Launch) and s.kernel.endswith("_table")]
    assert tables, plan.format()
    # Every tensor's per-tensor norm (and, fused, its whole update) is one launch; unfused,
    # several same-kernel ops per tensor may share one launch too.
    widest = max(len(s.args[0].items) for s in tables if isinstance(s.args[0], ArgTable))
    assert widest >= len(SIZES)
    norms = [s for s in tables if s.kernel.startswith("k_reduce_norm")]
    assert norms
    assert all(len(s.args[0].items) == len(SIZES) for s in norms)
    assert "COCO_KERNEL(" + tables[0].kernel in plan.cuda_source


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("config", [LaunchConfig(), LaunchConfig(block=1, max_blocks=2)])
@pytest.mark.parametrize("pipeline", ["", "coco-fuse"])
def test_table_launches_match_oracle(ranks: int, config: LaunchConfig, pipeline: str):
    program = apply_pipeline(load("mlir"), pipeline)
    plan = lower(program, ranks, config)
    inputs = prepare_inputs(program, None, plan.grid_shape, seed=7)
    want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
    got = ThreadedExecutor(plan).run(inputs)
    for name, value in want.items():
        # Norms sum in another order than NumPy: a few ulp.
        np.testing.assert_allclose(got[name], value, rtol=2e-5, atol=1e-6, err_msg=name)


def test_lamb_norms_finish_inside_the_fused_kernel():
    """fuse(rs-c-ag) of LAMB: the sliced norm of r (partials, blocks, ranks) completes inside
    the first fused kernel: no reduction kernel and no library all_reduce of it remain."""
    from coconet.lowering.plan import Collective

    schedule = Schedule(coconet.load(EXAMPLES / "lamb.mlir"))
    schedule.named("fuse(rs-c-ag)")
    plan = lower(schedule.program, 2)
    fused = [
        s for s in plan.steps if isinstance(s, Launch) and s.kernel.startswith("k_fused_all_reduce")
    ]
    assert len(fused) == 2
    assert not [s for s in plan.steps if isinstance(s, Collective)]
    partial_kernels = [
        s for s in plan.steps if isinstance(s, Launch) and s.kernel.endswith("_partial")
    ]
    # ||w|| too: coco-fuse computes it on the chain's slice of w (partials all-reduced inside
    # the fused kernel) instead of a reduction of the whole replicated w before the region.
    assert partial_kernels == []


def test_a_slice_of_an_argument_is_read_where_needed_not_stored_between_kernels():
    """Both kernels of fused LAMB read w's slice (the first for ||w|| and the update, the
    second for w - lr * trust * r): each reads w at this rank's piece, instead of the first
    storing a copy of the slice for the second (8 bytes more per element of the slice), and
    the step still matches the oracle on 1, 2 and 4 ranks."""
    schedule = Schedule(coconet.load(EXAMPLES / "lamb.mlir"))
    schedule.named("fuse(rs-c-ag)")
    plan = lower(schedule.program, 2)
    first, second = [s for s in plan.steps if isinstance(s, Launch)]
    assert "w_s" not in {b.name for b in plan.buffers}
    assert "w" in {a.name for a in second.args if hasattr(a, "name")}
    assert "w_s" not in {w for s in (first, second) for w in s.writes}
    for ranks in (1, 2, 4):
        plan = lower(schedule.program, ranks)
        inputs = prepare_inputs(schedule.program, None, plan.grid_shape, seed=ranks)
        want = coconet.run(schedule.program, inputs, ranks=ranks, inplace=False).outputs
        got = ThreadedExecutor(plan).run(inputs)
        for name, value in want.items():
            # Norms sum in another order than NumPy: a few ulp.
            np.testing.assert_allclose(got[name], value, rtol=2e-5, atol=1e-6, err_msg=name)
