"""The `comm` dialect: collectives and point-to-point transfers over process-grid axes, and
the schedule regions (fused, overlapped) that transformations build around them.

A collective spans the grid axes named by `over [..]` (all axes when omitted): the ranks that
share their coordinates on every other axis form one group, as in MLIR's `shard` dialect. On a
`[stages, ranks]` grid, `over [1]` is a collective inside each stage.

Reductions combine in rank order, accumulating in f64 (int64 for integers) and rounding once
to the element type; real collectives (NCCL rings) reorder this sum, which translation
validation allows for with a per-dtype tolerance.

Layout rules (per spanned axis; other axes keep their layout):

* all-reduce-input      local | replicated -> replicated (a sliced input is refused)
* reduce-scatter-input  local | replicated -> sliced<dim>
* all-gather-input      sliced<d> -> replicated
* broadcast-input       local | replicated -> replicated (root's value)
* reduce-input          local | replicated -> local (root holds the result, the other ranks
                        keep their input unchanged, as NCCL's in-place reduce leaves them)
* send                  any -> local along the shifted axis: rank c receives what rank
                        c - shift sent; ranks with no sender receive zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import auto
from typing import ClassVar

from coconet.dialects.coco import (
    DYNAMIC,
    LOCAL,
    REPLICATED,
    CocoOp,
    LayoutAttr,
    SlicedAttr,
    TensorType,
    layout_str,
    parse_operands,
    parse_signature,
    print_signature,
)
from xdsl.dialects.builtin import ArrayAttr, IntAttr, IntegerAttr, StringAttr, i64
from xdsl.ir import Attribute, Dialect, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.rewriter import Rewriter
from xdsl.traits import HasParent, IsTerminator, Pure
from xdsl.utils.exceptions import ParseError, VerifyException
from xdsl.utils.str_enum import StrEnum


class CollectiveKind(StrEnum):
    SUM = auto()
    PROD = auto()
    MAX = auto()
    MIN = auto()


def _fail(rule: str, message: str) -> VerifyException:
    return VerifyException(f"[{rule}] {message}")


def _describe(v: SSAValue) -> str:
    """`%name : T` (or just `T` for an unnamed value), for messages."""
    return f"%{v.name_hint} : {v.type}" if v.name_hint else str(v.type)


class CollectiveOp(CocoOp):
    """Base of the collectives: an input, a result, the spanned axes (`over`)."""

    input = operand_def(TensorType)
    result = result_def(TensorType)
    axes = opt_prop_def(ArrayAttr[IntAttr])
    traits = traits_def(Pure())

    HAS_KIND: ClassVar[bool] = False
    HAS_ROOT: ClassVar[bool] = False

    def span(self) -> tuple[int, ...]:
        """The grid axes this collective spans."""
        from coconet.dialects.layout_rules import grid_of

        if self.axes is not None:
            return tuple(a.data for a in self.axes)
        # An op built before it sits in a function sees the default 1-D grid: span every
        # axis its input's type names, so a builder infers the same type the verifier does.
        return tuple(range(max(grid_of(self).rank, len(self.input.type.layouts))))

    def check_axes(self) -> None:
        from coconet.dialects.layout_rules import grid_of

        grid = grid_of(self)
        if self.axes is None:
            return
        seen = [a.data for a in self.axes]
        if not seen or len(set(seen)) != len(seen) or any(not 0 <= a < grid.rank for a in seen):
            raise _fail(
                "collective-axes",
                f"{self.name} spans axes {seen}, which are not distinct axes of the grid {grid}",
            )

    def infer(self) -> TensorType:
        t: TensorType = self.input.type
        span = self.span()
        from coconet.dialects.layout_rules import grid_of

        rank = max(grid_of(self).rank, len(t.layouts))
        out = [
            self.axis_rule(a, t.layout_on(a)) if a in span else t.layout_on(a) for a in range(rank)
        ]
        return t.with_layouts(out)

    def axis_rule(self, axis: int, layout: LayoutAttr) -> LayoutAttr:
        raise NotImplementedError

    def _set_inferred_result_type(self) -> None:
        """For constructors: results are built with a placeholder type (inference needs the
        op), and an OpResult's type cannot be assigned, so swap in a result of the right type."""
        Rewriter.replace_value_with_new_type(self.results[0], self.infer())

    def verify_layouts(self) -> None:
        from coconet.dialects.layout_rules import check_innermost_slicing

        self.check_axes()
        inferred = self.infer()
        self.expect_result(inferred)
        # Gathering or scattering a dim that several axes cut must act on the innermost ones.
        if isinstance(self, AllGatherOp):
            check_innermost_slicing(self, self.input.type, self.span())
        elif isinstance(self, ReduceScatterOp):
            check_innermost_slicing(self, inferred, self.span())

    # -- syntax: comm.OP [KIND] %x [root N] [over [..]] {attrs} : T -> T ---------------------

    def print(self, printer: Printer) -> None:
        if self.HAS_KIND:
            printer.print_string(f" {self.kind.data}")
        printer.print_string(" ")
        printer.print_operand(self.input)
        self.print_extra(printer)
        if self.axes is not None:
            printer.print_string(" over [" + ", ".join(str(a.data) for a in self.axes) + "]")
        printer.print_op_attributes(self.attributes)
        print_signature(printer, [self.input.type], [self.result.type])

    def print_extra(self, printer: Printer) -> None:
        if self.HAS_ROOT:
            printer.print_string(f" root {self.root.value.data}")

    @classmethod
    def parse(cls, parser: Parser):
        props: dict[str, Attribute] = {}
        if cls.HAS_KIND:
            props["kind"] = StringAttr(parser.parse_str_enum(CollectiveKind).value)
        (x,) = parse_operands(parser, 1)
        props |= cls.parse_extra(parser)
        if parser.parse_optional_keyword("over"):
            axes = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE,
                lambda: IntAttr(parser.parse_integer(allow_boolean=False, allow_negative=False)),
            )
            props["axes"] = ArrayAttr(axes)
        attrs = parser.parse_optional_attr_dict()
        (xt,), (res,) = parse_signature(parser, 1, 1)
        op = cls.build(
            operands=[parser.resolve_operand(x, xt)], result_types=[res], properties=props
        )
        op.attributes |= attrs
        return op

    @classmethod
    def parse_extra(cls, parser: Parser) -> dict[str, Attribute]:
        if cls.HAS_ROOT:
            parser.parse_keyword("root")
            return {"root": IntegerAttr(parser.parse_integer(allow_boolean=False), i64)}
        return {}


