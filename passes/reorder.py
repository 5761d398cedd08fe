"""`coco-reorder`: move elementwise computation that consumes an all_gather before it, onto
the slices (CoCoNet's `reorder(comps, ag)`)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint
from xdsl.utils.exceptions import PassFailedException, VerifyException

from coconet.dialects import coco, comm
from coconet.dialects.coco import (
    LocalAttr,
    ReplicatedAttr,
    SlicedAttr,
    TensorType,
    readable_at,
    tensor_type_of,
)
from coconet.dialects.coco_types import nest_layouts, remember, same_cut
from coconet.dialects.layout_rules import (
    grid_of,
    infer_dim_reduction,
    infer_elementwise,
    infer_reduction,
    infer_scaled,
)
from coconet.dialects.reduction import FULL, Reduction
from coconet.passes.common import (
    ancestor_in,
    body_block,
    combine_partials,
    derived_name,
    fail,
    find_named_ops,
    finish_partials,
    functions,
    grid_rank,
    name_of,
    op_name,
    partial_reduction,
    replace_operand,
    set_name,
)

RULE = "reorder"


class _BlockOrder:
    """Where each op of a block stands, numbered once per pass run. Plans visit only the ops
    that read planned values (a heap ordered by position), so a block's many gathers do not
    each rescan it: a deep stack's reorder stays linear. The rewrite only inserts and erases
    ops, never moves one, so the numbers keep their order; an op inserted since is placed
    after the nearest numbered op before it."""

    def __init__(self, block: Block):
        self._position = {op: i for i, op in enumerate(block.ops)}

    def key(self, op: Operation) -> tuple[int, int]:
        inserted_since = 0
        o = op
        while o is not None and o not in self._position:
            o = o.prev_op
            inserted_since += 1
        return (self._position[o] if o is not None else -1, inserted_since)


class _OrderedOps:
    """A work list of a block's ops that yields each op once, in program order (or latest
    first), whenever it was added."""

    def __init__(self, order: _BlockOrder, block: Block, latest_first: bool):
        self._order = order
        self._block = block
        self._sign = -1 if latest_first else 1
        self._heap: list[tuple[int, int, int, Operation]] = []
        self._added: set[Operation] = set()

    def add(self, op: Operation) -> None:
        if op in self._added or op.parent_block() is not self._block:
            return
        self._added.add(op)
        position, inserted_since = self._order.key(op)
        s = self._sign
        heapq.heappush(self._heap, (s * position, s * inserted_since, len(self._added), op))

    def add_users(self, v: SSAValue) -> None:
        for use in v.uses:
            self.add(use.operation)

    def add_writer(self, v: SSAValue) -> None:
        if isinstance(v.owner, Operation):
            self.add(v.owner)

    def pop(self) -> Operation | None:
        return heapq.heappop(self._heap)[3] if self._heap else None


@dataclass
class _Plan:
    """What one reorder across one all_gather will do; built without touching the IR."""

    ag: comm.AllGatherOp
    span: tuple[int, ...]
    order: _BlockOrder
    # moved elementwise ops (downstream of the gather, or pulled up because they only feed
    # moved ops), and the type each result will have
    moved: dict[Operation, TensorType] = field(default_factory=dict)
    # values whose new (sliced) type is planned: the gather's result and moved results
    planned: dict[SSAValue, TensorType] = field(default_factory=dict)
    # (op, operand index) -> the sliced type that operand needs from a `coco.slice`
    demands: dict[tuple[Operation, int], TensorType] = field(default_factory=dict)
    reductions: list[coco.ReduceOp] = field(default_factory=list)


def _layouts_len(*types: TensorType, span: tuple[int, ...] = ()) -> int:
    return max([len(t.layouts) for t in types] + [max(span, default=-1) + 1])


def _slice_type(vt: TensorType, result: TensorType, span: tuple[int, ...]) -> TensorType:
    """The type an operand of type `vt` takes so that it lines up, by broadcasting, with a
    result of type `result`: sliced wherever the result is sliced on a spanned axis and the
    operand is replicated there and really spans the sliced dim (not broadcast along it).
    Remembered by its arguments: a deep program's layers ask the same few."""
    key = (vt, result, span)
    got = _SLICE_TYPES.get(key)
    if got is None:
        got = remember(_SLICE_TYPES, key, _sliced_like(vt, result, span))
    return got


