"""Compile time stays linear in the program: structural counts, not wall time. The stacks are
benchmarks/compile_time.py's tensor-parallel layers (6 ops each), and its other program shapes
(`shape_text`: every layer reading one sliced input, each its own input, independent layers, one
long elementwise chain)."""

from __future__ import annotations

import cProfile
import functools
import importlib.util
import pstats
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from xdsl.ir import Block
from xdsl.utils.exceptions import PassFailedException

import coconet
from coconet.compile import apply_schedule
from coconet.core.program import Program, parse_module
from coconet.equivalence import check_equivalence
from coconet.lowering.batching import TableBatcher
from coconet.lowering.cuda_printer import CudaPrinter
from coconet.lowering.kernel_ir import Kernel
from coconet.lowering.kernels.elementwise import ElementwiseKernel
from coconet.lowering.kernels.vectors import CONJUNCTION_TERMS
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Launch
from coconet.lowering.signature import ParamKind
from coconet.passes.common import OrderInfo, check_groups_acyclic
from coconet.passes.fuse.chain import ChainScans
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import ScheduleError, named_schedules

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _benchmark() -> Any:
    spec = importlib.util.spec_from_file_location(
        "compile_time", ROOT / "benchmarks/compile_time.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stack_text(layers: int) -> str:
    return _benchmark().stack_text(layers)


def _visits(layers: int, pipeline: str) -> int:
    program = Program(parse_module(_stack_text(layers)))
    OrderInfo.visits = 0
    apply_schedule(program, pipeline)
    return OrderInfo.visits


def test_elementwise_fusion_looks_at_each_op_a_bounded_number_of_times():
    small, large = _visits(20, "ar-c"), _visits(40, "ar-c")
    assert small > 0
    # twice the program: about twice the ops listed and facts computed, not four times
    assert large <= 2.3 * small, (small, large)


def test_the_fused_program_is_the_same_whatever_the_order_info_covers():
    """The greedy elementwise fusion of a stack: one region per layer, each holding the bias,
    the dropout and the residual (what the whole-block analysis found before)."""
    program = apply_schedule(Program(parse_module(_stack_text(6))), "ar-c")
    text = str(program.module)
    assert text.count("comm.fused elementwise") == 6
    assert text.count("comm.all_reduce") == 6


def _chain_visits(layers: int) -> int:
    program = apply_schedule(Program(parse_module(_stack_text(layers))), "coco-split-allreduce")
    ChainScans.visits = 0
    apply_schedule(program, "coco-fuse{mode=all_reduce}")
    return ChainScans.visits


def test_the_reduce_scatter_chain_scans_stop_at_each_chain_s_last_use():
    """Each layer's chain ends within the layer: every scan looks at a few ops, not at the
    rest of the function (which made coco-fuse quadratic in the number of layers)."""
    small, large = _chain_visits(20), _chain_visits(40)
    assert small > 0
    assert large <= 2.3 * small, (small, large)


def test_the_fused_stack_holds_one_fused_all_reduce_per_layer():
    program = apply_schedule(
        Program(parse_module(_stack_text(6))), "coco-split-allreduce,coco-fuse{mode=all_reduce}"
    )
    text = str(program.module)
    assert text.count("comm.fused all_reduce") == 6
    assert "comm.reduce_scatter" in text  # inside the regions
    assert text.count("comm.all_reduce ") == 0


def _dependence_checks(layers: int, pipeline: str) -> int:
    program = apply_schedule(Program(parse_module(_stack_text(layers))), pipeline)
    TableBatcher.dependence_checks = 0
    lower(program, 2)
    return TableBatcher.dependence_checks


def test_the_stream_schedule_looks_at_each_step_a_bounded_number_of_times():
    for pipeline in ("none", "coco-split-allreduce,coco-fuse"):
        small, large = _dependence_checks(20, pipeline), _dependence_checks(40, pipeline)
        assert small > 0
        assert large <= 2.3 * small, (pipeline, small, large)


# The benchmark's schedules (benchmarks/compile_time.py).
BENCHMARK_SCHEDULES = (
    "none",
    "ar-c",
    "coco-split-allreduce",
    "coco-split-allreduce,coco-fuse",
    "rs-c-ag",
    "fuse(rs-c-ag)",
)


def _calls(work: Callable[[], object]) -> int:
    """The Python function calls (builtins included) `work` makes: the work done, counted
    instead of timed."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        work()
    finally:
        profile.disable()
    return pstats.Stats(profile).total_calls  # type: ignore[attr-defined]


def _phase_calls(layers: int, schedule: str) -> tuple[int, int, int]:
    """The calls of parse + verify, schedule and lower of a `layers`-deep stack."""
    text = _stack_text(layers)
    parse = _calls(lambda: Program(parse_module(text)))
    program = Program(parse_module(text))
    scheduled: list[Program] = []
    schedule_calls = _calls(lambda: scheduled.append(apply_schedule(program, schedule)))
    lower_calls = _calls(lambda: lower(scheduled[0], 2))
    return parse, schedule_calls, lower_calls


@pytest.mark.parametrize("schedule", BENCHMARK_SCHEDULES)
def test_every_phase_does_work_linear_in_the_program(schedule: str):
    """Three times the layers: at most about three times the calls in every phase, for
    every schedule of the benchmark. A scan of the function per rewrite or per kernel shows
    up as more (coco-fuse's absorbing of whole reductions listed the function per fused
    chain: x3.46 here; coco-reorder's check of every named gather planned the residual
    stream to the end of the function once per gather, and the split looked each target
    up by a scan of the function: rs-c-ag's schedule x8.6)."""
    small, large = _phase_calls(10, schedule), _phase_calls(30, schedule)
    for phase, a, b in zip(("parse+verify", "schedule", "lower"), small, large, strict=True):
        assert b <= 3.15 * a, (schedule, phase, a, b)


def test_the_lowering_prints_each_kernel_once(monkeypatch: pytest.MonkeyPatch):
    """Kernels are compared by structure (kernel_ir.structural_key), not by printing them:
    the only kernels printed are those of the translation unit, once each."""
    printed: list[str] = []
    print_kernel = CudaPrinter.print_kernel

    def counting(self: CudaPrinter, kernel: Kernel) -> None:
        printed.append(kernel.name)
        print_kernel(self, kernel)

    monkeypatch.setattr(CudaPrinter, "print_kernel", counting)
    for schedule in BENCHMARK_SCHEDULES:
        printed.clear()
        program = apply_schedule(Program(parse_module(_stack_text(6))), schedule)
        plan = lower(program, 2)
        assert sorted(printed) == sorted(plan.signatures), schedule


@pytest.mark.parametrize("schedule", ["none", "ar-c", "coco-split-allreduce,coco-fuse"])
def test_layers_that_differ_in_names_and_seeds_share_their_kernels(
    schedule: str, monkeypatch: pytest.MonkeyPatch
):
    """A stack's layers differ in their values' names and their dropouts' seeds only: one
    kernel per kind of step whatever the depth (a seed is an argument), built once
    (lowering/kernel_site.py), and each layer's launch draws its own dropout mask (the
    outputs are the sim's, bit for bit)."""
    builds: list[str] = []
    build = ElementwiseKernel.build

    def counting(self: ElementwiseKernel) -> Kernel:
        builds.append(self.name)
        return build(self)

    monkeypatch.setattr(ElementwiseKernel, "build", counting)
    counts, plans = [], []
    for n in (2, 7):
        builds.clear()
        plans.append(lower(apply_schedule(Program(parse_module(_stack_text(n))), schedule), 2))
        counts.append(len(builds))
    assert counts[0] == counts[1] > 0, (schedule, counts)
    assert len(plans[0].signatures) == len(plans[1].signatures) <= 4, schedule
    program = Program(parse_module(_stack_text(7)))
    inputs = prepare_inputs(program, None, plans[1].grid_shape, seed=3)
    want = coconet.run(program, inputs, ranks=2, inplace=False).outputs
    got = ThreadedExecutor(plans[1]).run(inputs)
    for name, value in want.items():
        assert np.array_equal(got[name], value), (schedule, name)
    # the seeds the launches pass: every layer's own, in program order
    seeds = [
        arg
        for step in plans[1].steps
        if isinstance(step, Launch)
        for p, arg in zip(plans[1].signatures[step.kernel], step.args, strict=True)
        if p.kind == ParamKind.SEED
    ]
    assert seeds == list(range(7)), schedule


def test_fuse_rs_c_ag_fuses_every_layer_of_a_residual_stack():
    """After coco-reorder a layer's sliced residual reads the previous layer's slice:
    `%x2_s = %dr1_s + %x1_s`. The chain of layer 0 used to take it in (it reads the chain's
    `%x1_s`), and with it layer 1's bias and dropout, which wait for layer 0's all_gather
    (through layer 1's matmul): a real cycle for that set, so [fuse-cycle] refused the whole
    schedule. The chain now ends where an op waits for its own all_gather: one fused
    all_reduce per layer, the stack's output computed as the oracle computes it (sim, and the
    plan's CUDA C run by the threaded executor)."""
    program = Program(parse_module(_stack_text(3)))
    assert "fuse(rs-c-ag)" in named_schedules(program)
    fused = apply_schedule(program, "fuse(rs-c-ag)")
    text = str(fused.module)
    assert text.count("comm.fused all_reduce") == 3
    assert text.count("comm.reduce_scatter") == 3
    assert text.count("comm.all_gather") == 3  # inside the regions: one per layer
    report = check_equivalence(program, fused, ranks=(2,), seeds=(0,))
    assert report.ok, report
    assert report.checked, report
    plan = lower(fused, 2)
    inputs = prepare_inputs(fused, None, plan.grid_shape, seed=1)
    want = coconet.run(program, inputs, ranks=2, inplace=False).outputs
    got = ThreadedExecutor(plan).run(inputs)
    for name, value in want.items():
        assert np.array_equal(got[name], value), name


def _reordered_chain_visits(layers: int) -> int:
    program = apply_schedule(
        Program(parse_module(_stack_text(layers))), "coco-split-allreduce{dim=1},coco-reorder"
    )
    ChainScans.visits = 0
    fused = apply_schedule(program, "coco-fuse{mode=all_reduce}")
    assert str(fused.module).count("comm.fused all_reduce") == layers
    return ChainScans.visits


def test_a_reordered_stack_s_chain_scans_end_within_their_layer():
    """The residual stream links every layer's slice to the next: a chain scan that
    followed it would run to the end of the function (quadratic in the layers)."""
    small, large = _reordered_chain_visits(10), _reordered_chain_visits(30)
    assert large <= 3.15 * small, (small, large)


def _targeted_fuse_calls(layers: int) -> int:
    program = apply_schedule(
        Program(parse_module(_stack_text(layers))), "coco-split-allreduce{dim=1},coco-reorder"
    )
    names = ",".join(f"ar{i}_rs" for i in range(layers))
    fused: list[Program] = []
    calls = _calls(
        lambda: fused.append(apply_schedule(program, f"coco-fuse{{mode=all_reduce ops={names}}}"))
    )
    assert str(fused[0].module).count("comm.fused all_reduce") == layers
    return calls


def test_fusing_many_named_chains_checks_their_order_in_linear_work():
    """Fusing every layer's chain by name (what fuse(rs-c-ag) asks) checks, before building
    any region, that the regions form no cycle between them: over the def-use and
    read-before-update edges of the block, not over every pair of its ops."""
    small, large = _targeted_fuse_calls(10), _targeted_fuse_calls(30)
    assert large <= 3.15 * small, (small, large)


def _wide_stack_source(layers: int) -> str:
    """The stack as a Python program function with every weight and bias a parameter (a
    model's parameters passed in): hundreds of locals in the frame each op names from."""
    params = ["x0: Tensor(F32, [2, 8, 64])"]
    body = ["    x = x0"]
    for i in range(layers):
        params += [f"w{i}: Tensor(F32, [64, 64], Sliced(0))", f"b{i}: Tensor(F32, [64])"]
        body += [
            "    xs = Slice(x, 2)",
            f"    mm = MatMul(xs, w{i})",
            '    ar = AllReduce("+", mm)',
            f"    bi = ar + b{i}",
            f"    dr = Dropout(bi, 0.1, seed={i})",
            "    x = dr + x",
        ]
    return "def stack(" + ", ".join(params) + "):\n" + "\n".join(body) + "\n    return x\n"


def _build_work(layers: int) -> tuple[int, int, Program]:
    """(calls, locals examined to name values, program) of building the wide stack."""
    from coconet import frontend

    scope = {name: getattr(frontend, name) for name in frontend.__all__}
    exec(compile(_wide_stack_source(layers), f"<stack{layers}>", "exec"), scope)
    built: list[Program] = []
    before = frontend._Builder.locals_examined
    calls = _calls(lambda: built.append(frontend.build_program(scope["stack"], grid=[None])))
    return calls, frontend._Builder.locals_examined - before, built[0]


def test_building_with_the_front_end_is_linear_in_the_program():
    """Each op names the new values after the locals holding them. Testing every local at
    every op made a program with many parameters quadratic (x7.4 the locals examined for x3
    the layers); the latest locals are looked at first, and the look stops once every new
    value has its name."""
    (small_calls, small, _), (large_calls, large, program) = _build_work(10), _build_work(30)
    assert 0 < small
    assert large <= 3.15 * small, (small, large)
    assert large_calls <= 3.15 * small_calls, (small_calls, large_calls)
    names = [op.results[0].name_hint for op in program.func.body.block.ops if op.results]
    assert names[:6] == ["xs", "mm", "ar", "bi", "dr", "x"]


def _chain_block(length: int) -> Block:
    t = "!coco.tensor<4xf32>"
    lines = [f"func.func @chain(%v0: {t}) -> {t} {{"]
    lines += [f"  %v{i + 1} = coco.add %v{i}, %v0 : {t}" for i in range(length)]
    lines += [f"  func.return %v{length} : {t}", "}"]
    return Program(parse_module("\n".join(lines))).func.body.block


def test_the_region_cycle_check_walks_chains_deeper_than_the_recursion_limit():
    """A deep program's def-use chain runs through thousands of ops: the cycle check of
    coco-fuse and coco-overlap searches it without recursion (its recursive search raised
    RecursionError on fuse(rs-c-ag) of the 400-layer stack, depending on set order)."""
    length = sys.getrecursionlimit() + 500
    block = _chain_block(length)
    ops = list(block.ops)
    check_groups_acyclic(block, [], "fuse-cycle", "the regions")  # a chain: no cycle
    check_groups_acyclic(block, [{ops[0], ops[1]}], "fuse-cycle", "the regions")
    # contracting the first and the last add: the ops between read the first and feed the
    # last, so the contracted group would both precede and follow them
    with pytest.raises(PassFailedException, match=r"\[fuse-cycle\] the regions would form a cycle"):
        check_groups_acyclic(block, [{ops[0], ops[length - 1]}], "fuse-cycle", "the regions")


# The other program shapes of the benchmark (benchmarks/compile_time.py shape_text), through
# the pipeline that audit timed and the named schedules (`clip`: an optimizer step over many
# tensors coupled by a global-norm clip, whose fusions went x4.4 in calls for 3x the tensors;
# `clip4`: the same over tensors of four recurring shapes, x5.1).
SHAPES = ("shared", "own", "wide", "chain", "clip", "clip4")
SHAPE_PIPELINE = "coco-split-allreduce,coco-reorder,coco-fuse{mode=all_reduce}"
SHAPE_SCHEDULES = (SHAPE_PIPELINE, "ar-c", "rs-c-ag", "fuse(rs-c-ag)", "ol(mm,fuse(rs-c-ag))")


def _shape_program(shape: str, layers: int) -> Program:
    return Program(parse_module(_benchmark().shape_text(shape, layers)))


def _schedule_work(shape: str, layers: int, schedule: str) -> tuple[int, str]:
    """(calls, outcome) of scheduling a `layers`-deep program of `shape`: the fused regions
    made, or the rule of the refusal where the schedule does not fit (finding that out must be
    linear too: named_schedules tries every schedule)."""
    program = _shape_program(shape, layers)
    outcome: list[str] = []

    def work() -> None:
        try:
            text = str(apply_schedule(program, schedule).module)
        except ScheduleError as e:
            outcome.append(f"refused [{e.rule}]")
            return
        outcome.append(
            f"{text.count('comm.fused all_reduce')} fused all_reduce, "
            f"{text.count('comm.fused elementwise')} fused elementwise, "
            f"{text.count('comm.overlap')} overlap"
        )

    return _calls(work), outcome[0]


@pytest.mark.parametrize("schedule", SHAPE_SCHEDULES)
def test_scheduling_is_linear_in_the_layers_of_every_program_shape(schedule: str):
    """Three times the layers: at most about three times the calls, in every shape. Where
    every layer reads one sliced input, after coco-reorder each layer's chain runs on along
    the sliced residual stream to the end of the function: coco-fuse planned a chain by
    testing pairs of ops (cubic), grew every layer's chain before fusing any (quadratic), and
    refused fuse(rs-c-ag) only after growing all of them; the greedy elementwise fusion
    planned each component again per member (a long chain: quadratic); and a step per
    matmul of ol(...) walked the whole program (x4.3 on independent layers)."""
    for shape in SHAPES:
        (small, small_outcome), (large, large_outcome) = (
            _schedule_work(shape, 8, schedule),
            _schedule_work(shape, 24, schedule),
        )
        assert small_outcome.startswith("refused") == large_outcome.startswith("refused"), (
            shape,
            small_outcome,
            large_outcome,
        )
        assert large <= 3.5 * small, (shape, schedule, small, large)


def test_listing_the_named_schedules_is_linear_in_every_program_shape():
    """named_schedules tries every schedule (refusals included): linear too."""
    for shape in SHAPES:
        small = _calls(lambda shape=shape: named_schedules(_shape_program(shape, 8)))
        large = _calls(lambda shape=shape: named_schedules(_shape_program(shape, 24)))
        assert large <= 3.5 * small, (shape, small, large)


def test_one_shot_chains_coupled_by_a_global_norm_look_at_their_own_ops():
    """Each tensor's one-shot chain in a clipped optimizer step meets the global norm, which
    is computed from every chain and read by every update: following the values computed
    from the chain outside it cost each chain the rest of the program (quadratic in the
    tensors); the block's record of which all_reduces each value comes from answers it."""
    visits = []
    for tensors in (8, 24):
        program = _shape_program("clip", tensors)
        ChainScans.visits = 0
        fused = str(apply_schedule(program, "fuse(ar-c)").module)
        assert fused.count("comm.fused all_reduce one_shot") == tensors
        visits.append(ChainScans.visits)
    assert visits[1] <= 3 * visits[0], visits


@pytest.mark.parametrize("shape", ["clip", "clip4"])
def test_two_shot_chains_coupled_by_a_global_norm_cost_their_own_ops(shape: str):
    """fuse(rs-c-ag) of a clipped optimizer step over 24 and 72 tensors: three times the
    tensors, at most about three times the work. Grown apart, each tensor's chain joined the
    norm's running sum from its own partial on and looked at every reader of the clipping
    factor, and the chains of same-shaped tensors were merged one at a time, the growing
    union's cycle check run at each (calls x3.9 for `clip`, x6.8 for `clip4`, from 24 to 72
    tensors; chain scan visits x7.0 and x8.7). Now the first chain to reach a scalar op
    follows it and the others stop there (passes/fuse/chain.py CoupledScalars), and chains
    of one space that meet are checked as one union."""
    calls, visits = [], []
    for tensors in (24, 72):
        program = _shape_program(shape, tensors)
        ChainScans.visits = 0
        fused: list[str] = []
        calls.append(
            _calls(lambda: fused.append(str(apply_schedule(program, "fuse(rs-c-ag)").module)))
        )
        visits.append(ChainScans.visits)
        assert fused[0].count("comm.fused all_reduce") == 1  # one region: every tensor
        assert fused[0].count("comm.reduce_scatter") == tensors
    assert calls[1] <= 3.5 * calls[0], calls
    assert visits[1] <= 3.5 * visits[0], visits


@pytest.mark.parametrize(
    ("shape", "schedule", "small", "large", "bound"),
    [
        ("clip4", "ar-c", 24, 72, 3.5),
        ("clip4", "fuse(ar-c)", 24, 72, 3.5),
        ("clip4", "rs-c-ag", 24, 72, 3.5),
        ("wide", "fuse(ar-c)", 24, 96, 4.0),
    ],
)
def test_larger_programs_schedule_in_linear_work(
    shape: str, schedule: str, small: int, large: int, bound: float
):
    """What only larger programs show (x5.5-6.5 from 24 to 72 tensors of `clip4`, x4.3 from
    24 to 96 layers of `wide`): the greedy elementwise fusion fused a global norm's component
    (holding every same-shaped tensor's step) before the components it spans, splitting each
    (their spans then ran over everything moved above it: components now go shortest span
    first), and planned it again from the norm whenever a tensor's op it took sat between two
    it held (now rolled back to there); chain scans followed uses into a function's return
    of every layer's output (read whole by each chain); and named chains were sorted by a
    lookup that walked the block per site."""
    work = [_schedule_work(shape, n, schedule)[0] for n in (small, large)]
    assert work[1] <= bound * work[0], work


def test_the_shared_input_stack_s_fusions():
    """What the schedules make of a stack whose layers read one sliced input: after the
    reorder the whole sliced residual stream is one fused all_reduce (the first layer's chain
    takes the later layers' bias, dropout and gelu, which feed only it; their
    reduce_scatters stay outside), ar-c fuses every layer's elementwise ops and the residual
    into one kernel, and fuse(rs-c-ag) is refused: its chains share the stream."""
    _, fused = _schedule_work("shared", 4, SHAPE_PIPELINE)
    assert fused == "1 fused all_reduce, 0 fused elementwise, 0 overlap"
    text = str(apply_schedule(_shape_program("shared", 4), SHAPE_PIPELINE).module)
    assert text.count("comm.reduce_scatter") == 4  # 1 inside the region, 3 feeding it
    assert (
        _schedule_work("shared", 4, "ar-c")[1]
        == "0 fused all_reduce, 1 fused elementwise, 0 overlap"
    )
    assert _schedule_work("shared", 4, "fuse(rs-c-ag)")[1] == "refused [fuse-chain]"
    assert sorted(named_schedules(_shape_program("shared", 4))) == ["ar-c", "fuse(ar-c)", "rs-c-ag"]


def _longest_conjunction(source: str) -> int:
    return max(line.count("&&") for line in source.splitlines())


def test_a_kernel_of_hundreds_of_operands_lowers():
    """The shared-input stack's pipeline fuses every layer into one kernel reading each
    layer's bias and reduce_scatter: its vector loop's alignment check ANDed them all in one
    `&&` chain, which nests as deep as it is long (RecursionError printing the kernel from
    about 170 layers on); the checks now go a bounded number to a statement."""
    plan = lower(apply_schedule(_shape_program("shared", 250), SHAPE_PIPELINE), 2)
    assert _longest_conjunction(plan.cuda_source) <= CONJUNCTION_TERMS


def test_a_kernel_with_its_checks_in_several_statements_computes_as_the_sim():
    program = _shape_program("shared", 40)
    plan = lower(apply_schedule(program, SHAPE_PIPELINE), 2)
    assert plan.cuda_source.count("vec_ = vec_ && ") >= 2  # 80 checks, 32 to a statement
    assert _longest_conjunction(plan.cuda_source) <= CONJUNCTION_TERMS
    inputs = prepare_inputs(program, None, plan.grid_shape, seed=2)
    want = coconet.run(program, inputs, ranks=2, inplace=False).outputs
    got = ThreadedExecutor(plan).run(inputs)
    for name, value in want.items():
        assert np.array_equal(got[name], value), name


def test_lowering_runs_with_the_collector_paused(monkeypatch):
    """`lower` pauses Python's cyclic collector (core/gc_pause.py: a large program's IR is
    millions of objects the collector would walk again and again); a refactor once moved the
    pause onto a per-op helper, pausing and resuming it once an op instead."""
    import gc

    import coconet.lowering.lower_to_plan as lp

    seen: list[bool] = []
    dead = lp._dead

    def spy(op):
        seen.append(gc.isenabled())
        return dead(op)

    monkeypatch.setattr(lp, "_dead", spy)
    was = gc.isenabled()
    lp.lower(coconet.load(Path(__file__).resolve().parents[2] / "examples" / "adam.mlir"), 2)
    assert seen
    assert not any(seen)
    assert gc.isenabled() == was
