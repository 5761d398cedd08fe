"""Vocab-parallel cross-entropy (examples/vocab_parallel_cross_entropy.*, issue #25 item 5):
Megatron's three all_reduces (row max, sum of exp, the target's logit as a masked sum) over
logits sliced on an uneven vocab.

The two sums' chains meet in the loss: `fuse(rs-c-ag)` fuses them as ONE fused all_reduce
(it was refused, `[fuse-chain] ... share`), the exp(x - max) between the all_reduces is one
elementwise kernel, and the fused plan launches no more kernels than `ar-c` (which also runs
three library all_reduces). Every offered schedule matches the sim oracle (the per-token
loss bit for bit, the mean within the reassociated sum's tolerance) and a float64 NumPy
reference, on the sim and the threaded cpu backend's kernels, in f32 and bf16, at 2, 3, 4
and 7 ranks (1003 = 2 * 501 + 1 = 3 * 334 + 1 = 4 * 250 + 3 = 7 * 143 + 2: uneven at each)."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import coconet
from coconet.core.program import Program
from coconet.dialects import comm
from coconet.frontend import BF16, F32
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective, Launch
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vocab_parallel_cross_entropy.py"
RANKS = (2, 3, 4, 7)
DTYPES = {"f32": (F32, np.float32), "bf16": (BF16, ml_dtypes.bfloat16)}
# the mean's sum is reassociated (per slice of tokens, then across ranks) by rs-c-ag
MEAN_RTOL = {"f32": 1e-6, "bf16": 1e-2}


@functools.cache
def program(dtype: str = "f32", vocab: int = 1003) -> Program:
    return runpy.run_path(str(EXAMPLE))["build"](DTYPES[dtype][0], vocab=vocab)


def make_inputs(dtype: str, rows: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = (4 * rng.standard_normal((rows, vocab))).astype(DTYPES[dtype][1])
    mask = np.zeros((rows, vocab), DTYPES[dtype][1])
    # targets in every rank's piece, the last word of the vocab among them
    mask[np.arange(rows), np.r_[vocab - 1, rng.integers(0, vocab, rows - 1)]] = 1
    return {"logits": logits, "target_mask": mask}


def reference(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    """Per-token loss and its mean in float64, from the whole logits."""
    x = inputs["logits"].astype(np.float64)
    target = (x * inputs["target_mask"].astype(np.float64)).sum(-1, keepdims=True)
    m = x.max(-1, keepdims=True)
    loss = np.log(np.exp(x - m).sum(-1, keepdims=True)) - (target - m)
    return loss, float(loss.mean())


def launches(scheduled: Program, ranks: int) -> tuple[int, int]:
    plan = lower(scheduled, ranks)
    return (
        sum(isinstance(s, Launch) for s in plan.steps),
        sum(isinstance(s, Collective) for s in plan.steps),
    )


def test_the_fused_form_is_offered_and_fuses_the_meeting_chains() -> None:
    offers = named_schedules(program(), explain=True)
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)"} <= set(offers.offered)
    fused = apply_schedule(program(), "fuse(rs-c-ag)")
    regions = [op for op in fused.func.walk() if isinstance(op, comm.FusedOp)]
    scatters = [sum(isinstance(o, comm.ReduceScatterOp) for o in r.body.block.ops) for r in regions]
    # the max's, and the two sums' meeting in the loss as one region
    assert sorted(s for s in scatters if s) == [1, 2]
    # exp(logits - max) is one elementwise kernel, not a kernel each
    assert any(
        r.kind.data == comm.FusionKind.ELEMENTWISE and len(list(r.body.block.ops)) == 3
        for r in regions
    )


@pytest.mark.parametrize("ranks", [2, 7])
def test_fused_runs_fewer_steps_than_ar_c(ranks: int) -> None:
    """fuse(rs-c-ag) replaces ar-c's three library all_reduces by two fused kernels (the row
    max's; the two sums' with the loss and its mean), and runs no more steps in all; ar-c's
    loss and its mean's sum are one kernel too (coco-fuse{mode=reduction})."""
    ar_c = launches(apply_schedule(program(), "ar-c"), ranks)
    fused = launches(apply_schedule(program(), "fuse(rs-c-ag)"), ranks)
    assert ar_c[1] == 3  # three library all_reduces
    assert fused[1] == 0
    assert sum(fused) < sum(ar_c), (fused, ar_c)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_offered_schedule_matches_the_oracle(dtype: str) -> None:
    p = program(dtype)
    tol = MEAN_RTOL[dtype]
    for name in named_schedules(p):
        scheduled = apply_schedule(p, name)
        for ranks in RANKS:
            inputs = make_inputs(dtype, 8, 1003, seed=ranks)
            want = coconet.run(p, {k: v.copy() for k, v in inputs.items()}, ranks=ranks).outputs
            sim = coconet.run(scheduled, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
            got = ThreadedExecutor(lower(scheduled, ranks)).run(
                {k: v.copy() for k, v in inputs.items()}
            )
            for out in (sim.outputs, got):
                at = f"{name} at {ranks} ranks"
                assert out["loss"].dtype == want["loss"].dtype, at
                assert np.array_equal(out["loss"], want["loss"]), at
                m, w = float(out["mean"]), float(want["mean"])
                assert abs(m - w) <= tol * abs(w), (at, m, w)
            loss, mean = reference(inputs)
            # the program's rounding: f32 to a few ulps, bf16 to its 8-bit mantissa
            close = 1e-5 if dtype == "f32" else 5e-2
            np.testing.assert_allclose(
                want["loss"].astype(np.float64), loss, rtol=close, atol=close
            )
            assert abs(float(want["mean"]) - mean) <= close * abs(mean)


def test_a_gpt2_sized_vocab_fused_at_three_ranks() -> None:
    """50257 words (3 * 16752 + 1): the fused plan on the cpu kernels, as the oracle."""
    p = program("f32", 50257)
    scheduled = apply_schedule(p, "fuse(rs-c-ag)")
    inputs = make_inputs("f32", 8, 50257, seed=0)
    want = coconet.run(p, {k: v.copy() for k, v in inputs.items()}, ranks=3).outputs
    got = ThreadedExecutor(lower(scheduled, 3)).run({k: v.copy() for k, v in inputs.items()})
    assert np.array_equal(got["loss"], want["loss"])
    assert abs(float(got["mean"]) - float(want["mean"])) <= 1e-6 * abs(float(want["mean"]))
