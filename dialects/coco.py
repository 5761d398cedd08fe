"""The `coco` dialect: distributed tensors over a process grid, and computation on them.

A program is a `func.func` that runs SPMD on a process grid (`#coco.grid<[8]>`,
`#coco.grid<[2, 4]>`, `#coco.grid<[?]>` for "as many ranks as launched"). Every value is a
`!coco.tensor<SHAPE x ELT, LAYOUT>`; SHAPE is the global (logical) shape and LAYOUT says, for
each grid axis, how the logical tensor lives on the ranks along that axis:

* `replicated`  every rank along the axis holds the same full value;
* `sliced<d>`   the tensor is cut in equal contiguous parts along dim `d`, one per rank;
* `local`       every rank holds a value of its own (per-rank gradients, partial sums).

A 1-D grid writes the single layout bare (`sliced<0>`); an N-D grid writes one layout per axis
(`[local, sliced<2>]`). A tensor replicated on every axis writes no layout at all, which is
also how scalars read: `!coco.tensor<f32>`.

Numerics (the sim oracle implements exactly this, and generated kernels must too): every op
computes in f32 for f16/bf16/f32 operands (f64 for f64, int64 for integers) and rounds its
result to its element type, so a fused kernel that keeps intermediates in registers must still
round them. Transcendentals (pow, exp, log, tanh, gelu, sigmoid) compute in f64 and round once:
f32 implementations differ between NumPy, glibc and CUDA, f64 ones rarely enough that their
rounded results agree. That is the `exact` numerics policy, the default; under the `fast` one
(`#coco<numerics fast>`, on the op or as the function's or module's `coco.numerics`) a
transcendental or rsqrt on a float narrower than f64 computes in f32 with each target's f32
functions, within a few f32 ulps of the exact result, not bit-identical across targets
(docs/architecture.md §3.4.2). Integer division truncates toward zero, as in C. fp8 (f8E4M3FN,
f8E5M2) computes in f32 like f16; a cast to it overflows as ml_dtypes' does (e4m3fn to NaN,
e5m2 to inf), `coco.quantize` saturates instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set as AbstractSet
from enum import auto
from typing import ClassVar, TypeVar, cast

from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    TensorType as BuiltinTensorType,
    UnitAttr,
    f64,
    i64,
)
from xdsl.dialects.utils.enum_attribute import EnumAttribute
from xdsl.ir import (
    Attribute,
    BlockArgument,
    Dialect,
    Operation,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    IRDLOperation,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.irdl.declarative_assembly_format import (
    AttributeVariable,
    CustomDirective,
    ParsingState,
    PrintingState,
    TypeDirective,
    irdl_custom_directive,
)
from xdsl.parser import Parser
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern
from xdsl.printer import Printer
from xdsl.traits import (
    EffectInstance,
    HasCanonicalizationPatternsTrait,
    MemoryEffect,
    MemoryEffectKind,
    Pure,
)
from xdsl.transforms.dead_code_elimination import is_trivially_dead
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from coconet.dialects import layout_rules

# The attributes and types (coco_types.py), re-exported: `coco.TensorType` is the usual spelling.
from coconet.dialects.coco_types import (
    DEFAULT_GRID as DEFAULT_GRID,
    DYNAMIC as DYNAMIC,
    ELEMENT_TYPE_NAMES as ELEMENT_TYPE_NAMES,
    FLOAT_TYPE_NAMES as FLOAT_TYPE_NAMES,
    FP8_MAX as FP8_MAX,
    FP8_TYPE_NAMES as FP8_TYPE_NAMES,
    GRID_ATTR_NAME as GRID_ATTR_NAME,
    LOCAL as LOCAL,
    MAX_ELEMENTS as MAX_ELEMENTS,
    MAX_RANKS as MAX_RANKS,
    NUMERICS_ATTR_NAME as NUMERICS_ATTR_NAME,
    REPLICATED as REPLICATED,
    SCHEDULE_ATTR_NAME as SCHEDULE_ATTR_NAME,
    SYMMETRIC_ARG_ATTR as SYMMETRIC_ARG_ATTR,
    GridAttr as GridAttr,
    LayoutAttr as LayoutAttr,
    LocalAttr as LocalAttr,
    ReplicatedAttr as ReplicatedAttr,
    SlicedAttr as SlicedAttr,
    TensorType as TensorType,
    element_type_name as element_type_name,
    exact_widening as exact_widening,
    is_float_name as is_float_name,
    is_float_type as is_float_type,
    layout_str as layout_str,
    normalize_layouts as normalize_layouts,
)
from coconet.dialects.reduction import DIMS, FULL, Reduction, ReductionsOf, reduction

_EnumT = TypeVar("_EnumT", bound=StrEnum)

# --------------------------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------------------------
# Every op's result type follows from its operands by CoCoNet's layout rules
# (layout_rules.py). Ops verify that the written result type is the inferred one, so a
# layout violation is reported at the op that commits it, naming the rule.


def tensor_operand() -> SSAValue[TensorType]:
    """An operand constrained to `!coco.tensor`, declared with that type for the type checker:
    xDSL 0.74's `operand_def` returns an untyped `SSAValue`, the constraint is what checks it."""
    return cast(SSAValue[TensorType], operand_def(TensorType))


def tensor_type_of(value: SSAValue) -> TensorType:
    """The type of a value that coco/comm ops take or make: their operand and result
    constraints check it is a `!coco.tensor`; this only tells the type checker so."""
    return cast(TensorType, value.type)


