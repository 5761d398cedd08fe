"""`coco-canonicalize`: fold slice/all_gather round trips."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from coconet.dialects import coco, comm
from coconet.passes.common import (
    erase_if_dead,
    fail,
    find_named_ops,
    functions,
    op_name,
    readable_at,
)

RULE = "canonicalize"


def _fold(op: Operation) -> SSAValue | None:
    """The value `op` is equivalent to, if one of the folds applies and every reader of `op`
    may read that value where it stands (not an argument after its update)."""
    value = _equivalent(op)
    if value is None:
        return None
    if not all(readable_at(value, use.operation) for use in op.results[0].uses):
        return None
    return value


def _equivalent(op: Operation) -> SSAValue | None:
    if isinstance(op, coco.SliceOp):
        if op.input.type == op.result.type:
            return op.input  # slice that cuts nothing
        src = op.input.owner
        if isinstance(src, comm.AllGatherOp) and src.input.type == op.result.type:
            return src.input  # slice(all_gather(y)) -> y
    if isinstance(op, comm.AllGatherOp):
        src = op.input.owner
        if isinstance(src, coco.SliceOp) and src.input.type == op.result.type:
            return src.input  # all_gather(slice(x)) -> x, x replicated
    return None


@dataclass(frozen=True)
class CanonicalizePass(ModulePass):
    """Fold layout round trips that move no data:
    * `coco.slice %x` whose type equals `%x`'s                      -> `%x`
    * `coco.slice (comm.all_gather %y)` of `%y`'s type               -> `%y`
    * `comm.all_gather (coco.slice %x)` of `%x`'s (replicated) type  -> `%x`
    A fold's producer is erased once nothing reads it. Ops inside regions fold too. A fold to
    a function argument is skipped where a reader runs after the argument's update (it would
    read the overwritten buffer).

    Options: `ops` names the ops to fold (targeted: each must fold, else
    [canonicalize-fold] refuses); none: every op, to a fixpoint (greedy).
    """

    name = "coco-canonicalize"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.ops:
            sites = [s for _, s in find_named_ops(op, self.ops, f"{RULE}-fold", "op")]
            for s in sites:
                if _fold(s) is None:
                    raise fail(f"{RULE}-fold", f"{op_name(s)} is not a foldable slice/all_gather round trip")
            for s in sites:
                self._replace(s)
            return
        changed = True
        while changed:
            changed = False
            for fn in functions(op):
                for o in list(fn.walk()):
                    if o.parent is not None and _fold(o) is not None:
                        self._replace(o)
                        changed = True

    def _replace(self, op: Operation) -> None:
        value = _fold(op)
        assert value is not None
        producer = op.operands[0].owner
        name = op.results[0].name_hint
        op.results[0].replace_all_uses_with(value)
        if value.name_hint is None:
            value.name_hint = name
        op.detach()
        op.erase()
        if isinstance(producer, Operation) and producer.parent is not None:
            erase_if_dead(producer)
