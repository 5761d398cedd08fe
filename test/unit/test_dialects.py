"""The coco and comm dialects built programmatically: constructors infer result types by the
layout rules, verifiers refuse what the rules refuse (naming the rule), and text printed
from built IR parses back."""

from __future__ import annotations

import importlib
import io
import re
from collections.abc import Sequence

import pytest
from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import (
    BFloat16Type,
    IntegerType,
    ModuleOp,
    Signedness,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i8,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, Operation, Region, SSAValue
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import EffectInstance, MemoryEffectKind, get_effects, is_side_effect_free
from xdsl.utils.exceptions import VerifyException

from coconet.dialects import coco, comm, get_all_dialects, layout_rules
from coconet.dialects.coco import (
    DYNAMIC,
    GRID_ATTR_NAME,
    LOCAL,
    REPLICATED,
    AddOp,
    CastOp,
    CmpOp,
    ConstantOp,
    DropoutOp,
    GridAttr,
    MatmulOp,
    NegOp,
    ReduceOp,
    SelectOp,
    SlicedAttr,
    SliceOp,
    SqrtOp,
    TensorType,
    UpdateOp,
)
from coconet.dialects.comm import (
    AllGatherOp,
    AllReduceOp,
    BroadcastOp,
    FusedOp,
    OverlapOp,
    ReduceScatterOp,
    SendOp,
    YieldOp,
)
from coconet.dialects.reduction import Reduction, ReductionsOf

S0, S1, S2 = SlicedAttr(0), SlicedAttr(1), SlicedAttr(2)


def T(shape: Sequence[int], elt: Attribute = f32, *layouts) -> TensorType:
    return TensorType(shape, elt, layouts)


def values(*types: Attribute) -> tuple[SSAValue, ...]:
    """Fresh SSA values of the given types (arguments of a detached block)."""
    return tuple(Block(arg_types=types).args)


def rule(name: str) -> str:
    """A `pytest.raises(match=...)` pattern: the message starts with `[name]`."""
    return "^" + re.escape(f"[{name}]")


class Fn:
    """A `func.func` under construction: arguments of the given types, ops appended in order."""

    def __init__(self, *arg_types: Attribute, grid: Sequence[int] | None = None):
        self.op = func.FuncOp("f", (list(arg_types), []))
        if grid is not None:
            self.op.attributes[GRID_ATTR_NAME] = GridAttr(grid)
        self.module = ModuleOp([self.op])

    @property
    def args(self) -> tuple[SSAValue, ...]:
        return tuple(self.op.body.block.args)

    def add(self, op: Operation) -> Operation:
        self.op.body.block.add_op(op)
        return op

    def verify(self) -> None:
        if not isinstance(self.op.body.block.last_op, func.ReturnOp):
            self.op.body.block.add_op(func.ReturnOp())
        self.module.verify()


def make_context() -> Context:
    ctx = Context()
    ctx.load_dialect(builtin.Builtin)
    ctx.load_dialect(func.Func)
    for name, factory in get_all_dialects().items():
        ctx.register_dialect(name, factory)
    return ctx


def print_op(op: Operation) -> str:
    out = io.StringIO()
    Printer(stream=out).print_op(op)
    return out.getvalue()


# --------------------------------------------------------------------------------------------
# Importing and registering
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        "coconet",
        "coconet.dialects",
        "coconet.dialects.coco",
        "coconet.dialects.comm",
        "coconet.dialects.layout_rules",
        "coconet.passes",
        "coconet.lowering",
        "coconet.runtime",
        "coconet.tools.coco_opt",
    ],
)
def test_import_everything(module: str) -> None:
    importlib.import_module(module)


def test_dialect_factories_build_every_op_and_attribute() -> None:
    # The factories are lazy: an import error in a dialect would only show when it is used.
    factories = get_all_dialects()
    assert set(factories) == {"coco", "comm"}
    for name, factory in factories.items():
        dialect = factory()
        assert isinstance(dialect, Dialect)
        assert dialect.name == name
        ops = list(dialect.operations)
        assert ops
        for op in ops:
            assert op.name.startswith(f"{name}."), op.name
            assert op.__name__.endswith("Op"), op.__name__
        for attr in dialect.attributes:
            assert attr.name.startswith(f"{name}."), attr.name
            assert attr.__name__.endswith(("Attr", "Type")), attr.__name__


def test_every_documented_op_is_registered() -> None:
    ctx = make_context()
    for name in [
        "add",
        "sub",
        "mul",
        "div",
        "max",
        "min",
        "pow",
        "neg",
        "abs",
        "sqrt",
        "rsqrt",
        "exp",
        "log",
        "tanh",
        "relu",
        "gelu",
        "sigmoid",
        "cmp",
        "select",
        "cast",
        "constant",
        "dropout",
        "matmul",
        "reduce",
        "slice",
        "update",
    ]:
        assert ctx.get_optional_op(f"coco.{name}") is not None, name
    for name in [
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "reduce",
        "send",
        "fused",
        "overlap",
        "yield",
    ]:
        assert ctx.get_optional_op(f"comm.{name}") is not None, name
    assert ctx.get_optional_type("coco.tensor") is not None
    for name in ("coco.grid", "coco.sliced", "coco.local", "coco.replicated"):
        assert ctx.get_optional_attr(name) is not None, name


def test_coco_opt_registers_the_dialects() -> None:
    from coconet.tools.coco_opt import CocoOptMain

    main = CocoOptMain(args=[])
    assert main.ctx.get_optional_op("coco.matmul") is not None
    assert main.ctx.get_optional_op("comm.all_reduce") is not None


