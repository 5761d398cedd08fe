"""The `comm` dialect: collectives and point-to-point transfers over process-grid axes, and
the schedule regions (fused, overlapped) that transformations build around them.

A collective spans the grid axes named by `over [..]` (all axes when omitted): the ranks that
share their coordinates on every other axis form one group, as in MLIR's `shard` dialect. On a
`[stages, ranks]` grid, `over [1]` is a collective inside each stage.

Reductions combine in rank order, accumulating in f64 (int64 for integers) and rounding once
to the element type; real collectives (NCCL rings) reorder this sum, which translation
validation allows for with a per-dtype tolerance. A float reduction may state its accumulation
type (`comm.all_reduce sum %g acc f32 : ...`, the reducing collectives' `acc`): each partial
sum, in rank order, is rounded to `acc` after every step (the first rank's value included),
then the result to the element type; every lowering honours it bit for bit (`check_acc` says
which types can be stated).

Layout rules (per spanned axis; other axes keep their layout):

* all-reduce-input      local | replicated -> replicated (a sliced input is refused)
* reduce-scatter-input  local | replicated -> sliced<dim>; reduce-scatter-dim: `dim` is a dim
                        of the tensor
* all-gather-input      sliced<d> -> replicated
* broadcast-input       local | replicated -> replicated (root's value)
* reduce-input          local | replicated -> local (root holds the result, the other ranks
                        keep their input unchanged, as NCCL's in-place reduce leaves them)
* send                  any -> local along the shifted axis: rank c receives what rank
                        c - shift sent; ranks with no sender receive zeros.
* all-to-all-*          sliced<a> -> sliced<b> (a != b): the group's part of the tensor re-cut
                        along b, uneven sizes cut by split_range; or local -> local (dispatch
                        buffers: block j of dim 0 of member i lands as block i of member j).
                        The result type names b (layout_rules.check_all_to_all).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Sequence
from enum import auto
from typing import TypeGuard

from xdsl.dialects.builtin import I64, DenseArrayBase, IntegerAttr, UnitAttr, i64
from xdsl.dialects.utils.enum_attribute import EnumAttribute
from xdsl.ir import Attribute, Dialect, Operation, Region, SpacedOpaqueSyntaxAttribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern
from xdsl.rewriter import InsertPoint
from xdsl.traits import (
    HasCanonicalizationPatternsTrait,
    HasParent,
    IsTerminator,
    Pure,
    RecursiveMemoryEffect,
)
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from coconet.dialects.coco import (
    DYNAMIC,
    LOCAL,
    REPLICATED,
    ROUND_TRIPS,
    SIGNATURE,
    CastOp,
    CocoOp,
    FoldRoundTrip,
    LayoutAttr,
    SlicedAttr,
    SliceOp,
    TensorType,
    enum_member,
    layout_str,
    tensor_operand,
    tensor_type_of,
)
from coconet.dialects.coco_types import (
    element_type_name,
    element_type_of_name,
    exact_widening,
    is_float_name,
    memo,
    nest_layouts,
    remember,
    same_cut,
)
from coconet.dialects.layout_rules import check_all_to_all, check_innermost_slicing, grid_of
from coconet.dialects.reduction import COLLECTIVE, Reduction, ReductionsOf, reduction


@irdl_attr_definition
class CollectiveKindAttr(ReductionsOf, EnumAttribute[Reduction], SpacedOpaqueSyntaxAttribute):
    """How a collective combines the ranks' values (`#comm<collective_kind sum>` in generic
    form)."""

    name = "comm.collective_kind"
    kinds = COLLECTIVE


def _fail(rule: str, message: str) -> VerifyException:
    return VerifyException(f"[{rule}] {message}")


def _describe(v: SSAValue) -> str:
    """`%name : T` (or just `T` for an unnamed value), for messages."""
    return f"%{v.name_hint} : {v.type}" if v.name_hint else str(v.type)


# --------------------------------------------------------------------------------------------
# Collectives
# --------------------------------------------------------------------------------------------


def collective_result_type(
    op_type: type[CollectiveOp],
    input_type: TensorType,
    span: Sequence[int],
    grid_rank: int,
    *,
    dim: int = 0,
    operand: str | Callable[[], str] | None = None,
) -> TensorType:
    """The result type of the collective `op_type` applied to a value of type `input_type`,
    spanning the grid axes `span` of a rank-`grid_rank` grid: each spanned axis takes the
    op's layout rule (`axis_rule`), every other axis keeps its layout. `dim` is the tensor
    dim a reduce_scatter slices; `operand` names the input in messages (or describes it when
    called: only a failure asks).

    The one statement of the collectives' layout rules: verifiers, constructors and passes
    all infer through it. Raises `VerifyException("[rule] ...")` for an input the collective
    does not take.
    """

    key = (op_type, input_type, tuple(span), grid_rank, dim)
    got = _INFERRED_COLLECTIVES.get(key)
    if got is not None:
        return got

    def layouts(what: str) -> list[LayoutAttr]:
        out: list[LayoutAttr] = []
        for a in range(max(grid_rank, len(input_type.layouts))):
            lay = input_type.layout_on(a)
            if a in span:
                lay = op_type.axis_rule(a, lay, input_type=input_type, what=what, dim=dim)
            out.append(lay)
        # A collective cuts each rank's piece: the cuts it adds nest inside those there.
        return nest_layouts(input_type, out)

    try:
        got = input_type.with_layouts(layouts(""))
    except VerifyException:
        # Again naming the operand: describing it (printing its type) for every inference
        # would cost more than inferring (verifiers infer for every collective of a program).
        what = operand() if callable(operand) else operand
        return input_type.with_layouts(layouts(what or str(input_type)))
    return remember(_INFERRED_COLLECTIVES, key, got)


# Results by (collective, input type, span, grid rank, dim): the verifier of every collective
# infers its result, and a program's collectives take a few types. Successes only. Bounded
# (remember).
_INFERRED_COLLECTIVES: dict[tuple[object, ...], TensorType] = memo("inferred collectives")


def _span(input_type: Attribute, axes: Sequence[int] | None, grid_rank: int) -> tuple[int, ...]:
    """What a collective built with `axes` spans: the axes, or every axis of the grid and of
    the input's type (an op built outside a function sees a 1-D grid)."""
    if axes is not None:
        return tuple(axes)
    assert isinstance(input_type, TensorType)
    return tuple(range(max(grid_rank, len(input_type.layouts))))


def _axes_props(axes: Sequence[int] | None) -> dict[str, Attribute]:
    if axes is None:
        return {}
    return {"axes": DenseArrayBase.from_list(i64, axes)}


class CollectiveOp(CocoOp):
    """Base of the collectives: an input, a result, the grid axes spanned (`span`)."""

    input = tensor_operand()
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def span(self) -> tuple[int, ...]:
        """The grid axes this collective spans."""
        raise NotImplementedError

    def check_axes(self) -> None:
        """Refuse a span the grid does not have."""
        raise NotImplementedError

    def combining_kind(self) -> Reduction | None:
        """How the ranks' values combine (`sum`, ...); None for a collective that only moves
        data."""
        return None

    def root_rank(self) -> int | None:
        """The group rank a rooted collective (broadcast, reduce) starts from or lands on."""
        return None

    def scattered_dim(self) -> int:
        """The tensor dim the collective slices (a reduce_scatter's `dim`; 0 otherwise)."""
        return 0

    def infer(self) -> TensorType:
        """The result type the layout rules give this op where it stands."""
        return collective_result_type(
            type(self),
            self.input.type,
            self.span(),
            grid_of(self).rank,
            dim=self.scattered_dim(),
            operand=lambda: _describe(self.input),
        )

    @classmethod
    def axis_rule(
        cls, axis: int, layout: LayoutAttr, *, input_type: TensorType, what: str, dim: int
    ) -> LayoutAttr:
        """The result's layout on a spanned grid axis where the input is `layout`."""
        raise NotImplementedError

    def verify_layouts(self) -> None:
        self.check_axes()
        inferred = self.infer()
        self.expect_result(inferred)
        check_acc(self, tensor_type_of(self.input).elt)
        # Gathering a dim that several axes cut must act on the innermost ones (a scatter's
        # inferred cuts nest innermost).
        if isinstance(self, AllGatherOp):
            check_innermost_slicing(self, self.input.type, self.span())


