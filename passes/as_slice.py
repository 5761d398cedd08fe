"""`coco-as-slice`: keep a replicated argument (optimizer state) sliced (CoCoNet's `asSlice`)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp
from xdsl.ir import BlockArgument, Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint

from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType, readable_at
from coconet.dialects.layout_rules import runs_after
from coconet.passes.common import (
    body_block,
    fail,
    find_named_args,
    functions,
    name_of,
    op_name,
)

RULE = "as-slice"


@dataclass
class _Plan:
    fn: func.FuncOp
    arg: BlockArgument
    sliced: TensorType
    slices: list[coco.SliceOp]
    update: coco.UpdateOp | None
    gather: comm.AllGatherOp | None


@dataclass(frozen=True)
class AsSlicePass(ModulePass):
    """Store a replicated function argument sliced, as ZeRO stores Adam's `m` and `v`: after
    `coco-reorder`, the argument is read only through `coco.slice`s and its update stores
    `all_gather(s)` of a slice `s`. The argument's type becomes the slices' type (the function
    signature changes: the caller now hands a sliced buffer), the slices fold to the argument,
    the update stores `s` itself, and the all_gather that only re-replicated it is erased.
    Logical values do not change, so the sim's outputs compare equal.

    Options: `ops` names the arguments (targeted); none (greedy): every argument that has a
    `coco.update` and passes the rules (read-only arguments are sliced only when named), and
    that no fused region reads (a fusion has chosen its kernel's layouts: coco-fuse computes
    a norm of a replicated argument on the chain's slices, which leaves the argument read
    only through slices -- slicing it afterwards would reschedule a fused program).

    Legality (refusals name the rule):
    * [as-slice-arg]     a named value is a (!coco.tensor) argument of a function.
    * [as-slice-uses]    every use of the argument is a `coco.slice` (or the target of its
                         update), there is at least one slice, and no slice is read after
                         the update (it would then read the overwritten buffer).
    * [as-slice-layout]  all those slices produce the same type.
    * [as-slice-update]  the update (if any) stores `comm.all_gather %s` with `%s` of exactly
                         the slices' type, `%s` not an argument whose own update runs before.
    """

    name = "coco-as-slice"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        # Each argument is planned on the IR the earlier rewrites left: folding one
        # argument's slices can leave another's update storing an all_gather of the first
        # argument itself, read after the first argument's update ([as-slice-update]).
        done: list[_Plan] = []
        if self.ops:
            named = find_named_args(op, self.ops, f"{RULE}-arg")
            refused = [
                p for p in (self._plan(fn, a) for fn, a in named) if not isinstance(p, _Plan)
            ]
            if refused:
                raise refused[0]
            for fn, a in named:
                p = self._plan(fn, a)
                if not isinstance(p, _Plan):
                    raise p
                self._rewrite(p)
                done.append(p)
        else:
            for fn in functions(op):
                for a in list(body_block(fn).args):
                    if any(_in_fused_region(use.operation) for use in a.uses):
                        continue
                    p = self._plan(fn, a)
                    if isinstance(p, _Plan) and p.update is not None:
                        self._rewrite(p)
                        done.append(p)
        # each function's signature once, after all its arguments (once per argument cost
        # the signature's length each: quadratic in a deep optimizer's state)
        for fn in dict.fromkeys(p.fn for p in done):
            fn.properties["function_type"] = FunctionType.from_lists(
                [a.type for a in fn.args], fn.function_type.outputs.data
            )
            PatternRewriter(fn).notify_op_modified(fn)

    def _plan(self, fn: func.FuncOp, arg: BlockArgument) -> _Plan | Exception:
        if not isinstance(arg.type, TensorType):
            return fail(f"{RULE}-arg", f"{name_of(arg)} is not a !coco.tensor", at=fn)
        slices: list[coco.SliceOp] = []
        update: coco.UpdateOp | None = None
        for use in arg.uses:
            user = use.operation
            if isinstance(user, coco.UpdateOp) and use.index == 0:
                update = user
            elif isinstance(user, coco.SliceOp):
                slices.append(user)
            else:
                return fail(
                    f"{RULE}-uses",
                    f"{name_of(arg)} is read by {op_name(user)}, not through a coco.slice: every "
                    "use must be a slice (run coco-reorder first)",
                    at=user,
                )
        if not slices:
            return fail(f"{RULE}-uses", f"{name_of(arg)} is never read through a coco.slice", at=fn)
        types = {s.result.type for s in slices}
        if len(types) != 1:
            return fail(
                f"{RULE}-layout",
                f"the slices of {name_of(arg)} have different types: "
                + ", ".join(sorted(map(str, types))),
                at=_second_layout(fn, slices),
            )
        (sliced,) = types
        if update is not None:
            for sl in slices:
                late = [u.operation for u in sl.result.uses if runs_after(u.operation, update)]
                if late:
                    return fail(
                        f"{RULE}-uses",
                        f"{op_name(late[0])} reads {name_of(sl.result)}, the slice of "
                        f"{name_of(arg)}, after the update of {name_of(arg)}: stored sliced, "
                        "the argument would be read after it was overwritten",
                        at=late[0],
                    )
        gather: comm.AllGatherOp | None = None
        if update is not None:
            owner = update.value.owner
            if not isinstance(owner, comm.AllGatherOp) or owner.input.type != sliced:
                what = op_name(owner) if isinstance(owner, Operation) else name_of(update.value)
                return fail(
                    f"{RULE}-update",
                    f"the update of {name_of(arg)} stores {what}, not an all_gather of a value "
                    f"of type {sliced}",
                    at=update,
                )
            if not readable_at(owner.input, update):
                return fail(
                    f"{RULE}-update",
                    f"the update of {name_of(arg)} stores the all_gather of "
                    f"{name_of(owner.input)}, an argument its own update overwrote before: "
                    "stored sliced, the update would read the overwritten buffer",
                    at=update,
                )
            gather = owner
        return _Plan(fn, arg, sliced, slices, update, gather)

    def _rewrite(self, p: _Plan) -> None:
        rewriter = PatternRewriter(InsertPoint.at_start(p.fn.body.block))
        arg = rewriter.replace_value_with_new_type(p.arg, p.sliced)
        for s in p.slices:
            # Not `replace`: it would hand the slice's name to an unnamed argument.
            rewriter.replace_all_uses_with(s.result, arg)
            rewriter.erase(s)
        if p.update is not None and p.gather is not None:
            update = p.update
            rewriter.replace_uses_with_if(
                p.gather.result, p.gather.input, lambda use: use.operation is update
            )
            if not p.gather.result.uses:
                rewriter.erase(p.gather)


def _in_fused_region(op: Operation) -> bool:
    parent = op.parent_op()
    while parent is not None:
        if isinstance(parent, comm.FusedOp):
            return True
        parent = parent.parent_op()
    return False


def _second_layout(fn: func.FuncOp, slices: list[coco.SliceOp]) -> Operation:
    """The first slice, in program order, whose type differs from the first slice's."""
    position = {op: i for i, op in enumerate(fn.walk())}
    ordered = sorted(slices, key=position.__getitem__)
    return next(s for s in ordered if s.result.type != ordered[0].result.type)
