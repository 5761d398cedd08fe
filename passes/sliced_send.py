"""`coco-sliced-send`: send only this rank's slice to the next stage and all_gather there
(CoCoNet's reorder of an AllGather with a Send)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.utils.exceptions import PassFailedException, VerifyException

from coconet.dialects import comm
from coconet.dialects.coco import readable_at
from coconet.dialects.layout_rules import grid_of
from coconet.passes.common import (
    Refusal,
    axes_prop,
    derived_name,
    fail,
    find_named_ops,
    name_of,
    op_name,
    remark_skipped,
    remarks_wanted,
    set_name,
)

RULE = "sliced-send"


def check_sliced_send(send: comm.SendOp) -> None:
    """Refuse (PassFailedException, naming the rule) what this pass cannot do with `send`."""
    ag = send.input.owner
    if not isinstance(ag, comm.AllGatherOp) or ag.parent_block() is not send.parent_block():
        raise fail(
            f"{RULE}-gather",
            f"the input of {op_name(send)} is not the result of a comm.all_gather: there is "
            "no gather to move to the receiving stage",
            at=send,
        )
    if not readable_at(ag.input, send):
        raise fail(
            f"{RULE}-update",
            f"{op_name(send)} runs after the update of {name_of(ag.input)}: sending the "
            "slice itself would read the overwritten buffer",
            at=send,
        )
    along = send.along.value.data
    if along in ag.span():
        raise fail(
            f"{RULE}-axes",
            f"{op_name(ag)} spans grid axis {along}, the axis {op_name(send)} sends along: "
            "the receivers could not gather the slices",
            at=ag,
        )
    rank = grid_of(send).rank
    try:
        sent = comm.collective_result_type(comm.SendOp, ag.input.type, (along,), rank)
        gathered = comm.collective_result_type(comm.AllGatherOp, sent, ag.span(), rank)
    except VerifyException as e:
        raise fail(f"{RULE}-axes", f"sending the slice of {op_name(ag)}: {e}", at=ag) from None
    if gathered != send.result.type:
        raise fail(
            f"{RULE}-axes",
            f"sending the slice and gathering gives {gathered}, not {send.result.type}",
            at=send,
        )


class SliceSend(RewritePattern):
    """`%y = comm.send (comm.all_gather %x)` -> `%y_s = comm.send %x` and
    `%y = comm.all_gather %y_s`, for a send of a function body the rules allow (the others are
    left alone); the old gather goes once nothing else reads it."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: comm.SendOp, rewriter: PatternRewriter) -> None:
        if not isinstance(op.parent_op(), func.FuncOp):
            return
        try:
            check_sliced_send(op)
        except PassFailedException:
            return
        ag = op.input.owner
        assert isinstance(ag, comm.AllGatherOp)
        rank = grid_of(op).rank
        new_send = comm.SendOp(ag.input, op.along.value.data, op.shift.value.data, grid_rank=rank)
        set_name(new_send.result, derived_name(op.result, "s"))
        new_ag = comm.AllGatherOp(new_send.result, axes_prop(ag), grid_rank=rank)
        # the new gather takes the send's name: readers and output names stay
        rewriter.replace(op, [new_send, new_ag], [new_ag.result])
        if not ag.result.uses:
            rewriter.erase(ag)


@dataclass(frozen=True)
class SlicedSendPass(ModulePass):
    """Rewrite `%y = comm.send (comm.all_gather %x over A) along s shift k` into
    `%y_s = comm.send %x along s shift k` and `%y = comm.all_gather %y_s over A`: each
    rank sends only its slice across the stage boundary (cross-node traffic / |A|) and the
    receiving stage gathers over its fast intra-stage links. The all_gather stays for its
    other readers, else it is erased. Ranks with no sender receive zeros, whose gather is
    zeros, so the result is unchanged.

    Options: `ops` names sends (targeted); none: every legal send (greedy).

    Legality (refusals name the rule; greedy mode skips what they refuse, with a remark
    under `coco-opt --remarks`):
    * [sliced-send-op]     a named op is a `comm.send`.
    * [sliced-send-gather] the send's input is the result of a `comm.all_gather` of the same
                           block.
    * [sliced-send-axes]   the all_gather spans only axes other than the send's axis.
    * [sliced-send-update] the send does not run after an update of the gathered argument.
    """

    name = "coco-sliced-send"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if not self.ops:
            if remarks_wanted():  # coco-opt --remarks: the sends of a gather it skips, and why
                for send in op.walk():
                    if isinstance(send, comm.SendOp) and isinstance(
                        send.input.owner, comm.AllGatherOp
                    ):
                        try:
                            check_sliced_send(send)
                        except Refusal as refusal:
                            remark_skipped(self.name, refusal, send)
            PatternRewriteWalker(SliceSend(), apply_recursively=False).rewrite_module(op)
            return
        sites = [s for _, s in find_named_ops(op, self.ops, f"{RULE}-op", "send")]
        for s in sites:  # check every request before changing anything
            if not isinstance(s, comm.SendOp):
                raise fail(f"{RULE}-op", f"{op_name(s)} is not a comm.send", at=s)
            check_sliced_send(s)
        for s in sites:
            SliceSend().match_and_rewrite(s, PatternRewriter(s))