class GroupCollectiveOp(CollectiveOp):
    """A collective in the groups of ranks that share their coordinates off the grid axes
    `axes` (`over [..]`; every axis when omitted)."""

    axes = opt_prop_def(DenseArrayBase[I64])

    def span(self) -> tuple[int, ...]:
        if self.axes is not None:
            return self.axes.get_values()
        # An op outside a function sees the default 1-D grid: span every axis its input's
        # type names, as its constructor did.
        return tuple(range(max(grid_of(self).rank, len(self.input.type.layouts))))

    def check_axes(self) -> None:
        grid = grid_of(self)
        if self.axes is None:
            return
        seen = list(self.axes.get_values())
        if not seen or len(set(seen)) != len(seen) or any(not 0 <= a < grid.rank for a in seen):
            raise _fail(
                "collective-axes",
                f"{self.name} spans axes {seen}, which are not distinct axes of the grid {grid}",
            )


def _check_root(op: BroadcastOp | ReduceOp) -> None:
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


def _kind_attr(kind: str) -> CollectiveKindAttr:
    return CollectiveKindAttr(reduction(kind, COLLECTIVE, "reduction kind"))


# The accumulation types a reduction may state: what the kernels accumulate in (float registers,
# rounded per step for bf16 and f16) and the sim rounds to. fp8 is no accumulator: 2 or 3
# mantissa bits would lose every small addend.
ACC_TYPE_NAMES = ("bf16", "f16", "f32", "f64")

ACC = "(`acc` $acc^)?"


def _acc_attr(acc: str | Attribute | None) -> dict[str, Attribute]:
    if acc is None:
        return {}
    if isinstance(acc, str):
        acc = element_type_of_name(acc)
    return {"acc": acc}


def accumulation(op: Operation) -> str | None:
    """The element type name a reducing collective states as its accumulation (`acc`), or
    None: the default (f64, int64, rounded once)."""
    acc = op.properties.get("acc")
    return None if acc is None else element_type_name(acc)


def check_acc(op: Operation, elt: str) -> None:
    """[<op>-acc]: a stated accumulation holds every value of the element type `elt` exactly
    (so the first rank's value enters unrounded), is a float for float data, and is one the
    lowerings accumulate in (`ACC_TYPE_NAMES`); integers accumulate exactly (int64) and state
    none."""
    acc = op.properties.get("acc")
    if acc is None:
        return
    rule = op.name.removeprefix("comm.").replace("_", "-") + "-acc"
    try:
        name = element_type_name(acc)
    except VerifyException:
        raise _fail(rule, f"{op.name} accumulates in {acc}, which is no element type") from None
    if not is_float_name(elt) or not is_float_name(name):
        raise _fail(
            rule,
            f"{op.name} of {elt} values accumulating in {name}: integers accumulate exactly "
            "(int64) and state no acc; float data accumulates in a float type",
        )
    if name not in ACC_TYPE_NAMES:
        raise _fail(
            rule,
            f"{op.name} accumulating in {name}: no lowering accumulates in fp8 (too few "
            f"mantissa bits); use one of {', '.join(ACC_TYPE_NAMES)}",
        )
    if name != elt and not exact_widening(elt, name):
        raise _fail(
            rule,
            f"{op.name} of {elt} values accumulating in {name}, which does not hold every "
            f"{elt} value: the accumulation is at least as wide as the data",
        )


class AllReduceCanonicalization(HasCanonicalizationPatternsTrait):
    """An all_reduce whose only reader keeps a slice of it becomes a reduce_scatter
    (ScatterForSlicedAllReduce)."""

    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return (ScatterForSlicedAllReduce(),)


@irdl_op_definition
class AllReduceOp(GroupCollectiveOp):
    """`comm.all_reduce sum %g : !coco.tensor<Nxf32, local> -> !coco.tensor<Nxf32>`."""

    name = "comm.all_reduce"
    kind = prop_def(CollectiveKindAttr)
    acc = opt_prop_def(Attribute)
    traits = traits_def(Pure(), AllReduceCanonicalization())

    assembly_format = f"$kind $input {ACC} (`over` $axes^)? attr-dict {SIGNATURE}"

    def combining_kind(self) -> Reduction | None:
        return self.kind.data

    def __init__(
        self,
        input: SSAValue,
        kind: str = Reduction.SUM,
        axes: Sequence[int] | None = None,
        *,
        grid_rank: int = 1,
        acc: str | Attribute | None = None,
    ):
        properties = {"kind": _kind_attr(kind)} | _axes_props(axes) | _acc_attr(acc)
        result_type = collective_result_type(
            AllReduceOp, tensor_type_of(input), _span(input.type, axes, grid_rank), grid_rank,
            operand=lambda: _describe(input),
        )  # fmt: skip
        super().__init__(operands=[input], result_types=[result_type], properties=properties)

    @classmethod
    def axis_rule(
        cls, axis: int, layout: LayoutAttr, *, input_type: TensorType, what: str, dim: int
    ) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            raise _fail(
                "all-reduce-input",
                f"all_reduce of {what}, which is {layout_str(layout)} on grid axis {axis}: "
                "all_reduce takes local or replicated tensors (all_gather a slice)",
            )
        return REPLICATED


@irdl_op_definition
class ReduceScatterOp(GroupCollectiveOp):
    """`comm.reduce_scatter sum %g dim 1 : local -> sliced<1>`: reduce, keep this rank's part
    of tensor dim `dim` (0 when not written)."""

    name = "comm.reduce_scatter"
    kind = prop_def(CollectiveKindAttr)
    dim = prop_def(IntegerAttr[I64], default_value=IntegerAttr(0, i64))
    acc = opt_prop_def(Attribute)

    assembly_format = f"$kind $input (`dim` $dim^)? {ACC} (`over` $axes^)? attr-dict {SIGNATURE}"

    def combining_kind(self) -> Reduction | None:
        return self.kind.data

    def __init__(
        self,
        input: SSAValue,
        kind: str = Reduction.SUM,
        dim: int = 0,
        axes: Sequence[int] | None = None,
        *,
        grid_rank: int = 1,
        acc: str | Attribute | None = None,
    ):
        properties = (
            {"kind": _kind_attr(kind), "dim": IntegerAttr(dim, i64)}
            | _axes_props(axes)
            | _acc_attr(acc)
        )
        result_type = collective_result_type(
            ReduceScatterOp, tensor_type_of(input), _span(input.type, axes, grid_rank), grid_rank,
            dim=dim, operand=lambda: _describe(input),
        )  # fmt: skip
        super().__init__(operands=[input], result_types=[result_type], properties=properties)

    def scattered_dim(self) -> int:
        return self.dim.value.data

    @classmethod
    def axis_rule(
        cls, axis: int, layout: LayoutAttr, *, input_type: TensorType, what: str, dim: int
    ) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            raise _fail(
                "reduce-scatter-input",
                f"reduce_scatter of {what}, which is already sliced on grid axis {axis}: "
                "reduce_scatter takes local or replicated tensors",
            )
        if not 0 <= dim < input_type.rank:
            raise _fail(
                "reduce-scatter-dim",
                f"reduce_scatter of {what} along dim {dim}, which a rank-{input_type.rank} "
                "tensor does not have",
            )
        return SlicedAttr(dim)


