"""`coco-canonicalize`: fold slice/all_gather and all_to_all round trips; cast before an
all_to_all where that moves fewer bytes."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.transforms.dead_code_elimination import is_trivially_dead

from coconet.dialects import coco, comm
from coconet.passes.common import fail, find_named_ops, functions, op_name, readable_at

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
    if isinstance(op, comm.AllToAllOp):
        src = op.input.owner
        if (
            isinstance(src, comm.AllToAllOp)
            and src.input.type == op.result.type
            and src.span() == op.span()
        ):
            # all_to_all(all_to_all(x)) back to x's layout over the same axes -> x: the
            # re-cut undone (the dispatch form is its own inverse)
            return src.input
    return None


class FoldLayoutRoundTrip(RewritePattern):
    """Replace a slice or all_gather that moves no data by the value it is equivalent to, and
    erase its producer once nothing reads it."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        value = _fold(op)
        if value is None:
            return
        producer = op.operands[0].owner
        # `replace` names an unnamed `value` after the folded op, keeping the program's names
        rewriter.replace(op, [], [value])
        if isinstance(producer, Operation) and is_trivially_dead(producer):
            rewriter.erase(producer)


class NarrowBeforeAllToAll(RewritePattern):
    """`coco.cast (comm.all_to_all %x)` to a narrower element type, the cast its only reader
    -> `comm.all_to_all (coco.cast %x)`: moving data changes no value, so casting first gives
    the same values and moves fewer bytes (bf16 or f16 before dispatch)."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, coco.CastOp):
            return
        a2a = op.input.owner
        if not isinstance(a2a, comm.AllToAllOp) or len(list(a2a.result.uses)) != 1:
            return
        src, dst = a2a.input.type, op.result.type
        if not _bits(dst.element_type) < _bits(src.element_type):
            return
        cast = coco.CastOp(a2a.input, src.with_element_type(dst.element_type))
        moved = comm.AllToAllOp.build(
            operands=[cast.result], result_types=[dst], properties=dict(a2a.properties)
        )
        rewriter.insert(cast, InsertPoint.before(a2a))
        rewriter.replace(op, [moved])
        rewriter.erase(a2a)


def _bits(t: Attribute) -> int:
    bits = getattr(t, "bitwidth", None)
    return bits if isinstance(bits, int) else 0


@dataclass(frozen=True)
class CanonicalizePass(ModulePass):
    """Fold layout round trips that move no data:
    * `coco.slice %x` whose type equals `%x`'s                      -> `%x`
    * `coco.slice (comm.all_gather %y)` of `%y`'s type               -> `%y`
    * `comm.all_gather (coco.slice %x)` of `%x`'s (replicated) type  -> `%x`
    * `comm.all_to_all (comm.all_to_all %x)` of `%x`'s type, over the same axes -> `%x`
    and moves a narrowing cast that alone reads an all_to_all before it (fewer bytes moved,
    the same values).
    A fold's producer is erased once nothing reads it. Ops inside regions fold too. A fold to
    a function argument is skipped where a reader runs after the argument's update (it would
    read the overwritten buffer).

    Options: `ops` names the ops to fold (targeted: each must fold, else
    [canonicalize-fold] refuses); none: every op, to a fixpoint (greedy).
    """

    name = "coco-canonicalize"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FoldLayoutRoundTrip()
        if not self.ops:
            both = GreedyRewritePatternApplier([pattern, NarrowBeforeAllToAll()])
            for fn in functions(op):
                PatternRewriteWalker(both).rewrite_region(fn.body)
            return
        sites = [s for _, s in find_named_ops(op, self.ops, f"{RULE}-fold", "op")]
        for s in sites:
            if _fold(s) is None:
                raise fail(
                    f"{RULE}-fold",
                    f"{op_name(s)} is not a foldable slice/all_gather or all_to_all round trip",
                    at=s,
                )
        for s in sites:
            pattern.match_and_rewrite(s, PatternRewriter(s))