@pytest.mark.parametrize("tail", ["", "\n", "\\n still inside"])
def test_an_unterminated_string_is_refused_at_once(tail: str, tmp_path) -> None:
    """A string literal with no closing quote (a truncated file) is a parse error naming
    the literal, at once: xDSL 0.74's lexer backtracked exponentially on it (`coco-opt` spun
    for minutes on a 32-character one; dialects/xdsl_lexer.py), and every parser of
    coconet's IR -- coco-opt's and `parse_module`'s -- gets the fix with the dialects. (In
    child processes, so that a regression fails on their timeout instead of hanging.)"""
    import subprocess
    import sys

    text = 'module attributes {coco.schedule = "coco-fuse-all-reduce{ops=t,s form=one_sh' + tail
    path = tmp_path / "cut.mlir"
    path.write_text(text)
    parse = (
        "import sys\n"
        "from coconet.core.program import CocoError, parse_module\n"
        "try:\n"
        "    parse_module(open(sys.argv[1]).read())\n"
        "except CocoError as e:\n"
        "    print(e, file=sys.stderr)\n"
        "    sys.exit(1)\n"
    )
    for cmd in (
        [sys.executable, "-m", "coconet.tools.coco_opt", str(path)],
        [sys.executable, "-c", parse, str(path)],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert "End of file reached before closing string literal" in done.stderr
        assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------------------------
# Types and attributes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elt", "name"),
    [
        (f16, "f16"),
        (bf16, "bf16"),
        (f32, "f32"),
        (f64, "f64"),
        (i32, "i32"),
        (i64, "i64"),
        (i1, "i1"),
    ],
)
def test_every_element_type(elt: Attribute, name: str) -> None:
    t = T([4], elt, LOCAL)
    assert t.elt == name
    assert str(t) == f"!coco.tensor<4x{name}, local>"


@pytest.mark.parametrize(
    "elt", [i8, IntegerType(32, Signedness.UNSIGNED), IntegerType(16), builtin.IndexType()]
)
def test_unsupported_element_types(elt: Attribute) -> None:
    with pytest.raises(VerifyException, match=rule("unsupported-element-type")):
        T([4], elt)


def test_tensor_type_forms() -> None:
    assert str(T([], f32)) == "!coco.tensor<f32>"
    assert str(T([8, 4], bf16, S1)) == "!coco.tensor<8x4xbf16, sliced<1>>"
    assert str(T([8, 4], f16, LOCAL, S1)) == "!coco.tensor<8x4xf16, [local, sliced<1>]>"
    # replicated on every axis is written as no layout at all: one spelling per meaning
    assert T([8], f32, REPLICATED) == T([8], f32)
    assert T([8], f32, REPLICATED, REPLICATED) == T([8], f32)
    assert T([8], f32).is_replicated()
    assert str(T([8], f32, REPLICATED, LOCAL)) == "!coco.tensor<8xf32, [replicated, local]>"
    assert isinstance(T([8], bf16).element_type, BFloat16Type)


def test_tensor_type_queries() -> None:
    t = T([8, 16, 4], f32, S0, LOCAL, S1)
    assert t.rank == 3
    assert t.get_shape() == (8, 16, 4)
    assert t.layout_on(0) == S0
    assert t.layout_on(1) == LOCAL
    assert t.layout_on(7) == REPLICATED
    assert t.slicing_axes(0) == (0,)
    assert t.slicing_axes(1) == (2,)
    assert t.slicing_axes(2) == ()
    assert t.local_axes() == (1,)
    assert t.local_shape((2, 3, 4)) == (4, 4, 4)
    assert t.layout_text() == "[sliced<0>, local, sliced<1>]"
    assert t.with_element_type(f16) == T([8, 16, 4], f16, S0, LOCAL, S1)
    assert t.with_layouts(REPLICATED) == T([8, 16, 4], f32)
    two_axes_one_dim = T([16], f32, S0, S0)
    assert two_axes_one_dim.slicing_axes(0) == (0, 1)
    assert two_axes_one_dim.local_shape((2, 4)) == (2,)


def test_tensor_type_verifier() -> None:
    with pytest.raises(VerifyException, match=rule("sliced-dim-in-range")):
        T([8], f32, S1)
    with pytest.raises(VerifyException, match=rule("sliced-dim-in-range")):
        T([], f32, S0)
    with pytest.raises(VerifyException, match=rule("tensor-shape")):
        T([4, 0], f32)


def _parse_types(text: str) -> list[Attribute]:
    parser = Parser(make_context(), text)
    types = [parser.parse_type()]
    while parser.parse_optional_punctuation(","):
        types.append(parser.parse_type())
    return types


def test_the_dialects_memos_are_one_registry_and_clear_together() -> None:
    """Every compile-time memo of the dialects is registered (coco_types.MEMOS): after a
    program verifies they hold entries; clear_memos() empties them all, and the program
    parses and verifies the same again."""
    from pathlib import Path

    from coconet.core.program import parse_module
    from coconet.dialects import coco_types

    text = (Path(__file__).resolve().parents[2] / "examples/lamb.mlir").read_text()
    first = str(parse_module(text))
    assert len(coco_types.MEMOS) == 9
    assert any(coco_types.MEMOS.values())
    coco_types.clear_memos()
    assert not any(coco_types.MEMOS.values())
    assert str(parse_module(text)) == first


def test_a_tensor_type_spelled_again_parses_from_its_first_parse() -> None:
    from coconet.dialects import coco_types

    body = "4x6xf32, [sliced<1>, local]"
    coco_types._PARSED_BODIES.pop(body, None)
    first, again, spaced = _parse_types(
        f"!coco.tensor<{body}>, !coco.tensor<{body}>, !coco.tensor<4x6xf32,[sliced<1>,local]>"
    )
    assert first == again == spaced == T([4, 6], f32, S1, LOCAL)
    # the parameters of the first parse are reused (they are immutable attributes)
    assert body in coco_types._PARSED_BODIES
    assert again.parameters[0] is first.parameters[0]
    # the parser stands right after a type parsed from the table: what follows parses
    parser = Parser(make_context(), f"!coco.tensor<{body}> 7 -> !coco.tensor<{body}>")
    assert parser.parse_type() == first
    assert parser.parse_integer() == 7
    parser.parse_punctuation("->")
    assert parser.parse_type() == first


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("!coco.tensor<?x4xf32>", "static shapes"),
        ("!coco.tensor<4xf32, sliced<3>>", "sliced-dim-in-range"),
        ("!coco.tensor<4xf32, sliced<0>", "'>'"),
    ],
)
def test_a_bad_tensor_type_is_refused_every_time_it_is_written(text: str, message: str) -> None:
    # a failed parse is never remembered: the second spelling fails as the first did
    for _ in range(2):
        with pytest.raises(Exception, match=re.escape(message)):
            _parse_types(text)


def test_grid_attr() -> None:
    grid = GridAttr([2, 4])
    assert grid.shape == (2, 4)
    assert grid.rank == 2
    assert grid.is_static()
    assert str(grid) == "[2, 4]"
    dyn = GridAttr([DYNAMIC])
    assert not dyn.is_static()
    assert str(dyn) == "[?]"
    assert layout_rules.DEFAULT_GRID == dyn