def _props(kind: str | None, axes: Sequence[int] | None, **extra: Attribute):
    props: dict[str, Attribute] = dict(extra)
    if kind is not None:
        if kind not in {k.value for k in CollectiveKind}:
            raise ValueError(f"unknown reduction kind {kind!r}: use sum, prod, max or min")
        props["kind"] = StringAttr(kind)
    if axes is not None:
        props["axes"] = ArrayAttr(IntAttr(a) for a in axes)
    return props


def _check_root(op: CollectiveOp) -> None:
    from coconet.dialects.layout_rules import grid_of

    root = op.root.value.data
    if root < 0:
        raise _fail("collective-root", f"root {root} is not a rank")
    grid = grid_of(op)
    span = op.span()
    if all(0 <= a < grid.rank and grid.shape[a] != DYNAMIC for a in span):
        size = 1
        for a in span:
            size *= grid.shape[a]
        if root >= size:
            raise _fail(
                "collective-root",
                f"{op.name} with root {root}, but its group on the grid {grid} has only "
                f"{size} rank(s)",
            )


def _check_kind(op: CollectiveOp) -> None:
    if op.kind.data not in {k.value for k in CollectiveKind}:
        raise _fail(
            "collective-kind",
            f"{op.name} has unknown reduction kind '{op.kind.data}': expected one of "
            + ", ".join(k.value for k in CollectiveKind),
        )


