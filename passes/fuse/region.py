"""Building a fused region: what joins a fused set besides the ops chosen (the updates that
store its values, the slices and constants only it reads), and wrapping the set into one
`comm.fused KIND` region after checking it closes no cycle. Every mode builds its regions
here, so all of them move ops and yield values the same way."""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set as AbstractSet
from typing import TypeVar

from xdsl.dialects import func
from xdsl.ir import Attribute, Block, Operation, Region
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.passes.common import (
    Facts,
    OrderInfo,
    ancestor_in,
    body_block,
    check_groups_acyclic,
    fail,
    op_name,
    plan_contiguous,
    reaches_effect,
    wrap_in_region,
)
from coconet.passes.fuse.spaces import Space, meet, op_space
from coconet.passes.fuse.whole_reductions import absorb_whole_reductions

RULE = "fuse"

# The kind of a one-shot fused all_reduce's plan (`comm.fused all_reduce one_shot`).
ONE_SHOT = "one_shot"

# A planned region: its block, its members and its kind (`all_reduce`, ..., ONE_SHOT).
Plan = tuple[Block, set[Operation], str]


def in_order(members: set[Operation]) -> list[Operation]:
    """Members in program order (so refusals name the same op every run)."""
    by_block: dict[Block | None, list[Operation]] = {}
    for m in members:
        by_block.setdefault(m.parent_block(), []).append(m)
    out: list[Operation] = []
    for block, ops in by_block.items():
        if block is None:
            out.extend(ops)
            continue
        index = {op: i for i, op in enumerate(block.ops)}
        out.extend(sorted(ops, key=index.__getitem__))
    return out


def position(op: Operation) -> tuple[int, int]:
    """Where `op` stands: its function's place in the module, its own in the function."""
    fn = op.parent_op()
    block = op.parent_block()
    assert fn is not None
    assert block is not None
    module = fn.parent_block()
    outer = module.get_operation_index(fn) if module is not None else 0
    return outer, block.get_operation_index(op)


def shared(op: Operation) -> PassFailedException:
    return fail(
        f"{RULE}-chain", f"the named chains share {op_name(op)}: fuse them one at a time", at=op
    )


def _make_fused(kind: str):
    def make(body: Region, types: list[Attribute]) -> comm.RegionOp:
        if kind == ONE_SHOT:
            return comm.FusedOp("all_reduce", body, types, one_shot=True)
        return comm.FusedOp(kind, body, types)

    return make


def absorb_updates(block: Block, members: set[Operation], info: OrderInfo) -> set[Operation]:
    """Add the updates that store a member's result, each only if that keeps the set acyclic
    (found through the members' uses: no scan of the block). All at once where that is
    acyclic (one check of the span: a component holding many tensors' steps stores many,
    and a check per update was quadratic), else one at a time, in order."""
    updates = {
        use.operation
        for m in members
        for r in m.results
        for use in r.uses
        if isinstance(use.operation, coco.UpdateOp)
        and use.index == 1
        and use.operation.parent_block() is block
    }
    updates -= members
    if not updates:
        return members
    if any(u not in info.index for u in updates) or any(m not in info.index for m in members):
        info = OrderInfo.spanning(block, members | updates)
    try:
        plan_contiguous(block, members | updates, RULE, "", info)
        return members | updates
    except PassFailedException:
        pass
    for op in sorted(updates, key=info.index.__getitem__):
        try:
            plan_contiguous(block, members | {op}, RULE, "", info)
        except PassFailedException:
            continue
        members = members | {op}
    return members


def absorb_feeders(block: Block, members: set[Operation]) -> set[Operation]:
    """Add slices and constants read only by members, and what feeds those only (the
    constant under a slice of it): they move no data, and inside the region the kernel sees
    them as a pointer offset, an immediate or its own array of values (found through the
    members' operands: no scan of the block)."""
    members = set(members)
    work = list(members)
    while work:
        m = work.pop()
        for o in m.walk():
            for v in o.operands:
                op = v.owner
                if (
                    not isinstance(op, coco.SliceOp | coco.ConstantOp)
                    or op in members
                    or op.parent_block() is not block
                ):
                    continue
                users = {ancestor_in(block, use.operation) for use in op.results[0].uses}
                if users and users <= members:
                    members.add(op)
                    work.append(op)
    return members


