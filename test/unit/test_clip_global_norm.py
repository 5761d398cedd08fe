"""Coupled norms: global-norm gradient clipping, then Adam, over three parameter tensors of
sizes 1000, 33 and 4097 (examples/adam_clip_global_norm.*), written per tensor -- no
flattening by hand. Every tensor's update reads one clipping factor computed from every
tensor's summed gradient, so each tensor's fused chain is coupled to the others through
scalars: coco-fuse puts the coupled chains in ONE fused region, and the lowering runs each
segment as one table launch over the tensors.

Every schedule the enumerator offers runs on the sim and on the cpu kernels (threaded ranks)
at 1, 2 and 4 ranks and matches an independent NumPy reference."""

from __future__ import annotations

import functools
import runpy
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
from coconet.schedule import Schedule, enumerate_scheduled_programs, named_schedules
from coconet.toolchain.nvrtc import compile_all_archs, nvrtc_available

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIZES = (1000, 33, 4097)
F32 = np.float32


@functools.cache
def program() -> Program:
    return coconet.load(EXAMPLES / "adam_clip_global_norm.py")


@functools.cache
def schedules() -> list[tuple[str, Program]]:
    return [(name, p) for name, _pipe, p in enumerate_scheduled_programs(program())]


def clipped_adam(
    inputs: dict[str, np.ndarray], ranks: int, tensors: int = len(SIZES)
) -> dict[str, np.ndarray]:
    """NumPy, one f32 op at a time in the program's order; sums of squares in f64."""
    lr, beta1, beta2, eps, step, max_norm = (
        ref.f32(inputs[k]) for k in ("lr", "beta1", "beta2", "eps", "step", "max_norm")
    )
    grads = [
        ref.all_reduce_sum([inputs[f"g{i}"][r] for r in range(ranks)], F32) for i in range(tensors)
    ]
    squares = None
    for g in grads:
        sq = ref.ew(np.multiply, g, g, out=F32).astype(np.float64)
        part = np.asarray(sq.sum()).astype(F32)  # tolerance covers the summation order
        squares = part if squares is None else ref.ew(np.add, squares, part, out=F32)
    total = ref.ew(np.sqrt, squares, out=F32)
    clip = ref.ew(
        np.minimum, F32(1.0), ref.ew(np.divide, max_norm, total + F32(1e-6), out=F32), out=F32
    )
    out = {}
    for i, g in enumerate(grads):
        gc = ref.ew(np.multiply, g, clip, out=F32)
        m1, v1, mhat, vhat = ref._adam_moments(
            gc, inputs[f"m{i}"], inputs[f"v{i}"], beta1, beta2, step
        )
        num = ref.ew(np.multiply, lr, mhat, out=F32)
        den = ref.ew(np.add, ref.ew(np.sqrt, vhat, out=F32), eps, out=F32)
        out |= {
            f"w{i}": ref.ew(
                np.subtract, inputs[f"w{i}"], ref.ew(np.divide, num, den, out=F32), out=F32
            ),
            f"m{i}": m1,
            f"v{i}": v1,
        }
    return out


def inputs_for(p: Program, ranks: int, seed: int) -> dict[str, np.ndarray]:
    inputs = prepare_inputs(p, None, (ranks,), seed=seed)
    # A max norm below the gradients' global norm: the clipping takes effect.
    inputs["max_norm"] = np.asarray(0.5, dtype=F32)
    return inputs


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} {what}")


def test_python_form_builds_the_mlir_form():
    assert coconet.load(EXAMPLES / "adam_clip_global_norm.mlir").print() == program().print()


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_oracle_matches_numpy(ranks: int):
    inputs = inputs_for(program(), ranks, seed=ranks)
    got = coconet.run(program(), inputs, ranks=ranks, inplace=False).outputs
    want = clipped_adam(inputs, ranks)
    assert_close(got, want, f"at {ranks} ranks")
    # The clipping is active: the update differs from unclipped Adam.
    unclipped = ref.adam({k: inputs[f"{k}0"] for k in "gwmv"} | inputs, ranks)
    assert not np.allclose(got["m0"], unclipped["m"])


def test_fused_schedule_is_offered_and_runs_as_two_table_launches():
    assert "fuse(rs-c-ag)" in named_schedules(program())
    s = Schedule(program())
    s.named("fuse(rs-c-ag)")
    regions = [op for op in s.program.func.body.block.ops if op.name == "comm.fused"]
    assert len(regions) == 1  # the three coupled chains: one region
    for ranks in (2, 4):
        plan = lower(s.program, ranks)
        launches = [st for st in plan.steps if isinstance(st, Launch)]
        assert len(launches) == 2, plan.format()
        assert all(st.kernel.endswith("_table") for st in launches), plan.format()
        assert not [st for st in plan.steps if isinstance(st, Collective)], plan.format()


