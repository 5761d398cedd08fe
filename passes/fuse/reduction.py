"""`coco-fuse-reduction`: a full reduction, the elementwise computation of its input and the
all_reduce of its partial -> one `comm.fused reduction` region, one kernel. An fp8 scale's
amax (`all_reduce(max |w|)`) or a clipping's norm then reads the tensor once: no |w| or g*g
stored and read back, no library all_reduce of one scalar (the partials are exchanged
through symmetric memory)."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.dialects.coco_types import is_float_name
from coconet.passes.common import body_block, fail, find_named_ops, functions, op_name
from coconet.passes.fuse.checks import exact_set
from coconet.passes.fuse.region import (
    RULE,
    absorb_feeders,
    chains_in_order,
    feeding_computation,
    fuse,
    fuse_plans,
    in_order,
)
from coconet.passes.fuse.spaces import meet, op_space, space_of

KIND = "reduction"


@dataclass(frozen=True)
class FuseReductionPass(ModulePass):
    """Group a full `coco.reduce`, the elementwise computation of its input (in the input's
    iteration space, walking back from it) and the `comm.all_reduce` of its partial (its only
    reader, of the same kind, no stated `acc`) into one `comm.fused reduction` region: one
    kernel computes every element's values, stores those read after it, and finishes the
    reduction, across the all_reduce's group when it holds one. Reductions whose computation
    overlaps join one region (a kernel can finish several). Greedy (no `ops`): every reduction
    with computation or an all_reduce to fuse. Targeted: `ops` names reductions (each with its
    maximal computation), or the exact set. `coco-fuse{mode=reduction}` is this pass.

    Legality (refusals name the rule; greedy mode skips what they refuse):
    * [fuse-reduction]   the set holds full reductions of one iteration space of a float type
                         (the kernel exchanges partials as doubles), the all_reduces of their
                         partials (all or none) and elementwise ops, constants and slices; no
                         member reads a reduction's total; a named reduction has computation
                         or an all_reduce to fuse.
    * [fuse-sizes]       computed tensors share the reductions' iteration space.
    * [fuse-connected], [fuse-cycle], [fuse-block] as for coco-fuse-elementwise.
    """

    name = "coco-fuse-reduction"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.ops:
            # an all_reduce of a reduction's partial names that reduction's chain
            sites = [
                (fn, _reduction_of(s))
                for fn, s in find_named_ops(op, self.ops, f"{RULE}-block", "op")
            ]
            plans = chains_in_order(sites, coco.ReduceOp, _named_chain, KIND)
            if plans is None:
                block, members = exact_set(sites, check_reduction_set)
                plans = [(block, members, KIND)]
            fuse_plans(plans)
            return
        for fn in functions(op):
            fuse_greedy(body_block(fn))


def fuse_greedy(block: Block) -> None:
    """Fuse every reduction of `block` that has computation or an all_reduce to fuse and that
    the rules admit; reductions whose computation overlaps share one region."""
    for members in _merged(block, _greedy_chains(block)):
        try:
            fuse(block, members, KIND)
        except PassFailedException:
            continue


def fusable_reductions(block: Block) -> bool:
    """Whether the greedy pass has a reduction of `block` to fuse (the schedule recipes add
    the step only then, so other programs' pipelines keep their text)."""
    return bool(_greedy_chains(block))


def _greedy_chains(block: Block) -> list[set[Operation]]:
    chains: list[set[Operation]] = []
    for r in [o for o in block.ops if isinstance(o, coco.ReduceOp)]:
        finisher = finisher_of(r)
        if not (finisher.result if finisher is not None else r.result).uses:
            continue  # a total nobody reads: cse would leave the region without its reduce
        try:
            chain = reduction_chain(block, r, frozenset())
        except PassFailedException:
            continue
        if len(chain) > 1:  # a reduction of memory, read by no all_reduce: its own kernel
            chains.append(chain)
    return chains


def _merged(block: Block, chains: list[set[Operation]]) -> list[set[Operation]]:
    """Chains sharing computation, merged where the union is one legal region (one space,
    all finished over one group or none); otherwise the later one goes without the shared
    ops, which it then reads from memory."""
    out: list[set[Operation]] = []
    for chain in chains:
        for i, held in enumerate(out):
            if not held & chain:
                continue
            union = held | chain
            try:
                check_reduction_set(union)
            except PassFailedException:
                chain = chain - held
                continue
            out[i] = union
            break
        else:
            if len(chain) > 1 and any(isinstance(m, coco.ReduceOp) for m in chain):
                out.append(chain)
    return out


def _described(v: SSAValue) -> str:
    return f"%{v.name_hint}" if v.name_hint else "a tensor"


def _reduction_of(op: Operation) -> Operation:
    """The reduction whose partial `op` all_reduces where it does (`finisher_of`), else `op`."""
    if isinstance(op, comm.AllReduceOp):
        r = op.input.owner
        if isinstance(r, coco.ReduceOp) and finisher_of(r) is op:
            return r
    return op


def _named_chain(block: Block, r: coco.ReduceOp, taken: AbstractSet[Operation]) -> set[Operation]:
    members = reduction_chain(block, r, taken)
    if len(members) == 1:
        raise fail(
            f"{RULE}-reduction",
            f"{op_name(r)} reads {_described(r.input)} "
            "from memory and its partial is not all_reduced here: there is nothing to fuse "
            "into it",
            at=r,
        )
    return members


def reduction_chain(
    block: Block, r: coco.ReduceOp, taken: AbstractSet[Operation]
) -> set[Operation]:
    """`r`, the elementwise computation of its input in the input's iteration space (not in
    `taken`), the all_reduce of its partial where that is its only reader, and the slices
    and constants only those read."""
    if r.parent_block() is not block:
        raise fail(f"{RULE}-block", f"{op_name(r)} is not in a function body", at=r)
    _check_reduced(r)
    members: set[Operation] = {r} | feeding_computation(block, r, space_of(r.input), taken)
    finisher = finisher_of(r)
    if finisher is not None and finisher.parent_block() is block:
        members.add(finisher)
    if len(members) == 1:
        return members
    return absorb_feeders(block, members)


def finisher_of(r: coco.ReduceOp) -> comm.AllReduceOp | None:
    """The all_reduce combining `r`'s partial, which a fused kernel can finish: `r`'s only
    reader, of `r`'s kind, with no stated accumulation (the kernel combines the partials in
    double and rounds once)."""
    uses = list(r.result.uses)
    if len(uses) != 1:
        return None
    ar = uses[0].operation
    if isinstance(ar, comm.AllReduceOp) and ar.kind.data == r.kind.data and ar.acc is None:
        return ar
    return None


def _check_reduced(r: coco.ReduceOp) -> None:
    elt = r.input.type.elt
    if not is_float_name(elt):
        raise fail(
            f"{RULE}-reduction",
            f"{op_name(r)} reduces {elt}: a fused reduction's kernel exchanges its partials "
            "as doubles, exact for float types only",
            at=r,
        )
    if space_of(r.input) is None:
        raise fail(
            f"{RULE}-reduction", f"{op_name(r)} reduces a scalar: there is nothing to fuse", at=r
        )


def check_reduction_set(members: set[Operation]) -> None:
    """The region verifier's rules (`comm.fused_reduction_problem`), as a refusal of the set
    before it is built; and what the pass adds: float reductions of tensors, all_reduces that
    are their partials' only readers with no stated acc, computation in the reductions'
    space."""
    ops = in_order(members)
    for r in ops:
        if isinstance(r, coco.ReduceOp):
            _check_reduced(r)
    problem = comm.fused_reduction_problem(ops)
    if problem is not None:
        message, at = problem
        raise fail(f"{RULE}-reduction", message, at=at)
    reduces = [m for m in ops if isinstance(m, coco.ReduceOp)]
    space = space_of(reduces[0].input)
    for m in ops:
        if isinstance(m, comm.AllReduceOp):
            r = m.input.owner
            if not isinstance(r, coco.ReduceOp) or finisher_of(r) is not m:
                raise fail(
                    f"{RULE}-reduction",
                    f"{op_name(m)} is not the only reader of the partial it combines, or "
                    "states its accumulation (the kernel combines partials in double and "
                    "rounds once)",
                    at=m,
                )
        elif isinstance(m, coco.ElementwiseOp) and meet(space, op_space(m)) != space:
            raise fail(
                f"{RULE}-sizes",
                f"{op_name(m)} computes over a different iteration space than the "
                "reductions (one kernel runs one space)",
                at=m,
            )