@irdl_op_definition
class AllReduceOp(CollectiveOp):
    """`comm.all_reduce sum %g : !coco.tensor<Nxf32, local> -> !coco.tensor<Nxf32>`."""

    name = "comm.all_reduce"
    kind = prop_def(StringAttr)
    HAS_KIND: ClassVar[bool] = True

    def __init__(self, input: SSAValue, kind: str = "sum", axes: Sequence[int] | None = None):
        super().__init__(operands=[input], result_types=[input.type], properties=_props(kind, axes))
        self._set_inferred_result_type()

    def axis_rule(self, axis: int, layout: LayoutAttr) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            raise _fail(
                "all-reduce-input",
                f"all_reduce of {_describe(self.input)}, which is {layout_str(layout)} on grid "
                f"axis {axis}: all_reduce takes local or replicated tensors (all_gather a slice)",
            )
        return REPLICATED

    def verify_layouts(self) -> None:
        _check_kind(self)
        super().verify_layouts()


@irdl_op_definition
class ReduceScatterOp(CollectiveOp):
    """`comm.reduce_scatter sum %g : local -> sliced<d>`: reduce, keep this rank's part."""

    name = "comm.reduce_scatter"
    kind = prop_def(StringAttr)
    HAS_KIND: ClassVar[bool] = True

    def __init__(
        self, input: SSAValue, kind: str = "sum", dim: int = 0, axes: Sequence[int] | None = None
    ):
        super().__init__(operands=[input], result_types=[input.type], properties=_props(kind, axes))
        self._dim = dim
        self._set_inferred_result_type()

    @property
    def dim(self) -> int:
        """The tensor dim the result is sliced on (read off the result type)."""
        for a in self.span():
            lay = self.result.type.layout_on(a)
            if isinstance(lay, SlicedAttr):
                return lay.dim.data
        return getattr(self, "_dim", 0)

    def axis_rule(self, axis: int, layout: LayoutAttr) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            raise _fail(
                "reduce-scatter-input",
                f"reduce_scatter of {_describe(self.input)}, which is already sliced on grid axis "
                f"{axis}: reduce_scatter takes local or replicated tensors",
            )
        return SlicedAttr(self.dim)

    def verify_layouts(self) -> None:
        _check_kind(self)
        super().verify_layouts()


@irdl_op_definition
class AllGatherOp(CollectiveOp):
    """`comm.all_gather %s : sliced<d> -> replicated`."""

    name = "comm.all_gather"

    def __init__(self, input: SSAValue, axes: Sequence[int] | None = None):
        super().__init__(operands=[input], result_types=[input.type], properties=_props(None, axes))
        self._set_inferred_result_type()

    def axis_rule(self, axis: int, layout: LayoutAttr) -> LayoutAttr:
        if not isinstance(layout, SlicedAttr):
            raise _fail(
                "all-gather-input",
                f"all_gather of {_describe(self.input)}, which is {layout_str(layout)} on grid "
                f"axis {axis}: all_gather takes sliced tensors",
            )
        return REPLICATED


@irdl_op_definition
class BroadcastOp(CollectiveOp):
    """`comm.broadcast %x root 0 : local -> replicated`: the root's value on every rank."""

    name = "comm.broadcast"
    root = prop_def(IntegerAttr)
    HAS_ROOT: ClassVar[bool] = True

    def __init__(self, input: SSAValue, root: int = 0, axes: Sequence[int] | None = None):
        super().__init__(
            operands=[input],
            result_types=[input.type],
            properties=_props(None, axes, root=IntegerAttr(root, i64)),
        )
        self._set_inferred_result_type()

    def axis_rule(self, axis: int, layout: LayoutAttr) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            raise _fail(
                "broadcast-input",
                f"broadcast of {_describe(self.input)}, sliced on grid axis {axis}: broadcast "
                "takes local or replicated tensors",
            )
        return REPLICATED

    def verify_layouts(self) -> None:
        _check_root(self)
        super().verify_layouts()


@irdl_op_definition
class ReduceOp(CollectiveOp):
    """`comm.reduce sum %x root 0 : local -> local`: the reduction lands on the root only."""

    name = "comm.reduce"
    kind = prop_def(StringAttr)
    root = prop_def(IntegerAttr)
    HAS_KIND: ClassVar[bool] = True
    HAS_ROOT: ClassVar[bool] = True

    def __init__(
        self, input: SSAValue, kind: str = "sum", root: int = 0, axes: Sequence[int] | None = None
    ):
        super().__init__(
            operands=[input],
            result_types=[input.type],
            properties=_props(kind, axes, root=IntegerAttr(root, i64)),
        )
        self._set_inferred_result_type()

    def axis_rule(self, axis: int, layout: LayoutAttr) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            raise _fail(
                "reduce-input",
                f"reduce of {_describe(self.input)}, sliced on grid axis {axis}: reduce takes "
                "local or replicated tensors",
            )
        return LOCAL

    def verify_layouts(self) -> None:
        _check_kind(self)
        _check_root(self)
        super().verify_layouts()


