"""Megatron's distributed optimizer (examples/megatron_dist_optimizer): a flat gradient buffer
sliced on tp, all-reduced over the outer dp axis of a [dp, tp] grid, AdamW on parameters and
moments sliced on tp. Split, each tp piece is reduce-scattered over dp (a dim both axes cut,
tp's cut outermost: `sliced<0, level L>`); every offered schedule computes what an independent
NumPy reference computes, bit for bit, at 1-4 dp ranks, buffers cut evenly and not, in the sim
and on the cpu backend's kernels."""

from __future__ import annotations

import runpy

import numpy as np
import numpy_references as ref
import pytest

import coconet
from coconet.core.program import Program
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Launch
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules

EXAMPLES = "examples/megatron_dist_optimizer"


def _build(n: int) -> Program:
    return runpy.run_path(f"{EXAMPLES}.py")["build"](n)


def _inputs(n: int, dp: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return {
        "g": rng.standard_normal((dp, n)).astype(f32),
        "w": rng.standard_normal(n).astype(f32),
    } | ref.adamw_state(rng, (n,))


def _equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    for name, value in want.items():
        np.testing.assert_array_equal(got[name].view(np.uint32), value.view(np.uint32), what)


def test_the_mlir_and_the_python_example_are_one_program():
    mlir = coconet.load(f"{EXAMPLES}.mlir")
    py = coconet.load(f"{EXAMPLES}.py")
    assert mlir.print() == py.print()


def test_the_split_schedules_cut_each_tp_piece_over_dp():
    program = _build(4096)
    offers = named_schedules(program, ranks=4)
    for name in ("rs-c-ag", "fuse(rs-c-ag)"):
        assert "coco-as-slice{ops=m,v}" in offers[name], offers[name]
        text = apply_schedule(program, name).print()
        nested = "!coco.tensor<4096xf32, [sliced<0, level 1>, sliced<0, level 0>]>"
        assert f"%m: {nested}" in text, text
        assert f"%v: {nested}" in text, text
    fused = lower(apply_schedule(program, "fuse(rs-c-ag)"), 4)
    assert [type(s) for s in fused.steps] == [Launch], fused.format()


@pytest.mark.parametrize("n", [4096, 4099], ids=["even", "uneven"])
@pytest.mark.parametrize("ranks", [2, 4, 6, 8])
def test_every_offered_schedule_matches_the_numpy_reference_in_the_sim(n, ranks):
    program = _build(n)
    dp = ranks // 2
    inputs = _inputs(n, dp, seed=ranks)
    want = ref.zero3_adamw(inputs, dp)
    offers = named_schedules(program, ranks=ranks)
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)"} <= set(offers), offers
    for name in ["as-written", *offers]:
        scheduled = program if name == "as-written" else apply_schedule(program, name)
        got = sim.run(scheduled, {k: np.array(v) for k, v in inputs.items()}, ranks).outputs
        _equal(got, want, f"{name} at {ranks} ranks in the sim")


@pytest.mark.parametrize(
    ("name", "ranks", "n"),
    [("fuse(rs-c-ag)", 4, 4096), ("fuse(rs-c-ag)", 6, 4099), ("rs-c-ag", 4, 4099)],
)
def test_the_split_schedules_match_the_numpy_reference_on_the_cpu_backend(name, ranks, n):
    program = _build(n)
    dp = ranks // 2
    inputs = _inputs(n, dp, seed=ranks)
    want = ref.zero3_adamw(inputs, dp)
    got = ThreadedExecutor(lower(apply_schedule(program, name), ranks)).run(inputs)
    _equal(got, want, f"{name} at {ranks} ranks on the cpu backend")
