"""`coco-dce`: dead-code elimination that keeps the program's side effects."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.traits import IsTerminator

from coconet.dialects import comm
from coconet.passes.common import (
    body_block,
    fail,
    find_named_ops,
    functions,
    has_side_effects,
    op_name,
)

RULE = "dce"


def is_dead(op: Operation) -> bool:
    if op.has_trait(IsTerminator):
        return False
    return not any(r.uses for r in op.results) and not has_side_effects(op)


def _prune_region_results(op: comm.RegionOp) -> comm.RegionOp:
    """Drop the results of a schedule region nobody reads (and their yields), so the ops that
    produced them become dead inside the region. Returns the (possibly new) region op."""
    keep = [i for i, r in enumerate(op.results) if r.uses]
    if len(keep) == len(op.results):
        return op
    yield_op = op.yield_op
    kept_values = [yield_op.values[i] for i in keep]
    new_yield = comm.YieldOp(kept_values)
    new_yield.attributes |= yield_op.attributes
    yield_block = yield_op.parent_block()
    assert yield_block is not None
    yield_block.insert_op_after(new_yield, yield_op)
    yield_op.detach()
    yield_op.erase()
    region = Rewriter.move_region_contents_to_new_regions(op.body)
    new = type(op).create(
        result_types=[op.results[i].type for i in keep],
        properties=dict(op.properties),
        attributes=dict(op.attributes),
        regions=[region],
    )
    for i, r in zip(keep, new.results, strict=True):
        r.name_hint = op.results[i].name_hint
    for i, r in zip(keep, new.results, strict=True):
        op.results[i].replace_all_uses_with(r)
    block = op.parent_block()
    assert block is not None
    block.insert_op_after(new, op)
    op.detach()
    op.erase()
    return new


def _inline_trivial_region(op: comm.RegionOp) -> bool:
    """A region holding nothing but its yield forwards outer values: replace it by them."""
    if len(op.body.block.ops) != 1:
        return False
    values = list(op.yield_op.values)
    for r, v in zip(op.results, values, strict=True):
        r.replace_all_uses_with(v)
    op.detach()
    op.erase()
    return True


def dce_block(block: Block) -> bool:
    """Erase dead ops of `block` and of the regions nested in it, to a fixpoint."""
    changed_any = False
    changed = True
    while changed:
        changed = False
        for op in reversed(list(block.ops)):
            if isinstance(op, comm.RegionOp):
                op = _prune_region_results(op)
                for b in op.body.blocks:
                    changed |= dce_block(b)
                if _inline_trivial_region(op):
                    changed = True
                    continue
            else:
                for region in op.regions:
                    for b in region.blocks:
                        changed |= dce_block(b)
            if is_dead(op):
                op.detach()
                op.erase()
                changed = True
        changed_any |= changed
    return changed_any


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
                if not is_dead(site):
                    why = "has side effects" if has_side_effects(site) else "is still read"
                    raise fail(f"{RULE}-live", f"{op_name(site)} {why}: it is not dead")
            for _, site in sites:
                site.detach()
                site.erase()
            return
        for fn in functions(op):
            dce_block(body_block(fn))