@irdl_op_definition
class SendOp(CollectiveOp):
    """`comm.send %y along 0 shift 1 : T -> T'`: point-to-point to the rank `shift` further
    along grid axis `along` (CoCoNet's `Send(x, GroupRank(GROUP+1, RANK))`).

    The result is what this rank received: rank c gets the value of rank c - shift; ranks with
    no sender get zeros. It is `local` along the shifted axis (each stage has its own).
    """

    name = "comm.send"
    along = prop_def(IntegerAttr)
    shift = prop_def(IntegerAttr)

    def __init__(self, input: SSAValue, along: int = 0, shift: int = 1):
        super().__init__(
            operands=[input],
            result_types=[input.type],
            properties={"along": IntegerAttr(along, i64), "shift": IntegerAttr(shift, i64)},
        )
        self._set_inferred_result_type()

    def span(self) -> tuple[int, ...]:
        return (self.along.value.data,)

    def check_axes(self) -> None:
        from coconet.dialects.layout_rules import grid_of

        grid = grid_of(self)
        a = self.along.value.data
        if not 0 <= a < grid.rank:
            raise _fail("collective-axes", f"comm.send along axis {a}, which the grid {grid} lacks")
        shift = self.shift.value.data
        if shift == 0:
            raise _fail("send-shift", "comm.send with shift 0 sends nothing")
        if grid.shape[a] != DYNAMIC and abs(shift) >= grid.shape[a]:
            raise _fail(
                "send-shift",
                f"comm.send along axis {a} with shift {shift} reaches no rank: the axis has "
                f"{grid.shape[a]} rank(s)",
            )

    def axis_rule(self, axis: int, layout: LayoutAttr) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            # Each rank would receive a slice but the result type promises a full value.
            raise _fail(
                "send-input",
                f"comm.send along grid axis {axis} of {self.input.type}, which is sliced along "
                "that axis: all_gather it first, or send it along another axis",
            )
        return LOCAL

    def print_extra(self, printer: Printer) -> None:
        printer.print_string(f" along {self.along.value.data} shift {self.shift.value.data}")

    @classmethod
    def parse_extra(cls, parser: Parser) -> dict[str, Attribute]:
        parser.parse_keyword("along")
        along = parser.parse_integer(allow_boolean=False, allow_negative=False)
        parser.parse_keyword("shift")
        shift = parser.parse_integer(allow_boolean=False)
        return {"along": IntegerAttr(along, i64), "shift": IntegerAttr(shift, i64)}


COLLECTIVE_OPS = (AllReduceOp, ReduceScatterOp, AllGatherOp, BroadcastOp, ReduceOp, SendOp)


# --------------------------------------------------------------------------------------------
# Schedule regions
# --------------------------------------------------------------------------------------------


class FusionKind(StrEnum):
    ELEMENTWISE = auto()  # a chain of elementwise ops: one kernel
    ALL_REDUCE = auto()  # reduce_scatter + sliced computation + all_gather: one collective
    SEND = auto()  # computation + send: one fused transfer


