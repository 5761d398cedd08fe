"""The chain of a fused all_reduce: from a reduce_scatter, the sliced computation that reads
it, the all_gathers re-replicating its results and the updates storing them, grown in
program order (CoCoNet's FusedAllReduce); and what joins any fused all_reduce's chain, the
two-shot or the one-shot form's (the ops feeding only it, the rows of a row kernel)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import ClassVar

from xdsl.ir import Block, Operation, SSAValue
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.passes.common import OrderInfo, ancestor_in, fail, op_name, plan_contiguous
from coconet.passes.fuse.region import RULE, shared
from coconet.passes.fuse.spaces import (
    Space,
    meet,
    op_space,
    row_reduction_of,
    row_space,
    space_of,
)


class ChainScans:
    """Ops the chain scans (of reduce_scatters and of one-shot all_reduces) looked at, over
    all runs (a test checks it grows linearly with the program)."""

    visits: ClassVar[int] = 0


class Frontier:
    """The ops a chain scan visits, in program order after `start`. Without the block's
    order: every op, one after the other. With it (`info`, one for all the chains grown on
    an unchanged block): only the ops `add`ed, the ones that can change the chain (readers
    of its values), so a chain coupled to every other through a global norm costs the ops
    that read it, not the distance to its last one (a walk each: quadratic in the tensors
    of a clipped optimizer step)."""

    def __init__(self, start: Operation, info: OrderInfo | None):
        self.info = info
        self.walk: Operation | None = start.next_op
        # (position, op): positions are distinct, so ops are never compared
        self.heap: list[tuple[int, Operation]] = []
        self.queued: set[Operation] = set()

    def add(self, op: Operation) -> None:
        if self.info is None or op in self.queued:
            return
        self.queued.add(op)
        heapq.heappush(self.heap, (self.info.index[op], op))

    def pop(self) -> Operation | None:
        if self.info is None:
            op, self.walk = self.walk, self.walk.next_op if self.walk is not None else None
            return op
        return heapq.heappop(self.heap)[1] if self.heap else None


def reduce_scatter_chain(
    block: Block,
    rs: comm.ReduceScatterOp,
    held: dict[Operation, None] | None = None,
    info: OrderInfo | None = None,
    close: bool = True,
) -> set[Operation]:
    """The maximal fused all_reduce around `rs`. `held`: ops of other chains fused with
    this one, which cannot couple with it: the chain is refused at the first it would take
    ([fuse-chain], as the check of disjoint chains refuses). `info`: the order of `block`,
    where several chains are grown on it unchanged (Frontier). `close=False`: without the
    scalar arithmetic that closes a cycle (`close_cycles`), for chains that are merged
    first and closed together (a chain coupled to all others spans them all: closing each
    cost the whole program)."""
    if rs.parent_block() is not block:
        raise fail(f"{RULE}-block", f"{op_name(rs)} is not in a function body", at=rs)
    space = space_of(rs.result)
    span = set(rs.span())
    members: set[Operation] = {rs}
    chain: set[SSAValue] = {rs.result}
    gathered: set[SSAValue] = set()
    frontier = Frontier(rs, info)
    # Only ops of the block that read a chain value (or update with a gathered one) can
    # join, so the scan follows those uses and stops after the last one: it costs the
    # chain's extent, not the rest of the function (linear over every reduce_scatter).
    pending: set[Operation] = set()

    def watch(v: SSAValue, updates_only: bool = False) -> None:
        for use in v.uses:
            user = use.operation
            if user.parent_block() is block and (
                not updates_only or isinstance(user, coco.UpdateOp)
            ):
                pending.add(user)
                frontier.add(user)

    # Ops outside the chain computed from its gathered values (the next layer's matmul
    # on this layer's output, a norm of gathered rows): an op reading one of them cannot
    # join, as the chain would then wait for itself (a residual stack after coco-reorder:
    # the next layer's sliced residual reads this layer's slice and that layer's output).
    after_gather: set[Operation] = set()

    def waits_for_gather(u: Operation) -> bool:
        ops = u.walk() if u.regions else (u,)
        return any(v in gathered or v.owner in after_gather for o in ops for v in o.operands)

    def readers_wait(values: Sequence[SSAValue]) -> None:
        # what reads a gathered value or an op after the gather waits: the frontier
        # visits it (a walk visits everything anyway)
        if info is not None:
            for v in values:
                for use in v.uses:
                    if (top := ancestor_in(block, use.operation)) is not None:
                        frontier.add(top)

    watch(rs.result)
    while pending and (u := frontier.pop()) is not None:
        ChainScans.visits += 1
        waits = waits_for_gather(u)
        joined = None
        if u in pending:
            pending.discard(u)
            # (an update joins with a gathered value: the kernel writes it)
            if not waits or isinstance(u, coco.UpdateOp):
                joined = _chain_step(u, space, span, chain, gathered)
        if joined is not None:
            if held is not None and u in held:
                raise shared(u)
            members.add(u)
            for v in joined:
                watch(v, updates_only=v in gathered)
            readers_wait([v for v in joined if v in gathered])
        elif waits:
            after_gather.add(u)
            readers_wait(u.results)
    if not any(isinstance(m, comm.AllGatherOp) for m in members) and not stays_sliced(members):
        raise fail(
            f"{RULE}-chain",
            f"no all_gather of the chain of {op_name(rs)} over its axes: a fused all_reduce "
            "needs reduce_scatter, computation and all_gather (or, ZeRO-3's, computation "
            "whose every result updates sliced state)",
            at=rs,
        )
    check_rows(members, space)
    members = pull_feeders(block, members, space)
    if held is not None:
        for m in members:
            if m in held:
                raise shared(m)
    return close_cycles(block, members, f"fusing the chain of {op_name(rs)}") if close else members


def close_cycles(
    block: Block, members: set[Operation], what: str, info: OrderInfo | None = None
) -> set[Operation]:
    """`members` with the scalar arithmetic between them that they both feed and read (a
    trust ratio of two norms), which belongs in the fused region too; refused
    [fuse-cycle] where another op closes a cycle."""
    if info is None:
        info = OrderInfo.spanning(block, members)
    while True:
        try:
            plan_contiguous(block, members, f"{RULE}-cycle", what, info)
            return members
        except PassFailedException:
            bridge = _bridges(info, members)
            if not bridge:
                raise
            members |= bridge


def _chain_step(
    u: Operation,
    space: Space,
    span: set[int],
    chain: set[SSAValue],
    gathered: set[SSAValue],
) -> tuple[SSAValue, ...] | None:
    """Whether `u` (an op after the reduce_scatter reading the chain, or updating with a
    chain or gathered value) joins the chain: None if not, else the values it adds (to
    `chain` or, for an all_gather, to `gathered`)."""
    if isinstance(u, coco.UpdateOp):
        return () if u.value in chain or u.value in gathered else None
    if not any(v in chain for v in u.operands):
        return None
    if isinstance(u, comm.AllGatherOp):
        if set(u.span()) == span and space_of(u.input) == space:
            gathered.add(u.result)
            return (u.result,)
        return None
    if isinstance(u, coco.ElementwiseOp) and meet(space, space_of(u.results[0])) == space:
        chain.add(u.results[0])
        return (u.results[0],)
    if row_reduction_of(u, space) or (
        isinstance(u, coco.ElementwiseOp)
        and space_of(u.results[0]) is not None
        and space_of(u.results[0]) == row_space(space)
    ):
        # rows of the slice: one block per row finishes them in the kernel
        chain.add(u.results[0])
        return (u.results[0],)
    if isinstance(u, coco.ReduceOp) or (isinstance(u, comm.AllReduceOp) and u.input.type.rank == 0):
        chain.add(u.result)
        return (u.result,)
    return None


def pull_feeders(
    block: Block, members: set[Operation], space: Space, read_before: Operation | None = None
) -> set[Operation]:
    """Add the ops that only feed the chain (slices, constants, elementwise ops in its
    space), to a fixpoint: a candidate is an operand's producer, looked at again each time
    one of its users joins (no rescan of the block). Not what feeds `read_before` (a one-shot
    all_reduce, whose input peers read from memory: computed before the region)."""
    members = set(members)
    work = [v.owner for m in members if m is not read_before for o in m.walk() for v in o.operands]
    while work:
        p = work.pop()
        if not isinstance(p, Operation) or p in members or p.parent_block() is not block:
            continue
        if not p.results or not isinstance(p, coco.SliceOp | coco.ConstantOp | coco.ElementwiseOp):
            continue
        # slices and splat constants move no data, so any shape may join
        if isinstance(p, coco.ElementwiseOp) and meet(space, op_space(p)) != space:
            continue
        users = {ancestor_in(block, use.operation) for r in p.results for use in r.uses}
        if users and users <= members:
            members.add(p)
            work.extend(v.owner for o in p.walk() for v in o.operands)
    return members


def check_rows(members: set[Operation], space: Space) -> None:
    """A chain with row reductions is one kernel with a block per row: no full
    reduction (those finish across blocks). Rows of any length: the row kernel streams
    what does not fit in shared memory."""
    rows = [m for m in members if isinstance(m, coco.ReduceDimsOp)]
    if not rows or space is None:
        return
    if any(isinstance(m, coco.ReduceOp) for m in members):
        raise fail(
            f"{RULE}-chain",
            "a fused all_reduce with row reductions cannot also finish full reductions",
        )


def _bridges(info: OrderInfo, members: set[Operation]) -> set[Operation]:
    """Scalar elementwise ops outside the set that depend on it and feed it."""
    order = sorted(members, key=info.index.__getitem__)
    span = info.ops[info.index[order[0]] : info.index[order[-1]] + 1]
    after = info.reached(members, span)
    feeding = info.first_dependents(after, members, span)
    bridges: set[Operation] = {
        op for op in feeding if isinstance(op, coco.ElementwiseOp) and op_space(op) is None
    }
    return bridges


def stays_sliced(members: set[Operation]) -> bool:
    """Whether a chain without an all_gather is ZeRO-3's step: computation on the slice
    whose results only its own updates read (sliced parameters and state stay sliced), at
    least one of them. Where a result leaves the chain (a send of the slice, a value the
    program returns), the chain is not fused as an all_reduce."""
    updates = [m for m in members if isinstance(m, coco.UpdateOp)]
    return bool(updates) and all(
        use.operation in members
        for m in members
        if not isinstance(m, coco.UpdateOp)
        for r in m.results
        for use in r.uses
    )