def float_literal(x: float) -> str:
    """`repr(x)` as MLIR's lexer reads it: `1e-05` has no `.`, so it would lex as `1`."""
    mantissa, e, exponent = repr(x).partition("e")
    if e and "." not in mantissa:
        return f"{mantissa}.0e{exponent}"
    return repr(x)


# -- custom directives of the assembly formats -----------------------------------------------


def _parse_signature(
    parser: Parser, state: ParsingState, num_results: int
) -> tuple[list[TypeAttribute], list[TypeAttribute]]:
    """`T`, or `T1, T2 -> T3` (`T1, T2` without results), checked against the op's arity."""
    # Operands are parsed before the signature in every format that uses it.
    num_operands = sum(len(o) for o in state.operands if o is not None)
    start = parser.pos
    types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
    results: list[TypeAttribute] = []
    if parser.parse_optional_punctuation("->"):
        results = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
    elif len(types) == 1:
        types, results = [types[0]] * num_operands, [types[0]] * num_results
    if len(types) != num_operands or len(results) != num_results:
        parser.raise_error(
            f"expected {num_operands} operand type(s) and {num_results} result type(s), "
            f"got {len(types)} and {len(results)}",
            start,
        )
    return types, results


def _print_signature(
    printer: Printer, operand_types: Sequence[Attribute], result_types: Sequence[Attribute]
) -> None:
    types = [*operand_types, *result_types]
    if types and all(t == types[0] for t in types):
        printer.print_attribute(types[0])
        return
    printer.print_list(operand_types, printer.print_attribute)
    if result_types:
        printer.print_string(" -> ")
        printer.print_list(result_types, printer.print_attribute)


@irdl_custom_directive
class Signature(CustomDirective):
    """An op's types after its `:`: `T` when every operand and result has type T (most coco
    ops keep their operands' type), else `T1, T2 -> T3`.

    MLIR would spell the general case `functional-type(operands, results)`; the short form
    is the point of this directive, as almost every op of a program keeps its type.
    """

    operand_types: TypeDirective
    result_types: TypeDirective

    def parse(self, parser: Parser, state: ParsingState) -> None:
        types, results = _parse_signature(parser, state, len(state.result_types))
        self.operand_types.set(state, types)
        self.result_types.set(state, results)

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        state.print_whitespace(printer)
        _print_signature(printer, self.operand_types.get(op), self.result_types.get(op))


@irdl_custom_directive
class OperandSignature(CustomDirective):
    """`Signature` of an op without results (`type(results)` needs one): `T` or `T1, T2`."""

    operand_types: TypeDirective

    def parse(self, parser: Parser, state: ParsingState) -> None:
        types, _ = _parse_signature(parser, state, 0)
        self.operand_types.set(state, types)

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        state.print_whitespace(printer)
        _print_signature(printer, self.operand_types.get(op), ())


SIGNATURE = "`:` custom<Signature>(type(operands), type(results))"


def constant_attr(value: float | bool, result_type: TensorType) -> FloatAttr | IntegerAttr:
    """How a splat `coco.constant` stores `value`: f64 for a float element type, else i64."""
    if is_float_type(result_type.element_type):
        return FloatAttr(float(value), f64)
    return IntegerAttr(int(value), i64)


def dense_constant_attr(
    values: Sequence[float | int | bool], shape: Sequence[int], result_type: TensorType
) -> DenseIntOrFPElementsAttr:
    """How a dense `coco.constant` stores its values (row-major, `shape`): as the splat form
    does, f64 for a float element type, else i64; each is rounded to the element type where
    it is used, as a splat is."""
    if is_float_type(result_type.element_type):
        return DenseIntOrFPElementsAttr.from_list(
            BuiltinTensorType(f64, shape), [float(v) for v in values]
        )
    return DenseIntOrFPElementsAttr.from_list(
        BuiltinTensorType(i64, shape), [int(v) for v in values]
    )


def _parse_number(parser: Parser) -> float | int:
    """A literal of `coco.constant`: a number, `true`/`false`, or `inf`, `-inf`, `nan`."""
    negative = parser.parse_optional_punctuation("-") is not None
    number: float | int
    if parser.parse_optional_keyword("inf") is not None:
        number = float("inf")
    elif not negative and parser.parse_optional_keyword("nan") is not None:
        number = float("nan")
    else:
        number = parser.parse_number(allow_boolean=not negative)
    return -number if negative else number


def _parse_nested_literal(parser: Parser) -> tuple[list[float | int], list[int]]:
    """`[[1.0, 2.0], [3.0, 4.0]]`: the values in row-major order and the nesting's shape
    (every sublist of one level has the same length, else a parse error)."""
    pos = parser.pos
    items = parser.parse_optional_comma_separated_list(
        parser.Delimiter.SQUARE, lambda: _parse_nested_literal(parser)
    )
    if items is None:
        return [_parse_number(parser)], []
    inner = [shape for _, shape in items]
    if any(shape != inner[0] for shape in inner):
        parser.raise_error("a dense literal's rows must all have the same shape", pos)
    values = [v for vs, _ in items for v in vs]
    return values, [len(items), *(inner[0] if inner else [])]