class GatherCanonicalization(HasCanonicalizationPatternsTrait):
    """`comm.all_gather (coco.slice %x)` of `%x`'s type folds to `%x` (FoldRoundTrip)."""

    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return (FoldRoundTrip(),)


class AllToAllCanonicalization(HasCanonicalizationPatternsTrait):
    """An all_to_all undoing another folds (FoldRoundTrip); one a narrowing cast alone reads
    moves after the cast (NarrowBeforeAllToAll)."""

    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return (FoldRoundTrip(), NarrowBeforeAllToAll())


@irdl_op_definition
class AllGatherOp(GroupCollectiveOp):
    """`comm.all_gather %s : sliced<d> -> replicated`."""

    name = "comm.all_gather"
    traits = traits_def(Pure(), GatherCanonicalization())

    assembly_format = f"$input (`over` $axes^)? attr-dict {SIGNATURE}"

    def __init__(self, input: SSAValue, axes: Sequence[int] | None = None, *, grid_rank: int = 1):
        result_type = collective_result_type(
            AllGatherOp, tensor_type_of(input), _span(input.type, axes, grid_rank), grid_rank,
            operand=lambda: _describe(input),
        )  # fmt: skip
        super().__init__(operands=[input], result_types=[result_type], properties=_axes_props(axes))

    @classmethod
    def axis_rule(
        cls, axis: int, layout: LayoutAttr, *, input_type: TensorType, what: str, dim: int
    ) -> LayoutAttr:
        if not isinstance(layout, SlicedAttr):
            raise _fail(
                "all-gather-input",
                f"all_gather of {what}, which is {layout_str(layout)} on grid axis {axis}: "
                "all_gather takes sliced tensors",
            )
        return REPLICATED


@irdl_op_definition
class BroadcastOp(GroupCollectiveOp):
    """`comm.broadcast %x root 0 : local -> replicated`: the root's value on every rank."""

    name = "comm.broadcast"
    root = prop_def(IntegerAttr[I64])

    assembly_format = f"$input `root` $root (`over` $axes^)? attr-dict {SIGNATURE}"

    def root_rank(self) -> int | None:
        return self.root.value.data

    def __init__(
        self,
        input: SSAValue,
        root: int = 0,
        axes: Sequence[int] | None = None,
        *,
        grid_rank: int = 1,
    ):
        result_type = collective_result_type(
            BroadcastOp, tensor_type_of(input), _span(input.type, axes, grid_rank), grid_rank,
            operand=lambda: _describe(input),
        )  # fmt: skip
        super().__init__(
            operands=[input],
            result_types=[result_type],
            properties={"root": IntegerAttr(root, i64)} | _axes_props(axes),
        )

    @classmethod
    def axis_rule(
        cls, axis: int, layout: LayoutAttr, *, input_type: TensorType, what: str, dim: int
    ) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            raise _fail(
                "broadcast-input",
                f"broadcast of {what}, sliced on grid axis {axis}: broadcast takes local or "
                "replicated tensors",
            )
        return REPLICATED

    def verify_layouts(self) -> None:
        _check_root(self)
        super().verify_layouts()


@irdl_op_definition
class ReduceOp(GroupCollectiveOp):
    """`comm.reduce sum %x root 0 : local -> local`: the reduction lands on the root only."""

    name = "comm.reduce"
    kind = prop_def(CollectiveKindAttr)
    root = prop_def(IntegerAttr[I64])
    acc = opt_prop_def(Attribute)

    assembly_format = f"$kind $input `root` $root {ACC} (`over` $axes^)? attr-dict {SIGNATURE}"

    def combining_kind(self) -> Reduction | None:
        return self.kind.data

    def root_rank(self) -> int | None:
        return self.root.value.data

    def __init__(
        self,
        input: SSAValue,
        kind: str = Reduction.SUM,
        root: int = 0,
        axes: Sequence[int] | None = None,
        *,
        grid_rank: int = 1,
        acc: str | Attribute | None = None,
    ):
        result_type = collective_result_type(
            ReduceOp, tensor_type_of(input), _span(input.type, axes, grid_rank), grid_rank,
            operand=lambda: _describe(input),
        )  # fmt: skip
        super().__init__(
            operands=[input],
            result_types=[result_type],
            properties={"kind": _kind_attr(kind), "root": IntegerAttr(root, i64)}
            | _axes_props(axes)
            | _acc_attr(acc),
        )

    @classmethod
    def axis_rule(
        cls, axis: int, layout: LayoutAttr, *, input_type: TensorType, what: str, dim: int
    ) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            raise _fail(
                "reduce-input",
                f"reduce of {what}, sliced on grid axis {axis}: reduce takes local or "
                "replicated tensors",
            )
        return LOCAL

    def verify_layouts(self) -> None:
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
    along = prop_def(IntegerAttr[I64])
    shift = prop_def(IntegerAttr[I64])

    assembly_format = f"$input `along` $along `shift` $shift attr-dict {SIGNATURE}"

    def __init__(self, input: SSAValue, along: int = 0, shift: int = 1, *, grid_rank: int = 1):
        result_type = collective_result_type(
            SendOp, tensor_type_of(input), (along,), grid_rank, operand=lambda: _describe(input)
        )
        super().__init__(
            operands=[input],
            result_types=[result_type],
            properties={"along": IntegerAttr(along, i64), "shift": IntegerAttr(shift, i64)},
        )

    def span(self) -> tuple[int, ...]:
        return (self.along.value.data,)

    def check_axes(self) -> None:
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

    @classmethod
    def axis_rule(
        cls, axis: int, layout: LayoutAttr, *, input_type: TensorType, what: str, dim: int
    ) -> LayoutAttr:
        if isinstance(layout, SlicedAttr):
            # Each rank would receive a slice but the result type promises a full value.
            raise _fail(
                "send-input",
                f"comm.send along grid axis {axis} of {input_type}, which is sliced along "
                "that axis: all_gather it first, or send it along another axis",
            )
        return LOCAL