@pytest.mark.parametrize(
    ("sizes", "ranks", "bound"),
    [([DYNAMIC], 8, (8,)), ([DYNAMIC], 1, (1,)), ([2, 4], 8, (2, 4)), ([2, DYNAMIC], 8, (2, 4)),
     ([DYNAMIC, 3], 12, (4, 3)), ([2, DYNAMIC, 2], 16, (2, 4, 2))],
)  # fmt: skip
def test_grid_bind(sizes: list[int], ranks: int, bound: tuple[int, ...]) -> None:
    assert GridAttr(sizes).bind(ranks) == bound


@pytest.mark.parametrize(("sizes", "ranks"), [([2, 4], 6), ([8], 4), ([4, DYNAMIC], 6)])
def test_grid_bind_refuses(sizes: list[int], ranks: int) -> None:
    with pytest.raises(ValueError, match="rank"):
        GridAttr(sizes).bind(ranks)


@pytest.mark.parametrize("sizes", [[], [0], [4, -3], [DYNAMIC, DYNAMIC]])
def test_grid_verifier(sizes: list[int]) -> None:
    with pytest.raises(VerifyException, match=rule("grid")):
        GridAttr(sizes)


def test_grid_of() -> None:
    fn = Fn(T([8], f32), grid=[2, 4])
    op = fn.add(NegOp(fn.args[0]))
    assert layout_rules.grid_of(op) == GridAttr([2, 4])
    assert layout_rules.grid_of(fn.op) == GridAttr([2, 4])
    # outside any function: a 1-D world sized at launch
    (x,) = values(T([8], f32))
    assert layout_rules.grid_of(NegOp(x)) == GridAttr([DYNAMIC])
    bad = Fn(T([8], f32))
    bad.op.attributes[GRID_ATTR_NAME] = builtin.IntegerAttr(8, 64)
    neg = bad.add(NegOp(bad.args[0]))
    with pytest.raises(VerifyException, match=rule("grid")):
        layout_rules.grid_of(neg)


# --------------------------------------------------------------------------------------------
# Elementwise inference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lhs", "rhs", "result"),
    [
        (T([8]), T([8]), T([8])),
        (T([8]), T([8], f32, S0), T([8], f32, S0)),
        (T([8], f32, S0), T([8]), T([8], f32, S0)),
        (T([8], f32, LOCAL), T([8], f32, LOCAL), T([8], f32, LOCAL)),
        (T([8], f32, LOCAL), T([8]), T([8], f32, LOCAL)),
        (T([], f32), T([4, 8], f32, S1), T([4, 8], f32, S1)),
        (T([], f32, LOCAL), T([4, 8]), T([4, 8], f32, LOCAL)),
        # a lower-rank operand broadcasts over leading dims: its sliced<0> is the result's dim 1
        (T([4, 8]), T([8], f32, S0), T([4, 8], f32, S1)),
        (T([4, 1]), T([4, 8], f32, S1), T([4, 8], f32, S1)),
        (T([2, 4, 8], f32, S2), T([8], f32, S0), T([2, 4, 8], f32, S2)),
        # per grid axis
        (T([8, 8], f32, LOCAL, S1), T([8, 8]), T([8, 8], f32, LOCAL, S1)),
        (
            T([8, 8], f32, LOCAL, REPLICATED),
            T([8, 8], f32, REPLICATED, S0),
            T([8, 8], f32, LOCAL, S0),
        ),
    ],
)
def test_elementwise_inference(lhs: TensorType, rhs: TensorType, result: TensorType) -> None:
    a, b = values(lhs, rhs)
    for op_type in coco.BINARY_OPS:
        op = op_type(a, b)
        assert op.result.type == result, op_type.name
        fn = Fn(lhs, rhs, grid=[2, 4] if len(result.layouts) == 2 else None)
        fn.add(op_type(*fn.args))
        fn.verify()


@pytest.mark.parametrize(
    ("lhs", "rhs", "name", "text"),
    [
        (T([8], f32, LOCAL), T([8], f32, S0), "elementwise-layouts", "local and sliced<0>"),
        (T([4, 8], f32, S0), T([4, 8], f32, S1), "elementwise-layouts", "sliced<0> and sliced<1>"),
        (T([1, 8], f32, S0), T([4, 8]), "elementwise-layouts", "broadcast along that dim"),
        (T([4, 8]), T([4, 7]), "broadcast-shapes", "do not broadcast"),
        (T([8], f32), T([8], f16), "element-types", "insert a coco.cast"),
        (T([8], i32), T([8], i64), "element-types", "i32, i64"),
    ],
)
def test_elementwise_refusals(lhs: TensorType, rhs: TensorType, name: str, text: str) -> None:
    a, b = values(lhs, rhs)
    with pytest.raises(VerifyException, match=rule(name)) as info:
        AddOp(a, b)
    assert text in str(info.value)


def test_elementwise_messages_name_the_operands() -> None:
    fn = Fn(T([8], f32, LOCAL), T([8], f32, S0))
    a, b = fn.args
    a.name_hint, b.name_hint = "grad", "slice"
    fn.add(AddOp.build(operands=[a, b], result_types=[T([8], f32, LOCAL)]))
    with pytest.raises(VerifyException, match=rule("elementwise-layouts")) as info:
        fn.verify()
    assert "%grad : !coco.tensor<8xf32, local>" in str(info.value)
    assert "%slice : !coco.tensor<8xf32, sliced<0>>" in str(info.value)


def test_unary_ops() -> None:
    (x, _i) = values(T([8], f16, S0), T([8], i32, LOCAL))
    for op_type in coco.UNARY_OPS:
        assert op_type(x).result.type == x.type
    fn = Fn(T([8], i32))
    fn.add(NegOp(fn.args[0]))
    fn.add(coco.AbsOp(fn.args[0]))
    fn.add(coco.ReluOp(fn.args[0]))
    fn.verify()
    bad = Fn(T([8], i32))
    bad.add(SqrtOp(bad.args[0]))
    with pytest.raises(VerifyException, match=rule("element-types")):
        bad.verify()