@irdl_custom_directive
class ConstantValue(CustomDirective):
    """`0.9 : !coco.tensor<f32>` (a splat) or `dense<[1.0, 2.0]> : !coco.tensor<2xf32>` (one
    value per element, nested by dims): literals read against the result type that follows
    (a float element type stores them as f64, an integer one as i64, and an integer type
    refuses a float literal), so literal and type are one directive. `inf`, `-inf` and `nan`
    spell the non-finite values."""

    value: AttributeVariable
    result_type: TypeDirective

    def parse(self, parser: Parser, state: ParsingState) -> None:
        number_pos = parser.pos
        dense = parser.parse_optional_keyword("dense") is not None
        numbers: list[float | int]
        shape: list[int] = []
        if dense:
            parser.parse_punctuation("<")
            literal_pos = parser.pos
            numbers, shape = _parse_nested_literal(parser)
            if not shape:
                parser.raise_error(
                    "a dense literal lists every element in brackets (one value for every "
                    "element is a splat: `coco.constant 1.0 : T`)",
                    literal_pos,
                )
            parser.parse_punctuation(">")
        else:
            numbers = [_parse_number(parser)]
        parser.parse_punctuation(":")
        type_pos = parser.pos
        result_type = parser.parse_type()
        if not isinstance(result_type, TensorType):
            parser.raise_error(
                f"coco.constant needs a !coco.tensor type, got {result_type}", type_pos
            )
        for number in numbers:
            if isinstance(number, float) and not is_float_type(result_type.element_type):
                # int() would silently truncate the literal
                parser.raise_error(
                    f"coco.constant of element type {result_type.elt} needs an integer "
                    f"literal, got {number}",
                    number_pos,
                )
        attr = (
            dense_constant_attr(numbers, shape, result_type)
            if dense
            else constant_attr(numbers[0], result_type)
        )
        self.value.set(state, attr)
        self.result_type.set(state, (result_type,))

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        state.print_whitespace(printer)
        attr = self.value.get(op)
        if isinstance(attr, DenseIntOrFPElementsAttr):
            values = attr.get_values()
            text = f"dense<{_nested_text([_literal_text(v) for v in values], attr.get_shape())}>"
        else:
            assert isinstance(attr, FloatAttr | IntegerAttr)
            text = _literal_text(attr.value.data)
        printer.print_string(f"{text} : ")
        printer.print_list(self.result_type.get(op), printer.print_attribute)


def _literal_text(number: float | int) -> str:
    return float_literal(number) if isinstance(number, float) else str(number)


def _nested_text(items: Sequence[str], shape: Sequence[int]) -> str:
    """Row-major `items` nested by `shape`: `[[a, b], [c, d]]`."""
    if not shape:
        return items[0]
    step = len(items) // shape[0] if shape[0] else 0
    rows = [_nested_text(items[k * step : (k + 1) * step], shape[1:]) for k in range(shape[0])]
    return "[" + ", ".join(rows) + "]"


# -- effects -----------------------------------------------------------------------------------


class WritesTarget(MemoryEffect):
    """`coco.update`'s effect: it writes the caller's buffer behind its target operand. The
    one side effect of a coco program, so xDSL's `dce`, `canonicalize` and `cse` keep updates
    (and what they store) and erase everything else nobody reads."""

    @classmethod
    def get_effects(cls, op: Operation) -> AbstractSet[EffectInstance]:
        return frozenset((EffectInstance(MemoryEffectKind.WRITE, op.operands[0]),))


# -- ops ---------------------------------------------------------------------------------------


class CocoOp(IRDLOperation):
    """Shared verification for every coco/comm op: types fit the grid, results follow rules."""

    custom_directives = (Signature, OperandSignature, ConstantValue)

    def verify_(self) -> None:
        layout_rules.check_types_fit_grid(self)
        self.verify_layouts()

    def verify_layouts(self) -> None:
        """Check the result types against the layout rules (overridden per op)."""

    def expect_result(self, inferred: TensorType) -> None:
        layout_rules.expect_result_type(self, self.results[0].type, inferred)


class ElementwiseOp(CocoOp):
    """Marker base of ops that act element by element (reorder and fuse rely on it)."""


class Numerics(StrEnum):
    """How a transcendental op computes (docs/architecture.md §3.4.2): `exact` in f64, rounded
    once (bit-identical on every target), `fast` in f32 with each target's f32 functions."""

    EXACT = auto()
    FAST = auto()


@irdl_attr_definition
class NumericsAttr(EnumAttribute[Numerics], SpacedOpaqueSyntaxAttribute):
    """A numerics policy: `numerics fast` on an op, `#coco<numerics fast>` in generic form and
    as a function's or module's `coco.numerics` default."""

    name = "coco.numerics"


# An op's own policy, between its operands and its attributes: `coco.exp %x numerics fast : T`.
NUMERICS = "(`numerics` $numerics^)?"


class BinaryOp(ElementwiseOp):
    lhs = tensor_operand()
    rhs = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$lhs `,` $rhs attr-dict {SIGNATURE}"

    def __init__(self, lhs: SSAValue, rhs: SSAValue, result_type: Attribute | None = None):
        if result_type is None:
            result_type = layout_rules.infer_elementwise([lhs.type, rhs.type])
        super().__init__(operands=[lhs, rhs], result_types=[result_type])

    def verify_layouts(self) -> None:
        inferred = layout_rules.infer_elementwise(
            [self.lhs.type, self.rhs.type],
            names=[layout_rules.value_name(self.lhs), layout_rules.value_name(self.rhs)],
        )
        layout_rules.check_not_boolean(inferred, self.name)
        self.expect_result(inferred)


@irdl_op_definition
class AddOp(BinaryOp):
    name = "coco.add"


@irdl_op_definition
class SubOp(BinaryOp):
    name = "coco.sub"


@irdl_op_definition
class MulOp(BinaryOp):
    name = "coco.mul"


@irdl_op_definition
class DivOp(BinaryOp):
    name = "coco.div"


