"""`coco-split-allreduce`: all_reduce -> reduce_scatter + all_gather (CoCoNet's `split`)."""

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
from coconet.dialects.layout_rules import check_type_fits_grid, grid_of
from coconet.passes.common import (
    axes_prop,
    derived_name,
    fail,
    find_named_ops,
    op_name,
    remark_skipped,
    remarks_wanted,
    set_name,
)

RULE = "split-allreduce"


def split_refusal(ar: comm.AllReduceOp, dim: int) -> PassFailedException | None:
    """Why `ar` cannot be split along tensor dim `dim` (None: it can)."""
    t = ar.input.type
    if t.rank == 0 or not 0 <= dim < t.rank:
        return fail(
            f"{RULE}-scalar",
            f"{op_name(ar)} reduces a value of type {t}, which has no dim {dim} to "
            "slice for a reduce_scatter",
            at=ar,
        )
    grid = grid_of(ar)
    span = ar.span()
    rs_type = comm.collective_result_type(comm.ReduceScatterOp, t, span, grid.rank, dim=dim)
    try:
        check_type_fits_grid(rs_type, grid, f"the reduce_scatter of {op_name(ar)}")
    except VerifyException as e:
        return fail(f"{RULE}-empty", str(e).split("] ", 1)[-1], at=ar)
    return None


@dataclass
class SplitAllReduce(RewritePattern):
    """`%y = comm.all_reduce K %x` -> `%y_rs = comm.reduce_scatter K %x dim D` and
    `%y = comm.all_gather %y_rs`, for an all_reduce of a function body the rules allow (the
    others are left alone)."""

    dim: int

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: comm.AllReduceOp, rewriter: PatternRewriter) -> None:
        if not isinstance(op.parent_op(), func.FuncOp) or split_refusal(op, self.dim) is not None:
            return
        rank = grid_of(op).rank
        axes = axes_prop(op)
        # The stated accumulation moves to the reduce_scatter, which now does the reducing.
        rs = comm.ReduceScatterOp(
            op.input, op.kind.data, self.dim, axes, grid_rank=rank, acc=op.acc
        )
        ag = comm.AllGatherOp(rs.result, axes, grid_rank=rank)
        set_name(rs.result, derived_name(op.result, "rs"))
        # the gather takes the all_reduce's name: readers and output names stay
        rewriter.replace(op, [rs, ag], [ag.result])


@dataclass(frozen=True)
class SplitAllReducePass(ModulePass):
    """Split `%y = comm.all_reduce K %x over A` into
    `%y_rs = comm.reduce_scatter K %x dim D over A` (sliced on tensor dim D, option `dim`) and
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
    * [split-allreduce-empty] dim `dim` holds at least one element per rank that cuts it
      (the all_reduce's axes and any axis already slicing that dim), counting the grid's
      static axes (one sized at launch has at least one rank). A dim that does not divide
      is cut unevenly (core/values.py `split_range`).
    Greedy mode skips the all_reduces these rules refuse (each with a remark saying which
    rule: `coco-opt --remarks`), but refuses a `dim` that no
    all_reduce of the module has (a negative one, or `dim=9` on vectors): a pass asked to split
    on a dim that does not exist would otherwise do nothing, silently.
    """

    name = "coco-split-allreduce"

    ops: tuple[str, ...] = ()
    dim: int = 0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = SplitAllReduce(self.dim)
        if not self.ops:
            self._check_dim_exists(op)
            if remarks_wanted():  # coco-opt --remarks: what is skipped, and why
                for ar in op.walk():
                    if isinstance(ar, comm.AllReduceOp) and isinstance(ar.parent_op(), func.FuncOp):
                        if (refusal := split_refusal(ar, self.dim)) is not None:
                            remark_skipped(self.name, refusal, ar)
            PatternRewriteWalker(pattern, apply_recursively=False).rewrite_module(op)
            return
        sites: list[comm.AllReduceOp] = []
        for _, site in find_named_ops(op, self.ops, f"{RULE}-op", "all_reduce"):
            if not isinstance(site, comm.AllReduceOp):
                raise fail(
                    f"{RULE}-op",
                    f"{op_name(site)} is not a comm.all_reduce: only all_reduces split",
                    at=site,
                )
            sites.append(site)
        # check every request before changing anything
        for site in sites:
            if (refusal := split_refusal(site, self.dim)) is not None:
                raise refusal
        for site in sites:
            pattern.match_and_rewrite(site, PatternRewriter(site))

    def _check_dim_exists(self, module: ModuleOp) -> None:
        ranks = sorted(
            {ar.input.type.rank for ar in module.walk() if isinstance(ar, comm.AllReduceOp)}
        )
        if self.dim < 0 or (ranks and self.dim != 0 and all(self.dim >= r for r in ranks)):
            raise fail(
                f"{RULE}-dim",
                f"dim={self.dim}: no comm.all_reduce in the module has a tensor dim {self.dim} "
                f"(their values have {', '.join(map(str, ranks)) or 'no'} dim(s)); "
                "nothing would be split",
            )
