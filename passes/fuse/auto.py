"""`coco-fuse`: CoCoNet's `fuse` as one pass over every mode: the fused all_reduces first,
then the fused sends, the fused all_to_alls, and elementwise kernels over the rest. Each
mode is a pass of its own (coco-fuse-all-reduce, -send, -all-to-all, -elementwise); this
one runs them in that order, or the one its `mode` option names."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from coconet.dialects import comm
from coconet.passes.common import fail, find_named_ops
from coconet.passes.fuse.all_reduce import FORMS, FuseAllReducePass
from coconet.passes.fuse.all_to_all import FuseAllGatherPass, FuseAllToAllPass
from coconet.passes.fuse.elementwise import FuseElementwisePass
from coconet.passes.fuse.reduction import FuseReductionPass
from coconet.passes.fuse.region import ONE_SHOT, RULE
from coconet.passes.fuse.send import FuseSendPass

MODES = ("auto", "elementwise", "all_reduce", "send", "all_to_all", "all_gather", "reduction")


@dataclass(frozen=True)
class FusePass(ModulePass):
    """Group ops into `comm.fused KIND` regions (one kernel, or one fused collective): the
    pipeline of the fusion passes, or one of them (`mode` option).

    Modes:
    * `auto` (default): `coco-fuse-all-reduce`, `coco-fuse-send`, `coco-fuse-all-to-all`,
      then `coco-fuse-elementwise` on the rest, each greedy. Targeted (`ops`): a fused
      all_reduce where a reduce_scatter is named, else an elementwise kernel.
    * `elementwise`, `all_reduce`, `send`, `all_to_all`, `all_gather`, `reduction`: that
      mode's pass, with `ops` (and,
      for all_reduce, `form`): `coco-fuse{mode=all_reduce form=one_shot}` is
      `coco-fuse-all-reduce{form=one_shot}`. Each pass's docstring says what its regions hold
      and the rules that refuse them.

    Legality (besides the passes' own):
    * [fuse-mode] `mode` is one of auto, elementwise, all_reduce, send, all_to_all,
      all_gather, reduction. (`auto` leaves all_gathers outside fused all_reduces to the
      library: `all_gather` fuses those with computation around them; and full reductions
      outside fused collectives to their own kernels: `reduction` fuses their computation.)
    * [fuse-form] `form` is two_shot or one_shot; one_shot goes with mode=all_reduce.
    """

    name = "coco-fuse"

    mode: str = "auto"
    ops: tuple[str, ...] = ()
    form: str = "two_shot"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.mode not in MODES:
            raise fail(f"{RULE}-mode", f"unknown mode '{self.mode}': use one of {', '.join(MODES)}")
        if self.form not in FORMS:
            raise fail(f"{RULE}-form", f"unknown form '{self.form}': use one of {', '.join(FORMS)}")
        if self.form == ONE_SHOT and self.mode != "all_reduce":
            raise fail(
                f"{RULE}-form",
                f"form=one_shot is a form of a fused all_reduce: use it with "
                f"mode=all_reduce, not mode={self.mode}",
            )
        for mode_pass in self._passes(op):
            mode_pass.apply(ctx, op)

    def _passes(self, op: ModuleOp) -> list[ModulePass]:
        mode = self.mode
        if mode == "auto" and self.ops:
            named = [s for _, s in find_named_ops(op, self.ops, f"{RULE}-block", "op")]
            reduce_scatter = any(isinstance(s, comm.ReduceScatterOp) for s in named)
            mode = "all_reduce" if reduce_scatter else "elementwise"
        if mode == "all_reduce":
            return [FuseAllReducePass(ops=self.ops, form=self.form)]
        if mode == "send":
            return [FuseSendPass(ops=self.ops)]
        if mode == "all_to_all":
            return [FuseAllToAllPass(ops=self.ops)]
        if mode == "all_gather":
            return [FuseAllGatherPass(ops=self.ops)]
        if mode == "elementwise":
            return [FuseElementwisePass(ops=self.ops)]
        if mode == "reduction":
            return [FuseReductionPass(ops=self.ops)]
        return [FuseAllReducePass(), FuseSendPass(), FuseAllToAllPass(), FuseElementwisePass()]