_SLICE_TYPES: dict[tuple[TensorType, TensorType, tuple[int, ...]], TensorType] = {}


def _sliced_like(vt: TensorType, result: TensorType, span: tuple[int, ...]) -> TensorType:
    n = _layouts_len(vt, result, span=span)
    lays = [vt.layout_on(a) for a in range(n)]
    gap = result.rank - vt.rank
    for a in span:
        r = result.layout_on(a)
        if not (isinstance(r, SlicedAttr) and isinstance(lays[a], ReplicatedAttr)):
            continue
        d = r.dim.data - gap
        if d >= 0 and vt.get_shape()[d] == result.get_shape()[r.dim.data]:
            lays[a] = SlicedAttr(d)
    # A slice cuts each rank's piece: its cuts nest inside the operand's.
    return vt.with_layouts(nest_layouts(vt, lays))


def _gather_axes(new: TensorType, old: TensorType, span: tuple[int, ...]) -> list[int] | None:
    """The spanned axes an all_gather must cover to take `new` back to `old`; None if no
    all_gather can (the layouts differ off the span, or not as sliced -> replicated)."""
    axes: list[int] = []
    for a in range(_layouts_len(new, old, span=span)):
        ln, lo = new.layout_on(a), old.layout_on(a)
        if same_cut(ln, lo):
            continue
        if a in span and isinstance(ln, SlicedAttr) and isinstance(lo, ReplicatedAttr):
            axes.append(a)
            continue
        return None
    return axes


class _Refusal(Exception):
    def __init__(self, rule: str, message: str, op: Operation | None = None):
        super().__init__(message)
        self.rule = rule
        self.message = message
        self.op = op

    def exception(self) -> PassFailedException:
        return fail(self.rule, self.message, at=self.op)


