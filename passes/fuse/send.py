"""`coco-fuse-send`: the elementwise computation feeding a `comm.send` and the send -> one
`comm.fused send` region, one kernel (CoCoNet's fused computation + P2P)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.passes.common import (
    body_block,
    fail,
    find_named_ops,
    functions,
    op_name,
    plan_contiguous,
)
from coconet.passes.fuse.checks import check_elementwise, check_sizes, exact_set
from coconet.passes.fuse.region import (
    RULE,
    Plan,
    absorb_feeders,
    feeding_computation,
    fuse,
    fuse_plans,
)
from coconet.passes.fuse.spaces import space_of

KIND = "send"


@dataclass(frozen=True)
class FuseSendPass(ModulePass):
    """Group a `comm.send` and the elementwise computation feeding it into one `comm.fused send`
    region (built as coco-fuse-elementwise builds its regions): the computation in the send's
    iteration space, walking back from its input. Greedy (no `ops`): every send. Targeted: `ops`
    names sends (their maximal feeding computation), or the exact set (one send plus elementwise
    ops). `coco-fuse{mode=send}` is this pass.

    Legality (refusals name the rule; greedy mode skips what they refuse):
    * [fuse-chain]       a send fusion holds exactly one send, fed by elementwise
                         computation.
    * [fuse-elementwise] besides the send, the set holds elementwise ops only.
    * [fuse-sizes]       tensors computed in the region share one iteration space.
    * [fuse-connected], [fuse-cycle], [fuse-block] as for coco-fuse-elementwise.
    """

    name = "coco-fuse-send"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.ops:
            sites = find_named_ops(op, self.ops, f"{RULE}-block", "op")
            plans: list[Plan] = []
            if all(isinstance(s, comm.SendOp) for _, s in sites):
                for fn, send in sites:
                    assert isinstance(send, comm.SendOp)  # checked just above
                    block = body_block(fn)
                    plans.append((block, send_chain(block, send), KIND))
            else:
                block, members = exact_set(
                    sites, _check_send, lambda members: check_sizes(members, KIND)
                )
                plans.append((block, members, KIND))
            fuse_plans(plans)
            return
        for fn in functions(op):
            fuse_greedy(body_block(fn))


def fuse_greedy(block: Block) -> None:
    """Fuse the computation of every send of `block` that the rules admit."""
    for send in [o for o in block.ops if isinstance(o, comm.SendOp)]:
        if send.parent_block() is not block:
            continue
        try:
            fuse(block, send_chain(block, send), KIND)
        except PassFailedException:
            continue


def _check_send(members: set[Operation]) -> None:
    sends = [m for m in members if isinstance(m, comm.SendOp)]
    if len(sends) != 1:
        raise fail(
            f"{RULE}-chain",
            f"a fused send holds exactly one comm.send; the named ops hold {len(sends)}",
        )
    check_elementwise(members - set(sends))


def send_chain(block: Block, send: comm.SendOp) -> set[Operation]:
    """The elementwise computation feeding `send` (in its iteration space), and the send."""
    if send.parent_block() is not block:
        raise fail(f"{RULE}-block", f"{op_name(send)} is not in a function body", at=send)
    space = space_of(send.input)
    producer = send.input.owner
    if not (isinstance(producer, coco.ElementwiseOp) and producer.parent_block() is block):
        raise fail(
            f"{RULE}-chain",
            f"the input of {op_name(send)} is not computed by an elementwise op: there is "
            "no computation to fuse into the send",
            at=send,
        )
    members = {producer} | feeding_computation(block, producer, space)
    members = absorb_feeders(block, members | {send})
    plan_contiguous(block, members, f"{RULE}-cycle", f"fusing the computation of {op_name(send)}")
    return members
