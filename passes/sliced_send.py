"""`coco-sliced-send`: send only this rank's slice to the next stage and all_gather there
(CoCoNet's reorder of an AllGather with a Send)."""

from __future__ import annotations

from dataclasses import dataclass

from coconet.dialects import comm
from coconet.passes.common import (
    axes_prop,
    body_block,
    derived_name,
    fail,
    find_named_ops,
    functions,
    grid_rank,
    name_of,
    op_name,
    readable_at,
    set_name,
)
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

RULE = "sliced-send"


@dataclass(frozen=True)
class SlicedSendPass(ModulePass):
    """Rewrite `%y = comm.send (comm.all_gather %x over A) along s shift k` into
    `%y_s = comm.send %x along s shift k` and `%y = comm.all_gather %y_s over A`: each
    rank sends only its slice across the stage boundary (cross-node traffic / |A|) and the
    receiving stage gathers over its fast intra-stage links. The all_gather stays for its
    other readers, else it is erased. Ranks with no sender receive zeros, whose gather is
    zeros, so the result is unchanged.

    Options: `ops` names sends (targeted); none: every legal send (greedy).

    Legality (refusals name the rule; greedy mode skips what they refuse):
    * [sliced-send-op]     a named op is a `comm.send`.
    * [sliced-send-gather] the send's input is the result of a `comm.all_gather` of the same
                           block.
    * [sliced-send-axes]   the all_gather spans only axes other than the send's axis.
    * [sliced-send-update] the send does not run after an update of the gathered argument.
    """

    name = "coco-sliced-send"

    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.ops:
            sites = find_named_ops(op, self.ops, f"{RULE}-op", "send")
            for fn, s in sites:
                if not isinstance(s, comm.SendOp):
                    raise fail(f"{RULE}-op", f"{op_name(s)} is not a comm.send")
                self._check(fn, s)
            for fn, s in sites:
                assert isinstance(s, comm.SendOp)
                self._rewrite(fn, s)
            return
        for fn in functions(op):
            for s in [o for o in body_block(fn).ops if isinstance(o, comm.SendOp)]:
                try:
                    self._check(fn, s)
                except PassFailedException:
                    continue
                self._rewrite(fn, s)

    def _check(self, fn: func.FuncOp, send: comm.SendOp) -> None:
        ag = send.input.owner
        if not isinstance(ag, comm.AllGatherOp) or ag.parent_block() is not send.parent_block():
            raise fail(
                f"{RULE}-gather",
                f"the input of {op_name(send)} is not the result of a comm.all_gather: there is "
                "no gather to move to the receiving stage",
            )
        if not readable_at(ag.input, send):
            raise fail(
                f"{RULE}-update",
                f"{op_name(send)} runs after the update of {name_of(ag.input)}: sending the "
                "slice itself would read the overwritten buffer",
            )
        along = send.along.value.data
        if along in ag.span():
            raise fail(
                f"{RULE}-axes",
                f"{op_name(ag)} spans grid axis {along}, the axis {op_name(send)} sends along: "
                "the receivers could not gather the slices",
            )
        rank = grid_rank(fn)
        sent = comm.collective_result_type(comm.SendOp, ag.input.type, (along,), rank)
        gathered = comm.collective_result_type(comm.AllGatherOp, sent, ag.span(), rank)
        if gathered != send.result.type:
            raise fail(
                f"{RULE}-axes",
                f"sending the slice and gathering gives {gathered}, not {send.result.type}",
            )

    def _rewrite(self, fn: func.FuncOp, send: comm.SendOp) -> None:
        ag = send.input.owner
        assert isinstance(ag, comm.AllGatherOp)
        rank = grid_rank(fn)
        block = body_block(fn)
        new_send = comm.SendOp(
            ag.input, send.along.value.data, send.shift.value.data, grid_rank=rank
        )
        set_name(new_send.result, derived_name(send.result, "s"))
        new_ag = comm.AllGatherOp(new_send.result, axes_prop(ag), grid_rank=rank)
        block.insert_ops_before([new_send, new_ag], send)
        name = send.result.name_hint
        send.result.replace_all_uses_with(new_ag.result)
        set_name(new_ag.result, name)
        send.detach()
        send.erase()
        if not ag.result.uses:
            ag.detach()
            ag.erase()
