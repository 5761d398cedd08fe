"""Mixed-precision Adam with dynamic loss scaling (examples/adam_loss_scaling.*, issue #25): f16
gradients summed over the ranks, unscaled, checked for inf/NaN; the step applied or skipped as
a whole; the scale and its growth counter updated from the found-inf flag.

Every schedule the enumerator offers runs on the sim and on the cpu kernels (threaded ranks) at
1, 2 and 3 ranks against an independent NumPy reference, on a clean step, a step that grows the
scale, and steps with an inf or a NaN in one rank's gradient. Under fuse(rs-c-ag) the scalar
state's updates are one kernel after the fused collectives (no launch per scalar op)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import numpy_references as ref
import pytest

import coconet
from coconet.core.program import Program
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective, Launch
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIZES = (1000, 4096)
F32 = np.float32


@functools.cache
def program() -> Program:
    return coconet.load(EXAMPLES / "adam_loss_scaling.py")


def loss_scaled_adam(inputs: dict[str, np.ndarray], ranks: int) -> dict[str, np.ndarray]:
    """NumPy, one f32 op at a time in the program's order (GradScaler's rule)."""
    lr, beta1, beta2, eps, step, scale, tracker, interval = (
        ref.f32(inputs[k])
        for k in ("lr", "beta1", "beta2", "eps", "step", "scale", "tracker", "interval")
    )
    unscaled, found = [], np.float32(0.0)
    for i in range(len(SIZES)):
        gsum = ref.all_reduce_sum([inputs[f"g{i}"][r] for r in range(ranks)], np.dtype(np.float16))
        g = ref.ew(np.divide, gsum.astype(F32), scale, out=F32)
        with np.errstate(invalid="ignore"):
            finite = ref.ew(np.subtract, g, g, out=F32) == 0  # inf - inf and NaN are NaN
        found = np.maximum(found, F32(0.0) if finite.all() else F32(1.0))
        unscaled.append(g)
    ok = found == 0
    out: dict[str, np.ndarray] = {}
    for i, g in enumerate(unscaled):
        m, v, w = inputs[f"m{i}"], inputs[f"v{i}"], inputs[f"w{i}"]
        with np.errstate(invalid="ignore", over="ignore"):
            m1, v1, mhat, vhat = ref._adam_moments(g, m, v, beta1, beta2, step)
            num = ref.ew(np.multiply, lr, mhat, out=F32)
            den = ref.ew(np.add, ref.ew(np.sqrt, vhat, out=F32), eps, out=F32)
            w1 = ref.ew(np.subtract, w, ref.ew(np.divide, num, den, out=F32), out=F32)
        out |= {f"m{i}": m1 if ok else m, f"v{i}": v1 if ok else v, f"w{i}": w1 if ok else w}
    clean = ref.ew(np.add, tracker, F32(1.0), out=F32) if ok else F32(0.0)
    grow = clean == interval
    grown = ref.ew(np.multiply, scale, F32(2.0), out=F32) if grow else scale
    halved = ref.ew(np.multiply, scale, F32(0.5), out=F32)
    out["scale"] = np.asarray(grown if ok else halved, F32)
    out["tracker"] = np.asarray(F32(0.0) if grow else clean, F32)
    return out


def case_inputs(ranks: int, case: str) -> dict[str, np.ndarray]:
    inputs = prepare_inputs(program(), None, (ranks,), seed=ranks)
    inputs |= {
        "lr": np.asarray(1e-3, F32),
        "beta1": np.asarray(0.9, F32),
        "beta2": np.asarray(0.999, F32),
        "eps": np.asarray(1e-8, F32),
        "step": np.asarray(3.0, F32),
        "scale": np.asarray(1024.0, F32),
        "interval": np.asarray(4.0, F32),
        "tracker": np.asarray(3.0 if case == "grow" else 1.0, F32),
    }
    bad = {"inf": np.inf, "nan": np.nan}.get(case)
    if bad is not None:  # one element of one rank's gradient (the last rank's)
        g = inputs["g1"].copy()
        g[ranks - 1, 77] = bad
        inputs["g1"] = g
    return inputs


CASES = ["clean", "grow", "inf", "nan"]


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_every_offered_schedule_matches_numpy_on_sim_and_kernels(ranks: int) -> None:
    p = program()
    offered = named_schedules(p)
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)"} <= set(offered)
    for case in CASES:
        inputs = case_inputs(ranks, case)
        want = loss_scaled_adam(inputs, ranks)
        got = coconet.run(p, {k: v.copy() for k, v in inputs.items()}, ranks=ranks, inplace=False)
        for k, w in want.items():
            assert np.array_equal(got.outputs[k], w, equal_nan=True), ("sim", case, k)
        for name in offered:
            plan = lower(apply_schedule(p, name), ranks)
            out = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
            for k, w in want.items():
                assert np.array_equal(np.asarray(out[k]), w, equal_nan=True), (name, case, k)
    assert case_inputs(ranks, "inf")["g1"].dtype == np.float16


def test_fused_schedule_updates_the_scalar_state_in_one_kernel() -> None:
    """fuse(rs-c-ag) runs each tensor's reduce_scatter + found-inf reduction and its update
    + all_gather as fused collective kernels, then ONE kernel of one element for the scale
    and its counter -- fewer steps than ar-c (whose found-inf reductions are fused kernels
    too, beside its library all_reduces); it used to be refused ([fuse-chain]: the chains
    shared the scalar updates), and then lowered every scalar op as its own launch."""
    steps = {
        name: sum(
            isinstance(s, Launch | Collective)
            for s in lower(apply_schedule(program(), name), 2).steps
        )
        for name in ("ar-c", "fuse(rs-c-ag)")
    }
    assert steps["fuse(rs-c-ag)"] < steps["ar-c"]
    plan = lower(apply_schedule(program(), "fuse(rs-c-ag)"), 2)
    tail = [s for s in plan.steps if isinstance(s, Launch) and "scalar_updates" in s.kernel]
    assert len(tail) == 1
    assert {"scale", "tracker"} <= set(tail[0].writes)
    assert not [s for s in plan.steps if not isinstance(s, Launch)]  # no copy of an update


def test_the_mlir_text_is_the_front_ends_program() -> None:
    assert coconet.load(EXAMPLES / "adam_loss_scaling.mlir").print() == program().print()