def test_compare_and_select() -> None:
    a, b, c = values(T([8], i64), T([8], i64, LOCAL), T([8], i1, S0))
    cmp = CmpOp("gt", a, b)
    assert cmp.result.type == T([8], i1, LOCAL)
    assert SelectOp(cmp.result, a, b).result.type == T([8], i64, LOCAL)
    x, y = values(T([8], f32), T([8], f32))
    assert SelectOp(c, x, y).result.type == T([8], f32, S0)
    with pytest.raises(VerifyException, match=rule("element-types")):
        SelectOp(x, x, y)
    with pytest.raises(VerifyException, match=rule("elementwise-layouts")) as info:
        SelectOp(c, b, b)
    # the condition's layout is reported with its own type
    assert "!coco.tensor<8xi1, sliced<0>>" in str(info.value)
    # a predicate is an enum attribute: an unknown one is refused where it is built
    with pytest.raises(ValueError, match="unknown comparison 'lol'"):
        CmpOp("lol", a, a)
    fn = Fn(T([8], i32))
    fn.add(CmpOp.build(operands=[fn.args[0]] * 2, result_types=[T([8], i1)],
                       properties={"predicate": builtin.StringAttr("lol")}))  # fmt: skip
    with pytest.raises(VerifyException, match="should be of base attribute coco.cmp_predicate"):
        fn.verify()


def test_cast() -> None:
    (x,) = values(T([8], f16, LOCAL))
    assert CastOp(x, f32).result.type == T([8], f32, LOCAL)
    assert CastOp(x, T([8], i1, LOCAL)).result.type == T([8], i1, LOCAL)
    fn = Fn(T([8], f16))
    fn.add(CastOp(fn.args[0], T([8], f32, LOCAL)))
    with pytest.raises(VerifyException, match=rule("result-type")):
        fn.verify()


def test_constant() -> None:
    c = ConstantOp(0.9, T([], f32))
    assert c.number == pytest.approx(0.9)
    assert isinstance(c.value, builtin.FloatAttr)
    assert isinstance(ConstantOp(3, T([4], i32)).value, builtin.IntegerAttr)
    assert ConstantOp(True, T([], i1)).number == 1
    fn = Fn()
    fn.add(ConstantOp(1.0, T([4], f32, LOCAL)))
    with pytest.raises(VerifyException, match=rule("constant-replicated")):
        fn.verify()
    for value, elt in [(2, i1), (-1, i1), (2**32, i32), (-(2**31) - 1, i32)]:
        fn = Fn()
        fn.add(ConstantOp(value, T([], elt)))
        with pytest.raises(VerifyException, match=rule("constant-type")):
            fn.verify()
    fn = Fn()
    for value, elt in [(0, i1), (1, i1), (-(2**31), i32), (2**32 - 1, i32), (-(2**63), i64)]:
        fn.add(ConstantOp(value, T([], elt)))
    fn.verify()
    fn = Fn()
    fn.add(ConstantOp.build(result_types=[T([], f32)],
                            properties={"value": builtin.IntegerAttr(1, i64)}))  # fmt: skip
    with pytest.raises(VerifyException, match=rule("constant-type")):
        fn.verify()


@pytest.mark.parametrize(
    ("p", "ok"), [(0.0, True), (0.5, True), (0.999, True), (1.0, False), (-0.1, False)]
)
def test_dropout_probability(p: float, ok: bool) -> None:
    fn = Fn(T([8], f32, S0))
    op = fn.add(DropoutOp(fn.args[0], p, seed=7))
    assert op.result.type == T([8], f32, S0)
    if ok:
        fn.verify()
    else:
        with pytest.raises(VerifyException, match=rule("dropout-probability")):
            fn.verify()


# --------------------------------------------------------------------------------------------
# Matmul and reductions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lhs", "rhs", "result"),
    [
        (T([4, 8]), T([8, 16]), T([4, 16])),
        (T([4, 8], f32, S0), T([8, 16]), T([4, 16], f32, S0)),  # sliced(rows) x R
        (T([4, 8]), T([8, 16], f32, S1), T([4, 16], f32, S1)),  # R x sliced(cols)
        (T([4, 8], f32, S1), T([8, 16], f32, S0), T([4, 16], f32, LOCAL)),  # sliced(K) x sliced(K)
        (T([4, 8], f32, LOCAL), T([8, 16]), T([4, 16], f32, LOCAL)),
        (T([4, 8], f32, LOCAL), T([8, 16], f32, LOCAL), T([4, 16], f32, LOCAL)),
        (T([4, 8]), T([8, 16], f32, LOCAL), T([4, 16], f32, LOCAL)),
        (T([2, 4, 8], f32, S0), T([8, 16]), T([2, 4, 16], f32, S0)),  # batch dim
        (T([2, 4, 8], f32, S1), T([2, 8, 16]), T([2, 4, 16], f32, S1)),  # batched rows
        (T([2, 4, 8]), T([2, 8, 16], f32, S2), T([2, 4, 16], f32, S2)),  # batched cols
        (T([4, 8], f16, S0, S1), T([8, 16], f16, REPLICATED, S0), T([4, 16], f16, S0, LOCAL)),
    ],
)
def test_matmul_inference(lhs: TensorType, rhs: TensorType, result: TensorType) -> None:
    a, b = values(lhs, rhs)
    assert MatmulOp(a, b).result.type == result
    fn = Fn(lhs, rhs, grid=[2, 2] if len(result.layouts) == 2 else None)
    fn.add(MatmulOp(*fn.args))
    fn.verify()


@pytest.mark.parametrize(
    ("lhs", "rhs", "name"),
    [
        (T([4, 8], f32, S0), T([8, 16], f32, S1), "matmul-layouts"),
        (T([4, 8], f32, S1), T([8, 16]), "matmul-layouts"),
        (T([4, 8]), T([8, 16], f32, S0), "matmul-layouts"),
        (T([4, 8], f32, LOCAL), T([8, 16], f32, S1), "matmul-layouts"),
        (T([4, 8], f32, S0), T([8, 16], f32, LOCAL), "matmul-layouts"),
        (T([8]), T([8, 16]), "matmul-shapes"),
        (T([4, 8]), T([7, 16]), "matmul-shapes"),
        (T([2, 4, 8]), T([3, 8, 16]), "matmul-shapes"),
        (T([4, 8], f32), T([8, 16], f16), "element-types"),
    ],
)
def test_matmul_refusals(lhs: TensorType, rhs: TensorType, name: str) -> None:
    a, b = values(lhs, rhs)
    with pytest.raises(VerifyException, match=rule(name)):
        MatmulOp(a, b)


