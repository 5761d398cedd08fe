"""Compile time stays linear in the program: structural counts, not wall time. The stacks are
benchmarks/compile_time.py's tensor-parallel layers (6 ops each)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from coconet.compile import apply_schedule
from coconet.core.program import Program, parse_module
from coconet.lowering.lower_to_plan import Lowering, lower
from coconet.passes.common import OrderInfo
from coconet.passes.fuse import FusePass

ROOT = Path(__file__).resolve().parents[2]


def _stack_text(layers: int) -> str:
    spec = importlib.util.spec_from_file_location(
        "compile_time", ROOT / "benchmarks/compile_time.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.stack_text(layers)


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
    FusePass.chain_visits = 0
    apply_schedule(program, "coco-fuse{mode=all_reduce}")
    return FusePass.chain_visits


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
    Lowering.dependence_checks = 0
    lower(program, 2)
    return Lowering.dependence_checks


def test_the_stream_schedule_looks_at_each_step_a_bounded_number_of_times():
    for pipeline in ("none", "coco-split-allreduce,coco-fuse"):
        small, large = _dependence_checks(20, pipeline), _dependence_checks(40, pipeline)
        assert small > 0
        assert large <= 2.3 * small, (pipeline, small, large)