@dataclass(frozen=True)
class ReorderPass(ModulePass):
    """Move elementwise computation that consumes `%X = comm.all_gather %x over A` before the
    gather, onto slices: the moved ops read `%x` instead of `%X`, their replicated tensor
    operands read a `coco.slice` (this rank's part, no communication; a slice of an
    all_gather's result folds to the gather's input), rank-0 operands stay as they are, and
    result layouts are re-inferred (they become sliced on A). Each moved value still used
    outside the moved set (by another op, a region, `func.return`, or the `coco.update` of a
    replicated argument) gets a new `comm.all_gather` right after it, and those uses read it.
    The old gather is erased once nothing reads it.

    Names: a moved value `%v` becomes `%v_s` (it now holds this rank's slice) and the new
    gather takes the name `%v`, so outside readers and the program's output names stay; the
    slice of an operand `%w` is `%w_s`; a moved reduction keeps its name for its final value.

    Moved set:
    * targeted by gather (`ops` names all_gathers) and greedy (no `ops`: every all_gather of
      a function body, in program order): the maximal legal set, i.e. every elementwise op
      (coco.ElementwiseOp: arithmetic, cmp, select, cast, dropout) of the same block reading
      the gather or a moved value, whose operands pass the rules below; then, pulled up, every
      elementwise op whose results are read only by moved ops (so `beta1 * %m` is computed on
      the slice of `%m`, and `%m` is then read only through a slice, which `coco-as-slice`
      needs). Ops the rules refuse are left in place and read the re-gathered value.
    * targeted by computations (`ops` names elementwise/reduce ops): exactly those; they must
      consume exactly one all_gather, directly or through each other, or feed only named ops.

    Reductions (`coco.reduce`) of a moved value move too: `sum`/`max`/`min` become this rank's
    partial reduction (a `local` scalar) and a `comm.all_reduce` of the same kind over the
    gather's axes; `norm` becomes `sqrt(all_reduce sum(sum(x * x)))`. Their results are the
    same replicated scalars as before (the order of the sum changes, so compare with a
    tolerance), and they do not propagate slicing further.

    Row reductions (`coco.reduce_dims`) of a moved value move like elementwise ops when the
    gather's slices cut only dims they keep (each rank reduces whole rows of its slice, in
    the same order: bit-identical); their results are sliced like their input.

    Dropout stays exact: its mask is keyed on global element indices.

    Legality (refusals name the rule; greedy mode skips what they refuse):
    * [reorder-gather]      named ops are all_gathers or computations; computations consume
                            exactly one all_gather.
    * [reorder-elementwise] a moved op is elementwise (or a sum/max/min/norm reduction).
    * [reorder-row-reduction] a moved row reduction keeps the dims the gather's slices cut.
    * [reorder-local]       no operand of a moved op is `local` on an axis the gather spans.
    * [reorder-layouts]     the sliced operands combine by the layout rules, and a moved
                            result goes back to its old type by an all_gather.
    * [reorder-block]       moved ops sit in the gather's block (not inside a region).
    * [reorder-connected]   every named computation reads the gather or a moved value, or
                            feeds only moved ops.
    * [reorder-nothing]     a named gather has at least one movable consumer.
    * [reorder-update]      a moved op does not run after the update of the argument the
                            gather gathers (it would read the overwritten buffer).
    """

    name = "coco-reorder"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if not self.ops:
            for fn in functions(op):
                order = _BlockOrder(body_block(fn))
                for ag in [o for o in body_block(fn).ops if isinstance(o, comm.AllGatherOp)]:
                    if ag.parent is None:
                        continue
                    plan = self._plan_maximal(ag, order)
                    if plan is not None and (plan.moved or plan.reductions):
                        self._rewrite(fn, plan)
            return
        sites = find_named_ops(op, self.ops, f"{RULE}-gather", "op")
        for _, s in sites:
            if isinstance(s, comm.CollectiveOp) and not isinstance(s, comm.AllGatherOp):
                raise fail(
                    f"{RULE}-gather",
                    f"{op_name(s)} is not a comm.all_gather: reorder moves computation across "
                    "an all_gather (split an all_reduce first)",
                    at=s,
                )
        gathers = [(fn, s) for fn, s in sites if isinstance(s, comm.AllGatherOp)]
        comps = [(fn, s) for fn, s in sites if not isinstance(s, comm.AllGatherOp)]
        try:
            if comps:
                fn, plan = self._plan_exact(comps, gathers)
                self._rewrite(fn, plan)
                return
            orders = {fn: _BlockOrder(body_block(fn)) for fn in {fn for fn, _ in gathers}}
            for fn, ag in gathers:  # check every request before changing anything
                self._check_movable(ag, orders[fn])
        except _Refusal as r:
            raise r.exception() from None
        for fn, ag in gathers:
            # re-plan on the current IR: an earlier gather's reorder may have moved ops that
            # also read this one
            if ag.parent is None:
                continue
            plan = self._plan_maximal(ag, orders[fn])
            if plan is not None:
                self._rewrite(fn, plan)

    # -- planning ------------------------------------------------------------------------

    def _new_plan(self, ag: comm.AllGatherOp, order: _BlockOrder) -> _Plan:
        plan = _Plan(ag, ag.span(), order)
        plan.planned[ag.result] = ag.input.type
        return plan

    def _plan_forward(self, plan: _Plan, u: Operation) -> tuple[TensorType, dict[int, TensorType]]:
        """The new result type of a downstream op `u` and the slices its operands need."""
        if isinstance(u, coco.ReduceDimsOp):
            return self._plan_row_reduction(plan, u), {}
        if not isinstance(u, coco.ElementwiseOp):
            raise _Refusal(
                f"{RULE}-elementwise",
                f"{op_name(u)} reads {self._moved_operand_name(plan, u)} but is not elementwise: "
                "only elementwise ops (and sum/max/min/norm reductions) commute with an all_gather",
                u,
            )
        self._check_operands(plan, u)
        self._check_readable(plan, u)
        types = [plan.planned.get(v, tensor_type_of(v)) for v in u.operands]
        result = self._infer(u, types)
        demands: dict[int, TensorType] = {}
        for i, v in enumerate(u.operands):
            if v in plan.planned or tensor_type_of(v).rank == 0:
                continue
            st = _slice_type(tensor_type_of(v), result, plan.span)
            if st != v.type:
                demands[i] = st
                types[i] = st
        if self._infer(u, types) != result:
            raise _Refusal(
                f"{RULE}-layouts",
                f"the sliced operands of {op_name(u)} do not line up with its sliced result",
                u,
            )
        self._check_regather(u, result, plan)
        return result, demands

    def _plan_row_reduction(self, plan: _Plan, u: coco.ReduceDimsOp) -> TensorType:
        """A row reduction moves onto slices that cut only dims it keeps: each rank then
        reduces whole rows of its slice, in the same order as before (bit-identical)."""
        self._check_readable(plan, u)
        x = plan.planned[u.input]
        for a in plan.span:
            lay = x.layout_on(a)
            if isinstance(lay, SlicedAttr) and lay.dim.data in u.reduced_dims:
                raise _Refusal(
                    f"{RULE}-row-reduction",
                    f"{op_name(u)} reduces dim {lay.dim.data}, which the slices of "
                    f"{op_name(plan.ag)} cut (grid axis {a}): on slices it would see part "
                    "rows only; reorder moves a row-wise op onto slices of the dims it keeps "
                    "(split the all_reduce along another dim)",
                    u,
                )
        try:
            result = infer_dim_reduction(u.kind.data, x, u.reduced_dims, u.keeps_dims)
        except VerifyException as e:
            raise _Refusal(f"{RULE}-layouts", f"{op_name(u)} on slices: {e}", u) from None
        self._check_regather(u, result, plan)
        return result

    def _check_readable(self, plan: _Plan, u: Operation) -> None:
        x = plan.ag.input
        if plan.ag.result in u.operands and not readable_at(x, u):
            raise _Refusal(
                f"{RULE}-update",
                f"{op_name(u)} runs after the update of {name_of(x)}: reading the slice "
                f"{name_of(x)} instead of {op_name(plan.ag)} would read the overwritten buffer",
                u,
            )

    def _moved_operand_name(self, plan: _Plan, u: Operation) -> str:
        for v in u.operands:
            if v in plan.planned:
                return name_of(v)
        return "a moved value"

    def _check_operands(self, plan: _Plan, u: Operation) -> None:
        for v in u.operands:
            if v in plan.planned or not isinstance(v.type, TensorType):
                continue
            for a in plan.span:
                if isinstance(v.type.layout_on(a), LocalAttr):
                    raise _Refusal(
                        f"{RULE}-local",
                        f"{op_name(u)} reads {name_of(v)} : {v.type}, which is local on grid "
                        f"axis {a}: a per-rank value cannot be sliced, so {op_name(u)} cannot "
                        "move before the all_gather",
                        u,
                    )

    def _infer(self, u: Operation, types: list[TensorType]) -> TensorType:
        old = tensor_type_of(u.results[0])
        try:
            if isinstance(u, coco.ScaleOp):  # its scale may hold one value per block
                inferred = infer_scaled(types[0], types[1], op_name=u.name, grid=grid_of(u))
            else:
                inferred = infer_elementwise(types, same_element_type=False)
        except VerifyException as e:
            raise _Refusal(
                f"{RULE}-layouts",
                f"on slices, the operands of {op_name(u)} do not combine: {e}",
                u,
            ) from None
        return old.with_layouts(inferred.layouts.data)

    def _check_regather(self, u: Operation, new: TensorType, plan: _Plan) -> None:
        old = tensor_type_of(u.results[0])
        if _gather_axes(new, old, plan.span) is None:
            raise _Refusal(
                f"{RULE}-layouts",
                f"{op_name(u)} would produce {new}, which no all_gather over the gather's axes "
                f"takes back to its type {old}",
                u,
            )

    def _plan_reduction(self, plan: _Plan, r: coco.ReduceOp) -> None:
        if r.kind.data not in FULL:
            raise _Refusal(
                f"{RULE}-elementwise", f"{op_name(r)}: unknown reduction '{r.kind.data}'", r
            )
        self._check_readable(plan, r)
        x = plan.planned[r.input]
        if x == r.input.type:
            return  # the input's layout does not change: the reduction stays as it is
        kind = Reduction.SUM if r.kind.data == Reduction.NORM else r.kind.data
        try:
            part = infer_reduction(kind, x)
        except VerifyException as e:
            raise _Refusal(f"{RULE}-layouts", f"{op_name(r)} on slices: {e}", r) from None
        old: TensorType = r.result.type
        for a in range(_layouts_len(part, old, span=plan.span)):
            lp, lo = part.layout_on(a), old.layout_on(a)
            if lp != lo and not (
                a in plan.span and isinstance(lp, LocalAttr) and isinstance(lo, ReplicatedAttr)
            ):
                raise _Refusal(
                    f"{RULE}-layouts",
                    f"{op_name(r)}: the partial result {part} does not all_reduce back to {old}",
                    r,
                )
        plan.reductions.append(r)

    def _add_forward(self, plan: _Plan, u: Operation) -> None:
        result, demands = self._plan_forward(plan, u)
        plan.moved[u] = result
        plan.planned[u.results[0]] = result
        for i, t in demands.items():
            plan.demands[(u, i)] = t

    def _pull_type(self, plan: _Plan, p: Operation) -> TensorType | None:
        """The single sliced type every use of `p`'s result asks for, if all uses are
        demands of moved ops (else None)."""
        v = p.results[0] if len(p.results) == 1 else None
        if v is None or tensor_type_of(v).rank == 0 or not v.uses:
            return None
        wanted: set[TensorType] = set()
        for use in v.uses:
            t = plan.demands.get((use.operation, use.index))
            if t is None:
                return None
            wanted.add(t)
        return wanted.pop() if len(wanted) == 1 else None

    def _plan_pull(self, plan: _Plan, p: Operation, target: TensorType) -> dict[int, TensorType]:
        if not isinstance(p, coco.ElementwiseOp):
            raise _Refusal(f"{RULE}-elementwise", f"{op_name(p)} is not elementwise", p)
        self._check_operands(plan, p)
        types: list[TensorType] = []
        demands: dict[int, TensorType] = {}
        for i, v in enumerate(p.operands):
            vt = tensor_type_of(v)
            if vt.rank == 0:
                types.append(vt)
                continue
            st = _slice_type(vt, target, plan.span)
            if st != v.type:
                demands[i] = st
            types.append(st)
        if self._infer(p, types) != target:
            raise _Refusal(
                f"{RULE}-layouts",
                f"{op_name(p)} cannot compute the slice {target} from slices",
                p,
            )
        return demands

    def _add_pull(self, plan: _Plan, p: Operation, target: TensorType) -> None:
        demands = self._plan_pull(plan, p, target)
        v = p.results[0]
        for use in list(v.uses):
            plan.demands.pop((use.operation, use.index), None)
        plan.moved[p] = target
        plan.planned[v] = target
        for i, t in demands.items():
            plan.demands[(p, i)] = t

    def _plan_downstream(self, plan: _Plan, block: Block, check_only: bool) -> _Refusal | None:
        """Plan, in program order, each op of the block that reads a planned value (the
        gather's result, then moved results); returns the first refusal. `check_only` stops
        at the first op that moves: enough to know the gather has a movable consumer."""
        first_refusal: _Refusal | None = None
        readers = _OrderedOps(plan.order, block, latest_first=False)
        readers.add_users(plan.ag.result)
        while (u := readers.pop()) is not None:
            if check_only and (plan.moved or plan.reductions):
                break
            if isinstance(u, coco.UpdateOp | func.ReturnOp):
                continue
            try:
                if isinstance(u, coco.ReduceOp):
                    self._plan_reduction(plan, u)
                else:
                    self._add_forward(plan, u)
                    readers.add_users(u.results[0])
            except _Refusal as r:
                first_refusal = first_refusal or r
        return first_refusal

    def _plan_maximal(self, ag: comm.AllGatherOp, order: _BlockOrder) -> _Plan | None:
        """The maximal plan of `ag` (None if nothing moves)."""
        plan = self._new_plan(ag, order)
        block = ag.parent_block()
        assert block is not None
        self._plan_downstream(plan, block, check_only=False)
        if not (plan.moved or plan.reductions):
            return None
        self._pull_maximal(plan, block)
        return plan

    def _check_movable(self, ag: comm.AllGatherOp, order: _BlockOrder) -> None:
        """Refuse a named gather that nothing can move before. Only up to the first op that
        moves: planning every named gather in full before rewriting any would re-plan a
        residual stream once per gather (quadratic in a deep stack)."""
        plan = self._new_plan(ag, order)
        block = ag.parent_block()
        assert block is not None
        first_refusal = self._plan_downstream(plan, block, check_only=True)
        if plan.moved or plan.reductions:
            return
        if first_refusal is not None:
            raise first_refusal
        nested = [
            use.operation for use in ag.result.uses if use.operation.parent_block() is not block
        ]
        if nested:
            raise _Refusal(
                f"{RULE}-block",
                f"{op_name(ag)} is read only inside a region ({nested[0].name}); reorder "
                "moves ops of the gather's own block",
                ag,
            )
        raise _Refusal(
            f"{RULE}-nothing", f"{op_name(ag)} has no elementwise consumer to move before it", ag
        )

    def _pull_maximal(self, plan: _Plan, block: Block) -> None:
        """Pull up, latest first, every op whose results only moved ops read (through the
        slices they demand): only the writers of demanded operands can qualify."""
        writers = _OrderedOps(plan.order, block, latest_first=True)
        for u, i in plan.demands:
            writers.add_writer(u.operands[i])
        while (p := writers.pop()) is not None:
            if p in plan.moved or p is plan.ag:
                continue
            target = self._pull_type(plan, p)
            if target is None:
                continue
            try:
                self._add_pull(plan, p, target)
            except _Refusal:
                continue
            for v in p.operands:
                writers.add_writer(v)

    def _plan_exact(
        self,
        comps: list[tuple[func.FuncOp, Operation]],
        gathers: list[tuple[func.FuncOp, comm.AllGatherOp]],
    ) -> tuple[func.FuncOp, _Plan]:
        fns = {fn for fn, _ in comps} | {fn for fn, _ in gathers}
        if len(fns) != 1:
            raise _Refusal(f"{RULE}-gather", "the named ops are in different functions")
        fn = comps[0][0]
        block = body_block(fn)
        named = {c for _, c in comps}
        for c in named:
            if not isinstance(c, coco.ElementwiseOp | coco.ReduceOp | coco.ReduceDimsOp):
                raise _Refusal(
                    f"{RULE}-elementwise",
                    f"{op_name(c)} is not elementwise: only elementwise ops (and sum/max/min/norm "
                    "reductions) commute with an all_gather",
                    c,
                )
        # the gather: the one all_gather a named op reads
        read = {v.owner for c in named for v in c.operands if isinstance(v.owner, comm.AllGatherOp)}
        named_gathers = {g for _, g in gathers}
        if len(read) != 1 or (named_gathers and named_gathers != read):
            found = ", ".join(sorted(op_name(g) for g in read)) or "none"
            raise _Refusal(
                f"{RULE}-gather",
                "the named computations must read exactly one all_gather (the one named, if "
                f"any); they read: {found}",
                comps[0][1],  # reported at the first of them
            )
        (ag,) = read
        plan = self._new_plan(ag, _BlockOrder(block))
        ops = list(block.ops)
        upstream: list[Operation] = []
        for u in ops:
            if u not in named:
                continue
            if not any(v in plan.planned for v in u.operands):
                upstream.append(u)
                continue
            if isinstance(u, coco.ReduceOp):
                self._plan_reduction(plan, u)
            else:
                self._add_forward(plan, u)
        for p in reversed(upstream):
            target = self._pull_type(plan, p)
            if target is None:
                raise _Refusal(
                    f"{RULE}-connected",
                    f"{op_name(p)} neither reads {op_name(ag)} (or a moved value) nor feeds only "
                    "moved ops",
                    p,
                )
            self._add_pull(plan, p, target)
        return fn, plan

    # -- rewriting -----------------------------------------------------------------------

    def _rewrite(self, fn: func.FuncOp, plan: _Plan) -> None:
        block = body_block(fn)
        rank = grid_rank(fn)
        ag = plan.ag
        x = ag.input
        order = plan.order.key
        touched = set(plan.moved) | set(plan.reductions)
        rewriter = PatternRewriter(ag)

        # 1. the slices (one per value and type, before its first reader; a slice of an
        #    all_gather's result folds to the gather's input)
        slices: dict[tuple[SSAValue, TensorType], SSAValue] = {}
        folded: set[comm.AllGatherOp] = set()
        readers_of: dict[tuple[SSAValue, TensorType], list[Operation]] = {}
        for (u, i), t in plan.demands.items():
            readers_of.setdefault((u.operands[i], t), []).append(u)
        for (u, i), t in sorted(plan.demands.items(), key=lambda kv: order(kv[0][0])):
            v = u.operands[i]
            key = (v, t)
            if key not in slices:
                owner = v.owner
                readers = readers_of[key]
                if (
                    isinstance(owner, comm.AllGatherOp)
                    and owner.input.type == t
                    and all(readable_at(owner.input, r) for r in readers)
                ):
                    slices[key] = owner.input
                    folded.add(owner)
                else:
                    s = coco.SliceOp(v, t)
                    set_name(s.result, derived_name(v, "s"))
                    rewriter.insert(s, InsertPoint.before(u))
                    slices[key] = s.result
            replace_operand(rewriter, u, i, slices[key])

        # 2. moved ops read the slices; results take their sliced types; outside readers get
        #    a new all_gather
        if plan.moved and x.name_hint is None:
            x.name_hint = ag.result.name_hint  # as replace_uses_with_if carries it over
        for u in sorted(plan.moved, key=order):
            for i, v in enumerate(u.operands):
                if v is ag.result:
                    replace_operand(rewriter, u, i, x)
            old = u.results[0]
            old_type = tensor_type_of(old)
            new_type = plan.moved[u]
            if new_type == old_type:
                continue
            name = old.name_hint
            new = rewriter.replace_value_with_new_type(old, new_type)
            new.name_hint = f"{name}_s" if name else None
            outside = {
                (use.operation, use.index)
                for use in new.uses
                if ancestor_in(block, use.operation) not in touched
            }
            if not outside:
                continue
            axes = _gather_axes(new_type, old_type, plan.span)
            assert axes is not None
            ag_axes = None if (axes == list(range(rank)) and ag.axes is None) else axes
            gather = comm.AllGatherOp(new, ag_axes, grid_rank=rank)
            set_name(gather.result, name)
            rewriter.insert(gather, InsertPoint.after(u))
            rewriter.replace_uses_with_if(
                new,
                gather.result,
                lambda use, outside=outside: (use.operation, use.index) in outside,
            )

        # 3. reductions become partial reductions + all_reduce
        for r in plan.reductions:
            x_r = x if r.input is ag.result else r.input
            self._rewrite_reduction(rewriter, r, x_r, rank, plan)

        # 4. gathers nothing reads any more
        for g in (ag, *folded):
            if g.parent is not None and not g.result.uses:
                rewriter.erase(g)

    def _rewrite_reduction(
        self, rewriter: PatternRewriter, r: coco.ReduceOp, x: SSAValue, rank: int, plan: _Plan
    ) -> None:
        new_ops, part = partial_reduction(r, x)
        old: TensorType = r.result.type
        axes = [
            a
            for a in plan.span
            if isinstance(part.result.type.layout_on(a), LocalAttr)
            and isinstance(old.layout_on(a), ReplicatedAttr)
        ]
        ar_axes = None if (axes == list(range(rank)) and plan.ag.axes is None) else axes
        ar = combine_partials(r, part.result, ar_axes, rank)
        finish = finish_partials(r, ar.result)
        new_ops += [ar, *finish]
        final = new_ops[-1].results[0]
        # the final value takes the reduction's name: readers and output names stay
        rewriter.replace(r, new_ops, [final])