def feeding_computation(
    block: Block, root: Operation, space: Space, taken: AbstractSet[Operation] = frozenset()
) -> set[Operation]:
    """The elementwise ops of `block` in iteration space `space` that feed `root` (walking
    back over its operands, then theirs), none of `taken`: what a fused send, reduction or
    exchange computes before its own op."""
    members: set[Operation] = set()
    work = [root]
    while work:
        op = work.pop()
        for v in op.operands:
            p = v.owner
            if (
                isinstance(p, coco.ElementwiseOp)
                and p.parent_block() is block
                and p not in members
                and p not in taken
                and meet(space, op_space(p)) == space
            ):
                members.add(p)
                work.append(p)
    return members


def describe(members: set[Operation]) -> str:
    names = [op_name(m) for m in members if m.results and m.results[0].name_hint]
    return "{" + ", ".join(sorted(names)[:6]) + (", ...}" if len(names) > 6 else "}")


def check_live(members: set[Operation], kind: str) -> None:
    """Refuse [fuse-dead] an all_to_all fusion whose exchange computes what nothing uses:
    dead-code elimination would remove it from the region and leave the region without the
    collective it is built around, kept alive by a producer's update. (A fused all_reduce
    holds no such producer: its chain starts at the reduce_scatter, and the ops feeding it
    join only where they feed nothing else.)"""
    collectives = [m for m in members if isinstance(m, comm.CollectiveOp)]
    exchanges = ("all_to_all", "all_gather")
    if kind not in exchanges or not collectives or any(map(reaches_effect, collectives)):
        return
    first = in_order(set(collectives))[0]
    raise fail(
        f"{RULE}-dead",
        f"the result of {op_name(first)} reaches no update and no return: there is nothing "
        "to fuse (dead-code elimination removes it)",
        at=first,
    )


def fuse(
    block: Block, members: set[Operation], kind: str, facts: dict[Operation, Facts] | None = None
) -> comm.RegionOp:
    """Wrap `members` into one `comm.fused KIND` region: the ops between them move above it
    if they do not depend on it, below if they do. `facts`: OrderInfo's, shared by the
    fusions of one pass over `block`."""
    if any(m.parent_block() is not block for m in members):
        raise fail(f"{RULE}-block", "a fused set lies partly inside another region")
    check_live(members, kind)
    if kind == "all_reduce":
        # done here, as the region is built, so that every two-shot chain (greedy or named)
        # finishes the whole tensors' reductions it reads in its own kernel
        members = absorb_whole_reductions(block, members)
    hoisted, order = plan_contiguous(
        block, members, f"{RULE}-cycle", "fusing " + describe(members), facts=facts
    )
    return wrap_in_region(block, hoisted, order, _make_fused(kind), facts)


_SiteOp = TypeVar("_SiteOp", bound=Operation)


def chains_in_order(
    sites: Sequence[tuple[func.FuncOp, Operation]],
    site_type: type[_SiteOp],
    chain: Callable[[Block, _SiteOp, AbstractSet[Operation]], set[Operation]],
    kind: str,
) -> list[Plan] | None:
    """The plans of named sites that are all `site_type`: in program order, each site's
    `chain` without the ops an earlier one took (what two sites both reach -- a residual
    stream, the computation between two exchanges -- is the first one's). None where a named
    op is of another type: the names are then a set to fuse as it is."""
    typed = [(fn, s) for fn, s in sites if isinstance(s, site_type)]
    if len(typed) != len(sites):
        return None
    plans: list[Plan] = []
    taken: set[Operation] = set()
    # each site's place, from one index per block (a lookup per site walked its block)
    where: dict[Operation, tuple[int, int]] = {}
    for fn, site in typed:
        if site not in where:
            fn_at = position(fn)[1]
            where.update({op: (fn_at, i) for i, op in enumerate(body_block(fn).ops)})
    for fn, site in sorted(typed, key=lambda t: where[t[1]]):
        block = body_block(fn)
        members = chain(block, site, taken)
        taken |= members
        plans.append((block, members, kind))
    return plans


def fuse_plans(plans: list[Plan]) -> None:
    """Fuse each planned set, after checking every region before building any."""
    for block, members, kind in plans:
        check_live(members, kind)
        plan_contiguous(block, members, f"{RULE}-cycle", "fusing " + describe(members))
    if len(plans) > 1:
        _check_disjoint(plans)
        for block in {b for b, _, _ in plans}:
            check_groups_acyclic(
                block,
                [m for b, m, _ in plans if b is block],
                f"{RULE}-cycle",
                "fusing these sets",
            )
    for block, members, kind in plans:
        fuse(block, members, kind)


def _check_disjoint(plans: list[Plan]) -> None:
    seen: set[Operation] = set()
    for _, members, _ in plans:
        if seen & members:
            raise shared(next(iter(seen & members)))
        seen |= members