# More tensors than the lowering lets each kernel recompute the norm from (SHARED_SCALAR_INPUTS)
MANY = tuple(40 + 7 * i for i in range(20))


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_norm_over_many_tensors_is_computed_once_per_step(ranks: int):
    """Each tensor's kernel computed the clipping factor itself from every tensor's partial
    sum: N kernels taking N partials each, a launch table of N^2 arguments (4.8 s to lower
    200 tensors). Past SHARED_SCALAR_INPUTS values, one kernel of one element computes it
    between the two table launches, and each tensor's kernel reads the factor."""
    build = runpy.run_path(str(EXAMPLES / "adam_clip_global_norm.py"))["build"]
    s = Schedule(build(MANY))
    s.named("fuse(rs-c-ag)")
    plan = lower(s.program, ranks)
    launches = [st for st in plan.steps if isinstance(st, Launch)]
    assert [st.kernel.split("_")[-1] for st in launches] == ["table", "scalars", "table"], (
        plan.format()
    )
    partials = {f"%sumsq{i}" for i in range(len(MANY))}
    text = plan.format().splitlines()
    (shared,) = [line for line in text if "k_shared_scalars" in line]
    assert all(f"{name}," in shared or f"{name}]" in shared for name in partials), shared
    (update,) = [line for line in text if "launch" in line][2:]
    assert not any(name in update for name in partials), update
    inputs = inputs_for(s.program, ranks, seed=5)
    want = clipped_adam(inputs, ranks, tensors=len(MANY))
    assert_close(ThreadedExecutor(plan).run(inputs), want, f"on cpu kernels at {ranks} ranks")


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_a_norm_over_many_tensors_compiles_with_nvrtc():
    """The once-computed norm is a kernel of its own: the unit holding it compiles for the
    GPUs CI checks, without warnings."""
    build = runpy.run_path(str(EXAMPLES / "adam_clip_global_norm.py"))["build"]
    s = Schedule(build(MANY))
    s.named("fuse(rs-c-ag)")
    source = lower(s.program, 2).cuda_source
    assert "k_shared_scalars" in source
    for compiled in compile_all_archs(source, warnings_as_errors=True).values():
        assert compiled.binary


@pytest.mark.parametrize("sizes", [(1000, 33, 1000), (8, 16, 8, 16), (17, 17, 19, 17, 19)])
def test_interleaved_shapes_fuse_as_one_region(sizes: tuple[int, ...]):
    """Weights and biases interleaved (tensors of one shape with another between them): the
    chains of one shape meet in each other's updates, which read the norm. Merged in program
    order, the union with the tensor between them was not one kernel and fuse(rs-c-ag) was
    refused (not even offered); now one region, as for sizes in any other order."""
    build = runpy.run_path(str(EXAMPLES / "adam_clip_global_norm.py"))["build"]
    p = Schedule(build(sizes)).program
    assert "fuse(rs-c-ag)" in named_schedules(p)
    s = Schedule(p)
    s.named("fuse(rs-c-ag)")
    regions = [op for op in s.program.func.body.block.ops if op.name == "comm.fused"]
    assert len(regions) == 1
    for ranks in (2, 3):
        inputs = inputs_for(p, ranks, seed=ranks)
        want = clipped_adam(inputs, ranks, tensors=len(sizes))
        got = ThreadedExecutor(lower(s.program, ranks)).run(inputs)
        assert_close(got, want, f"{sizes} on cpu kernels at {ranks} ranks")


def test_enumerator_offers_fused_coupled_schedules():
    names = [n for n, _ in schedules()]
    assert any("fuse(all_reduce)" in n for n in names), names
    fused = [p for n, p in schedules() if "fuse(all_reduce)" in n]
    for p in fused:
        assert any(op.name == "comm.fused" for op in p.func.body.block.ops)


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_every_enumerated_schedule_matches_numpy_on_sim_and_cpu(ranks: int):
    inputs = inputs_for(program(), ranks, seed=10 + ranks)
    want = clipped_adam(inputs, ranks)
    for name, p in schedules():
        sim = coconet.run(p, inputs, ranks=ranks, inplace=False).outputs
        assert_close(sim, want, f"[{name}] on the sim at {ranks} ranks")
        cpu = ThreadedExecutor(lower(p, ranks)).run(inputs)
        assert_close(cpu, want, f"[{name}] on cpu kernels at {ranks} ranks")
