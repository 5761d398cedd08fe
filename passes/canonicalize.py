"""`coco-canonicalize`: fold slice/all_gather and all_to_all round trips; cast before an
all_to_all where that moves fewer bytes; reduce-scatter what an all_reduce's only reader
slices. The patterns are the ops' own (their
canonicalization traits, dialects/coco.py and comm.py), so xDSL's `canonicalize` applies them
too; this pass applies only them, and can target ops by name."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
)

from coconet.dialects.coco import FoldRoundTrip, round_trip
from coconet.dialects.comm import (
    AllReduceOp,
    DissolveSpentRegion,
    NarrowBeforeAllToAll,
    ScatterForSlicedAllReduce,
    scatter_for_sliced_all_reduce,
)
from coconet.passes.common import fail, find_named_ops, functions, op_name

RULE = "canonicalize"


@dataclass(frozen=True)
class CanonicalizePass(ModulePass):
    """Fold layout round trips that move no data:
    * `coco.slice %x` whose type equals `%x`'s                      -> `%x`
    * `coco.slice (comm.all_gather %y)` of `%y`'s type               -> `%y`
    * `comm.all_gather (coco.slice %x)` of `%x`'s (replicated) type  -> `%x`
    * `comm.all_to_all (comm.all_to_all %x)` of `%x`'s type, over the same axes -> `%x`
    * `coco.slice (comm.all_reduce K %x)`, the all_reduce's only reader, cutting its axes
      as a reduce_scatter would                                       -> `comm.reduce_scatter K %x`
    and moves a narrowing cast that alone reads an all_to_all before it (fewer bytes moved,
    the same values), and dissolves a fused region whose collective is gone (dead, removed):
    its other ops move out in front of it.
    A fold's producer is erased once nothing reads it. Ops inside regions fold too. A fold to
    a function argument is skipped where a reader runs after the argument's update (it would
    read the overwritten buffer).

    Options: `ops` names the ops to fold (targeted: each must fold, else
    [canonicalize-fold] refuses); none: every op, to a fixpoint (greedy).
    """

    name = "coco-canonicalize"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FoldRoundTrip()
        if not self.ops:
            both = GreedyRewritePatternApplier(
                [
                    pattern,
                    NarrowBeforeAllToAll(),
                    ScatterForSlicedAllReduce(),
                    DissolveSpentRegion(),
                ]
            )
            for fn in functions(op):
                PatternRewriteWalker(both).rewrite_region(fn.body)
            return
        sites = [s for _, s in find_named_ops(op, self.ops, f"{RULE}-fold", "op")]
        scatter = ScatterForSlicedAllReduce()
        for s in sites:
            sliced = isinstance(s, AllReduceOp) and scatter_for_sliced_all_reduce(s) is not None
            if not sliced and round_trip(s) is None:
                raise fail(
                    f"{RULE}-fold",
                    f"{op_name(s)} is not a foldable slice/all_gather or all_to_all round trip, "
                    "nor an all_reduce whose only reader slices it as a reduce_scatter would",
                    at=s,
                )
        for s in sites:
            (scatter if isinstance(s, AllReduceOp) else pattern).match_and_rewrite(
                s, PatternRewriter(s)
            )
