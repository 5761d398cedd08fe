"""Full reductions a fused all_reduce reads, of tensors every rank holds whole, rewritten onto
the chain's slice (a partial per rank and an all_reduce of the partials), so that the fused
kernel finishes them with its own reductions."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Block, Operation, SSAValue

from coconet.dialects import coco, comm
from coconet.dialects.coco import ReplicatedAttr, TensorType
from coconet.dialects.coco_types import same_cut
from coconet.dialects.layout_rules import precedes_in_block
from coconet.dialects.reduction import Reduction
from coconet.passes.common import (
    OrderInfo,
    ancestor_in,
    combine_partials,
    derived_name,
    finish_partials,
    grid_rank,
    partial_reduction,
    set_name,
)


def function_of(block: Block) -> func.FuncOp:
    """The function whose body `block` is (fused chains are found in function bodies)."""
    fn = block.parent_op()
    assert isinstance(fn, func.FuncOp), "a fused chain's block is a function body"
    return fn


def absorb_whole_reductions(block: Block, members: set[Operation]) -> set[Operation]:
    """Full reductions of a tensor every rank of the group holds whole, read only by the
    chain (LAMB's norm(w) of a replicated w, a clipping's norm), join the chain computed on
    the chain's slice: a partial per rank and an all_reduce of the partials (a norm: of the
    squares, then a square root), as coco-reorder rewrites a reduction of a gathered value.
    The fused kernel then finishes them with the chain's own reductions, instead of every
    rank reducing the whole tensor in kernels of its own before the region. The sum is
    reassociated (per slice, then across ranks): equal within the reductions' tolerance."""
    scatters = [m for m in members if isinstance(m, comm.ReduceScatterOp)]
    if len(scatters) != 1:
        return members
    rs = scatters[0]
    sliced: TensorType = rs.result.type
    span = set(rs.span())
    rank = grid_rank(function_of(block))
    # The candidates are the reductions the chain reads: found from the members' operands,
    # not by a scan of the function (each fusion costs its chain, not the program).
    candidates = _reductions_read_by(block, members)
    if not candidates:
        return members
    # Their order in the block, and where the tensors they reduce are computed.
    inputs = [
        r.input.owner
        for r in candidates
        if isinstance(r.input.owner, Operation) and r.input.owner.parent_block() is block
    ]
    info = OrderInfo.spanning(block, {rs, *candidates, *inputs})
    members = set(members)
    for r in sorted(candidates, key=info.index.__getitem__):
        if r.kind.data not in (Reduction.SUM, Reduction.MAX, Reduction.MIN, Reduction.NORM):
            continue
        # Its slice is taken right after the reduce_scatter: the tensor must exist there.
        owner = r.input.owner
        if isinstance(owner, Operation) and (
            owner not in info.index or info.index[owner] >= info.index[rs]
        ):
            continue
        x: TensorType = r.input.type
        users = {ancestor_in(block, use.operation) for use in r.result.uses}
        if not users or not users <= members or _updated_outside(block, r.input, members):
            continue
        if x.get_shape() != sliced.get_shape():
            continue
        # The whole tensor on every group member, laid out as the slice off the group's axes.
        if not all(
            same_cut(x.layout_on(a), ReplicatedAttr() if a in span else sliced.layout_on(a))
            for a in range(rank)
        ):
            continue
        piece = x.with_layouts(list(sliced.layouts))
        members |= _reduce_on_slice(block, r, rs, piece, members)
    return members


def _reductions_read_by(block: Block, members: set[Operation]) -> list[coco.ReduceOp]:
    """The `coco.reduce` ops of `block`, outside `members`, whose results a member (or an op
    nested in one) reads."""
    found: dict[coco.ReduceOp, None] = {}
    for m in members:
        for o in m.walk():
            for v in o.operands:
                r = v.owner
                if isinstance(r, coco.ReduceOp) and r not in members and r.parent_block() is block:
                    found[r] = None
    return list(found)


def _updated_outside(block: Block, v: SSAValue, members: set[Operation]) -> bool:
    """Whether a top-level `coco.update` of `block` outside `members` writes `v`."""
    return any(
        isinstance(u := use.operation, coco.UpdateOp)
        and u.target is v
        and u not in members
        and u.parent_block() is block
        for use in v.uses
    )


def _reduce_on_slice(
    block: Block,
    r: coco.ReduceOp,
    rs: comm.ReduceScatterOp,
    piece: TensorType,
    members: set[Operation],
) -> set[Operation]:
    """Rewrites `r` as its partial on this rank's slice (right after `rs`; the chain's slice
    of the tensor where `members` hold one) and an all_reduce
    over `rs`'s axes; a norm's square root goes just before its first reader, so that the
    kernel reading the partial's all_reduce is not cut before the chain's other work."""
    rank = grid_rank(function_of(block))
    new_ops: list[Operation] = []
    # The chain's own slice of the tensor, if it has one, moves up to serve both.
    existing = [
        s
        for s in members
        if isinstance(s, coco.SliceOp) and s.input is r.input and s.result.type == piece
    ]
    if existing:
        piece_of = existing[0]
        block.detach_op(piece_of)
    else:
        piece_of = coco.SliceOp(r.input, piece)
        set_name(piece_of.result, derived_name(r.input, "s"))
    new_ops.append(piece_of)
    partial, part = partial_reduction(r, piece_of.result)
    axes = rs.axes.get_values() if rs.axes is not None else None
    total = combine_partials(r, part.result, axes, rank)
    new_ops += [*partial, total]
    at = rs
    for op in new_ops:
        block.insert_op_after(op, at)
        at = op
    final = total.result
    finish = finish_partials(r, total.result)
    if finish:
        # (the square root and the cast back go right before the first reader)
        readers = [ancestor_in(block, use.operation) for use in r.result.uses]
        first: Operation | None = None
        for op in readers:
            if op is not None and (first is None or precedes_in_block(op, first)):
                first = op
        assert first is not None
        for op in finish:
            block.insert_op_before(op, first)
        new_ops += finish
        final = finish[-1].results[0]
    set_name(final, r.result.name_hint)
    r.result.replace_all_uses_with(final)
    block.erase_op(r)
    return set(new_ops)