@irdl_op_definition
class MaxOp(BinaryOp):
    name = "coco.max"


@irdl_op_definition
class MinOp(BinaryOp):
    name = "coco.min"


@irdl_op_definition
class PowOp(BinaryOp):
    name = "coco.pow"
    numerics = opt_prop_def(NumericsAttr)

    assembly_format = f"$lhs `,` $rhs {NUMERICS} attr-dict {SIGNATURE}"

    def __init__(
        self,
        lhs: SSAValue,
        rhs: SSAValue,
        result_type: Attribute | None = None,
        numerics: str | Numerics | None = None,
    ):
        super().__init__(lhs, rhs, result_type)
        set_numerics(self, numerics)


class UnaryOp(ElementwiseOp):
    input = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())
    FLOAT_ONLY: ClassVar[bool] = True

    assembly_format = f"$input attr-dict {SIGNATURE}"

    def __init__(self, input: SSAValue, result_type: Attribute | None = None):
        super().__init__(operands=[input], result_types=[result_type or input.type])

    def verify_layouts(self) -> None:
        self.expect_result(layout_rules.infer_unary(self.input.type, self.FLOAT_ONLY, self.name))


class PolicyUnaryOp(UnaryOp):
    """A unary op a numerics policy applies to (`numerics_of`): the transcendentals and rsqrt."""

    numerics = opt_prop_def(NumericsAttr)

    assembly_format = f"$input {NUMERICS} attr-dict {SIGNATURE}"

    def __init__(
        self,
        input: SSAValue,
        result_type: Attribute | None = None,
        numerics: str | Numerics | None = None,
    ):
        super().__init__(input, result_type)
        set_numerics(self, numerics)


def set_numerics(op: PowOp | PolicyUnaryOp, numerics: str | Numerics | None) -> None:
    """Give `op` its own numerics policy (None: none, it takes its function's or module's);
    a ValueError names the policies for an unknown one."""
    if numerics is not None:
        op.numerics = NumericsAttr(enum_member(Numerics, numerics, "numerics policy"))


def set_numerics_default(op: Operation, numerics: str | Numerics) -> None:
    """Make `numerics` the policy of the ops inside `op` (a module or function) that name none
    of their own: its `coco.numerics`. A ValueError names the policies for an unknown one."""
    policy = enum_member(Numerics, numerics, "numerics policy")
    op.attributes[NUMERICS_ATTR_NAME] = NumericsAttr(policy)


# The ops whose numerics a policy chooses.
NUMERICS_OPS: tuple[type[Operation], ...] = (PowOp, PolicyUnaryOp)


def numerics_of(op: Operation) -> Numerics:
    """The policy `op` computes under: its own `numerics`, else the `coco.numerics` of the
    closest op around it that has one (its function, then its module), else `exact`; `exact`
    for ops no policy applies to."""
    if not isinstance(op, NUMERICS_OPS):
        return Numerics.EXACT
    own = op.properties.get("numerics")
    if isinstance(own, NumericsAttr):
        return own.data
    parent = op.parent_op()
    while parent is not None:
        default = parent.attributes.get(NUMERICS_ATTR_NAME)
        if isinstance(default, NumericsAttr):
            return default.data
        parent = parent.parent_op()
    return Numerics.EXACT


def is_fast(op: Operation) -> bool:
    """Whether `op` computes under the `fast` policy (`numerics_of`)."""
    return numerics_of(op) == Numerics.FAST


@irdl_op_definition
class NegOp(UnaryOp):
    name = "coco.neg"
    FLOAT_ONLY: ClassVar[bool] = False


@irdl_op_definition
class AbsOp(UnaryOp):
    name = "coco.abs"
    FLOAT_ONLY: ClassVar[bool] = False


@irdl_op_definition
class SqrtOp(UnaryOp):
    name = "coco.sqrt"


@irdl_op_definition
class RsqrtOp(PolicyUnaryOp):
    name = "coco.rsqrt"


@irdl_op_definition
class ExpOp(PolicyUnaryOp):
    name = "coco.exp"


@irdl_op_definition
class LogOp(PolicyUnaryOp):
    name = "coco.log"


@irdl_op_definition
class TanhOp(PolicyUnaryOp):
    name = "coco.tanh"


@irdl_op_definition
class ReluOp(UnaryOp):
    name = "coco.relu"
    FLOAT_ONLY: ClassVar[bool] = False


