"""The checks of a targeted fusion that names the exact set to fuse: every mode's set is
connected through its own values, sits in one function body and runs one iteration space
([fuse-connected], [fuse-block], [fuse-sizes]); an elementwise set holds elementwise ops
only ([fuse-elementwise]). The checks of one mode's own set live with that mode."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects import func
from xdsl.ir import Block, Operation

from coconet.dialects import coco, comm
from coconet.passes.common import OrderInfo, body_block, fail, op_name
from coconet.passes.fuse.region import RULE, absorb_updates, in_order
from coconet.passes.fuse.spaces import Space, meet, op_space, row_space, space_of

SetCheck = Callable[[set[Operation]], None]


def exact_set(
    sites: Sequence[tuple[func.FuncOp, Operation]],
    check_kind: SetCheck,
    check_sizes: SetCheck | None = None,
) -> tuple[Block, set[Operation]]:
    """The named ops as one set to fuse, once its mode's checks pass (what it may hold,
    then that it is connected, then its iteration spaces), with the updates storing its
    values that can join."""
    if len({fn for fn, _ in sites}) != 1:
        raise fail(f"{RULE}-block", "the named ops are in different functions")
    block = body_block(sites[0][0])
    members = {s for _, s in sites}
    check_kind(members)
    check_connected(members)
    if check_sizes is not None:
        check_sizes(members)
    return block, absorb_updates(block, members, OrderInfo(block))


def check_connected(members: set[Operation]) -> None:
    groups = comm.linked_groups(list(members), lambda _v: True)
    if len(groups) > 1:
        raise fail(
            f"{RULE}-connected",
            "the named ops are not connected through their own values: they form "
            f"{len(groups)} separate groups",
        )


def check_elementwise(members: set[Operation]) -> None:
    for m in in_order(members):
        if not isinstance(m, coco.ElementwiseOp):
            raise fail(
                f"{RULE}-elementwise",
                f"{op_name(m)} is not elementwise: an elementwise fusion holds elementwise "
                "ops only (use mode=all_reduce for a reduce_scatter chain)",
                at=m,
            )


def check_sizes(members: set[Operation], kind: str) -> None:
    """One iteration space: the reduce_scatter's for a fused all_reduce (and its rows);
    collectives and updates aside, which run on the values they are given."""
    space: Space = None
    if kind == "all_reduce":
        rs = next(m for m in members if isinstance(m, comm.ReduceScatterOp))
        space = space_of(rs.result)
    rows = row_space(space) if kind == "all_reduce" else None
    for m in in_order(members):
        if isinstance(m, comm.AllGatherOp | coco.UpdateOp | comm.SendOp):
            continue
        s = op_space(m)
        if rows is not None and s == rows:
            continue  # row values of a fused row kernel
        met = s if s == "mixed" else meet(space, s)
        if isinstance(met, str):
            raise fail(
                f"{RULE}-sizes",
                f"{op_name(m)} computes over a different iteration space than the rest of "
                "the fused set (one kernel runs one space)",
                at=m,
            )
        space = met
