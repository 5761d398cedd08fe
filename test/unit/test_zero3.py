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