@pytest.mark.parametrize(
    ("kind", "operand", "result"),
    [
        ("sum", T([4, 8]), T([], f32)),
        ("max", T([4, 8], f32, LOCAL), T([], f32, LOCAL)),
        ("min", T([4, 8], i32, S1), T([], i32, LOCAL)),  # a partial result
        ("sum", T([4, 8], f32, S0, LOCAL), T([], f32, LOCAL, LOCAL)),
        ("norm", T([8], bf16, LOCAL), T([], bf16, LOCAL)),
        ("norm", T([8], f64), T([], f64)),
    ],
)
def test_reduction_inference(kind: str, operand: TensorType, result: TensorType) -> None:
    (x,) = values(operand)
    assert ReduceOp(kind, x).result.type == result


def test_reduction_refusals() -> None:
    (s, i) = values(T([8], f32, S0), T([8], i32))
    with pytest.raises(VerifyException, match=rule("norm-of-slice")):
        ReduceOp("norm", s)
    with pytest.raises(VerifyException, match=rule("element-types")):
        ReduceOp("norm", i)
    fn = Fn(T([8], f32, S0))
    fn.add(ReduceOp("sum", fn.args[0], T([], f32)))  # a partial sum is local, not replicated
    with pytest.raises(VerifyException, match=rule("result-type")):
        fn.verify()
    with pytest.raises(ValueError, match="unknown reduction 'avg'"):
        ReduceOp("avg", i)
    fn = Fn(T([8], f32))
    fn.add(ReduceOp.build(operands=[fn.args[0]], result_types=[T([], f32)],
                          properties={"kind": builtin.StringAttr("avg")}))  # fmt: skip
    with pytest.raises(VerifyException, match="should be of base attribute coco.reduction_kind"):
        fn.verify()


# --------------------------------------------------------------------------------------------
# Slice and update
# --------------------------------------------------------------------------------------------


def test_slice() -> None:
    fn = Fn(T([8, 4]), T([8, 4], f32, REPLICATED, LOCAL), grid=None)
    fn.add(SliceOp(fn.args[0], T([8, 4], f32, S1)))
    fn.verify()
    fn2 = Fn(T([8, 4], f32, REPLICATED, LOCAL), grid=[2, 2])
    fn2.add(SliceOp(fn2.args[0], T([8, 4], f32, S0, LOCAL)))
    fn2.verify()


@pytest.mark.parametrize(
    ("src", "dst", "name"),
    [
        (T([8], f32, LOCAL), T([8], f32, S0), "slice-layouts"),
        (T([8], f32, S0), T([8], f32), "slice-layouts"),
        (T([8]), T([8], f16, S0), "slice-type"),
        (T([8]), T([4], f32, S0), "slice-type"),
    ],
)
def test_slice_refusals(src: TensorType, dst: TensorType, name: str) -> None:
    fn = Fn(src)
    fn.add(SliceOp(fn.args[0], dst))
    with pytest.raises(VerifyException, match=rule(name)):
        fn.verify()


def test_update() -> None:
    fn = Fn(T([8]), T([8]))
    m, v = fn.args
    new = fn.add(AddOp(m, v))
    fn.add(UpdateOp(m, new.result))
    fn.verify()


def test_update_refusals() -> None:
    fn = Fn(T([8]))
    neg = fn.add(NegOp(fn.args[0]))
    fn.add(UpdateOp(neg.result, fn.args[0]))
    with pytest.raises(VerifyException, match=rule("update-target")):
        fn.verify()

    fn = Fn(T([8]), T([8], f32, S0))
    fn.add(UpdateOp(*fn.args))
    with pytest.raises(VerifyException, match=rule("update-type")):
        fn.verify()

    fn = Fn(T([8]), T([8]))
    fn.add(UpdateOp(*fn.args))
    fn.add(UpdateOp(*fn.args))
    with pytest.raises(VerifyException, match=rule("update-once")):
        fn.verify()

    fn = Fn(T([8]), T([8]))
    fn.args[0].name_hint = "m"
    fn.add(UpdateOp(*fn.args))
    fn.add(NegOp(fn.args[0]))
    with pytest.raises(VerifyException, match=rule("update-last-use")) as info:
        fn.verify()
    assert "coco.neg reads %m" in str(info.value)


# --------------------------------------------------------------------------------------------
# Grid checks on every op
# --------------------------------------------------------------------------------------------


def test_uneven_slice_is_legal_and_empty_slice_is_refused() -> None:
    # 9 over 2 ranks: pieces of 5 and 4 (the first 9 % 2 ranks hold one more)
    fn = Fn(T([9], f32, S0), grid=[2])
    fn.add(NegOp(fn.args[0]))
    fn.verify()
    assert T([9], f32, S0).local_shape((2,)) == (5,)  # the largest piece
    # a dim smaller than its parts leaves a rank nothing: refused statically and at launch
    fn = Fn(T([3], f32, S0), grid=[4])
    fn.add(NegOp(fn.args[0]))
    with pytest.raises(VerifyException, match=rule("empty-slice")):
        fn.verify()
    fn = Fn(T([3], f32, S0), grid=[DYNAMIC])
    fn.add(NegOp(fn.args[0]))
    fn.verify()
    with pytest.raises(VerifyException, match=rule("empty-slice")):
        layout_rules.check_bound_shapes(T([3], f32, S0), (4,), "x")
    layout_rules.check_bound_shapes(T([9], f32, S0), (2,), "x")
    layout_rules.check_bound_shapes(T([3], f32, S0), (3,), "x")
    # two axes cutting one dim: 8 rows into 4 * 4 parts
    fn = Fn(T([8], f32, S0, S0), grid=[4, 4])
    fn.add(NegOp(fn.args[0]))
    with pytest.raises(VerifyException, match=rule("empty-slice")):
        fn.verify()


def test_layouts_per_axis() -> None:
    fn = Fn(T([8], f32, LOCAL), grid=[2, 2])
    fn.add(NegOp(fn.args[0]))
    with pytest.raises(VerifyException, match=rule("layouts-per-axis")):
        fn.verify()
    fn = Fn(T([8], f32, LOCAL, LOCAL))
    fn.add(NegOp(fn.args[0]))
    with pytest.raises(VerifyException, match=rule("layouts-per-axis")):
        fn.verify()


