"""The softmax example (examples/softmax_rows.*, issue #11): tensor-parallel attention scores,
a causal ALiBi bias as a dense constant, a row-wise softmax.

Every schedule the enumerator offers (coconet.schedule.enumerate_scheduled_programs) runs at
1, 2 and 4 ranks on the sim and on the cpu backend's kernels (in-process ranks), and matches
the independent NumPy reference bit for bit (dyadic inputs: the partial scores are exact in
any order; the row sums follow the dialect's lane order, as the reference does). On real MPI
ranks: test/mpi/test_mpi_cpu.py. The launch counts the README states are checked here."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import numpy_references as ref

import coconet
from coconet.core.program import Program
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective, Launch, Matmul
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, enumerate_scheduled_programs, named_schedules

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "softmax_rows.mlir"
RANKS = (1, 2, 4)


@functools.cache
def program() -> Program:
    return coconet.load(EXAMPLE)


@functools.cache
def space() -> dict[str, Program]:
    return {name: scheduled for name, _, scheduled in enumerate_scheduled_programs(program())}


def make_inputs(seed: int) -> dict[str, np.ndarray]:
    """Multiples of 2^-6 in [-1, 1] (test_examples.dyadic): the partial scores are exact."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-64, 65, size=(16, 64)) / 64
    kt = rng.integers(-64, 65, size=(64, 40)) / 64
    return {"q": q.astype(np.float32), "kt": kt.astype(np.float32)}


def assert_outputs_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert np.array_equal(got[k], want[k]), f"{k}: {np.abs(got[k] - want[k]).max()}"


def check(scheduled: Program, name: str) -> None:
    for ranks in RANKS:
        inputs = make_inputs(seed=ranks)
        want = ref.REFERENCES["softmax_rows"]({k: v.copy() for k, v in inputs.items()}, ranks)
        sim = coconet.run(scheduled, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
        assert_outputs_equal(sim.outputs, want)
        plan = lower(scheduled, ranks)
        got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
        try:
            assert_outputs_equal(got, want)
        except AssertionError as e:
            raise AssertionError(f"{name} at {ranks} ranks: {e}") from None


def test_the_enumerator_offers_the_named_schedules_and_more() -> None:
    assert set(named_schedules(program())) == {"ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)"}
    names = set(space())
    assert any("overlap(partial" in n for n in names)  # the matmul chunked
    assert any("split(scores,dim=1)" in n for n in names)  # split along the keys
    assert len(names) > 40


def test_every_enumerated_schedule_matches_numpy_on_sim_and_kernels() -> None:
    for name, scheduled in space().items():
        check(scheduled, name)


def steps(name: str) -> tuple[int, int, int]:
    """(matmuls, kernel launches, library collectives) of the schedule's plan at 4 ranks."""
    plan = lower(apply_schedule(program(), name), 4)
    return (
        sum(isinstance(s, Matmul) for s in plan.steps),
        sum(isinstance(s, Launch) for s in plan.steps),
        sum(isinstance(s, Collective) for s in plan.steps),
    )


def test_launch_counts_the_readme_states() -> None:
    """README's row-wise table: the scale and bias, each row reduction, the exp and the
    division are a launch each, around the all_reduce or between the reduce_scatter and the
    all_gather; fused, ONE launch (the row kernel) after the matmul."""
    assert steps("ar-c") == (1, 5, 1)
    assert steps("rs-c-ag") == (1, 5, 2)
    assert steps("fuse(rs-c-ag)") == (1, 1, 0)


def test_the_bias_is_in_the_fused_kernel() -> None:
    source = lower(apply_schedule(program(), "fuse(rs-c-ag)"), 2).cuda_source
    assert "static const float bias_values[640] = {" in source
    values = source[source.index("bias_values[640] = {") : source.index("};")]
    assert values.count("-1.0f / 0.0f") == 640 - sum(range(25, 41))  # the masked keys
    assert "-0x1.0000000000000p-1f" in values  # -0.5: the key just before the query