@irdl_op_definition
class AllToAllOp(GroupCollectiveOp):
    """`comm.all_to_all %x : sliced<0> -> sliced<1>`: every rank sends each member of its
    group the part of its piece that member holds under the result's layout (MPI_Alltoallv,
    NCCL grouped send/recv). On `local` tensors, the dispatch form of torch's
    all_to_all_single: dim 0 is cut into one equal block per member, and member i's block j
    becomes member j's block i.

    The result type says which dim each spanned axis re-cuts (no property repeats it)."""

    name = "comm.all_to_all"
    traits = traits_def(Pure(), AllToAllCanonicalization())

    assembly_format = f"$input (`over` $axes^)? attr-dict {SIGNATURE}"

    def __init__(
        self,
        input: SSAValue,
        dim: int = 0,
        axes: Sequence[int] | None = None,
        *,
        grid_rank: int = 1,
    ):
        """Re-cut the spanned axes along `dim` (ignored in the local form)."""
        result_type = collective_result_type(
            AllToAllOp, tensor_type_of(input), _span(input.type, axes, grid_rank), grid_rank,
            dim=dim, operand=lambda: _describe(input),
        )  # fmt: skip
        super().__init__(operands=[input], result_types=[result_type], properties=_axes_props(axes))

    def infer(self) -> TensorType:
        # The declared result names the target dims: check it rather than derive it.
        return check_all_to_all(self, self.input.type, self.result.type, self.span(), grid_of(self))

    def verify_layouts(self) -> None:
        self.check_axes()
        self.infer()

    @classmethod
    def axis_rule(
        cls, axis: int, layout: LayoutAttr, *, input_type: TensorType, what: str, dim: int
    ) -> LayoutAttr:
        """The builders' rule (one target `dim` for every spanned axis)."""
        if layout == LOCAL:
            return LOCAL
        if not isinstance(layout, SlicedAttr):
            raise _fail(
                "all-to-all-layouts",
                f"all_to_all of {what}, which is {layout_str(layout)} on grid axis {axis}: "
                "all_to_all takes sliced tensors (or local ones, the dispatch form)",
            )
        if layout.dim.data == dim or not 0 <= dim < input_type.rank:
            raise _fail(
                "all-to-all-layouts",
                f"all_to_all of {what} to dim {dim}: grid axis {axis} slices dim "
                f"{layout.dim.data}, and the target must be another dim of the "
                f"rank-{input_type.rank} tensor",
            )
        return SlicedAttr(dim)


def a2a_chunk_dims(op: AllToAllOp) -> tuple[int, ...]:
    """The dims an overlap may cut `op`'s exchange along, chunk by chunk: row dims (all but
    the last) that no grid axis slices before or after it -- so the all_to_all neither splits
    nor gathers them and every rank holds them whole, each chunk the same range on every rank
    -- and, in the dispatch form (local tensors), not dim 0, whose blocks go to the members.
    Each chunk's exchange is then the all_to_all of that range (lowering/overlap.py)."""
    t_in, t_out = tensor_type_of(op.input), tensor_type_of(op.result)
    dispatch = any(t_in.layouts.data[a] == LOCAL for a in op.span() if a < len(t_in.layouts))
    return tuple(
        d
        for d in range(t_in.rank - 1)
        if not t_in.slicing_axes(d) and not t_out.slicing_axes(d) and not (dispatch and d == 0)
    )


COLLECTIVE_OPS = (
    AllReduceOp,
    ReduceScatterOp,
    AllGatherOp,
    BroadcastOp,
    ReduceOp,
    SendOp,
    AllToAllOp,
)


# --------------------------------------------------------------------------------------------
# Schedule regions
# --------------------------------------------------------------------------------------------


class FusionKind(StrEnum):
    ELEMENTWISE = auto()  # a chain of elementwise ops: one kernel
    ALL_REDUCE = auto()  # reduce_scatter + sliced computation + all_gather: one collective
    SEND = auto()  # computation + send: one fused transfer
    ALL_TO_ALL = auto()  # producers + all_to_all + consumers: one kernel over symmetric memory
    ALL_GATHER = auto()  # producers + all_gather + consumers: the same exchange kernel
    REDUCTION = auto()  # full reductions + their inputs' computation + partials' all_reduces


@irdl_attr_definition
class FusionKindAttr(EnumAttribute[FusionKind], SpacedOpaqueSyntaxAttribute):
    """What a `comm.fused` region runs as (`#comm<fusion_kind elementwise>` in generic
    form)."""

    name = "comm.fusion_kind"


# --------------------------------------------------------------------------------------------
# Lowering decisions: discardable attributes the lowering's first passes set (lowering/
# decisions.py: `coco-choose-topology`, `coco-defer`; segments.py: `coco-segment`) and the
# plan builder reads
# --------------------------------------------------------------------------------------------


class Topology(StrEnum):
    FLAT = auto()  # the group within one node: the fused kernel reaches it over symmetric memory
    HIERARCHICAL = auto()  # the group spans nodes: node kernels, library collectives between


@irdl_attr_definition
class TopologyAttr(EnumAttribute[Topology], SpacedOpaqueSyntaxAttribute):
    """How a fused kernel's collective reaches its group (`#comm<topology flat>`), the
    `comm.topology` attribute of the collective: flat (one kernel over symmetric memory) or
    hierarchical (the group spans nodes)."""

    name = "comm.topology"


class Deferral(StrEnum):
    REMATERIALIZE = auto()  # computed in each fused kernel reading it, not where it stands
    WIRE = auto()  # an exact widening the peers apply to its narrow input as they accumulate


@irdl_attr_definition
class DeferralAttr(EnumAttribute[Deferral], SpacedOpaqueSyntaxAttribute):
    """Where the lowering computes an op it does not compute where it stands
    (`#comm<deferral rematerialize>`), the `comm.deferral` attribute of the op."""

    name = "comm.deferral"


# The keys of the discardable attributes holding those decisions.
TOPOLOGY_ATTR_NAME = "comm.topology"
DEFERRAL_ATTR_NAME = "comm.deferral"
# the segment (an i64) of an op of a two-shot fused region, and their count on the region
SEGMENT_ATTR_NAME = "comm.segment"
SEGMENTS_ATTR_NAME = "comm.segments"
CHAIN_ATTR_NAME = "comm.chain"
TABLE_READY_ATTR_NAME = "comm.table_ready"


def topology_of(op: Operation) -> Topology | None:
    """The topology chosen for a fused kernel's collective (its `comm.topology`), if any."""
    attr = op.attributes.get(TOPOLOGY_ATTR_NAME)
    return attr.data if isinstance(attr, TopologyAttr) else None


def segment_of(op: Operation) -> int | None:
    """The segment of its fused region that runs `op` (its `comm.segment`), if any."""
    attr = op.attributes.get(SEGMENT_ATTR_NAME)
    return attr.value.data if isinstance(attr, IntegerAttr) else None


def chain_of(op: Operation) -> int | None:
    """The tensor chain of its segment `op` is in (its `comm.chain`), where the segment
    holds several (one kernel each); None where it holds one."""
    attr = op.attributes.get(CHAIN_ATTR_NAME)
    return attr.value.data if isinstance(attr, IntegerAttr) else None


def deferral_of(op: Operation) -> Deferral | None:
    """How the lowering defers `op` (its `comm.deferral`), if it does."""
    attr = op.attributes.get(DEFERRAL_ATTR_NAME)
    return attr.data if isinstance(attr, DeferralAttr) else None


# `attributes {...}` rather than a bare attr-dict: with no results, `{` after the head would
# open either the attr-dict or the body.
REGION_TAIL = "attr-dict-with-keyword (`->` type($res)^)? $body"


class RegionOp(CocoOp):
    """A schedule region: runs its body in place (it reads outer values directly) and yields
    its results. The original ops stay inside, so the program still reads and interprets.

    Its effects are its body's (`RecursiveMemoryEffect`): a region holding an update writes
    the caller's buffer, one holding only pure ops is dead once nothing reads its results.
    """

    body = region_def("single_block")
    res = var_result_def(TensorType)
    traits = traits_def(RecursiveMemoryEffect())

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


class FusedCanonicalization(HasCanonicalizationPatternsTrait):
    """A fused region whose collective is gone dissolves (DissolveSpentRegion)."""

    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return (DissolveSpentRegion(),)