def test_result_type_is_checked() -> None:
    fn = Fn(T([8]))
    fn.add(AddOp(fn.args[0], fn.args[0], T([8], f32, LOCAL)))
    with pytest.raises(VerifyException, match=rule("result-type")) as info:
        fn.verify()
    assert "coco.add produces !coco.tensor<8xf32>" in str(info.value)


# --------------------------------------------------------------------------------------------
# Collectives
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "operand", "result"),
    [
        (lambda x: AllReduceOp(x), T([8], f32, LOCAL), T([8])),
        (lambda x: AllReduceOp(x, "max"), T([8]), T([8])),
        (lambda x: ReduceScatterOp(x), T([8], f32, LOCAL), T([8], f32, S0)),
        (lambda x: ReduceScatterOp(x, dim=1), T([4, 8], f32, LOCAL), T([4, 8], f32, S1)),
        (lambda x: ReduceScatterOp(x, "min", dim=1), T([4, 8]), T([4, 8], f32, S1)),
        (lambda x: AllGatherOp(x), T([4, 8], f32, S1), T([4, 8])),
        (lambda x: BroadcastOp(x, root=3), T([8], f32, LOCAL), T([8])),
        (lambda x: comm.ReduceOp(x, "prod", root=1), T([8], f32, LOCAL), T([8], f32, LOCAL)),
        (lambda x: comm.ReduceOp(x), T([8]), T([8], f32, LOCAL)),
        (lambda x: SendOp(x), T([8]), T([8], f32, LOCAL)),
        (lambda x: SendOp(x, along=0, shift=-1), T([8], f32, LOCAL), T([8], f32, LOCAL)),
        # on a 2-D grid: `over` picks the axes; the others keep their layout
        (
            lambda x: AllReduceOp(x, axes=[1]),
            T([8], f32, LOCAL, LOCAL),
            T([8], f32, LOCAL, REPLICATED),
        ),
        (lambda x: AllReduceOp(x, axes=[0, 1]), T([8], f32, LOCAL, LOCAL), T([8])),
        (
            lambda x: ReduceScatterOp(x, dim=0, axes=[1]),
            T([8], f32, LOCAL, LOCAL),
            T([8], f32, LOCAL, S0),
        ),
        (
            lambda x: AllGatherOp(x, axes=[1]),
            T([8, 8], f32, LOCAL, S1),
            T([8, 8], f32, LOCAL, REPLICATED),
        ),
        (lambda x: SendOp(x, along=0), T([8, 8], f32, REPLICATED, S1), T([8, 8], f32, LOCAL, S1)),
        # built before it sits in a function: every axis the input's type names is spanned
        (lambda x: AllReduceOp(x), T([8], f32, LOCAL, LOCAL), T([8])),
        (lambda x: AllGatherOp(x), T([8, 8], f32, S0, S1), T([8, 8])),
    ],
)
def test_collective_inference(make, operand: TensorType, result: TensorType) -> None:
    (x,) = values(operand)
    op = make(x)
    assert op.result.type == result
    # the same op verifies inside a function on a matching grid
    grid = [2, 4] if len(operand.layouts) == 2 or len(result.layouts) == 2 else [4]
    fn = Fn(operand, grid=grid)
    fn.add(make(fn.args[0]))
    fn.verify()


def test_reduce_scatter_dim_is_ir_state() -> None:
    # The dim lives in a property, so a clone (or a generic print and re-parse) keeps it and
    # the verifier infers from it.
    fn = Fn(T([4, 8], f32, LOCAL))
    rs = fn.add(ReduceScatterOp(fn.args[0], dim=1))
    assert isinstance(rs, ReduceScatterOp)
    assert rs.dim.value.data == 1
    clone = fn.add(rs.clone())
    assert isinstance(clone, ReduceScatterOp)
    assert clone.infer() == T([4, 8], f32, S1)
    fn.verify()
    with pytest.raises(VerifyException, match=rule("reduce-scatter-dim")):
        ReduceScatterOp(fn.args[0], dim=2)


def test_one_collective_inference() -> None:
    # constructors, verifiers (`infer`) and passes share comm.collective_result_type
    t = T([8, 8], f32, LOCAL, LOCAL)
    assert comm.collective_result_type(ReduceScatterOp, t, (1,), 2, dim=1) == T(
        [8, 8], f32, LOCAL, S1
    )
    assert comm.collective_result_type(SendOp, T([8, 8], f32, REPLICATED, S1), (0,), 2) == T(
        [8, 8], f32, LOCAL, S1
    )
    with pytest.raises(VerifyException, match=rule("all-gather-input")):
        comm.collective_result_type(AllGatherOp, t, (0,), 2)
    fn = Fn(t, grid=[2, 4])
    op = fn.add(AllReduceOp(fn.args[0], axes=[1], grid_rank=2))
    assert isinstance(op, AllReduceOp)
    assert op.result.type == op.infer() == T([8, 8], f32, LOCAL, REPLICATED)


def test_memory_effects() -> None:
    # coco.update writes its target; regions have their bodies' effects; the rest is pure
    fn = Fn(T([8]), T([8]))
    w, x = fn.args
    neg = fn.add(NegOp(x))
    update = UpdateOp(w, neg.results[0])
    assert get_effects(update) == {EffectInstance(MemoryEffectKind.WRITE, w)}
    assert is_side_effect_free(neg)
    assert is_side_effect_free(AllReduceOp(x))
    writes = FusedOp("elementwise", _region(lambda b: b.add_ops([update, YieldOp()])), [])
    assert get_effects(writes) == {EffectInstance(MemoryEffectKind.WRITE, w)}
    pure = FusedOp("elementwise", _region(lambda b: b.add_op(YieldOp([x]))), [T([8])])
    assert is_side_effect_free(pure)


@pytest.mark.parametrize(
    ("make", "operand", "name"),
    [
        (lambda x: AllReduceOp(x), T([8], f32, S0), "all-reduce-input"),
        (lambda x: ReduceScatterOp(x), T([8], f32, S0), "reduce-scatter-input"),
        (lambda x: AllGatherOp(x), T([8], f32, LOCAL), "all-gather-input"),
        (lambda x: AllGatherOp(x), T([8]), "all-gather-input"),
        (lambda x: BroadcastOp(x), T([8], f32, S0), "broadcast-input"),
        (lambda x: comm.ReduceOp(x), T([8], f32, S0), "reduce-input"),
    ],
)
def test_collective_input_refusals(make, operand: TensorType, name: str) -> None:
    (x,) = values(operand)
    x.name_hint = "x"
    with pytest.raises(VerifyException, match=rule(name)) as info:
        make(x)
    assert f"%x : {operand}" in str(info.value)