class RegionOp(CocoOp):
    """A schedule region: runs its body in place (it reads outer values directly) and yields
    its results. The original ops stay inside, so the program still reads and interprets."""

    body = region_def("single_block")
    res = var_result_def(TensorType)

    @property
    def yield_op(self) -> YieldOp:
        term = self.body.block.last_op
        assert isinstance(term, YieldOp)
        return term

    def verify_layouts(self) -> None:
        term = self.body.block.last_op
        if not isinstance(term, YieldOp):
            raise _fail("region-terminator", f"{self.name}'s body must end in comm.yield")
        got = [v.type for v in term.values]
        want = [r.type for r in self.res]
        if got != want:
            raise _fail(
                "region-results",
                f"{self.name} declares results ({', '.join(map(str, want))}) but yields "
                f"({', '.join(map(str, got))})",
            )

    def print_head(self, printer: Printer) -> None:
        raise NotImplementedError

    def print(self, printer: Printer) -> None:
        self.print_head(printer)
        printer.print_op_attributes(self.attributes)
        if self.res:
            printer.print_string(" -> ")
            printer.print_list([r.type for r in self.res], printer.print_attribute)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse_tail(cls, parser: Parser) -> tuple[dict[str, Attribute], list[Attribute], Region]:
        # With no results, `{` may open the attr-dict or the body (`comm.fused elementwise {
        # comm.yield }` reads as the unit attribute `comm.yield`): an attr-dict is always
        # followed by `->` or the body's `{`, so anything else means it was the body.
        start = parser.pos
        try:
            attrs = parser.parse_optional_attr_dict()
            is_attr_dict = not attrs or parser._current_token.text in ("->", "{")
        except ParseError:
            is_attr_dict = False
        if not is_attr_dict:
            parser._resume_from(start)
            attrs = {}
        types: list[Attribute] = []
        if parser.parse_optional_punctuation("->"):
            types = [parser.parse_type()]
            while parser.parse_optional_punctuation(","):
                types.append(parser.parse_type())
        region = parser.parse_region()
        return attrs, types, region


@irdl_op_definition
class FusedOp(RegionOp):
    """`%w = comm.fused all_reduce -> T { ... comm.yield %w2 : T }`: ops that run as one kernel.

    `all_reduce` holds one reduce_scatter, computation on its slices and the all_gathers that
    re-replicate results (CoCoNet's FusedAllReduce); `elementwise` holds computation only.
    """

    name = "comm.fused"
    kind = prop_def(StringAttr)

    def __init__(self, kind: str, body: Region, result_types: Sequence[Attribute]):
        super().__init__(
            regions=[body], result_types=[list(result_types)], properties={"kind": StringAttr(kind)}
        )

    def verify_layouts(self) -> None:
        super().verify_layouts()
        kinds = {k.value for k in FusionKind}
        if self.kind.data not in kinds:
            raise _fail("fuse-kind", f"unknown fusion kind '{self.kind.data}'")
        inner = [op for op in self.body.walk() if op is not self]
        collectives = [op for op in inner if isinstance(op, CollectiveOp)]
        if self.kind.data == FusionKind.ELEMENTWISE and collectives:
            raise _fail(
                "fuse-elementwise",
                f"an elementwise fusion holds no collective, but this one holds {collectives[0].name}",
            )
        if self.kind.data == FusionKind.ELEMENTWISE:
            # What one elementwise kernel computes at every element (the members coco-fuse
            # gathers): a reduction, a matmul or a nested region has no place in it.
            from coconet.dialects.coco import ConstantOp, ElementwiseOp, SliceOp, UpdateOp

            members = ElementwiseOp | ConstantOp | SliceOp | UpdateOp | YieldOp
            for op in self.body.block.ops:
                if not isinstance(op, members):
                    raise _fail(
                        "fuse-elementwise",
                        f"an elementwise fusion holds elementwise ops, constants, slices and "
                        f"updates, but this one holds {op.name}",
                    )
        if self.kind.data == FusionKind.ALL_REDUCE:
            scatters = [op for op in collectives if isinstance(op, ReduceScatterOp)]
            if len(scatters) != 1:
                raise _fail(
                    "fuse-one-collective",
                    f"a fused all_reduce holds exactly one reduce_scatter, this one holds "
                    f"{len(scatters)}",
                )

    def print_head(self, printer: Printer) -> None:
        printer.print_string(f" {self.kind.data}")

    @classmethod
    def parse(cls, parser: Parser):
        kind = parser.parse_str_enum(FusionKind)
        attrs, types, region = cls.parse_tail(parser)
        op = cls(kind.value, region, types)
        op.attributes |= attrs
        return op


