"""ZeRO-3 / FSDP's optimizer step (examples/zero3_adamw): weights and moments sliced over the
ranks, the full local gradient reduce-scattered to each slice. `fuse(rs-c)` makes the
reduce_scatter and the sliced AdamW one fused collective kernel: one launch, where the program
as written takes a library reduce_scatter and a kernel per op; both equal the NumPy reference on the
cpu backend's kernels, on even and uneven cuts."""

from __future__ import annotations

import numpy as np
import numpy_references as ref
import pytest
from test_examples import load, make_inputs

from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective, Launch
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules


def test_fuse_rs_c_is_offered_and_is_one_launch() -> None:
    program = load("zero3_adamw", "mlir")
    assert list(named_schedules(program)) == ["fuse(rs-c)"]
    fused = lower(apply_schedule(program, "fuse(rs-c)"), 4)
    assert [type(s) for s in fused.steps] == [Launch], fused.format()
    plain = lower(program, 4)  # (as written: the library reduce_scatter, then op by op)
    assert isinstance(plain.steps[0], Collective), plain.format()
    assert sum(isinstance(s, Launch) for s in plain.steps) > 1, plain.format()


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("schedule", ["as-written", "fuse(rs-c)"])
def test_the_step_on_the_cpu_kernels_equals_numpy(schedule: str, ranks: int) -> None:
    program = load("zero3_adamw", "mlir")
    if schedule != "as-written":
        program = apply_schedule(program, schedule)
    inputs = make_inputs("zero3_adamw", ranks, seed=ranks)
    want = ref.zero3_adamw({k: v.copy() for k, v in inputs.items()}, ranks)
    got = ThreadedExecutor(lower(program, ranks)).run(inputs)
    for name, value in want.items():
        np.testing.assert_array_equal(np.asarray(got[name]), value, err_msg=name)


def _written_naively() -> str:
    """zero3_adamw as a new user writes it first: all_reduce the gradient, keep a slice."""
    text = load("zero3_adamw", "mlir").print()
    naive = text.replace(
        "%g1 = comm.reduce_scatter sum %g : !coco.tensor<4096xf32, local> -> "
        "!coco.tensor<4096xf32, sliced<0>>",
        "%g0 = comm.all_reduce sum %g : !coco.tensor<4096xf32, local> -> !coco.tensor<4096xf32>"
        "\n    %g1 = coco.slice %g0 : !coco.tensor<4096xf32> -> !coco.tensor<4096xf32, sliced<0>>",
    )
    assert naive != text
    return naive


@pytest.mark.parametrize("ranks", [1, 3, 4])
def test_an_all_reduce_kept_as_a_slice_becomes_the_reduce_scatter(ranks: int) -> None:
    """ZeRO-3 written naively (all_reduce, then coco.slice) is offered fuse(rs-c): the
    schedule reduce-scatters what the slice keeps, the same program and plan as the
    example's, and the same values as the NumPy reference (even and uneven cuts)."""
    from coconet.core.program import Program, parse_module

    naive = Program(parse_module(_written_naively()))
    assert "fuse(rs-c)" in named_schedules(naive)
    scheduled = apply_schedule(naive, "fuse(rs-c)")
    example = apply_schedule(load("zero3_adamw", "mlir"), "fuse(rs-c)")
    assert scheduled.print() == example.print()
    inputs = make_inputs("zero3_adamw", ranks, seed=ranks)
    want = ref.zero3_adamw({k: v.copy() for k, v in inputs.items()}, ranks)
    for program in (naive, scheduled):
        got = ThreadedExecutor(lower(program, ranks)).run(inputs)
        for name, value in want.items():
            np.testing.assert_array_equal(np.asarray(got[name]), value, err_msg=name)
