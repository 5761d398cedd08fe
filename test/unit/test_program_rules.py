"""Strict verification: the program-level rules (dialects/program_rules.py), the grid and
tensor size limits, and the elementwise-fusion membership rule, through the Python API.

Every case here was accepted, crashed or hung somewhere downstream before these rules; each
must now be one CocoError (or VerifyException, for IR built by hand) naming its rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import FloatAttr, ModuleOp, f32
from xdsl.ir import Block, Region
from xdsl.utils.exceptions import VerifyException

import coconet
from coconet.core.program import CocoError, Program, parse_module
from coconet.dialects import coco, comm
from coconet.dialects.coco import MAX_RANKS, GridAttr, SlicedAttr, TensorType
from coconet.dialects.program_rules import verify_program

T8 = "!coco.tensor<8xf32>"


def rule(name: str) -> str:
    """A `pytest.raises(match=...)` pattern: the message names `[name]`."""
    return re.escape(f"[{name}]")


# --------------------------------------------------------------------------------------------
# coconet.load: every fuzzer finding is one CocoError naming its rule
# --------------------------------------------------------------------------------------------

FUZZER_CASES = [
    (
        "unknown-attribute",
        (
            f"func.func @f(%a: {T8}) attributes {{coco.gird = #coco.grid<[2]>}} {{\n"
            "  func.return\n}\n"
        ),
        "@f has attribute 'coco.gird', which coconet does not know (did you mean 'coco.grid'?)",
    ),
    (
        "unknown-attribute",
        f"func.func @f(%a: {T8}) {{\n  %0 = coco.neg %a {{coco.bogus}} : {T8}\n  func.return\n}}\n",
        "coco.neg in @f has attribute 'coco.bogus'",
    ),
    (
        "module-ops",
        (
            f"%0 = coco.constant 1.0 : !coco.tensor<f32>\nfunc.func @f(%a: {T8}) {{\n"
            "  func.return\n}\n"
        ),
        "coco.constant at module level, outside any function",
    ),
    (
        "function-declaration",
        f"func.func private @f(%a: {T8})\n",
        "@f is a declaration without a body",
    ),
    (
        "grid-size",
        "func.func @f() attributes {coco.grid = #coco.grid<[1099511627776]>} {\n  func.return\n}\n",
        "the grid [1099511627776] has 1099511627776 ranks: at most 65536 (2^16) ranks",
    ),
    (
        "grid-size",
        (
            "func.func @f() attributes {coco.grid = #coco.grid<[18446744073709551616]>} {\n"
            "  func.return\n}\n"
        ),
        "the grid [18446744073709551616] has 18446744073709551616 ranks",
    ),
    (
        "tensor-size",
        "func.func @f(%a: !coco.tensor<9223372036854775808xf32>) {\n  func.return\n}\n",
        "has 9223372036854775808 elements, more than int64 can count",
    ),
    (
        "dominance",
        (
            f"func.func @f(%a: {T8}) {{\n  %1 = coco.neg %0 : {T8}\n  %0 = coco.neg %a : {T8}\n"
            "  func.return\n}\n"
        ),
        "coco.neg in @f uses a result of coco.neg before its definition",
    ),
    (
        "dominance",
        f"func.func @f(%a: {T8}) {{\n  %0 = coco.add %a, %0 : {T8}\n  func.return\n}}\n",
        "coco.add in @f uses its own result",
    ),
    (
        "fuse-elementwise",
        (
            f"func.func @f(%a: {T8}) -> !coco.tensor<f32> {{\n"
            "  %r = comm.fused elementwise -> !coco.tensor<f32> {\n"
            f"    %s = coco.reduce sum %a : {T8} -> !coco.tensor<f32>\n"
            "    comm.yield %s : !coco.tensor<f32>\n  }\n"
            "  func.return %r : !coco.tensor<f32>\n}\n"
        ),
        "but this one holds coco.reduce",
    ),
    (
        "nested-function",
        (
            f"func.func @f(%a: {T8}) {{\n  comm.fused elementwise {{\n"
            "    func.func @g() {\n      func.return\n    }\n    comm.yield\n  }\n"
            "  func.return\n}\n"
        ),
        "func.func @g is nested in @f",
    ),
]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    FUZZER_CASES,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(FUZZER_CASES)],
)
def test_load_refuses(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / "program.mlir"
    path.write_text(text)
    with pytest.raises(CocoError, match=rule(name)) as info:
        coconet.load(path)
    assert message in str(info.value)
    assert str(info.value).startswith(f"{path}: invalid program: [{name}] ")


def test_attribute_errors_while_parsing_are_coco_errors() -> None:
    """Types verify as the parser builds them: that too is one CocoError, not a traceback."""
    text = "func.func @f(%a: !coco.tensor<0xf32>) {\n  func.return\n}\n"
    with pytest.raises(CocoError, match=r"^x\.mlir: invalid program: \[tensor-shape\]"):
        parse_module(text, "x.mlir")


# --------------------------------------------------------------------------------------------
# Program.verify on IR built in Python (what the parser cannot produce)
# --------------------------------------------------------------------------------------------

TWO_FUNCTIONS = f"""
func.func @f(%a: {T8}) -> {T8} {{
  %n = coco.neg %a : {T8}
  %r = comm.fused elementwise -> {T8} {{
    %inner = coco.neg %n : {T8}
    comm.yield %inner : {T8}
  }}
  func.return %r : {T8}
}}
func.func @g(%b: {T8}) -> {T8} {{
  %m = coco.neg %b : {T8}
  func.return %m : {T8}
}}
"""


def two_functions() -> tuple[Program, func.FuncOp, func.FuncOp]:
    program = Program(parse_module(TWO_FUNCTIONS))
    fns = [op for op in program.module.ops if isinstance(op, func.FuncOp)]
    return program, fns[0], fns[1]


def ops_named(fn: func.FuncOp, name: str) -> list:
    return [op for op in fn.walk() if op.name == name]


def test_valid_program_verifies() -> None:
    program, _, _ = two_functions()
    program.verify()


def test_value_of_another_function() -> None:
    program, f, g = two_functions()
    (m,) = ops_named(g, "coco.neg")
    m.operands = [f.body.block.first_op.results[0]]
    with pytest.raises(
        CocoError, match=rule("dominance") + " coco.neg in @g uses %n, a value of @f"
    ):
        program.verify()


def test_argument_of_another_function() -> None:
    program, f, g = two_functions()
    (m,) = ops_named(g, "coco.neg")
    m.operands = [f.body.block.args[0]]
    with pytest.raises(
        CocoError, match=rule("dominance") + " coco.neg in @g uses %a, an argument of @f"
    ):
        program.verify()


def test_value_defined_inside_a_region_used_outside() -> None:
    program, f, _ = two_functions()
    (fused,) = ops_named(f, "comm.fused")
    inner = fused.body.block.first_op.results[0]
    ret = f.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    ret.operands = [inner]
    with pytest.raises(
        CocoError,
        match=rule("dominance") + " func.return in @f uses %inner, defined inside comm.fused",
    ):
        program.verify()


def test_value_defined_at_module_level_after_the_function() -> None:
    """A function reading an op that stands at module level after it (a fuzzer's line swap):
    one message, not a KeyError of the dominance check."""
    text = """
func.func @f() -> !coco.tensor<f32> {
  %n = coco.neg %eps : !coco.tensor<f32>
  func.return %n : !coco.tensor<f32>
}
%eps = coco.constant 1.0 : !coco.tensor<f32>
"""
    with pytest.raises(CocoError, match=r"\[(dominance|module-ops)\]"):
        parse_module(text)


def test_a_module_of_two_blocks_is_one_message() -> None:
    """The fuzzer's line swap put a block label inside a generic module: one diagnostic, not
    xDSL's ValueError from `ModuleOp.ops`."""
    text = """
"builtin.module"() ({
    "func.return"() : () -> ()
  ^bb0(%x: !coco.tensor<8xf32>):
  "func.func"() <{sym_name = "f", function_type = (!coco.tensor<8xf32>) -> ()}> ({
  }) {coco.grid = #coco.grid<[2]>} : () -> ()
}) : () -> ()
"""
    with pytest.raises(CocoError, match=r"\[module-ops\] builtin.module holds 2 blocks"):
        parse_module(text)


def test_foreign_op_built_in_python() -> None:
    program, f, _ = two_functions()
    f.body.block.insert_op_before(arith.ConstantOp(FloatAttr(1.0, f32)), f.body.block.first_op)
    with pytest.raises(CocoError, match=rule("foreign-op") + " arith.constant in @f"):
        program.verify()


def test_declaration_built_in_python() -> None:
    declaration = func.FuncOp.external("ext", [TensorType([8], f32)], [])
    with pytest.raises(VerifyException, match=rule("function-declaration")):
        verify_program(ModuleOp([declaration]))


def test_program_verify_checks_signatures_too() -> None:
    """Program.verify is the whole program verifier, not just the op verifiers: an argument
    no op reads is checked against the grid as well."""
    fn = func.FuncOp("h", ([TensorType([2], f32, SlicedAttr(0))], []))
    fn.attributes["coco.grid"] = GridAttr([3])
    fn.body.block.add_op(func.ReturnOp())
    with pytest.raises(CocoError, match=rule("empty-slice")):
        Program(ModuleOp([fn])).verify()


def test_region_terminator_is_still_checked_by_the_op() -> None:
    """A foreign terminator is refused as [foreign-op] first; the op's own rule stays."""
    (a,) = Block(arg_types=[TensorType([8], f32)]).args
    body = Region(Block([coco.NegOp(a)]))
    fused = comm.FusedOp("elementwise", body, [])
    with pytest.raises(VerifyException, match=rule("region-terminator")):
        fused.verify_()


# --------------------------------------------------------------------------------------------
# Limits on grids and tensors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [[2**40], [2**64], [2**16 + 1], [512, 256], [2**17, -1]], ids=str)
def test_grid_size_limit(sizes: list[int]) -> None:
    with pytest.raises(VerifyException, match=rule("grid-size")):
        GridAttr(sizes)


def test_largest_grid_and_bind_limit() -> None:
    assert GridAttr([256, 256]).bind(MAX_RANKS) == (256, 256)
    assert GridAttr([-1]).bind(MAX_RANKS) == (MAX_RANKS,)
    with pytest.raises(ValueError, match="exceed the supported maximum of 65536"):
        GridAttr([-1]).bind(MAX_RANKS + 1)


@pytest.mark.parametrize("shape", [[2**63], [2**32, 2**32], [2**62, 2]], ids=str)
def test_tensor_size_limit(shape: list[int]) -> None:
    with pytest.raises(VerifyException, match=rule("tensor-size")):
        TensorType(shape, f32)


def test_largest_tensor() -> None:
    assert TensorType([2**63 - 1], f32).get_shape() == (2**63 - 1,)