@irdl_op_definition
class OverlapOp(RegionOp):
    """`comm.overlap chunks 4 -> T { ... }`: a producer (matmul) and the collective (or fused
    collective) consuming it, run as a pipeline of `chunks` pieces so communication of one
    chunk hides behind computation of the next."""

    name = "comm.overlap"
    chunks = prop_def(IntegerAttr)

    def __init__(self, chunks: int, body: Region, result_types: Sequence[Attribute]):
        super().__init__(
            regions=[body],
            result_types=[list(result_types)],
            properties={"chunks": IntegerAttr(chunks, i64)},
        )

    def verify_layouts(self) -> None:
        super().verify_layouts()
        if self.chunks.value.data < 1:
            raise _fail(
                "overlap-chunks", f"chunk count must be positive, got {self.chunks.value.data}"
            )
        # One producer (a matmul) and the collectives consuming it: what the lowering chunks.
        # (A region that dead-code elimination emptied is harmless and stays legal.)
        from coconet.dialects.coco import MatmulOp

        body = [op for op in self.body.block.ops if not isinstance(op, YieldOp)]
        producers = [op for op in body if isinstance(op, MatmulOp)]
        if len(producers) > 1:
            raise _fail(
                "overlap-producer",
                f"an overlap region holds one matmul producer, this one holds {len(producers)}",
            )
        if not producers:
            return
        # A fused consumer reads the matmul inside its body: count the top-level op around
        # each use.
        consumers = []
        for use in producers[0].result.uses:
            user = use.operation
            while user is not None and user.parent_block() is not self.body.block:
                user = user.parent_op()
            if user is not None and user not in consumers and not isinstance(user, YieldOp):
                consumers.append(user)
        strangers = [op for op in consumers if not isinstance(op, CollectiveOp | FusedOp)]
        if strangers:
            raise _fail(
                "overlap-consumer",
                "the matmul of an overlap region must feed a collective or a fused collective "
                "inside it, got " + ", ".join(op.name for op in strangers),
            )

    def print_head(self, printer: Printer) -> None:
        printer.print_string(f" chunks {self.chunks.value.data}")

    @classmethod
    def parse(cls, parser: Parser):
        parser.parse_keyword("chunks")
        chunks = parser.parse_integer(allow_boolean=False)
        attrs, types, region = cls.parse_tail(parser)
        op = cls(chunks, region, types)
        op.attributes |= attrs
        return op


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a schedule region, handing its results out."""

    name = "comm.yield"
    values = var_operand_def(TensorType)
    traits = traits_def(IsTerminator(), HasParent(FusedOp, OverlapOp), Pure())

    def __init__(self, values: Sequence[SSAValue] = ()):
        super().__init__(operands=[list(values)])

    def print(self, printer: Printer) -> None:
        if self.values:
            printer.print_string(" ")
            printer.print_list(self.values, printer.print_operand)
            printer.print_op_attributes(self.attributes)
            printer.print_string(" : ")
            printer.print_list([v.type for v in self.values], printer.print_attribute)
        else:
            printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser: Parser):
        operands = []
        if (first := parser.parse_optional_unresolved_operand()) is not None:
            operands = [first]
            while parser.parse_optional_punctuation(","):
                operands.append(parser.parse_unresolved_operand())
        attrs = parser.parse_optional_attr_dict()
        values: list[SSAValue] = []
        if operands:
            parser.parse_punctuation(":")
            types_pos = parser.pos
            types = [parser.parse_type()]
            while parser.parse_optional_punctuation(","):
                types.append(parser.parse_type())
            if len(types) != len(operands):
                parser.raise_error(
                    f"comm.yield has {len(operands)} values but {len(types)} types", types_pos
                )
            values = [parser.resolve_operand(o, t) for o, t in zip(operands, types)]
        op = cls(values)
        op.attributes |= attrs
        return op


Comm = Dialect(
    "comm",
    [*COLLECTIVE_OPS, FusedOp, OverlapOp, YieldOp],
    [],
)

__all__ = [
    "AllGatherOp",
    "AllReduceOp",
    "BroadcastOp",
    "CollectiveKind",
    "CollectiveOp",
    "Comm",
    "FusedOp",
    "FusionKind",
    "OverlapOp",
    "ReduceOp",
    "ReduceScatterOp",
    "RegionOp",
    "SendOp",
    "YieldOp",
]