@irdl_op_definition
class FusedOp(RegionOp):
    """`%w = comm.fused all_reduce -> T { ... comm.yield %w2 : T }`: ops that run as one kernel.

    `all_reduce` holds one reduce_scatter, computation on its slices and the all_gathers that
    re-replicate results (CoCoNet's FusedAllReduce, two-shot) -- or several such chains, one
    per tensor, that scalars couple (a global norm each tensor's update reads); `all_to_all`
    holds one all_to_all, the elementwise computation of its input (on the sender's piece) and
    of its result (on the receiver's); `elementwise` holds computation only; `reduction`
    holds full reductions of one iteration space, the elementwise computation of their
    inputs and the all_reduces combining their partials (an fp8 scale's amax, a clipping's
    global norm): one kernel, the partials exchanged through symmetric memory.

    `comm.fused all_reduce one_shot` is the one-shot form: one tensor `comm.all_reduce` and
    the computation on its whole result (elementwise ops, constants, row reductions over the
    last dim with their row values, updates). Each rank reads every peer's whole input from
    symmetric memory, reduces it in rank order and computes the rest on the whole tensor: one
    handshake, no all_gather (lowering/fused_collective.py `lower_one_shot`).
    """

    name = "comm.fused"
    kind = prop_def(FusionKindAttr)
    one_shot = opt_prop_def(UnitAttr)
    traits = traits_def(RecursiveMemoryEffect(), FusedCanonicalization())

    assembly_format = f"$kind (`one_shot` $one_shot^)? {REGION_TAIL}"

    def __init__(
        self,
        kind: str | FusionKind,
        body: Region,
        result_types: Sequence[Attribute],
        one_shot: bool = False,
    ):
        properties: dict[str, Attribute] = {
            "kind": FusionKindAttr(enum_member(FusionKind, kind, "fusion kind"))
        }
        if one_shot:
            properties["one_shot"] = UnitAttr()
        super().__init__(regions=[body], result_types=[list(result_types)], properties=properties)

    @property
    def is_one_shot(self) -> bool:
        return self.one_shot is not None

    def verify_layouts(self) -> None:
        super().verify_layouts()
        inner = [op for op in self.body.walk() if op is not self]
        collectives = [op for op in inner if isinstance(op, CollectiveOp)]
        if self.is_one_shot:
            self._check_one_shot(collectives)
            return
        if self.kind.data == FusionKind.ELEMENTWISE and collectives:
            raise _fail(
                "fuse-elementwise",
                "an elementwise fusion holds no collective, "
                f"but this one holds {collectives[0].name}",
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
        if self.kind.data == FusionKind.ALL_TO_ALL:
            self._check_exchange(collectives, AllToAllOp)
        if self.kind.data == FusionKind.ALL_GATHER:
            self._check_exchange(collectives, AllGatherOp)
        if self.kind.data == FusionKind.REDUCTION:
            self._check_reduction(collectives)
        if self.kind.data == FusionKind.ALL_REDUCE:
            scatters = [op for op in collectives if isinstance(op, ReduceScatterOp)]
            if not scatters:
                raise _fail(
                    "fuse-one-collective",
                    "a fused all_reduce holds one reduce_scatter per tensor chain, this one "
                    "holds 0",
                )
            if len(scatters) > 1:
                self._check_coupled_chains(scatters)
            self._check_gathered_readers(collectives)

    def _check_gathered_readers(self, collectives: Sequence[CollectiveOp]) -> None:
        """[fuse-gather-readers]: the kernel computes on slices; what an all_gather gathers
        is whole once the kernel ends, so inside the region only updates and the yield read
        it (the fuzzer: an op reading it made the lowering fail with a KeyError)."""
        from coconet.dialects.coco import UpdateOp

        for gather in collectives:
            if not isinstance(gather, AllGatherOp):
                continue
            for use in gather.result.uses:
                reader = use.operation
                if reader.parent_op() is self and not isinstance(reader, UpdateOp | YieldOp):
                    raise _fail(
                        "fuse-gather-readers",
                        f"{reader.name} reads {_describe(gather.result)}, the all_gather of a "
                        "fused all_reduce, inside the region: the kernel computes on slices "
                        "and the gathered value is whole only once it ends; read it after "
                        "the region (yield it) or compute on the slice before the all_gather",
                    )

    def _check_one_shot(self, collectives: Sequence[CollectiveOp]) -> None:
        """One tensor all_reduce and the computation on its whole result: what one kernel
        computes after reducing every peer's whole input."""
        from coconet.dialects.coco import (
            ConstantOp,
            ElementwiseOp,
            ReduceDimsOp,
            SliceOp,
            UpdateOp,
        )

        if self.kind.data != FusionKind.ALL_REDUCE:
            raise _fail(
                "fuse-one-shot",
                f"one_shot is a form of a fused all_reduce, not of a fused {self.kind.data}",
            )
        reduces = [op for op in collectives if isinstance(op, AllReduceOp)]
        if len(reduces) != 1 or len(collectives) != 1:
            raise _fail(
                "fuse-one-shot",
                "a one-shot fused all_reduce holds exactly one comm.all_reduce and no other "
                f"collective, this one holds {', '.join(op.name for op in collectives) or 'none'}",
            )
        if tensor_type_of(reduces[0].input).get_shape() == ():
            raise _fail(
                "fuse-one-shot",
                "a one-shot fused all_reduce reduces a tensor, not a scalar",
            )
        source = reduces[0].input.owner
        if isinstance(source, Operation) and source.parent_block() is self.body.block:
            raise _fail(
                "fuse-one-shot",
                "a one-shot fused all_reduce reads its all_reduce's input from memory (every "
                "peer reads it whole): the input is computed before the region, not in it",
            )
        members = (
            ElementwiseOp | ConstantOp | SliceOp | ReduceDimsOp | UpdateOp | AllReduceOp | YieldOp
        )
        for op in self.body.block.ops:
            if not isinstance(op, members):
                raise _fail(
                    "fuse-one-shot",
                    "a one-shot fused all_reduce holds its all_reduce, elementwise ops, "
                    f"constants, slices, row reductions and updates, but this one holds {op.name}",
                )

    def _check_reduction(self, collectives: Sequence[CollectiveOp]) -> None:
        """Full reductions over one iteration space, the elementwise computation of their
        inputs, and all_reduces of their partials: what one kernel computes, each element's
        values first, the reductions' totals last (lowering/fused_collective.py
        `lower_fused_reduction`); and no partial both all_reduced and yielded."""
        body = [op for op in self.body.block.ops if not isinstance(op, YieldOp)]
        problem = fused_reduction_problem(body)
        if problem is not None:
            raise _fail("fuse-reduction", problem[0])
        for c in collectives:
            partial = c.operands[0]
            if any(isinstance(u.operation, YieldOp) for u in partial.uses):
                raise _fail(
                    "fuse-reduction",
                    f"the partial {_describe(partial)} is all_reduced in the fused reduction: "
                    "the kernel keeps no rank's own partial to yield",
                )

    def _check_exchange(
        self, collectives: Sequence[CollectiveOp], cls: type[AllToAllOp | AllGatherOp]
    ) -> None:
        """One all_to_all (all_gather) and the elementwise computation around it (constants,
        slices and updates too): what one kernel computes before and after the exchange."""
        from coconet.dialects.coco import ConstantOp, ElementwiseOp, SliceOp, UpdateOp

        kind = self.kind.data.value
        exchanges = [op for op in collectives if isinstance(op, cls)]
        if len(exchanges) != 1 or len(collectives) != 1:
            raise _fail(
                "fuse-one-collective",
                f"a fused {kind} holds exactly one {cls.name} and no other "
                f"collective, this one holds {', '.join(op.name for op in collectives) or 'none'}",
            )
        members = ElementwiseOp | ConstantOp | SliceOp | UpdateOp | cls | YieldOp
        for op in self.body.block.ops:
            if not isinstance(op, members):
                raise _fail(
                    "fuse-one-collective",
                    f"a fused {kind} holds its {kind}, elementwise ops, constants, "
                    f"slices and updates, but this one holds {op.name}",
                )

    def _check_coupled_chains(self, scatters: Sequence[ReduceScatterOp]) -> None:
        """Several reduce_scatters: chains (ops linked through tensor values) coupled through
        scalars (a global norm every tensor's update reads); reduce_scatters of one chain
        (a loss reading the row sums of two all_reduces) share one slice and axes, which
        one kernel reads from the peers."""
        # The terminator yields results of any chain: it links none.
        ops = [op for op in self.body.block.ops if not isinstance(op, YieldOp)]
        chains = linked_groups(ops, lambda v: tensor_type_of(v).get_shape() != ())
        coupled = linked_groups(ops, lambda v: True)
        chain_of = {op: i for i, group in enumerate(chains) for op in group}
        held: dict[int, list[ReduceScatterOp]] = {}  # the reduce_scatters of each chain
        for s in scatters:
            held.setdefault(chain_of[s], []).append(s)
        for group in held.values():
            slices = {
                (tensor_type_of(s.result).get_shape(), tensor_type_of(s.result).layouts, s.span())
                for s in group
            }
            if len(slices) > 1:
                raise _fail(
                    "fuse-one-collective",
                    f"the reduce_scatters of one tensor chain of a fused all_reduce share one "
                    f"slice and grid axes, this one holds {len(group)} that differ",
                )
        group_of = {op: i for i, group in enumerate(coupled) for op in group}
        if len({group_of[s] for s in scatters}) > 1:
            raise _fail(
                "fuse-one-collective",
                f"a fused all_reduce holds one reduce_scatter per tensor chain, and chains "
                f"that scalars couple; this one holds {len(scatters)} uncoupled ones",
            )


def linked_groups(
    ops: Sequence[Operation], through: Callable[[SSAValue], bool]
) -> list[set[Operation]]:
    """`ops` grouped by the values `through` accepts that one reads from another (union-find
    over their operands; coco-fuse checks its named groups with it too)."""
    parent: dict[Operation, Operation] = {op: op for op in ops}

    def root(op: Operation) -> Operation:
        while parent[op] is not op:
            parent[op] = op = parent[parent[op]]  # path halving: near-constant depth
        return op

    for op in ops:
        for v in op.operands:
            owner = v.owner
            if isinstance(owner, Operation) and owner in parent and through(v):
                parent[root(op)] = root(owner)
    groups: dict[Operation, set[Operation]] = {}
    for op in ops:
        groups.setdefault(root(op), set()).add(op)
    return list(groups.values())


def fused_reduction_problem(ops: Sequence[Operation]) -> tuple[str, Operation | None] | None:
    """What keeps `ops` from being one `comm.fused reduction` (its body, or the set
    coco-fuse-reduction would fuse): a message and the op it is about, or None. One kernel
    computes the elementwise ops at every element and finishes the reductions last, so the set
    holds full reductions of one iteration space, elementwise ops, constants, slices and
    all_reduces each combining one reduction's partial in its kind -- every reduction so, or
    none, over one group -- and nothing in it reads a reduction's total."""
    from coconet.dialects.coco import ConstantOp, ElementwiseOp, ReduceOp as FullReduceOp, SliceOp

    members = ElementwiseOp | ConstantOp | SliceOp | FullReduceOp | AllReduceOp
    for op in ops:
        if not isinstance(op, members):
            return (
                "a fused reduction holds full reductions, the all_reduces of their partials, "
                f"elementwise ops, constants and slices, but this one holds {op.name}",
                op,
            )
    reduces = [op for op in ops if isinstance(op, FullReduceOp)]
    if not reduces:
        return "a fused reduction holds at least one coco.reduce", None
    if len({(r.input.type.get_shape(), r.input.type.layouts) for r in reduces}) > 1:
        return (
            "the reductions of a fused reduction reduce tensors of one shape and layout "
            f"(one iteration space), got {', '.join(_describe(r.input) for r in reduces)}",
            reduces[-1],
        )
    finished: dict[SSAValue, FullReduceOp] = {SSAValue.get(r.result): r for r in reduces}
    finishers = [op for op in ops if isinstance(op, AllReduceOp)]
    for c in finishers:
        r = finished.get(c.input)
        if r is None or c.kind.data != r.kind.data:
            return (
                f"{c.name} in a fused reduction combines the partial of one of its coco.reduce "
                "ops, of the same kind",
                c,
            )
    if finishers and len(finishers) != len(reduces):
        return (
            "the reductions of a fused reduction are all all_reduced, or none is: one kernel "
            "finishes them across one group or on each rank",
            reduces[0],
        )
    if len({c.span() for c in finishers}) > 1:
        return "the all_reduces of a fused reduction span the same grid axes", finishers[-1]
    finisher_of = {c.input: c for c in finishers}
    for r in reduces:
        total = finisher_of[r.result].result if r.result in finisher_of else r.result
        if not total.uses:
            # dead code elimination would remove it, and could leave no reduction here
            return f"{_describe(total)}, a reduction's total, is read by nothing", r
    totals = {r.result for r in reduces} | {c.result for c in finishers}
    for op in ops:
        read = (
            []
            if isinstance(op, FullReduceOp | AllReduceOp)
            else [v for v in op.operands if v in totals]
        )
        if read:
            return (
                f"{op.name} reads {_describe(read[0])}, a reduction's total, inside the fused "
                "reduction: the kernel finishes its reductions last; read it after the region",
                op,
            )
    return None


def is_fused_all_gather(op: object) -> TypeGuard[FusedOp]:
    """A `comm.fused all_gather` region (fuse(ag)): its all_gather and the computation around
    it as one exchange kernel, which an overlap chunks by rows like an all_gather."""
    return isinstance(op, FusedOp) and op.kind.data == FusionKind.ALL_GATHER


@irdl_op_definition
class OverlapOp(RegionOp):
    """`comm.overlap chunks 4 -> T { ... }`: a producer (matmul) and the collective (or fused
    collective) consuming it, or an all_gather and the matmul reading it, run as a pipeline
    of `chunks` pieces so communication of one chunk hides behind computation of the next.

    `comm.overlap chunks 3 dim 2`: the all_to_all forms (a matmul and the all_to_all reading
    it; an all_to_all and the matmul reading it, through a reshape or not) chunk the
    all_to_all's tensor along `dim`, one of `a2a_chunk_dims` (passes/overlap.py)."""

    name = "comm.overlap"
    chunks = prop_def(IntegerAttr[I64])
    dim = opt_prop_def(IntegerAttr[I64])

    assembly_format = f"`chunks` $chunks (`dim` $dim^)? {REGION_TAIL}"

    def __init__(
        self,
        chunks: int,
        body: Region,
        result_types: Sequence[Attribute],
        dim: int | None = None,
    ):
        props: dict[str, Attribute] = {"chunks": IntegerAttr(chunks, i64)}
        if dim is not None:
            props["dim"] = IntegerAttr(dim, i64)
        super().__init__(regions=[body], result_types=[list(result_types)], properties=props)

    @property
    def all_to_all(self) -> AllToAllOp | None:
        return next((o for o in self.body.block.ops if isinstance(o, AllToAllOp)), None)

    def verify_layouts(self) -> None:
        super().verify_layouts()
        if self.chunks.value.data < 1:
            raise _fail(
                "overlap-chunks", f"chunk count must be positive, got {self.chunks.value.data}"
            )
        # One producer (a matmul) and the collectives consuming it: what the lowering chunks.
        # (A region that dead-code elimination emptied is harmless and stays legal.)
        from coconet.dialects.coco import MatmulOp, ReshapeOp

        body = [op for op in self.body.block.ops if not isinstance(op, YieldOp)]
        producers = [op for op in body if isinstance(op, MatmulOp)]
        if len(producers) > 1:
            raise _fail(
                "overlap-producer",
                f"an overlap region holds one matmul producer, this one holds {len(producers)}",
            )
        if not producers:
            return
        self._verify_all_to_all(producers[0])
        # A fused consumer reads the matmul inside its body: count the top-level op around
        # each use.
        consumers: list[Operation] = []
        for use in producers[0].result.uses:
            user = use.operation
            while user is not None and user.parent_block() is not self.body.block:
                user = user.parent_op()
            if user is not None and user not in consumers and not isinstance(user, YieldOp):
                consumers.append(user)
        if not consumers:
            mm = producers[0]
            lhs = mm.lhs.owner
            if isinstance(lhs, ReshapeOp):
                lhs = lhs.input.owner
            rhs = mm.rhs.owner  # (the gathered weight: one matrix, passes/overlap.py)

            def gathered(op: object, exchanges: tuple[type, ...]) -> bool:
                return (
                    (isinstance(op, exchanges) or is_fused_all_gather(op))
                    and isinstance(op, Operation)
                    and op.parent_block() is self.body.block
                )

            if not gathered(lhs, (AllGatherOp, AllToAllOp)) and not gathered(rhs, (AllGatherOp,)):
                raise _fail(
                    "overlap-consumer",
                    "the matmul of an overlap region must feed a collective inside it, or "
                    "read an all_gather (either operand) or an all_to_all (or its reshape) "
                    "made inside it",
                )
            if self.all_to_all is not None:
                made = {mm, lhs, rhs, mm.lhs.owner}
                self._check_only(body, made, "the matmul and the all_to_all making its operand")
            return
        if self.all_to_all is not None:  # (a pipeline boundary's chain goes further)
            # (reached through a reshape or not)
            through = [
                use.operation
                for r in consumers
                if isinstance(r, ReshapeOp)
                for use in r.result.uses
                if use.operation.parent_block() is self.body.block
            ]
            self._check_only(
                body,
                {producers[0], *consumers, *through},
                "the matmul and the all_to_all consuming it",
            )
        via = ReshapeOp if self.all_to_all is not None else CollectiveOp
        strangers = [op for op in consumers if not isinstance(op, CollectiveOp | FusedOp | via)]
        if strangers:
            raise _fail(
                "overlap-consumer",
                "the matmul of an overlap region must feed a collective or a fused collective "
                "inside it, got " + ", ".join(op.name for op in strangers),
            )

    def _check_only(self, body: Sequence[Operation], allowed: Container[object], what: str) -> None:
        """[overlap-consumer]: an all_to_all form holds `what` and nothing else, which the
        lowering would not chunk (the fuzzer: an all_to_all round trip after an expert matmul that
        already reads an all_to_all made the lowering fail with no buffer for its result)."""
        strangers = [op for op in body if op not in allowed]
        if strangers:
            raise _fail(
                "overlap-consumer",
                f"an overlap region holds {what}, but this one also holds "
                + ", ".join(op.name for op in strangers)
                + ": compute it after the region",
            )

    def _verify_all_to_all(self, mm: Operation) -> None:
        """[overlap-dim]: an all_to_all form names its chunked dim, one the all_to_all can be
        cut along (`a2a_chunk_dims`); other forms name none."""
        a2a = self.all_to_all
        if a2a is None:
            if self.dim is not None:
                raise _fail(
                    "overlap-dim",
                    "`dim` names the chunked dim of an all_to_all; this overlap holds none",
                )
            return
        if self.dim is None:
            raise _fail(
                "overlap-dim", "an overlap of an all_to_all names the dim it chunks (`dim d`)"
            )
        d = self.dim.value.data
        legal = a2a_chunk_dims(a2a)
        if d not in legal:
            raise _fail(
                "overlap-dim",
                f"{a2a.name} of {a2a.input.type} cannot be chunked along dim {d}: chunks cut a "
                "row dim that no grid axis slices before or after it (not dim 0 of the dispatch "
                f"form); legal here: {list(legal) or 'none'}",
            )

    def check_rows_on_grid(self, grid_shape: Sequence[int]) -> None:
        """At launch: every rank's piece of the chunked value -- what one rank's collective
        handles: a reduce_scatter's result, an all_gather's input, or the whole matmul result
        an all_reduce reads -- has one size on every rank ([overlap-layout]) and at least
        `chunks` rows (the product of its dims but the last; [overlap-chunks]); the lowering
        (lowering/overlap.py `chunk_bounds`) cuts those rows into the chunks."""
        from coconet.dialects.coco import MatmulOp

        producer = next((op for op in self.body.block.ops if isinstance(op, MatmulOp)), None)
        if producer is None:
            return
        a2a = self.all_to_all
        if a2a is not None and self.dim is not None:
            # The all_to_all forms cut one dim: its extent in the smallest piece on each side.
            d, chunks = self.dim.value.data, self.chunks.value.data
            for t in (tensor_type_of(a2a.input), tensor_type_of(a2a.result)):
                parts = math.prod(grid_shape[a] for a in t.slicing_axes(d))
                if t.get_shape()[d] // parts < chunks:
                    raise _fail(
                        "overlap-chunks",
                        f"{chunks} chunks need at least {chunks} of dim {d} in each rank's "
                        f"piece of the exchanged value {t}, which has "
                        f"{t.get_shape()[d] // parts} on a grid of {list(grid_shape)} ranks: "
                        "choose fewer chunks",
                    )
            return
        piece: TensorType | None = None
        operands = {producer.lhs, producer.rhs}
        for op in self.body.block.ops:  # (a fused all_gather's result is its gather's)
            if is_fused_all_gather(op):
                operands |= {v for v, r in zip(op.yield_op.values, op.res) if r in operands}
        for op in self.walk():
            if isinstance(op, ReduceScatterOp) and op.input == producer.result:
                piece = op.result.type
            elif isinstance(op, AllGatherOp) and op.result in operands:
                piece = op.input.type
            elif isinstance(op, AllReduceOp) and op.input == producer.result:
                piece = op.result.type
            if piece is not None:
                break
        if piece is None or piece.rank < 2:
            return
        shape = piece.get_shape()
        parts = [math.prod(grid_shape[a] for a in piece.slicing_axes(d)) for d in range(piece.rank)]
        for d in range(piece.rank):
            if shape[d] % parts[d]:
                # each chunk is the same rows of every member's piece (lowering/overlap.py)
                raise _fail(
                    "overlap-layout",
                    f"the pieces of the overlapped value {piece} differ in size on a grid of "
                    f"{list(grid_shape)} ranks (dim {d} of {shape[d]} in {parts[d]} parts): "
                    "overlap chunks pieces of one size",
                )
        rows = math.prod(shape[d] // parts[d] for d in range(piece.rank - 1))
        chunks = self.chunks.value.data
        if rows < chunks:
            raise _fail(
                "overlap-chunks",
                f"{chunks} chunks need at least {chunks} rows in each rank's piece of the "
                f"overlapped value {piece}, which has {rows} on a grid of {list(grid_shape)} "
                "ranks: choose fewer chunks (or more rows per rank)",
            )


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a schedule region, handing its results out."""

    name = "comm.yield"
    values = var_operand_def(TensorType)
    traits = traits_def(IsTerminator(), HasParent(FusedOp, OverlapOp), Pure())

    assembly_format = "attr-dict ($values^ `:` type($values))?"

    def __init__(self, values: Sequence[SSAValue] = ()):
        super().__init__(operands=[list(values)])


# --------------------------------------------------------------------------------------------
# Folds the collectives publish (GatherCanonicalization, AllToAllCanonicalization)
# --------------------------------------------------------------------------------------------


def _gather_round_trip(op: Operation) -> SSAValue | None:
    """`comm.all_gather (coco.slice %x)` of `%x`'s (replicated) type -> `%x`."""
    src = op.operands[0].owner
    if isinstance(op, AllGatherOp) and isinstance(src, SliceOp):
        if src.input.type == op.result.type:
            return src.input
    return None


def _all_to_all_round_trip(op: Operation) -> SSAValue | None:
    """`comm.all_to_all (comm.all_to_all %x)` back to `%x`'s type over the same axes -> `%x`:
    the re-cut undone (the dispatch form is its own inverse)."""
    src = op.operands[0].owner
    if isinstance(op, AllToAllOp) and isinstance(src, AllToAllOp):
        if src.input.type == op.result.type and src.span() == op.span():
            return src.input
    return None


ROUND_TRIPS["comm.all_gather"] = _gather_round_trip
ROUND_TRIPS["comm.all_to_all"] = _all_to_all_round_trip


def _bits(t: Attribute) -> int:
    bits = getattr(t, "bitwidth", None)
    return bits if isinstance(bits, int) else 0


def scatter_for_sliced_all_reduce(op: AllReduceOp) -> tuple[SliceOp, int] | None:
    """(the slice, the dim) where `op`'s only reader is a `coco.slice` that cuts exactly the
    all_reduce's axes, each along one dim, as a reduce_scatter of `op`'s input along that dim
    would (ZeRO-3 written naively: reduce everything, keep a slice); else None."""
    uses = list(op.result.uses)
    if len(uses) != 1 or not isinstance(cut := uses[0].operation, SliceOp):
        return None
    src, dst = tensor_type_of(op.result), tensor_type_of(cut.result)
    span = op.span()
    grid_rank = grid_of(op).rank
    changed = [a for a in range(grid_rank) if not same_cut(src.layout_on(a), dst.layout_on(a))]
    dims = {lay.dim.data for a in changed if isinstance(lay := dst.layout_on(a), SlicedAttr)}
    if sorted(changed) != sorted(span) or len(dims) != 1:
        return None
    (dim,) = dims
    try:
        scattered = collective_result_type(
            ReduceScatterOp, tensor_type_of(op.input), span, grid_rank, dim=dim
        )
    except VerifyException:
        return None
    return (cut, dim) if scattered == dst else None


class ScatterForSlicedAllReduce(RewritePattern):
    """`coco.slice (comm.all_reduce K %x)`, the slice the all_reduce's only reader and cutting
    its axes along one dim -> `comm.reduce_scatter K %x dim D` (same axes, same `acc`): each
    rank reduces only the part it keeps, the same values, (p - 1) / p of the all_reduce's
    bytes. The reduce_scatter stands where the all_reduce did and takes the slice's name."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, AllReduceOp) or (found := scatter_for_sliced_all_reduce(op)) is None:
            return
        cut, dim = found
        props = dict(op.properties) | {"dim": IntegerAttr(dim, i64)}
        scatter = ReduceScatterOp.build(
            operands=[op.input], result_types=[cut.result.type], properties=props
        )
        scatter.result.name_hint = cut.result.name_hint or op.result.name_hint
        rewriter.insert(scatter, InsertPoint.before(op))
        rewriter.replace(cut, [], [scatter.result])
        rewriter.erase(op)


class NarrowBeforeAllToAll(RewritePattern):
    """`coco.cast (comm.all_to_all %x)` to a narrower element type, the cast its only reader
    -> `comm.all_to_all (coco.cast %x)`: moving data changes no value, so casting first gives
    the same values and moves fewer bytes (bf16 or f16 before dispatch)."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, AllToAllOp):
            return
        uses = list(op.result.uses)
        if len(uses) != 1 or not isinstance(cast := uses[0].operation, CastOp):
            return
        src, dst = op.input.type, cast.result.type
        if not _bits(dst.element_type) < _bits(src.element_type):
            return
        narrowed = CastOp(op.input, src.with_element_type(dst.element_type))
        moved = AllToAllOp.build(
            operands=[narrowed.result], result_types=[dst], properties=dict(op.properties)
        )
        rewriter.insert(narrowed, InsertPoint.before(op))
        rewriter.replace(cast, [moved])
        rewriter.erase(op)


class DissolveSpentRegion(RewritePattern):
    """A schedule region with nothing left to group dissolves: its ops move out in front of
    it and its results become what it yielded. Spent are a region holding nothing but its
    yield (it forwards outer values) and a fused region that no longer holds a collective
    (its all_to_all or reduce_scatter was dead and removed, by DCE or a fold), which would
    not verify ([fuse-one-collective]); an elementwise region holding ops stays. A yielded
    value computed inside takes the region's result name; an outer one keeps its own."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, RegionOp):
            return
        term = op.yield_op
        if term is not op.body.block.first_op and (
            not isinstance(op, FusedOp)
            or op.kind.data == FusionKind.ELEMENTWISE
            or any(isinstance(inner, CollectiveOp) for inner in op.body.walk())
        ):
            return
        # each yielded value's first result (a value may be yielded twice)
        result_of = {v: r for v, r in reversed(list(zip(term.values, op.results, strict=True)))}
        for inner in list(op.body.block.ops):
            if inner is term:
                break
            inner.detach()
            rewriter.insert(inner, InsertPoint.before(op))
            for r in inner.results:
                if r.name_hint is None and r in result_of:
                    r.name_hint = result_of[r].name_hint
        # Not `rewriter.replace`: it would hand the region's names to unnamed outer values.
        for r, v in zip(op.results, term.values, strict=True):
            rewriter.replace_all_uses_with(r, v)
        rewriter.erase(op)


Comm = Dialect(
    "comm",
    [*COLLECTIVE_OPS, FusedOp, OverlapOp, YieldOp],
    [CollectiveKindAttr, FusionKindAttr, TopologyAttr, DeferralAttr],
)

__all__ = [
    "CHAIN_ATTR_NAME",
    "DEFERRAL_ATTR_NAME",
    "SEGMENTS_ATTR_NAME",
    "SEGMENT_ATTR_NAME",
    "TABLE_READY_ATTR_NAME",
    "TOPOLOGY_ATTR_NAME",
    "AllGatherOp",
    "AllReduceOp",
    "AllToAllOp",
    "BroadcastOp",
    "CollectiveKindAttr",
    "CollectiveOp",
    "Comm",
    "Deferral",
    "DeferralAttr",
    "DissolveSpentRegion",
    "FusedOp",
    "FusionKind",
    "FusionKindAttr",
    "GroupCollectiveOp",
    "OverlapOp",
    "ReduceOp",
    "ReduceScatterOp",
    "RegionOp",
    "SendOp",
    "Topology",
    "TopologyAttr",
    "YieldOp",
    "accumulation",
    "chain_of",
    "check_acc",
    "collective_result_type",
    "deferral_of",
    "fused_reduction_problem",
    "is_fused_all_gather",
    "segment_of",
    "topology_of",
]