def test_unknown_collective_kind() -> None:
    (x,) = values(T([8], f32, LOCAL))
    with pytest.raises(ValueError, match="unknown reduction kind"):
        AllReduceOp(x, "avg")
    fn = Fn(T([8], f32, LOCAL))
    fn.add(AllReduceOp.build(operands=[fn.args[0]], result_types=[T([8])],
                             properties={"kind": builtin.StringAttr("avg")}))  # fmt: skip
    with pytest.raises(VerifyException, match="should be of base attribute comm.collective_kind"):
        fn.verify()


@pytest.mark.parametrize(
    ("make", "grid", "name"),
    [
        (lambda x: AllReduceOp(x, axes=[2]), [2, 4], "collective-axes"),
        (lambda x: AllReduceOp(x, axes=[1, 1]), [2, 4], "collective-axes"),
        (lambda x: AllReduceOp(x, axes=[]), [2, 4], "collective-axes"),
        (lambda x: SendOp(x, along=2), [2, 4], "collective-axes"),
        (lambda x: SendOp(x, along=0, shift=0), [2, 4], "send-shift"),
        (lambda x: SendOp(x, along=0, shift=2), [2, 4], "send-shift"),
        (lambda x: SendOp(x, along=1, shift=-4), [2, 4], "send-shift"),
        (lambda x: BroadcastOp(x, root=-1), [2, 4], "collective-root"),
        (lambda x: BroadcastOp(x, root=8), [2, 4], "collective-root"),
        (lambda x: comm.ReduceOp(x, root=4, axes=[1]), [2, 4], "collective-root"),
    ],
)
def test_collective_refusals(make, grid: list[int], name: str) -> None:
    fn = Fn(T([8], f32, LOCAL, LOCAL), grid=grid)
    try:
        op = make(fn.args[0])
    except VerifyException as e:  # some are refused while inferring the result type
        assert re.match(rule(name), str(e)), str(e)
        return
    fn.add(op)
    with pytest.raises(VerifyException, match=rule(name)):
        fn.verify()


def test_legal_roots_and_shifts() -> None:
    fn = Fn(T([8], f32, LOCAL, LOCAL), grid=[2, 4])
    x = fn.args[0]
    fn.add(BroadcastOp(x, root=7))
    fn.add(comm.ReduceOp(x, root=3, axes=[1]))
    fn.add(SendOp(x, along=0, shift=1))
    fn.add(SendOp(x, along=1, shift=-3))
    fn.verify()
    # sized at launch: any root and shift may be legal
    fn = Fn(T([8], f32, LOCAL))
    fn.add(BroadcastOp(fn.args[0], root=100))
    fn.add(SendOp(fn.args[0], shift=100))
    fn.verify()


# --------------------------------------------------------------------------------------------
# Schedule regions
# --------------------------------------------------------------------------------------------


def _region(build) -> Region:
    block = Block()
    build(block)
    return Region(block)


def test_fused_all_reduce() -> None:
    fn = Fn(T([1024], f32, LOCAL), T([1024]))
    g, w = fn.args

    def body(block: Block) -> None:
        rs = ReduceScatterOp(g)
        ws = SliceOp(w, T([1024], f32, S0))
        new = AddOp(ws.result, rs.result)
        ag = AllGatherOp(new.result)
        block.add_ops([rs, ws, new, ag, YieldOp([ag.result])])

    fused = fn.add(FusedOp("all_reduce", _region(body), [T([1024])]))
    assert fused.yield_op.values[0].type == T([1024])
    fn.verify()


def test_region_refusals() -> None:
    fn = Fn(T([8]))
    (x,) = fn.args
    fn.add(FusedOp("elementwise", _region(lambda b: b.add_op(YieldOp([x, x]))), [T([8])]))
    with pytest.raises(VerifyException, match=rule("region-results")):
        fn.verify()

    with pytest.raises(ValueError, match="unknown fusion kind 'magic'"):
        FusedOp("magic", _region(lambda b: b.add_op(YieldOp())), [])

    fn = Fn(T([8], f32, LOCAL))
    (g,) = fn.args

    def with_all_reduce(block: Block) -> None:
        ar = AllReduceOp(g)
        block.add_ops([ar, YieldOp([ar.result])])

    fn.add(FusedOp("elementwise", _region(with_all_reduce), [T([8])]))
    with pytest.raises(VerifyException, match=rule("fuse-elementwise")):
        fn.verify()

    fn = Fn(T([8], f32, LOCAL))
    (g,) = fn.args

    def two_scatters(block: Block) -> None:
        a, b = ReduceScatterOp(g), ReduceScatterOp(g, "max")
        block.add_ops([a, b, YieldOp([a.result])])

    fn.add(FusedOp("all_reduce", _region(two_scatters), [T([8], f32, S0)]))
    with pytest.raises(VerifyException, match=rule("fuse-one-collective")):
        fn.verify()

    fn = Fn(T([8]))
    fn.add(OverlapOp(0, _region(lambda b: b.add_op(YieldOp())), []))
    with pytest.raises(VerifyException, match=rule("overlap-chunks")):
        fn.verify()


def test_overlap() -> None:
    fn = Fn(T([64, 32], f16, S1), T([32, 16], f16, S0))
    a, b = fn.args

    def body(block: Block) -> None:
        mm = MatmulOp(a, b)
        ar = AllReduceOp(mm.result)
        block.add_ops([mm, ar, YieldOp([ar.result])])

    ov = fn.add(OverlapOp(4, _region(body), [T([64, 16], f16)]))
    assert ov.chunks.value.data == 4
    fn.verify()


