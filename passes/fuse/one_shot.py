"""The one-shot form of a fused all_reduce (`coco-fuse-all-reduce{form=one_shot}`): a tensor
`comm.all_reduce` as written and the computation on its whole result -> one
`comm.fused all_reduce one_shot` region, in which each rank reduces every peer's whole input
from symmetric memory and computes the rest locally (one handshake, no all_gather: the form
of small tensors, where latency wins)."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.passes.common import (
    OrderInfo,
    body_block,
    fail,
    find_named_ops,
    functions,
    is_terminator,
    op_name,
)
from coconet.passes.fuse.chain import ChainScans, Frontier, check_rows, pull_feeders
from coconet.passes.fuse.checks import exact_set
from coconet.passes.fuse.region import (
    ONE_SHOT,
    RULE,
    chains_in_order,
    fuse,
    fuse_plans,
    in_order,
    shared,
)
from coconet.passes.fuse.spaces import (
    Space,
    meet,
    op_space,
    row_reduction_of,
    row_space,
    space_of,
)


def fuse_one_shot(module: ModuleOp, ops: tuple[str, ...]) -> None:
    """Greedy (no `ops`): every tensor all_reduce's chain. Targeted: the chains of the
    named all_reduces, or the named set."""
    if not ops:
        for fn in functions(module):
            fuse_greedy(body_block(fn))
        return
    sites = find_named_ops(module, ops, f"{RULE}-block", "op")
    orders: dict[Block, BlockOrder] = {}  # the blocks stay as they are until fuse_plans

    def chain(block: Block, ar: comm.AllReduceOp, taken: AbstractSet[Operation]) -> set[Operation]:
        if block not in orders:
            orders[block] = BlockOrder.of(block)
        return one_shot_chain(block, ar, taken, orders[block])

    plans = chains_in_order(sites, comm.AllReduceOp, chain, ONE_SHOT)
    if plans is None:
        block, members = exact_set(sites, _check_one_shot_set)
        plans = [(block, members, ONE_SHOT)]
    fuse_plans(plans)


def fuse_greedy(block: Block) -> None:
    """Fuse the one-shot chain of every tensor all_reduce of `block` the rules admit."""
    for ar in [o for o in block.ops if isinstance(o, comm.AllReduceOp)]:
        if ar.parent_block() is not block or _scalar(ar):
            continue
        try:
            fuse(block, one_shot_chain(block, ar), ONE_SHOT)
        except PassFailedException:
            continue


@dataclass
class BlockOrder:
    """What the one-shot chains grown on one unchanged block share: its order, and for each
    top-level value the tensor all_reduces it is computed from (a bit each), so that a
    chain finds the values computed from it outside it without following their uses (a
    global norm computed from every chain and read by every update: following them cost
    each chain the whole program)."""

    info: OrderInfo
    bit: dict[Operation, int]
    computed_from: dict[SSAValue, int]

    @classmethod
    def of(cls, block: Block) -> BlockOrder:
        info = OrderInfo(block)
        bit: dict[Operation, int] = {}
        computed_from: dict[SSAValue, int] = {}
        for op in info.ops:
            bits = 0
            for o in op.walk() if op.regions else (op,):
                for v in o.operands:
                    bits |= computed_from.get(v, 0)
            if isinstance(op, comm.AllReduceOp) and not _scalar(op):
                bit[op] = 1 << len(bit)
                bits |= bit[op]
            for r in op.results:
                computed_from[r] = bits
        return cls(info, bit, computed_from)


def one_shot_chain(
    block: Block,
    ar: comm.AllReduceOp,
    taken: AbstractSet[Operation] = frozenset(),
    order: BlockOrder | None = None,
) -> set[Operation]:
    """The maximal one-shot fused all_reduce around `ar` (before the cycle check), without
    the ops in `taken` (an earlier chain's). `order`: the block's, where several chains are
    grown on it unchanged (chain.Frontier)."""
    if ar in taken:
        raise shared(ar)
    if ar.parent_block() is not block:
        raise fail(f"{RULE}-block", f"{op_name(ar)} is not in a function body", at=ar)
    _refuse_scalar(ar)
    space = space_of(ar.result)
    members: set[Operation] = {ar}
    chain: set[SSAValue] = {ar.result}
    # Values computed from the chain by ops that did not join (a full norm): an op
    # reading one waits for the region, so it cannot join it. Every op computed from the
    # chain that is not in it is such an op: with the block's order, the bits say which.
    outside: set[SSAValue] = set()
    pending: set[Operation] = set()
    frontier = Frontier(ar, order.info if order is not None else None)

    def reads_outside(read: list[SSAValue]) -> bool:
        if order is None:
            return any(v in outside for v in read)
        mine = order.bit[ar]
        return any(v not in chain and order.computed_from.get(v, 0) & mine for v in read)

    def watch(v: SSAValue) -> None:
        for use in v.uses:
            # (never a terminator: it joins no chain, and a return of every layer's
            # output, read whole by each layer's chain, was quadratic)
            if use.operation.parent_block() is block and not is_terminator(use.operation):
                pending.add(use.operation)
                frontier.add(use.operation)

    watch(ar.result)
    while pending and (u := frontier.pop()) is not None:
        ChainScans.visits += 1
        read = [v for o in (u.walk() if u.regions else (u,)) for v in o.operands]
        joined = None
        if u in pending:
            pending.discard(u)
            if not reads_outside(read) and u not in taken:
                joined = _one_shot_step(u, ar, space, chain)
        if joined is not None:
            members.add(u)
            for v in joined:
                watch(v)
        elif order is None and any(v in chain or v in outside for v in read):
            outside.update(u.results)
            for v in u.results:
                watch(v)
    check_rows(members, space)
    members = pull_feeders(block, members, space, read_before=ar)
    for m in in_order(members & set(taken)):
        raise shared(m)
    return members


def _one_shot_step(
    u: Operation, ar: comm.AllReduceOp, space: Space, chain: set[SSAValue]
) -> tuple[SSAValue, ...] | None:
    """Whether `u` joins the one-shot chain of `ar`: None if not, else its results."""
    if isinstance(u, coco.UpdateOp):
        # peers read the all_reduce's input: writing it stays a copy after the region
        return () if u.value in chain and u.target is not ar.input else None
    if not any(v in chain for v in u.operands):
        return None
    if isinstance(u, coco.ElementwiseOp) and (
        meet(space, space_of(u.results[0])) == space
        or (space_of(u.results[0]) is not None and space_of(u.results[0]) == row_space(space))
    ):
        chain.add(u.results[0])
        return (u.results[0],)
    if row_reduction_of(u, space):
        chain.add(u.results[0])
        return (u.results[0],)
    return None


def _check_one_shot_set(members: set[Operation]) -> None:
    """A named one-shot set: one tensor all_reduce, the rest computation in its space."""
    reduces = [m for m in in_order(members) if isinstance(m, comm.AllReduceOp)]
    if len(reduces) != 1:
        raise fail(
            f"{RULE}-one-shot",
            f"a one-shot fused all_reduce holds exactly one comm.all_reduce; the named ops "
            f"hold {len(reduces)}",
        )
    ar = reduces[0]
    _refuse_scalar(ar)
    source = ar.input.owner
    if isinstance(source, Operation) and source in members:
        raise fail(
            f"{RULE}-one-shot",
            f"{op_name(source)} computes the input of {op_name(ar)}, which peers read from "
            "memory: it is computed before a one-shot fused all_reduce, not in it",
            at=source,
        )
    space = space_of(ar.result)
    rows = row_space(space)
    for m in in_order(members - {ar}):
        ok = isinstance(m, coco.ElementwiseOp | coco.ConstantOp | coco.SliceOp) or (
            row_reduction_of(m, space)
        )
        if not ok:
            raise fail(
                f"{RULE}-one-shot",
                f"{op_name(m)} cannot be part of a one-shot fused all_reduce (its "
                "all_reduce, elementwise computation, row reductions over the last dim)",
                at=m,
            )
        s = op_space(m)
        if isinstance(m, coco.ElementwiseOp) and s not in (space, rows, None):
            raise fail(
                f"{RULE}-one-shot",
                f"{op_name(m)} computes over a different iteration space than the "
                "all_reduce's result (each rank computes the whole tensor)",
                at=m,
            )


def _scalar(ar: comm.AllReduceOp) -> bool:
    return ar.input.type.rank == 0


def _refuse_scalar(ar: comm.AllReduceOp) -> None:
    """[fuse-one-shot]: a one-shot fused all_reduce starts at an all_reduce of a tensor."""
    if _scalar(ar):
        raise fail(
            f"{RULE}-one-shot",
            f"{op_name(ar)} reduces a scalar (a norm's partials): a one-shot fused "
            "all_reduce reduces a tensor",
            at=ar,
        )
