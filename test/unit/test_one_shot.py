"""The one-shot fused all_reduce (`fuse(ar-c)`, `comm.fused all_reduce one_shot`, issue #29
item 1): each rank reads every peer's whole input from symmetric memory, reduces it in rank
order and applies the computation to the whole tensor in ONE kernel (one handshake, no
all_gather phase).

It sums the peers in rank order in double and rounds once, as the sim's all_reduce does, and
row reductions keep the lanes' order, so it is bit-identical to the program as written (and so
to the two-shot `fuse(rs-c-ag)`): the sim of every example it fits at 1-8 ranks, the cpu
backend's host kernels at 1, 2, 3, 4 and 7 ranks on sizes no rank count divides (AR + residual
+ RMSNorm / LayerNorm, rows longer than the row kernel's shared memory, an elementwise
epilogue), and across nodes (op by op: library all_reduce, then the computation)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

import coconet
from coconet.core.program import Program, parse_module
from coconet.equivalence import check_equivalence
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective, Launch, PeerTable
from coconet.lowering.plan_builder import LaunchConfig
from coconet.runtime import sim
from coconet.runtime.executor import plan_traffic
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import ScheduleError, ScheduleSteps, apply_schedule, named_schedules
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ONE_SHOT = "fuse(ar-c)"

# The examples fuse(ar-c) fits, with the rank counts their grids take.
SIM_CASES = [
    ("sgd", (1, 2, 3, 4, 8)),
    ("adam", (1, 2, 3, 4, 8)),
    ("adam_bf16_grads", (1, 2, 3, 4, 8)),
    ("adam_fp8_wire", (1, 2, 3, 4, 8)),
    ("adam_clip_global_norm", (1, 2, 3, 4, 8)),
    ("lamb", (1, 2, 3, 4, 8)),
    ("allreduce_rmsnorm", (1, 2, 3, 4, 8)),
    ("allreduce_rmsnorm_fp8", (1, 2, 3, 4, 8)),
    ("megatron_sp_layernorm", (1, 2, 3, 4, 8)),
    ("model_parallel_mlp", (1, 2, 3, 4, 8)),
    ("pipeline_boundary", (2, 4, 8)),
]
HOST_RANKS = (1, 2, 3, 4, 7)


@functools.cache
def example(name: str) -> Program:
    return coconet.load(EXAMPLES / f"{name}.mlir")


def _t(shape: tuple[int, ...], elt: str, layout: str = "") -> str:
    dims = "".join(f"{n}x" for n in shape)
    return f"!coco.tensor<{dims}{elt}{', ' + layout if layout else ''}>"


def _row_types(rows: int, cols: int, elt: str) -> tuple[str, str, str, str, str]:
    """The types of an AR + norm over [rows, cols]: the local partials, a whole tensor, a
    row's weights, the per-row statistics, a scalar."""
    return (
        _t((rows, cols), elt, "local"),
        _t((rows, cols), elt),
        _t((cols,), elt),
        _t((rows, 1), elt),
        _t((), elt),
    )


@functools.cache
def rmsnorm(rows: int, cols: int, elt: str) -> Program:
    """AR + residual + RMSNorm over [rows, cols] (the new residual an output too)."""
    x, t, w, r, s = _row_types(rows, cols, elt)
    return Program(
        parse_module(f"""
func.func @rms(%x: {x}, %res: {t}, %w: {w}) -> ({t}, {t}) {{
  %total = comm.all_reduce sum %x : {x} -> {t}
  %h = coco.add %total, %res : {t}
  %sq = coco.mul %h, %h : {t}
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : {t} -> {r}
  %eps = coco.constant 1.0e-05 : {s}
  %me = coco.add %ms, %eps : {r}, {s} -> {r}
  %inv = coco.rsqrt %me : {r}
  %n = coco.mul %h, %inv : {t}, {r} -> {t}
  %out = coco.mul %n, %w : {t}, {w} -> {t}
  func.return %h, %out : {t}, {t}
}}
""")
    )


@functools.cache
def layernorm(rows: int, cols: int, elt: str) -> Program:
    """AR + residual (updated in place) + LayerNorm over [rows, cols]."""
    x, t, w, r, s = _row_types(rows, cols, elt)
    return Program(
        parse_module(f"""
func.func @ln(%x: {x}, %res: {t}, %g: {w}, %b: {w}) -> {t} {{
  %total = comm.all_reduce sum %x : {x} -> {t}
  %h = coco.add %total, %res : {t}
  coco.update %res, %h : {t}
  %mu = coco.reduce_dims mean %h dims [1] keepdims : {t} -> {r}
  %d = coco.sub %h, %mu : {t}, {r} -> {t}
  %d2 = coco.mul %d, %d : {t}
  %var = coco.reduce_dims mean %d2 dims [1] keepdims : {t} -> {r}
  %eps = coco.constant 1.0e-05 : {s}
  %ve = coco.add %var, %eps : {r}, {s} -> {r}
  %inv = coco.rsqrt %ve : {r}
  %n = coco.mul %d, %inv : {t}, {r} -> {t}
  %gn = coco.mul %n, %g : {t}, {w} -> {t}
  %out = coco.add %gn, %b : {t}, {w} -> {t}
  func.return %out : {t}
}}
""")
    )