@irdl_op_definition
class GeluOp(PolicyUnaryOp):
    """tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    name = "coco.gelu"


@irdl_op_definition
class SigmoidOp(PolicyUnaryOp):
    name = "coco.sigmoid"


class CmpPredicate(StrEnum):
    EQ = auto()
    NE = auto()
    LT = auto()
    LE = auto()
    GT = auto()
    GE = auto()


@irdl_attr_definition
class CmpPredicateAttr(EnumAttribute[CmpPredicate], SpacedOpaqueSyntaxAttribute):
    """The comparison of a `coco.cmp` (`#coco<cmp_predicate gt>` in generic form)."""

    name = "coco.cmp_predicate"


def enum_member(enum: type[_EnumT], value: str, what: str) -> _EnumT:
    """`value` as a member of `enum`, or a ValueError listing the members."""
    try:
        return enum(value)
    except ValueError:
        raise ValueError(
            f"unknown {what} {value!r}: use " + ", ".join(m.value for m in enum)
        ) from None


@irdl_op_definition
class CmpOp(ElementwiseOp):
    """`coco.cmp gt %a, %b : ...`: elementwise comparison, i1 result."""

    name = "coco.cmp"
    predicate = prop_def(CmpPredicateAttr)
    lhs = tensor_operand()
    rhs = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$predicate $lhs `,` $rhs attr-dict {SIGNATURE}"

    def __init__(
        self,
        predicate: str | CmpPredicate,
        lhs: SSAValue,
        rhs: SSAValue,
        result_type: Attribute | None = None,
    ):
        predicate = enum_member(CmpPredicate, predicate, "comparison")
        if result_type is None:
            result_type = layout_rules.infer_compare(lhs.type, rhs.type)
        super().__init__(
            operands=[lhs, rhs],
            result_types=[result_type],
            properties={"predicate": CmpPredicateAttr(predicate)},
        )

    def verify_layouts(self) -> None:
        self.expect_result(
            layout_rules.infer_compare(
                self.lhs.type,
                self.rhs.type,
                names=[layout_rules.value_name(self.lhs), layout_rules.value_name(self.rhs)],
            )
        )


@irdl_op_definition
class SelectOp(ElementwiseOp):
    """`coco.select %cond, %a, %b`: elementwise `cond ? a : b` (CoCoNet's Ite)."""

    name = "coco.select"
    cond = tensor_operand()
    true_value = tensor_operand()
    false_value = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$cond `,` $true_value `,` $false_value attr-dict {SIGNATURE}"

    def __init__(
        self, cond: SSAValue, a: SSAValue, b: SSAValue, result_type: Attribute | None = None
    ):
        if result_type is None:
            result_type = layout_rules.infer_select(cond.type, a.type, b.type)
        super().__init__(operands=[cond, a, b], result_types=[result_type])

    def verify_layouts(self) -> None:
        self.expect_result(
            layout_rules.infer_select(
                self.cond.type,
                self.true_value.type,
                self.false_value.type,
                names=[layout_rules.value_name(v) for v in self.operands],
            )
        )


@irdl_op_definition
class CastOp(ElementwiseOp):
    """`coco.cast %x : T1 -> T2`: element type conversion (round to nearest even)."""

    name = "coco.cast"
    input = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$input attr-dict {SIGNATURE}"

    def __init__(self, input: SSAValue, result_type: Attribute):
        if not isinstance(result_type, TensorType) and isinstance(input.type, TensorType):
            result_type = input.type.with_element_type(result_type)
        super().__init__(operands=[input], result_types=[result_type])

    def verify_layouts(self) -> None:
        res = self.result.type
        self.expect_result(self.input.type.with_element_type(res.element_type))


class ScaleOp(ElementwiseOp):
    """An elementwise op of a tensor and its scale, whose shape states the granularity: it
    broadcasts against the tensor like any elementwise operand (a scalar per tensor, `[R, 1]`
    per row, `[1, C]` per column, the tensor's own shape per element), or holds one value per
    block (`[R / bR, C / bC]`: scale element (i // bR, j // bC) scales element (i, j); a scale
    dim neither 1 nor the tensor's divides it, `[quantize-block]`, and is cut across ranks on
    block boundaries or not at all, `[quantize-block-slices]`). Computes in f32, or in f64
    where any of its types is f64, and rounds once to the result's element type."""

    input = tensor_operand()
    scale = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$input `,` $scale attr-dict {SIGNATURE}"

    def __init__(self, input: SSAValue, scale: SSAValue, result_type: Attribute):
        if not isinstance(result_type, TensorType):
            inferred = layout_rules.infer_scaled(input.type, scale.type, op_name=self.name)
            result_type = inferred.with_element_type(result_type)
        super().__init__(operands=[input, scale], result_types=[result_type])

    def check_element_types(self, input: str, scale: str, result: str) -> None:
        """Refuse element types the op does not convert between (overridden per op)."""

    def verify_layouts(self) -> None:
        types = [tensor_type_of(self.input), tensor_type_of(self.scale)]
        res = tensor_type_of(self.result)
        self.check_element_types(types[0].elt, types[1].elt, res.elt)
        inferred = layout_rules.infer_scaled(
            types[0],
            types[1],
            op_name=self.name,
            names=[layout_rules.value_name(self.input), layout_rules.value_name(self.scale)],
            grid=layout_rules.grid_of(self),
        )
        self.expect_result(inferred.with_element_type(res.element_type))


def _quantize_types(op: str, want: str, got: str) -> VerifyException:
    return VerifyException(f"[quantize-types] {op}: {want}, got {got}")


@irdl_op_definition
class QuantizeOp(ScaleOp):
    """`coco.quantize %x, %scale : T, S -> Q`: `x / scale` rounded to the fp8 type of Q,
    saturating: what lies beyond its largest finite value (inf included) becomes that value,
    with its sign; NaN stays NaN (the OCP FP8 spec's saturating conversion). `scale` is the
    dequantization scale of MLIR's quant dialect: the value a code of 1 stands for."""

    name = "coco.quantize"

    def check_element_types(self, input: str, scale: str, result: str) -> None:
        if result not in FP8_TYPE_NAMES:
            raise _quantize_types(self.name, "the result is an fp8 type", result)
        if not is_float_name(input) or not is_float_name(scale):
            raise _quantize_types(
                self.name, "the input and the scale are floats", f"{input} and {scale}"
            )


@irdl_op_definition
class DequantizeOp(ScaleOp):
    """`coco.dequantize %q, %scale : Q, S -> T`: the fp8 values of `q` times `scale`, rounded
    to the float type of T (the inverse of coco.quantize up to its rounding)."""

    name = "coco.dequantize"

    def check_element_types(self, input: str, scale: str, result: str) -> None:
        if input not in FP8_TYPE_NAMES:
            raise _quantize_types(self.name, "the input is an fp8 type", input)
        if not is_float_name(scale) or not is_float_name(result):
            raise _quantize_types(
                self.name, "the scale and the result are floats", f"{scale} and {result}"
            )


@irdl_op_definition
class ConstantOp(CocoOp):
    """`coco.constant 0.9 : !coco.tensor<f32>`: a splat value; `coco.constant dense<[1.0, 2.0]>
    : !coco.tensor<2xf32>`: one value per element (row-major, nested by dims). Either is the
    same on every rank, and each value is rounded to the element type where it is used."""

    name = "coco.constant"
    value = prop_def(base(FloatAttr) | base(IntegerAttr) | base(DenseIntOrFPElementsAttr))
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = "custom<ConstantValue>($value, type($result)) attr-dict"

    def __init__(
        self, value: float | bool | DenseIntOrFPElementsAttr, result_type: TensorType
    ) -> None:
        attr = (
            value
            if isinstance(value, DenseIntOrFPElementsAttr)
            else constant_attr(value, result_type)
        )
        super().__init__(result_types=[result_type], properties={"value": attr})

    @staticmethod
    def dense(values: Sequence[float | int | bool], result_type: TensorType) -> ConstantOp:
        """A dense constant of `result_type` holding `values` (row-major, one per element)."""
        return ConstantOp(
            dense_constant_attr(values, result_type.get_shape(), result_type), result_type
        )

    @property
    def is_dense(self) -> bool:
        return isinstance(self.value, DenseIntOrFPElementsAttr)

    @property
    def number(self) -> float | int:
        """A splat's value."""
        assert isinstance(self.value, FloatAttr | IntegerAttr), "a dense constant has values"
        return self.value.value.data

    def values(self) -> tuple[float | int, ...]:
        """Every element's value, row-major (a splat's repeated)."""
        if isinstance(self.value, DenseIntOrFPElementsAttr):
            # float or integer values: the verifier refuses any other element type
            return cast("tuple[float | int, ...]", self.value.get_values())
        count = 1
        for n in self.result.type.get_shape():
            count *= n
        return (self.number,) * count

    def verify_layouts(self) -> None:
        res = self.result.type
        if not res.is_replicated():
            raise VerifyException(
                f"[constant-replicated] a constant is the same on every rank, so its type "
                f"must be replicated, not {res.layout_text()}"
            )
        attr = self.value
        if isinstance(attr, DenseIntOrFPElementsAttr):
            shape = attr.get_shape()
            if tuple(shape) != tuple(res.get_shape()):
                raise VerifyException(
                    f"[constant-shape] dense constant of shape {list(shape)} does not match "
                    f"the result shape {list(res.get_shape())}"
                )
            stored = attr.get_element_type()
            if (not isinstance(stored, IntegerType) and not is_float_type(stored)) or (
                is_float_type(res.element_type) != is_float_type(stored)
            ):
                raise VerifyException(
                    f"[constant-type] dense constant of {attr.get_element_type()} values "
                    f"does not match element type {res.elt}"
                )
            numbers: Sequence[float | int] = self.values()
        else:
            if is_float_type(res.element_type) != isinstance(attr, FloatAttr):
                raise VerifyException(
                    f"[constant-type] constant {self.number} does not match element type {res.elt}"
                )
            numbers = (self.number,)
        if isinstance(elt := res.element_type, IntegerType):
            width = elt.bitwidth
            low, high = (0, 1) if width == 1 else (-(2 ** (width - 1)), 2**width - 1)
            for number in numbers:
                if not low <= number <= high:
                    raise VerifyException(
                        f"[constant-type] constant {number} does not fit element type {res.elt}"
                    )


@irdl_op_definition
class DropoutOp(ElementwiseOp):
    """`coco.dropout %x, 1.000000e-01 seed 7 : T`: zero elements with probability p, scale by
    1/(1-p).

    Element i of the logical tensor is kept iff `(h >> 40) >= ceil(p * 2^24)` where
    `h = counter_hash(seed, global flat index of i, stream)` (core/counter_rng.py) and
    `stream` is the rank's coordinate on the axes where x is `local` (0 otherwise). Because
    the key is the global index, a sliced or fused schedule draws the unscheduled masks.
    """

    name = "coco.dropout"
    input = tensor_operand()
    prob = prop_def(FloatAttr[Float64Type])
    seed = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$input `,` $prob `seed` $seed attr-dict {SIGNATURE}"

    def __init__(
        self, input: SSAValue, prob: float, seed: int, result_type: Attribute | None = None
    ):
        super().__init__(
            operands=[input],
            result_types=[result_type or input.type],
            properties={"prob": FloatAttr(float(prob), f64), "seed": IntegerAttr(seed, i64)},
        )

    def verify_layouts(self) -> None:
        p = self.prob.value.data
        if not 0.0 <= p < 1.0:
            raise VerifyException(
                f"[dropout-probability] dropout probability must be in [0, 1), got {p}"
            )
        self.expect_result(layout_rules.infer_unary(self.input.type, True, self.name))


@irdl_op_definition
class MatmulOp(CocoOp):
    """`coco.matmul %a, %b`: [..., M, K] x [K, N] (or batched [..., K, N]) -> [..., M, N]."""

    name = "coco.matmul"
    lhs = tensor_operand()
    rhs = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$lhs `,` $rhs attr-dict {SIGNATURE}"

    def __init__(self, lhs: SSAValue, rhs: SSAValue, result_type: Attribute | None = None):
        if result_type is None:
            result_type = layout_rules.infer_matmul(lhs.type, rhs.type)
        super().__init__(operands=[lhs, rhs], result_types=[result_type])

    def verify_layouts(self) -> None:
        self.expect_result(layout_rules.infer_matmul(self.lhs.type, self.rhs.type))


@irdl_attr_definition
class ReductionKindAttr(ReductionsOf, EnumAttribute[Reduction], SpacedOpaqueSyntaxAttribute):
    """The reduction of a `coco.reduce` (`#coco<reduction_kind sum>` in generic form)."""

    name = "coco.reduction_kind"
    kinds = FULL


@irdl_op_definition
class ReduceOp(CocoOp):
    """`coco.reduce sum %x : T -> !coco.tensor<f32>`: a full reduction to a scalar.

    `norm` is the L2 norm. Over a sliced tensor sum/max/min give this rank's partial result
    (a `local` scalar that an all_reduce combines); a norm of a slice is refused, since
    partial norms do not combine by any collective: write sqrt(all_reduce(sum(x*x))).
    """

    name = "coco.reduce"
    kind = prop_def(ReductionKindAttr)
    input = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$kind $input attr-dict {SIGNATURE}"

    def __init__(self, kind: str, input: SSAValue, result_type: Attribute | None = None):
        kind = reduction(kind, FULL, "reduction")
        if result_type is None:
            result_type = layout_rules.infer_reduction(kind, input.type)
        super().__init__(
            operands=[input],
            result_types=[result_type],
            properties={"kind": ReductionKindAttr(kind)},
        )

    def verify_layouts(self) -> None:
        self.expect_result(layout_rules.infer_reduction(self.kind.data, self.input.type))


@irdl_attr_definition
class DimReductionKindAttr(ReductionsOf, EnumAttribute[Reduction], SpacedOpaqueSyntaxAttribute):
    """The reduction of a `coco.reduce_dims` (`#coco<dim_reduction_kind mean>` generic)."""

    name = "coco.dim_reduction_kind"
    kinds = DIMS


# Row reductions accumulate each result element in this many lanes: lane l takes the reduced
# elements l, l + ROW_LANES, ... in order (f64 / int64), then the lanes combine in lane order.
# A fixed order, so the oracle and every kernel (one block per row, a lane per thread) agree
# bit for bit whatever the block size.
ROW_LANES = 32


@irdl_op_definition
class ReduceDimsOp(CocoOp):
    """`coco.reduce_dims mean %x dims [1] keepdims : T -> T2`: a reduction over some dims.

    `dims` is a non-empty, increasing run of consecutive dims (the rows of a row-major
    tensor, or its columns, or a middle run); with `keepdims` they stay as dims of size 1,
    so the result broadcasts back against `x` in any elementwise op (NumPy's rules, as
    `coco.add` already broadcasts), which is how LayerNorm, RMSNorm and softmax are written.
    Each result element accumulates in f64 (int64) in the fixed order of `ROW_LANES` and
    rounds once; `mean` divides the f64 sum by the reduced count before that rounding.

    Layouts ([reduce-dims-layouts]): a dim sliced by a grid axis and not reduced stays
    sliced (each rank reduces whole rows of its slice); a sliced dim that is reduced gives
    this rank's partial result (`local`), which an all_reduce of the same kind combines;
    a partial mean is refused, since a mean of a slice is not a partial of the mean.
    """

    name = "coco.reduce_dims"
    kind = prop_def(DimReductionKindAttr)
    input = tensor_operand()
    dims = prop_def(DenseArrayBase[I64])
    keepdims = opt_prop_def(UnitAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$kind $input `dims` $dims (`keepdims` $keepdims^)? attr-dict {SIGNATURE}"

    def __init__(
        self,
        kind: str,
        input: SSAValue,
        dims: Sequence[int],
        keepdims: bool = False,
        result_type: Attribute | None = None,
    ):
        kind = reduction(kind, DIMS, "reduction")
        if result_type is None:
            result_type = layout_rules.infer_dim_reduction(kind, input.type, dims, keepdims)
        properties: dict[str, Attribute] = {
            "kind": DimReductionKindAttr(kind),
            "dims": DenseArrayBase.from_list(i64, list(dims)),
        }
        if keepdims:
            properties["keepdims"] = UnitAttr()
        super().__init__(operands=[input], result_types=[result_type], properties=properties)

    @property
    def reduced_dims(self) -> tuple[int, ...]:
        return tuple(self.dims.get_values())

    @property
    def keeps_dims(self) -> bool:
        return self.keepdims is not None

    def verify_layouts(self) -> None:
        self.expect_result(
            layout_rules.infer_dim_reduction(
                self.kind.data,
                self.input.type,
                self.reduced_dims,
                self.keeps_dims,
                name=layout_rules.value_name(self.input),
            )
        )


@irdl_op_definition
class ReshapeOp(CocoOp):
    """`coco.reshape %x : !coco.tensor<8x64xf32> -> !coco.tensor<8x4x16xf32>`: the same
    elements in row-major order under another shape (no data moves).

    [reshape-layouts]: a tensor sliced on dim d keeps dims 0..d (sizes and positions), so
    each rank's piece is the same run of elements before and after; the dims after d may
    regroup freely. Local and replicated axes keep their layouts.
    """

    name = "coco.reshape"
    input = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = f"$input attr-dict {SIGNATURE}"

    def __init__(self, input: SSAValue, result_type: Attribute):
        super().__init__(operands=[input], result_types=[result_type])

    def verify_layouts(self) -> None:
        layout_rules.check_reshape(self, self.input.type, self.result.type)


class SliceCanonicalization(HasCanonicalizationPatternsTrait):
    """A slice that moves no data folds (`FoldRoundTrip`): xDSL's `canonicalize` applies it,
    coco-canonicalize too."""

    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return (FoldRoundTrip(),)


@irdl_op_definition
class SliceOp(CocoOp):
    """`coco.slice %x : replicated -> sliced<d>`: this rank's part, no communication.

    CoCoNet's Scatter: along every axis where the result is sliced and the input replicated,
    the rank keeps its contiguous part; every other axis keeps its layout.
    """

    name = "coco.slice"
    input = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure(), SliceCanonicalization())

    assembly_format = f"$input attr-dict {SIGNATURE}"

    def __init__(self, input: SSAValue, result_type: TensorType):
        super().__init__(operands=[input], result_types=[result_type])

    def verify_layouts(self) -> None:
        layout_rules.check_slice(self, self.input.type, self.result.type)


@irdl_op_definition
class UpdateOp(CocoOp):
    """`coco.update %target, %value : T`: store `value` into the caller's buffer `target`.

    The program's side effects (`WritesTarget`). `target` is an argument of the enclosing
    function, updated at most once, and read by no op after its update (so SSA order is
    execution order).
    """

    name = "coco.update"
    target = tensor_operand()
    value = tensor_operand()
    traits = traits_def(WritesTarget())

    assembly_format = "$target `,` $value attr-dict `:` custom<OperandSignature>(type(operands))"

    def __init__(self, target: SSAValue, value: SSAValue):
        super().__init__(operands=[target, value])

    def verify_layouts(self) -> None:
        layout_rules.check_update(self)


BINARY_OPS: tuple[type[BinaryOp], ...] = (AddOp, SubOp, MulOp, DivOp, MaxOp, MinOp, PowOp)
UNARY_OPS: tuple[type[UnaryOp], ...] = (
    NegOp, AbsOp, SqrtOp, RsqrtOp, ExpOp, LogOp, TanhOp, ReluOp, GeluOp, SigmoidOp,
)  # fmt: skip

# --------------------------------------------------------------------------------------------
# Folds the ops publish (their canonicalization traits; comm.py has the collectives')
# --------------------------------------------------------------------------------------------


def readable_at(v: SSAValue, user: Operation) -> bool:
    """Whether `user` may read `v`: not when `v` is an argument `user` would read after the
    argument's `coco.update` (the buffer is overwritten then; see update-last-use). A region's
    terminator (`comm.yield`, by name: comm.py imports this module) hands what it reads to
    the region's results: their readers must be able to read `v` too (a fold inside a fused
    region whose result is returned after the argument's update, from a region of its own)."""
    if not isinstance(v, BlockArgument):
        return True
    if any(
        isinstance(use.operation, UpdateOp)
        and use.index == 0
        and layout_rules.runs_after(user, use.operation)
        for use in v.uses
    ):
        return False
    region_op = user.parent_op() if user.name == "comm.yield" else None
    return region_op is None or all(
        readable_at(v, use.operation) for r in region_op.results for use in r.uses
    )


def slice_round_trip(op: SliceOp) -> SSAValue | None:
    """The value a slice that moves no data equals: its input where it cuts nothing, `y` for
    `coco.slice (comm.all_gather %y)` of `y`'s type (the all_gather by name: comm.py imports
    this module)."""
    if op.input.type == op.result.type:
        return op.input
    src = op.input.owner
    if isinstance(src, Operation) and src.name == "comm.all_gather":
        y = src.operands[0]
        if y.type == op.result.type:
            return y
    return None


# The round trips of the collectives (comm.py), by op name: so this module's pattern folds
# all of them without importing comm.
ROUND_TRIPS: dict[str, Callable[[Operation], SSAValue | None]] = {
    "coco.slice": lambda op: slice_round_trip(op) if isinstance(op, SliceOp) else None
}


def round_trip(op: Operation) -> SSAValue | None:
    """The value `op` equals if it is a layout round trip that moves no data (ROUND_TRIPS)
    and every reader of it may read that value where it stands (not an argument after its
    update)."""
    fold = ROUND_TRIPS.get(op.name)
    value = fold(op) if fold is not None else None
    if value is None or not all(readable_at(value, u.operation) for u in op.results[0].uses):
        return None
    return value


class FoldRoundTrip(RewritePattern):
    """Replace a slice, all_gather or all_to_all that moves no data by the value it equals
    (`round_trip`), and erase its producer once nothing reads it."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        value = round_trip(op)
        if value is None:
            return
        producer = op.operands[0].owner
        # `replace` names an unnamed `value` after the folded op, keeping the program's names
        rewriter.replace(op, [], [value])
        if isinstance(producer, Operation) and is_trivially_dead(producer):
            rewriter.erase(producer)


Coco = Dialect(
    "coco",
    [
        *BINARY_OPS,
        *UNARY_OPS,
        CmpOp,
        SelectOp,
        CastOp,
        QuantizeOp,
        DequantizeOp,
        ConstantOp,
        DropoutOp,
        MatmulOp,
        ReduceOp,
        ReduceDimsOp,
        ReshapeOp,
        SliceOp,
        UpdateOp,
    ],
    [
        ReplicatedAttr,
        LocalAttr,
        SlicedAttr,
        GridAttr,
        TensorType,
        CmpPredicateAttr,
        NumericsAttr,
        ReductionKindAttr,
        DimReductionKindAttr,
    ],
)
