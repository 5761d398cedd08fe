"""The chain of a fused all_reduce: from a reduce_scatter, the sliced computation that reads
it, the all_gathers re-replicating its results and the updates storing them, grown in
program order (CoCoNet's FusedAllReduce); and what joins any fused all_reduce's chain, the
two-shot or the one-shot form's (the ops feeding only it, the rows of a row kernel)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence, Set as AbstractSet
from typing import ClassVar

from xdsl.ir import Block, Operation, SSAValue
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType
from coconet.passes.common import (
    OrderInfo,
    ancestor_in,
    fail,
    find_root,
    is_terminator,
    op_name,
    plan_contiguous,
)
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


def is_scalar(v: SSAValue) -> bool:
    return isinstance(v.type, TensorType) and v.type.rank == 0


def computes_scalars(op: Operation) -> bool:
    """Whether every result of `op` (one at least) is a scalar: arithmetic that any
    iteration space fits, shared by chains coupled through it (a global norm)."""
    return bool(op.results) and all(map(is_scalar, op.results))


class CoupledScalars:
    """The scalar arithmetic of the chains grown together on one unchanged block, each
    followed once. The first chain to join a scalar op follows its readers; a later chain
    that would join it takes it as a boundary (the two are then coupled: they share a
    scalar op, so `_merge_coupled` makes them one region) and does not follow it again.
    Grown apart, chain i of a global norm over N tensors joined the norm's running sum
    from its own partial on and looked at every reader of the clipping factor: O(N) each,
    quadratic in the tensors.

    What following a scalar finds that fits another chain's space (a tensor op reading
    only the norm and values of no chain, such as `clip * w`) is kept for it: the tensor
    readers of a coupled group's scalars that no chain joined, by their space (`spill`),
    which the first chain of that space in the group examines as if it had followed the
    scalars itself. Those a chain joined (`joined`) are looked at again only by a chain
    that re-replicates nothing of its own (its gradient feeds only the norm): grown apart,
    it took the all_gathers of the same-shaped tensors through the norm, and still does.
    Chains are numbered as they are grown and grouped (union-find) as they commit; a
    refused chain commits nothing. Outcomes are those of growing the chains apart (the
    plans of every example, benchmark shape and 210 generated programs under every offered
    schedule are unchanged); the cost is each chain's own ops."""

    def __init__(self) -> None:
        self.follower: dict[Operation, int] = {}  # scalar op -> the chain that followed it
        self.parent: list[int] = []
        self.spill: dict[int, dict[Space | str, dict[Operation, None]]] = {}
        self.joined: dict[int, dict[Space | str, dict[Operation, None]]] = {}

    def new_chain(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def group(self, chain: int) -> int:
        return find_root(self.parent, chain)

    def group_of(self, op: Operation) -> int | None:
        """The group of the chain that followed `op`, if one did."""
        follower = self.follower.get(op)
        return None if follower is None else self.group(follower)

    def readers(self, group: int, space: Space, joined_too: bool) -> list[Operation]:
        """The tensor readers of `group`'s scalars in `space` that no chain joined, and with
        `joined_too` those that one did."""
        found = list(self.spill.get(group, {}).get(space, ()))
        if joined_too:
            found += self.joined.get(group, {}).get(space, ())
        return found

    def commit(
        self,
        chain: int,
        block: Block,
        followed: Sequence[Operation],
        met: set[int],
        members: set[Operation],
    ) -> None:
        """Chain `chain` is grown (`members`): it followed `followed` and met the groups
        `met` at their scalars. What it joined is no longer spilled."""
        for other in met:
            self._union(chain, other)
        group = self.group(chain)
        spill = self.spill.setdefault(group, {})
        joined = self.joined.setdefault(group, {})
        for op in members:
            space = op_space(op)
            if op in spill.get(space, {}):
                del spill[space][op]
                joined.setdefault(space, {})[op] = None
        for op in followed:
            self.follower[op] = chain
            for r in op.results:
                for use in r.uses:
                    reader = ancestor_in(block, use.operation)
                    space = op_space(reader) if reader is not None else None
                    if reader is not None and space is not None:
                        index = joined if reader in members else spill
                        index.setdefault(space, {})[reader] = None

    def _union(self, a: int, b: int) -> None:
        a, b = self.group(a), self.group(b)
        if a == b:
            return
        small, large = sorted((a, b), key=self._size)
        self.parent[small] = large
        for index in (self.spill, self.joined):
            into = index.setdefault(large, {})
            for space, readers in index.pop(small, {}).items():
                into.setdefault(space, {}).update(readers)

    def _size(self, group: int) -> int:
        return sum(
            len(r) for index in (self.spill, self.joined) for r in index.get(group, {}).values()
        )


def reduce_scatter_chain(
    block: Block,
    rs: comm.ReduceScatterOp,
    held: dict[Operation, None] | None = None,
    info: OrderInfo | None = None,
    close: bool = True,
    coupled: CoupledScalars | None = None,
) -> set[Operation]:
    """The maximal fused all_reduce around `rs`. `held`: ops of other chains fused with
    this one, which cannot couple with it: the chain is refused at the first it would take
    ([fuse-chain], as the check of disjoint chains refuses). `info`: the order of `block`,
    where several chains are grown on it unchanged (Frontier). `close=False`: without the
    scalar arithmetic that closes a cycle (`close_cycles`), for chains that are merged
    first and closed together (a chain coupled to all others spans them all: closing each
    cost the whole program). `coupled` (with `info`): the scalar arithmetic the chains
    grown so far followed, which this one joins without following it again."""
    if rs.parent_block() is not block:
        raise fail(f"{RULE}-block", f"{op_name(rs)} is not in a function body", at=rs)
    assert coupled is None or info is not None, "coupled chains grow on an ordered block"
    me = coupled.new_chain() if coupled is not None else -1
    followed: list[Operation] = []  # scalar ops this chain is the first to follow
    met: set[int] = set()  # groups of chains whose scalars it joined
    boundary: set[Operation] = set()  # those scalars
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
            if (
                user.parent_block() is block
                and not is_terminator(user)  # joins no chain (one_shot.py's watch)
                and (not updates_only or isinstance(user, coco.UpdateOp))
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

    def examine(readers: Sequence[Operation], group: int) -> None:
        # readers of a group's scalars: those scalars are this chain's values too
        assert coupled is not None
        for r in readers:
            chain.update(
                v
                for o in r.walk()
                for v in o.operands
                if coupled.group_of(v.owner) == group  # type: ignore[arg-type]
            )
            pending.add(r)
            frontier.add(r)

    def scan() -> None:
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
                if coupled is not None and computes_scalars(u):
                    group = coupled.group_of(u)
                    if group is None:
                        followed.append(u)
                    else:
                        boundary.add(u)
                        if group not in met:
                            met.add(group)
                            examine(_readers(coupled, group, space, info, rs, False), group)
                        continue  # followed already
                for v in joined:
                    watch(v, updates_only=v in gathered)
                readers_wait([v for v in joined if v in gathered])
            elif waits:
                after_gather.add(u)
                readers_wait(u.results)

    watch(rs.result)
    scan()
    if coupled is not None and met and not any(isinstance(m, comm.AllGatherOp) for m in members):
        # Grown apart, a chain whose own values re-replicate nothing (its gradient only
        # feeds the norm) took the norm's readers in its space that other chains joined,
        # and their all_gathers with them: it looks at those too.
        for group in list(met):
            examine(_readers(coupled, group, space, info, rs, True), group)
        scan()
    if not any(isinstance(m, comm.AllGatherOp) for m in members) and not stays_sliced(members):
        raise fail(
            f"{RULE}-chain",
            f"no all_gather of the chain of {op_name(rs)} over its axes: a fused all_reduce "
            "needs reduce_scatter, computation and all_gather (or, ZeRO-3's, computation "
            "whose every result updates sliced state)",
            at=rs,
        )
    check_rows(members, space)
    members = pull_feeders(block, members, space, boundary=boundary)
    if held is not None:
        for m in members:
            if m in held:
                raise shared(m)
    if coupled is not None:
        coupled.commit(me, block, followed, met, members)
    return close_cycles(block, members, f"fusing the chain of {op_name(rs)}") if close else members


def _readers(
    coupled: CoupledScalars,
    group: int,
    space: Space,
    info: OrderInfo | None,
    rs: comm.ReduceScatterOp,
    joined_too: bool,
) -> list[Operation]:
    """The readers of `group`'s scalars that no chain joined (`joined_too`: or that a chain
    joined) and that may join a chain of `space` (its elementwise ops or its rows), after
    its reduce_scatter."""
    assert info is not None
    start = info.index[rs]
    found = coupled.readers(group, space, joined_too)
    if (rows := row_space(space)) is not None:
        found += coupled.readers(group, rows, joined_too)
    return [r for r in found if info.index[r] > start]


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
    block: Block,
    members: set[Operation],
    space: Space,
    read_before: Operation | None = None,
    boundary: AbstractSet[Operation] = frozenset(),
) -> set[Operation]:
    """Add the ops that only feed the chain (slices, constants, elementwise ops in its
    space), to a fixpoint: a candidate is an operand's producer, looked at again each time
    one of its users joins (no rescan of the block). Not what feeds `read_before` (a one-shot
    all_reduce, whose input peers read from memory: computed before the region), nor what
    feeds the `boundary` (scalar ops another chain followed: what feeds them is its)."""
    members = set(members)
    sources = [m for m in members if m is not read_before and m not in boundary]
    work = [v.owner for m in sources for o in m.walk() for v in o.operands]
    while work:
        p = work.pop()
        if not isinstance(p, Operation) or p in members or p.parent_block() is not block:
            continue
        if not p.results or not isinstance(p, coco.SliceOp | coco.ConstantOp | coco.ElementwiseOp):
            continue
        # slices and splat constants move no data, so any shape may join
        if isinstance(p, coco.ElementwiseOp) and meet(space, op_space(p)) != space:
            continue
        # stops at the first reader outside (a norm read by every tensor's update is looked
        # at by every chain: reading all its readers each time was quadratic)
        users = (ancestor_in(block, use.operation) for r in p.results for use in r.uses)
        first = next(users, None)
        if first is not None and first in members and all(u in members for u in users):
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