@functools.cache
def bias_gelu(n: int, elt: str) -> Program:
    """AR + bias + gelu + dropout, elementwise, over n elements."""
    x, t = _t((n,), elt, "local"), _t((n,), elt)
    return Program(
        parse_module(f"""
func.func @bg(%x: {x}, %b: {t}) -> {t} {{
  %total = comm.all_reduce sum %x : {x} -> {t}
  %y = coco.add %total, %b : {t}
  %g = coco.gelu %y : {t}
  %o = coco.dropout %g, 0.1 seed 7 : {t}
  func.return %o : {t}
}}
""")
    )


def _check_host(program: Program, ranks_list=HOST_RANKS, two_shot: bool = True) -> None:
    """The one-shot plan on the cpu backend against the sim, bit for bit (and the two-shot
    plan's outputs, which match the sim too, so the two forms agree)."""
    assert ONE_SHOT in named_schedules(program)
    one = apply_schedule(program, ONE_SHOT)
    assert "comm.fused all_reduce one_shot" in one.print()
    two = apply_schedule(program, "fuse(rs-c-ag)") if two_shot else None
    for ranks in ranks_list:
        plan = lower(one, ranks)
        inputs = sim.prepare_inputs(program, None, plan.grid_shape, seed=ranks)
        want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks).outputs
        got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
        assert set(got) == set(want)
        for name, value in want.items():
            assert np.array_equal(got[name], value, equal_nan=True), f"{name} at {ranks} ranks"
        if two is not None:
            other = ThreadedExecutor(lower(two, ranks)).run(
                {k: v.copy() for k, v in inputs.items()}
            )
            for name in want:
                assert np.array_equal(other[name], got[name], equal_nan=True), name


def test_the_plan_is_one_kernel_reading_every_peer_s_whole_input():
    one = apply_schedule(example("allreduce_rmsnorm"), ONE_SHOT)
    plan = lower(one, 4)
    launches = [s for s in plan.steps if isinstance(s, Launch)]
    assert not [s for s in plan.steps if isinstance(s, Collective)]
    assert [s.kernel for s in launches] == ["k_one_shot_all_reduce_rows"]
    (launch,) = launches
    inputs = [a for a in launch.args if isinstance(a, PeerTable) and a.buffer.kind != "scratch"]
    assert [a.buffer.name for a in inputs] == ["x"]  # the peers' inputs, nothing gathered
    assert launch.iteration_shape == (16, 64)  # the whole tensor on every rank
    # one handshake: entry and done, no all_gather's pull
    source = plan.cuda_source
    assert "coco_peers_entry" in source
    assert "coco_peers_done" in source
    assert "comm.all_gather" not in source
    # every peer reads this rank's whole input (2-byte f16, 16 x 64)
    assert plan_traffic(plan, 0) == 3 * 16 * 64 * 2


def test_peers_pull_the_narrow_type_of_an_exact_widening():
    """adam_fp8_wire casts its fp8 gradient to f32 before the all_reduce: the one-shot kernel
    pulls the fp8 input and widens it as it accumulates (`coco-defer`'s wire cast), no cast kernel."""
    plan = lower(apply_schedule(example("adam_fp8_wire"), ONE_SHOT), 2)
    (launch,) = [s for s in plan.steps if isinstance(s, Launch)]
    tables = [a.buffer for a in launch.args if isinstance(a, PeerTable)]
    assert [(b.name, b.type.elt) for b in tables if b.kind != "scratch"] == [("g", "f8E4M3FN")]


def test_the_one_shot_pipeline_is_the_named_schedule_s():
    p = example("allreduce_rmsnorm")
    assert named_schedules(p)[ONE_SHOT] == (
        "coco-fuse{mode=all_reduce ops=total form=one_shot},coco-fuse{mode=elementwise}"
    )
    s = ScheduleSteps(p)
    region = s.fuse("total", mode="all_reduce", form="one_shot")
    assert region.op.is_one_shot
    assert s.pipeline == "coco-fuse{mode=all_reduce ops=total form=one_shot}"
    assert apply_schedule(p, "one-shot").print() == apply_schedule(p, ONE_SHOT).print()


