"""Fused collectives over groups of one member (one rank, or a grid axis of size 1): every
collective is the identity on the rank's piece, so the fused kernel is a plain elementwise
kernel (lowering/fused_collective.py `single`): it reads the reduce_scatter's input from the
rank's own memory and stores the gathered value straight into what it updates -- no
symmetric buffer (an argument bound, not copied, every step), no staging store, no flags,
handshake or pull. Checked here: the plans hold none of that, the optimizers move exactly
their floor of bytes, and the kernels compute what the sim computes of the program as
written, bit for bit, for the examples' fused schedules, every float dtype, a stated
accumulation, in-kernel reductions (LAMB's norms), many tensors in one table launch and a
size-1 axis of a 2-D grid beside one of size 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from compiled_ranks import runs_as_the_sim_computes

import coconet
from coconet import frontend
from coconet.core.program import Program
from coconet.frontend import (
    BF16,
    F16,
    F32,
    AllReduce,
    Local,
    Replicated,
    Sliced,
    Sqrt,
    Tensor,
    Update,
)
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Launch, PeerTable, Plan
from coconet.lowering.traffic import floor_total, plan_total
from coconet.schedule import apply_schedule
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str) -> Program:
    return coconet.load(str(EXAMPLES / f"{name}.mlir"))


def _runs_as_the_sim_computes(program: Program, schedule: str, ranks: int) -> Plan:
    return runs_as_the_sim_computes(program, schedule, ranks)


def _peer_free(plan: Plan) -> None:
    """No symmetric buffer, no launch reaching peers."""
    assert not [b.name for b in plan.buffers if b.symmetric]
    for step in plan.steps:
        if isinstance(step, Launch):
            assert not [a for a in step.args if isinstance(a, PeerTable)], step.kernel


@pytest.mark.parametrize("example", ["sgd", "adam", "adam_bf16_grads", "adam_fp8_wire"])
@pytest.mark.parametrize("schedule", ["fuse(rs-c-ag)", "fuse(ar-c)"])
def test_fused_optimizers_on_one_rank_are_plain_kernels_at_the_floor(example, schedule):
    """One kernel, no peers, exactly the floor of bytes (the two-shot form used to store the
    updated slice twice and take the gradient through a symmetric copy), bit for bit the
    sim's."""
    program = _example(example)
    plan = _runs_as_the_sim_computes(program, schedule, 1)
    _peer_free(plan)
    scheduled = apply_schedule(program, schedule)
    assert plan_total(plan, 0) == floor_total(scheduled.func, plan.grid_shape, 0)


@pytest.mark.parametrize(
    ("example", "schedule"),
    [
        ("lamb", "fuse(rs-c-ag)"),  # norms finished in the kernel, a trust ratio after
        ("adam_clip_global_norm", "fuse(rs-c-ag)"),  # a global norm couples every chain
        ("adam_loss_scaling", "fuse(rs-c-ag)"),  # f16 gradients, scalar state updated
        ("zero3_adamw", "fuse(rs-c)"),  # no all_gather: the result stays sliced
    ],
)
def test_other_fused_regions_on_one_rank(example, schedule):
    _runs_as_the_sim_computes(_example(example), schedule, 1)


@pytest.mark.parametrize(
    "example",
    ["allreduce_rmsnorm", "allreduce_rmsnorm_fp8", "megatron_sp_layernorm", "softmax_rows"],
)
@pytest.mark.parametrize("schedule", ["fuse(rs-c-ag)", "fuse(ar-c)"])
def test_row_kernels_on_one_rank_are_plain(example, schedule):
    """The row form (AR + residual + RMSNorm or LayerNorm, softmax rows) over one member: a
    plain row kernel reading its input where it lies, bit for bit the sim's -- no symmetric
    copy of the input each call, no flags or handshake."""
    plan = _runs_as_the_sim_computes(_example(example), schedule, 1)
    _peer_free(plan)
    assert any("rows" in s.kernel for s in plan.steps if isinstance(s, Launch)), plan


