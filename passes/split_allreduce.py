"""`coco-split-allreduce`: all_reduce -> reduce_scatter + all_gather (CoCoNet's `split`)."""

from __future__ import annotations

from dataclasses import dataclass

from coconet.dialects import comm
from coconet.dialects.layout_rules import check_type_fits_grid, grid_of
from coconet.passes.common import (
    axes_prop,
    body_block,
    derived_name,
    fail,
    find_named_ops,
    functions,
    grid_rank,
    op_name,
    set_name,
)
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

RULE = "split-allreduce"


@dataclass(frozen=True)
class SplitAllReducePass(ModulePass):
    """Split `%y = comm.all_reduce K %x over A` into
    `%y_rs = comm.reduce_scatter K %x over A` (sliced on tensor dim `dim`) and
    `%y = comm.all_gather %y_rs over A`; every use of the all_reduce reads the all_gather.
    Ring all_reduce moves exactly these bytes, and the split exposes the sliced middle that
    `coco-reorder` moves computation into. The sim reduces both in f64 in rank order, so the
    split program is bit-identical.

    Options: `ops` names the all_reduces to split (targeted); none: every all_reduce in a
    function body (greedy). `dim`: the tensor dim the reduce_scatter slices (default 0).

    Legality (refusals name the rule):
    * [split-allreduce-op]    a named op must be a comm.all_reduce.
    * [split-allreduce-scalar] the value has a dim to slice (rank >= 1, `dim` < rank).
    * [split-allreduce-dim]   dim `dim` is not already sliced by a grid axis inner to (after)
      the all_reduce's axes: slices of one dim nest outer axis first, so a reduce_scatter
      over an outer axis cannot cut a dim an inner axis already cuts.
    * [split-allreduce-uneven] on a statically sized grid, dim `dim` divides evenly by the
      ranks that cut it (the all_reduce's axes and any axis already slicing that dim).
    Greedy mode skips the all_reduces these rules refuse.
    """

    name = "coco-split-allreduce"

    ops: tuple[str, ...] = ()
    dim: int = 0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.ops:
            sites = find_named_ops(op, self.ops, f"{RULE}-op", "all_reduce")
            for _, site in sites:
                if not isinstance(site, comm.AllReduceOp):
                    raise fail(
                        f"{RULE}-op",
                        f"{op_name(site)} is not a comm.all_reduce: only all_reduces split",
                    )
            plans = [(fn, site, self._check(site)) for fn, site in sites]
            if any(p[2] is not None for p in plans):
                raise next(p[2] for p in plans if p[2] is not None)
        else:
            plans = [
                (fn, site, None)
                for fn in functions(op)
                for site in body_block(fn).ops
                if isinstance(site, comm.AllReduceOp) and self._check(site) is None
            ]
        for fn, site, _ in plans:
            self._rewrite(fn, site)

    def _check(self, ar: comm.AllReduceOp) -> Exception | None:
        t = ar.input.type
        if t.rank == 0 or not 0 <= self.dim < t.rank:
            return fail(
                f"{RULE}-scalar",
                f"{op_name(ar)} reduces a value of type {t}, which has no dim {self.dim} to "
                "slice for a reduce_scatter",
            )
        grid = grid_of(ar)
        span = ar.span()
        inner = [a for a in t.slicing_axes(self.dim) if a > min(span)]
        if inner:
            return fail(
                f"{RULE}-dim",
                f"{op_name(ar)}: dim {self.dim} of {t} is already sliced by grid axis "
                f"{inner[0]}, inner to the all_reduce's axes {list(span)}: a reduce_scatter "
                "cannot slice it further (each rank's part would lie on another rank); pick "
                "another dim",
            )
        rs_type = comm.collective_result_type(
            comm.ReduceScatterOp, t, span, grid.rank, dim=self.dim
        )
        try:
            check_type_fits_grid(rs_type, grid, f"the reduce_scatter of {op_name(ar)}")
        except VerifyException as e:
            return fail(f"{RULE}-uneven", str(e).split("] ", 1)[-1])
        return None

    def _rewrite(self, fn: func.FuncOp, ar: comm.AllReduceOp) -> None:
        rank = grid_rank(fn)
        axes = axes_prop(ar)
        rs = comm.ReduceScatterOp(ar.input, ar.kind.data, self.dim, axes, grid_rank=rank)
        ag = comm.AllGatherOp(rs.result, axes, grid_rank=rank)
        block = body_block(fn)
        block.insert_ops_before([rs, ag], ar)
        set_name(rs.result, derived_name(ar.result, "rs"))
        name = ar.result.name_hint
        ar.result.replace_all_uses_with(ag.result)
        set_name(ag.result, name)
        ar.detach()
        ar.erase()