@pytest.mark.parametrize(("name", "ranks"), SIM_CASES)
def test_every_example_it_fits_matches_the_sim(name, ranks):
    p = example(name)
    report = check_equivalence(p, apply_schedule(p, ONE_SHOT), ranks=ranks, seeds=(0,))
    assert report.ok, str(report)
    assert not report.narrowed, str(report)
    assert not report.skipped, str(report)


@pytest.mark.parametrize("elt", ["f32", "bf16", "f16"])
def test_rmsnorm_on_uneven_rows_matches_the_sim_on_the_cpu_backend(elt):
    _check_host(rmsnorm(23, 45, elt))


def test_layernorm_with_an_in_place_residual_matches_the_sim_on_the_cpu_backend():
    _check_host(layernorm(7, 33, "f32"))


def test_rows_longer_than_shared_memory_stream():
    # 12,000 f32 elements a row: more than the row kernel's 40 KiB of shared memory
    _check_host(rmsnorm(3, 12000, "f32"), (1, 2, 3), two_shot=False)


@pytest.mark.parametrize("elt", ["f32", "bf16"])
def test_an_elementwise_epilogue_matches_the_sim_on_the_cpu_backend(elt):
    _check_host(bias_gelu(1001, elt))


@pytest.mark.parametrize(("name", "ranks"), [("pipeline_boundary", (2, 4)), ("lamb", (2, 3))])
def test_examples_on_the_cpu_backend(name, ranks):
    """A two-axis grid (the all_reduce over axis 1 of [2, ?], replicated there and local on
    axis 0) and a chain that a full norm ends (LAMB: the region stops before it)."""
    _check_host(example(name), ranks, two_shot=False)


def test_several_blocks_and_threads_per_rank():
    program = apply_schedule(rmsnorm(23, 45, "f32"), ONE_SHOT)
    elementwise = apply_schedule(bias_gelu(1001, "f32"), ONE_SHOT)
    for p in (program, elementwise):
        for config in (LaunchConfig(block=1, max_blocks=3), LaunchConfig(block=3, max_blocks=7)):
            plan = lower(p, 3, config)
            inputs = sim.prepare_inputs(p, None, plan.grid_shape, seed=5)
            want = sim.run(p, {k: v.copy() for k, v in inputs.items()}, ranks=3).outputs
            got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
            for name, value in want.items():
                assert np.array_equal(got[name], value), f"{name} {config}"


def test_across_nodes_it_lowers_op_by_op():
    p = apply_schedule(example("allreduce_rmsnorm"), ONE_SHOT)
    plan = lower(p, 4, None, (0, 0, 1, 1))
    assert any(isinstance(s, Collective) and s.op == "all_reduce" for s in plan.steps)
    assert "k_one_shot" not in plan.cuda_source
    inputs = sim.prepare_inputs(p, None, plan.grid_shape, seed=4)
    want = sim.run(p, {k: v.copy() for k, v in inputs.items()}, ranks=4).outputs
    got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
    for name, value in want.items():
        assert np.array_equal(got[name], value), name


def test_refusals_name_their_rule():
    p = example("adam_clip_global_norm")
    s = ScheduleSteps(p)
    with pytest.raises(ScheduleError, match=r"\[fuse-form\] form=one_shot .* mode=all_reduce"):
        s.fuse(mode="elementwise", form="one_shot")
    # a scalar's all_reduce (an amax for fp8 scales) is not a one-shot fused all_reduce
    fp8 = ScheduleSteps(example("fp8_allgather_matmul"))
    with pytest.raises(ScheduleError, match=r"\[fuse-one-shot\].*reduces a scalar"):
        fp8.fuse("amax", mode="all_reduce", form="one_shot")
    # split: no all_reduce left as written, so nothing is one-shot
    split = apply_schedule(example("sgd"), "rs-c-ag")
    assert "one_shot" not in str(ScheduleSteps(split).fuse(mode="all_reduce", form="one_shot"))


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_the_elementwise_and_streaming_forms_compile_with_nvrtc():
    # (adam's and allreduce_rmsnorm's one-shot kernels are in test_lowering's NVRTC matrix,
    # on sm_80 and sm_90; fp8 conversions differ by arch, so the fp8 wire's takes both too)
    cases = [
        (bias_gelu(1001, "bf16"), ("sm_90",)),
        (rmsnorm(3, 12000, "f32"), ("sm_90",)),
        (example("adam_fp8_wire"), ("sm_80", "sm_90")),
    ]
    for p, archs in cases:
        plan = lower(apply_schedule(p, ONE_SHOT), 2)
        assert "k_one_shot_all_reduce" in plan.cuda_source
        for arch in archs:
            assert compile_cuda(plan.cuda_source, arch, warnings_as_errors=True).binary