def test_a_size_one_axis_of_a_2d_grid():
    """pipeline_boundary's grid [2, ?] on 2 ranks is [2, 1]: its fused all_reduce spans the
    axis of size 1 (no peers) while the send crosses the other."""
    program = _example("pipeline_boundary")
    for schedule in ("fuse(rs-c-ag)", "fuse(ar-c)"):
        plan = _runs_as_the_sim_computes(program, schedule, 2)
        assert plan.grid_shape == (2, 1)
        _peer_free(plan)


def _adam_over(dt: Any, grid: list[Any], dp: int) -> Program:
    """Adam over three tensors of uneven sizes (one fused region each: one table launch),
    the gradient all-reduced over grid axis `dp`, everything cut on dim 0 by the other axis
    if any; narrow gradients state an f32 accumulation."""
    others = [Replicated if a == dp else Sliced(0) for a in range(len(grid))]
    grads = [Local if a == dp else lay for a, lay in enumerate(others)]
    acc = None if dt is F32 else F32
    A, B, C = [7, 3], [5, 4], [9, 2]

    def T(shape: list[int], layouts: list[Any]) -> Tensor:
        return Tensor(dt, shape, layouts)

    @frontend.program(grid=grid)
    def adam_many(
        g0=T(A, grads), w0=T(A, others), m0=T(A, others), v0=T(A, others),
        g1=T(B, grads), w1=T(B, others), m1=T(B, others), v1=T(B, others),
        g2=T(C, grads), w2=T(C, others), m2=T(C, others), v2=T(C, others),
    ):  # fmt: skip
        lr, beta1, beta2, eps = Tensor(dt, []), Tensor(dt, []), Tensor(dt, []), Tensor(dt, [])
        for g, w, m, v in ((g0, w0, m0, v0), (g1, w1, m1, v1), (g2, w2, m2, v2)):
            gs = AllReduce("+", g, over=[dp], acc=acc)
            mn = beta1 * m + (1 - beta1) * gs
            vn = beta2 * v + (1 - beta2) * gs * gs
            Update(m, mn)
            Update(v, vn)
            Update(w, w - lr * mn / (Sqrt(vn) + eps))

    return adam_many


@pytest.mark.parametrize("dt", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize(
    ("grid", "dp", "ranks"),
    [([None], 0, 1), ([None, 2], 0, 2), ([2, None], 1, 2)],
    ids=["one-rank", "dp-of-1-beside-tp-2", "dp-of-1-after-tp-2"],
)
def test_many_tensors_over_a_group_of_one(dt, grid, dp, ranks):
    """Three tensors of uneven sizes, every dtype, the data-parallel axis of size 1 (alone,
    or beside a tensor-parallel axis of 2 whose uneven cut the kernels honour): one table
    launch of a plain kernel, bit for bit the sim's."""
    program = _adam_over(dt, grid, dp)
    plan = _runs_as_the_sim_computes(program, "fuse(rs-c-ag)", ranks)
    _peer_free(plan)
    launches = [s for s in plan.steps if isinstance(s, Launch)]
    assert len(launches) == 1, [s.kernel for s in launches]


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_plain_kernels_of_one_member_compile_with_nvrtc():
    """The text at one rank differs from the collective one (every other test compiles the
    largest rank count's): its vector loops without peers compile for sm_80 and sm_90 without
    a warning."""
    sources = []
    for example, schedule in [
        ("adam_bf16_grads", "fuse(rs-c-ag)"),
        ("lamb", "fuse(rs-c-ag)"),
        ("adam", "fuse(ar-c)"),
    ]:
        plan = lower(apply_schedule(_example(example), schedule), 1)
        assert plan.peers_max() <= 1  # (LAMB's norms exchange partials in a group of one)
        sources.append(plan.device_source())
    for source in sources:
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(source, arch, warnings_as_errors=True).binary
