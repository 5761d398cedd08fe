"""`coco-dce`: dead-code elimination that keeps the program's side effects.

The effects are xDSL's: `coco.update` declares its write (`coco.WritesTarget`), schedule
regions have their bodies' effects (`RecursiveMemoryEffect`), every other coco/comm op is
`Pure`, and an op of another dialect without effect traits is assumed to have effects. So
xDSL's own `dce` and `canonicalize` already erase what nobody reads. This pass is kept for
what they do not do with coco's schedule regions, whose results a region op hands out for its
body: drop the results nobody reads (so the ops computing them die inside the region), and
dissolve a region left with nothing to group (`comm.DissolveSpentRegion`: nothing but its
yield, or a fused region whose collective died). It also keeps the
targeted form (`ops=...`), which refuses [dce-live] to erase a live op.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import Rewriter
from xdsl.transforms.dead_code_elimination import is_trivially_dead

from coconet.dialects import comm
from coconet.dialects.comm import DissolveSpentRegion
from coconet.passes.common import fail, find_named_ops, has_side_effects, op_name

RULE = "dce"


class PruneRegionResults(RewritePattern):
    """Drop the results of a schedule region nobody reads, and their yields."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: comm.RegionOp, rewriter: PatternRewriter) -> None:
        keep = [i for i, r in enumerate(op.results) if r.uses]
        if len(keep) == len(op.results):
            return
        old_yield = op.yield_op
        new_yield = comm.YieldOp([old_yield.values[i] for i in keep])
        new_yield.attributes |= old_yield.attributes
        rewriter.replace(old_yield, new_yield)
        # A result cannot be removed in place: build the region op anew around the body.
        new = type(op).create(
            result_types=[op.results[i].type for i in keep],
            properties=dict(op.properties),
            attributes=dict(op.attributes),
            regions=[rewriter.move_region_contents_to_new_regions(op.body)],
        )
        new_results: list[SSAValue | None] = [None] * len(op.results)
        for i, r in zip(keep, new.results, strict=True):
            new_results[i] = r
        rewriter.replace(op, new, new_results)


@dataclass(frozen=True)
class DeadCodeEliminationPass(ModulePass):
    """Erase ops whose results nobody reads and that have no side effects, including inside
    `comm.fused` / `comm.overlap` regions (whose unread results are dropped first).

    Kept: `coco.update` (it writes the caller's buffer) and everything it needs, the values
    `func.return` hands back, schedule regions holding an update, and ops of other dialects
    that are not `Pure` (they may have effects). Collectives are `Pure` in the comm dialect:
    every rank drops an unread collective alike, so erasing one is safe in SPMD.

    Options: `ops` names ops to erase (targeted: each must be dead, else
    [dce-live] refuses); none: every dead op (greedy).
    """

    name = "coco-dce"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.ops:
            sites = find_named_ops(op, self.ops, f"{RULE}-op", "op")
            for _, site in sites:
                if not is_trivially_dead(site):
                    why = "has side effects" if has_side_effects(site) else "is still read"
                    raise fail(f"{RULE}-live", f"{op_name(site)} {why}: it is not dead", at=site)
            for _, site in sites:
                Rewriter.erase_op(site)
            return
        # The applier erases every trivially dead op it visits (`dce_enabled`); the walker
        # repeats until nothing changes, so pruning a region's results kills what fed them.
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [PruneRegionResults(), DissolveSpentRegion()], dce_enabled=True
            ),
            walk_reverse=True,
        ).rewrite_module(op)
