"""`coco-fuse-all-to-all` and `coco-fuse-all-gather`: a `comm.all_to_all` (`comm.all_gather`)
with the elementwise computation of its input and of its result -> one `comm.fused all_to_all`
(`all_gather`) region, one kernel: the sender computes its piece into symmetric memory, the
receiver pulls its part from each peer (an all_gather's: the peer's whole piece) and computes
on it (lowering/fused_all_to_all.py)."""

from __future__ import annotations

from collections.abc import Sequence, Set as AbstractSet
from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.passes.common import (
    OrderInfo,
    ancestor_in,
    body_block,
    fail,
    find_named_ops,
    functions,
    op_name,
    plan_contiguous,
)
from coconet.passes.fuse.checks import exact_set
from coconet.passes.fuse.region import (
    RULE,
    absorb_feeders,
    absorb_updates,
    chains_in_order,
    fuse,
    fuse_plans,
    in_order,
)
from coconet.passes.fuse.spaces import op_space, space_of

Exchange = comm.AllToAllOp | comm.AllGatherOp


@dataclass(frozen=True)
class FuseAllToAllPass(ModulePass):
    """Group a `comm.all_to_all` and the elementwise computation of its input and of its result into
    one `comm.fused all_to_all` region (built as coco-fuse-elementwise builds its regions): the ops
    in the input's iteration space, walking back from it (a scale, a cast to bf16 before dispatch),
    and those in the result's space reading it, in program order, none waiting for a value computed
    from it outside the set (a weighted combine, a residual add, a cast back). Where producers and
    consumers together would close a cycle, the consumers alone, then the producers alone, then the
    all_to_all alone. Greedy (no `ops`): every all_to_all. Targeted: `ops` names all_to_alls (their
    maximal computation), or the exact set (one all_to_all plus elementwise ops).
    `coco-fuse{mode=all_to_all}` is this pass.

    Legality (refusals name the rule; greedy mode skips what they refuse):
    * [fuse-chain]       an all_to_all fusion holds exactly one all_to_all and elementwise
                         ops.
    * [fuse-sizes]       the ops before the exchange run in the input's iteration space,
                         those after it in the result's; scalars fit either.
    * [fuse-dead]        the all_to_all's result reaches an update or a return (a dead
                         exchange is dce's to remove, and would leave its region without
                         it).
    * [fuse-connected], [fuse-cycle], [fuse-block] as for coco-fuse-elementwise.
    """

    name = "coco-fuse-all-to-all"

    ops: tuple[str, ...] = ()

    # the exchange this pass fuses, and its region's kind
    exchange: ClassVar[type[Exchange]] = comm.AllToAllOp
    kind: ClassVar[str] = "all_to_all"
    # greedy mode leaves an exchange with no computation to fuse to its library collective
    alone: ClassVar[bool] = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.ops:
            sites = find_named_ops(op, self.ops, f"{RULE}-block", "op")
            plans = chains_in_order(sites, self.exchange, exchange_chain, self.kind)
            if plans is None:
                block, members = exact_set(sites, self._check_exchange, _check_exchange_sizes)
                plans = [(block, members, self.kind)]
            fuse_plans(plans)
            return
        for fn in functions(op):
            self.fuse_greedy(body_block(fn))

    def fuse_greedy(self, block: Block) -> None:
        """Fuse every exchange of `block` with the computation the rules admit."""
        for x in [o for o in block.ops if isinstance(o, self.exchange)]:
            try:
                members = exchange_chain(block, x)
                if self.alone or any(isinstance(m, coco.ElementwiseOp) for m in members):
                    fuse(block, members, self.kind)
            except PassFailedException:
                continue

    def _check_exchange(self, members: set[Operation]) -> None:
        kind, exchanges = self.kind, [m for m in in_order(members) if isinstance(m, Exchange)]
        if len(exchanges) != 1 or not isinstance(exchanges[0], self.exchange):
            raise fail(
                f"{RULE}-chain",
                f"a fused {kind} holds exactly one {self.exchange.name} and no other exchange; "
                f"the named ops hold {', '.join(op_name(x) for x in exchanges) or 'none'}",
            )
        for m in in_order(members - set(exchanges)):
            if not isinstance(m, coco.ElementwiseOp):
                raise fail(
                    f"{RULE}-chain",
                    f"{op_name(m)} cannot be part of a fused {kind} (its {kind} and "
                    "elementwise computation of its input and result only)",
                )