@pytest.mark.parametrize(
    ("x", "text"),
    [(0.1, "0.1"), (1e-05, "1.0e-05"), (2.5e20, "2.5e+20"), (-3e-7, "-3.0e-07"), (1.0, "1.0"),
     (float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan")],
)  # fmt: skip
def test_float_literals_parse_back(x: float, text: str) -> None:
    assert coco.float_literal(x) == text
    printed = print_op(ConstantOp(x, T([], f64))).split(" = ", 1)[1]
    assert printed == f"coco.constant {text} : !coco.tensor<f64>"
    reparsed = Parser(make_context(), f"%c = {printed}").parse_op()
    assert isinstance(reparsed, ConstantOp)
    assert print_op(reparsed).split(" = ", 1)[1] == printed


# --------------------------------------------------------------------------------------------
# Built IR prints as text that parses back to the same text
# --------------------------------------------------------------------------------------------


def test_built_program_round_trips() -> None:
    fn = Fn(T([4096], f16, LOCAL), T([4096], f32), T([], f32), grid=[DYNAMIC])
    g, m, lr = fn.args
    for v, name in zip(fn.args, ("g", "m", "lr")):
        v.name_hint = name
    g1 = fn.add(AllReduceOp(g))
    gf = fn.add(CastOp(g1.result, f32))
    b1 = fn.add(ConstantOp(0.9, T([], f32)))
    t = fn.add(coco.MulOp(b1.result, m))
    step = fn.add(coco.MulOp(lr, gf.result))
    new = fn.add(coco.SubOp(t.result, step.result))
    inf = fn.add(ConstantOp(float("-inf"), T([], f32)))
    fn.add(coco.MaxOp(new.result, inf.result))
    eps = fn.add(ConstantOp(1e-8, T([], f32)))
    fn.add(coco.AddOp(new.result, eps.result))
    fn.add(UpdateOp(m, new.result))
    fn.add(DropoutOp(new.result, 0.25, seed=3))
    fn.add(FusedOp("elementwise", _region(lambda b: b.add_op(YieldOp())), []))
    fn.verify()
    text = print_op(fn.module)
    assert (
        "comm.all_reduce sum %g : !coco.tensor<4096xf16, local> -> !coco.tensor<4096xf16>" in text
    )
    assert "coco.constant -inf : !coco.tensor<f32>" in text
    assert "coco.constant 1.0e-08 : !coco.tensor<f32>" in text  # `1e-08` would not parse
    reparsed = Parser(make_context(), text).parse_module()
    reparsed.verify()
    assert print_op(reparsed) == text


def test_tensor_types_hash_by_value_however_built():
    """TensorType remembers its hash per object: equal types built apart (parsed, built,
    derived) still hash alike and find each other in a dict, also once the memo of hashes
    has been emptied by more types than it holds."""
    from coconet.dialects import coco_types

    parsed = Parser(make_context(), "!coco.tensor<8x4xf32, sliced<0>>").parse_type()
    built = TensorType([8, 4], builtin.f32, [SlicedAttr(0)])
    derived = TensorType([8, 4], builtin.f32).with_layouts([SlicedAttr(0)])
    assert parsed == built == derived
    assert hash(parsed) == hash(built) == hash(derived)
    table = {built: "x"}
    assert table[parsed] == "x"
    assert table[derived] == "x"
    h = hash(built)
    for n in range(coco_types.MEMO_LIMIT + 1):  # overflow the memo: it starts over
        hash(TensorType([n + 1], builtin.f32))
    assert hash(built) == h
    assert hash(TensorType([8, 4], builtin.f32, [SlicedAttr(0)])) == h


# --------------------------------------------------------------------------------------------
# One reduction vocabulary
# --------------------------------------------------------------------------------------------

_REDUCING_OPS = [
    # (attribute, the op's text with {kind} in it, operand type)
    (
        coco.ReductionKindAttr,
        "%0 = coco.reduce {kind} %a : !coco.tensor<4x8xf32> -> !coco.tensor<f32>",
    ),
    (
        coco.DimReductionKindAttr,
        "%0 = coco.reduce_dims {kind} %a dims [1] : !coco.tensor<4x8xf32> -> !coco.tensor<4xf32>",
    ),
    (
        comm.CollectiveKindAttr,
        "%0 = comm.all_reduce {kind} %a : !coco.tensor<4x8xf32, local> -> !coco.tensor<4x8xf32>",
    ),
]


@pytest.mark.parametrize(("attr", "text"), _REDUCING_OPS)
@pytest.mark.parametrize("kind", list(Reduction))
def test_each_op_takes_its_subset_of_the_one_reduction_vocabulary(
    attr: type[ReductionsOf], text: str, kind: Reduction
) -> None:
    """Every reducing op names its reduction with the one `Reduction`: a member of its
    subset parses (its attribute holding that very member) and builds; any other member of
    the vocabulary is refused by the parser (naming the subset, marking the word) and by the
    attribute's verifier where built in Python."""
    from coconet.core.program import CocoError, parse_module

    ty = text.split(" : ")[1].split(" -> ")[0]
    program = f"func.func @f(%a: {ty}) {{\n  {text.format(kind=kind)}\n  func.return\n}}\n"
    if kind in attr.kinds:
        op = next(o for o in parse_module(program).walk() if "kind" in o.properties)
        assert op.properties["kind"] == attr(kind)
        assert op.properties["kind"].data is kind
        return
    with pytest.raises(CocoError) as info:
        parse_module(program)
    message = str(info.value)
    assert "Expected " + ", ".join(f"`{k}`" for k in attr.kinds[:-1]) in message
    assert "^" * len(kind) + "\n" in message or "^" * len(kind) + " " in message + " "
    with pytest.raises(
        VerifyException, match=rf"\[reduction-kind\] {attr.name} takes .*not {kind}"
    ):
        attr(kind)


def test_the_runtime_and_the_kernels_speak_the_dialects_reductions() -> None:
    """The transports' operator tables are keyed by exactly the collectives' reductions, and a
    lowered plan's collective carries the dialect's member itself (no string in between)."""
    from coconet.dialects.reduction import COLLECTIVE
    from coconet.runtime import host_combine, inprocess, transport

    for table in (transport.NCCL_OPS, host_combine._OPS, inprocess._REDUCE):
        assert set(table) == set(COLLECTIVE)
        assert all(type(k) is Reduction for k in table)
    assert {inprocess.InProcessMPI.SUM, inprocess.InProcessMPI.MAX} <= set(COLLECTIVE)
    from coconet.core.program import Program, parse_module
    from coconet.lowering.lower_to_plan import lower
    from coconet.lowering.plan import Collective

    module = parse_module(
        "func.func @f(%a: !coco.tensor<8xf32, local>) -> !coco.tensor<8xf32> {\n"
        "  %0 = comm.all_reduce max %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>\n"
        "  func.return %0 : !coco.tensor<8xf32>\n}\n"
    )
    (step,) = [s for s in lower(Program(module), 2).steps if isinstance(s, Collective)]
    assert step.kind is Reduction.MAX
