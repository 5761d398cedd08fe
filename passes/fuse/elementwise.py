"""`coco-fuse-elementwise`: connected elementwise ops -> one `comm.fused elementwise` region,
one kernel (CoCoNet's `fuse` of computation)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco
from coconet.passes.common import Facts, OrderInfo, body_block, find_named_ops, functions
from coconet.passes.fuse.checks import check_elementwise, check_sizes, exact_set
from coconet.passes.fuse.growing_plan import GrowingPlan
from coconet.passes.fuse.region import RULE, absorb_feeders, absorb_updates, fuse, fuse_plans
from coconet.passes.fuse.spaces import Space, meet, op_space

KIND = "elementwise"


@dataclass(frozen=True)
class FuseElementwisePass(ModulePass):
    """Group elementwise ops into one `comm.fused elementwise` region (one kernel). The
    region keeps the original ops, runs in place (it reads outer values directly), and yields
    the values used outside it; ops between the grouped ones move above the region if they
    do not depend on it, below if they do.

    Greedy (no `ops`): every maximal connected set (grown in program order, an op joining
    only where it keeps the set acyclic and in one iteration space) of two or more ops with a
    tensor result, or of scalar ops that update scalar state (a loss scale: one kernel of one
    element), plus the slices and constants only it reads. Targeted (`ops` names the
    ops): exactly those. Updates storing a fused value join the region when that keeps it
    acyclic (the kernel writes the buffer). `coco-fuse{mode=elementwise}` is this pass.

    Legality (refusals name the rule; greedy mode skips what they refuse):
    * [fuse-elementwise] the set holds only elementwise ops (and updates).
    * [fuse-sizes]       tensors computed in the region share one iteration space; scalars
                         fit any.
    * [fuse-connected]   a targeted set is connected through its own values.
    * [fuse-cycle]       no op outside the set depends on the set and feeds back into it.
    * [fuse-block]       named ops sit in one function body, not inside regions.
    """

    name = "coco-fuse-elementwise"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.ops:
            sites = find_named_ops(op, self.ops, f"{RULE}-block", "op")
            block, members = exact_set(
                sites, check_elementwise, lambda members: check_sizes(members, KIND)
            )
            fuse_plans([(block, members, KIND)])
            return
        for fn in functions(op):
            fuse_greedy(body_block(fn))


def fuse_greedy(block: Block) -> None:
    """Fuse every elementwise component of `block` that the rules admit, the shortest spans
    first. A component spanning many others (a global norm's, holding every same-shaped
    tensor's step) splits each of them when it is fused (what does not depend on it moves
    above, what does below); fused after them, it holds them as one op each, where fused
    before them each one's span ran over everything moved above it (quadratic)."""
    facts: dict[Operation, Facts] = {}
    index = {op: i for i, op in enumerate(block.ops)}

    def span(members: set[Operation]) -> int:
        at = [index[m] for m in members]
        return max(at) - min(at)

    for members in sorted(components(block, facts), key=span):
        try:
            fuse(block, members, KIND, facts)
        except PassFailedException:
            continue


def components(block: Block, facts: dict[Operation, Facts] | None = None) -> list[set[Operation]]:
    """Every maximal connected set of elementwise ops, grown in program order (an op joins
    where it keeps the set acyclic and in one iteration space), of two or more ops with a
    tensor result or updating scalar state, with the slices, constants and updates that
    join it."""
    info = OrderInfo(block, facts=facts)
    comps: list[set[Operation]] = []
    spaces: list[Space] = []
    # each component's contiguity plan, kept as it grows (None once merged away)
    plans: list[GrowingPlan | None] = []
    comp_of: dict[Operation, int] = {}
    for u in info.ops:
        if not isinstance(u, coco.ElementwiseOp):
            continue
        s = op_space(u)
        neighbours = sorted(
            {comp_of[v.owner] for v in u.operands if v.owner in comp_of}  # type: ignore[index]
        )
        placed = False
        if neighbours:
            merged = {u}.union(*(comps[i] for i in neighbours))
            space: Space | str = s
            for i in neighbours:
                space = space if isinstance(space, str) else meet(space, spaces[i])
            if (
                not isinstance(space, str)
                and (plan := GrowingPlan.join(info, plans, neighbours, comp_of, u)) is not None
            ):
                keep = neighbours[0]
                for i in neighbours[1:]:
                    for m in comps[i]:
                        comp_of[m] = keep
                    comps[i] = set()
                    plans[i] = None
                comps[keep] = merged
                spaces[keep] = space
                plans[keep] = plan
                comp_of[u] = keep
                placed = True
            else:
                for i in neighbours:
                    sp = meet(spaces[i], s) if not isinstance(s, str) else "mismatch"
                    if isinstance(sp, str):
                        continue
                    plan = GrowingPlan.join(info, plans, [i], comp_of, u)
                    if plan is None:
                        continue
                    comps[i] = comps[i] | {u}
                    spaces[i] = sp
                    plans[i] = plan
                    comp_of[u] = i
                    placed = True
                    break
        if not placed:
            comp_of[u] = len(comps)
            comps.append({u})
            spaces.append(None if isinstance(s, str) else s)
            plans.append(GrowingPlan.of(info, u))
    result: list[set[Operation]] = []
    for c, sp in zip(comps, spaces, strict=True):
        if len(c) < 2:
            continue
        c = absorb_updates(block, absorb_feeders(block, c), info)
        # Scalar arithmetic alone stays out (kernels reading it compute it themselves:
        # coco-defer), unless it updates scalar state (a loss scale), which some kernel must
        # store: one kernel of one element then, not one launch per op.
        if sp is None and not any(isinstance(m, coco.UpdateOp) for m in c):
            continue
        result.append(c)
    return result