@dataclass(frozen=True)
class FuseAllGatherPass(FuseAllToAllPass):
    """Group a `comm.all_gather` and the elementwise computation of its input (FSDP's cast of
    the f32 master shard to bf16) and of its result into one `comm.fused all_gather` region:
    one kernel computes this rank's piece into symmetric memory once and pulls every
    member's whole piece. The regions, their rules ([fuse-chain], [fuse-sizes], [fuse-dead],
    [fuse-connected], [fuse-cycle], [fuse-block]) and its targeted mode are
    coco-fuse-all-to-all's, for an all_gather; greedy mode fuses every all_gather (outside
    other regions) that has computation to fuse -- a bare one stays the library's.
    `coco-fuse{mode=all_gather}` is this pass."""

    name = "coco-fuse-all-gather"

    exchange: ClassVar[type[Exchange]] = comm.AllGatherOp
    kind: ClassVar[str] = "all_gather"
    alone: ClassVar[bool] = False


def _check_exchange_sizes(members: set[Operation]) -> None:
    """Ops computed from the exchange's result run on the receiver's piece (the result's
    space), the others on the sender's (the input's); scalars fit either."""
    a2a = next(m for m in members if isinstance(m, Exchange))
    after = _downstream(a2a, members)
    for m in in_order(members - {a2a}):
        s = op_space(m)
        want = space_of(a2a.result) if m in after else space_of(a2a.input)
        if s is not None and s != want:
            side = "result" if m in after else "input"
            raise fail(
                f"{RULE}-sizes",
                f"{op_name(m)} computes over a different iteration space than the "
                f"all_to_all's {side} (the kernel computes each side on one piece)",
            )


def exchange_chain(
    block: Block, a2a: Exchange, taken: AbstractSet[Operation] = frozenset()
) -> set[Operation]:
    """`a2a` with the elementwise computation of its input (producers) and of its
    result (consumers), plus the slices, constants and updates only they need: the
    largest of {producers and consumers, consumers, producers, none} that closes no
    cycle. Ops in `taken` (an earlier exchange's) are not taken again."""
    if a2a.parent_block() is not block:
        raise fail(f"{RULE}-block", f"{op_name(a2a)} is not in a function body")
    before = _exchange_producers(block, a2a, taken)
    after = _exchange_consumers(block, a2a, taken)
    tried: list[set[Operation]] = []
    for chosen in (before | after, after, before):
        if not chosen or chosen in tried:
            continue
        tried.append(chosen)
        members = absorb_feeders(block, chosen | {a2a})
        try:
            plan_contiguous(
                block, members, f"{RULE}-cycle", f"fusing the computation of {op_name(a2a)}"
            )
        except PassFailedException:
            continue
        return absorb_updates(block, members, OrderInfo.spanning(block, members))
    return absorb_updates(block, {a2a}, OrderInfo.spanning(block, {a2a}))


def _downstream(a2a: Exchange, members: set[Operation]) -> set[Operation]:
    """The members computed (transitively) from the all_to_all's result."""
    reached: set[SSAValue] = {a2a.result}
    out: set[Operation] = set()
    for m in in_order(members - {a2a}):
        if any(v in reached for o in m.walk() for v in o.operands):
            out.add(m)
            reached.update(m.results)
    return out


def _exchange_producers(
    block: Block, a2a: Exchange, taken: AbstractSet[Operation]
) -> set[Operation]:
    """The elementwise ops computing the all_to_all's input in its iteration space (shape and
    layouts; the element type may differ: a cast to bf16 before dispatch), walking back from
    it through their operands (not into `taken`)."""
    space = space_of(a2a.input)
    members: set[Operation] = set()
    work: list[SSAValue] = [a2a.input]
    while work:
        p = work.pop().owner
        if (
            isinstance(p, coco.ElementwiseOp)
            and p.parent_block() is block
            and p not in members
            and p not in taken
            and space is not None
            and op_space(p) == space
        ):
            members.add(p)
            work.extend(p.operands)
    return members


def _exchange_consumers(
    block: Block, a2a: Exchange, taken: AbstractSet[Operation]
) -> set[Operation]:
    """The elementwise ops in the all_to_all result's iteration space computed from it, in
    program order: an op joins when it reads the result or a joined op's, and nothing
    computed from them outside the set (which would then run between the set's ops), and
    it is not in `taken`. Only the users of those values are looked at, up to the last one
    (no scan of the rest of the function)."""
    space = space_of(a2a.result)
    members: set[Operation] = set()
    chain: set[SSAValue] = {a2a.result}
    waiting: set[SSAValue] = set()  # computed from the chain outside it
    pending: set[Operation] = set()

    def watch(values: Sequence[SSAValue]) -> None:
        for v in values:
            for use in v.uses:
                user = ancestor_in(block, use.operation)
                if user is not None:
                    pending.add(user)

    watch([a2a.result])
    u = a2a.next_op
    while pending and u is not None:
        if u in pending:
            pending.discard(u)
            reads = {v for o in u.walk() for v in o.operands}
            if (
                isinstance(u, coco.ElementwiseOp)
                and u not in taken
                and space is not None
                and op_space(u) == space
                and reads & chain
                and not reads & waiting
            ):
                members.add(u)
                chain.update(u.results)
            else:
                waiting.update(u.results)
            watch(list(u.results))
        u = u.next_op
    return members
