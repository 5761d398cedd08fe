"""`coco-overlap`: pipeline a matmul with the collective that consumes its output
(CoCoNet's `overlap`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from coconet.dialects import coco, comm
from coconet.passes.common import (
    ancestor_in,
    body_block,
    check_groups_acyclic,
    fail,
    find_named_ops,
    functions,
    op_name,
    plan_contiguous,
    wrap_in_region,
)
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Block, Operation, Region
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

RULE = "overlap"


@dataclass
class _Site:
    fn: func.FuncOp
    producer: coco.MatmulOp
    consumer: Operation


def _is_collective_consumer(op: Operation) -> bool:
    if isinstance(op, comm.CollectiveOp):
        return True
    return isinstance(op, comm.FusedOp) and op.kind.data != comm.FusionKind.ELEMENTWISE.value


@dataclass(frozen=True)
class OverlapPass(ModulePass):
    """Wrap a producer matmul and the collective consuming its output in
    `comm.overlap chunks N` (CoCoNet's overlapped GEMM + AllReduce): the lowering runs the
    matmul chunk by chunk (along its rows) while the collective of the previous chunk runs.
    The consumer may be a collective (all_reduce, reduce_scatter, ...) or a fused collective
    (`comm.fused all_reduce` / `send`). Ops between the two move above the region, or below it
    if they depend on the matmul's chain.

    Options: `chunks` (default 4); `ops` names matmuls or their consuming collectives /
    fused regions (targeted); none: every matmul with a legal consumer (greedy).

    Legality (refusals name the rule; greedy mode skips what they refuse):
    * [overlap-producer]  the producer is a `coco.matmul` in a function body.
    * [overlap-consumer]  every use of the matmul's result lies in one op, and that op is a
                          collective or a fused collective (so the matmul's result has no
                          other use outside the region).
    * [overlap-chunks]    `chunks` >= 1 and divides the matmul's rows (the product of all
                          result dims but the last, M = B*S for [B, S, H]).
    * [overlap-cycle]     no op between them depends on the matmul and feeds the consumer.
    """

    name = "coco-overlap"

    chunks: int = 4
    ops: tuple[str, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.chunks < 1:
            raise fail(f"{RULE}-chunks", f"chunk count must be positive, got {self.chunks}")
        if self.ops:
            sites = [
                self._site(fn, s)
                for fn, s in find_named_ops(op, self.ops, f"{RULE}-producer", "op")
            ]
            for s in sites:
                self._check(s)
            if len({(s.producer, s.consumer) for s in sites}) != len(sites):
                sites = list({(s.producer, s.consumer): s for s in sites}.values())
            consumers = [s.consumer for s in sites]
            if len(set(consumers)) != len(consumers):
                raise fail(
                    f"{RULE}-consumer",
                    "two named matmuls feed the same collective: overlap pairs one producer "
                    "with one consumer",
                )
            for fn in {s.fn for s in sites}:
                groups = [{s.producer, s.consumer} for s in sites if s.fn is fn]
                if len(groups) > 1:
                    check_groups_acyclic(
                        body_block(fn), groups, f"{RULE}-cycle", "overlapping these pairs"
                    )
            for s in sites:
                self._rewrite(s)
            return
        for fn in functions(op):
            for mm in [o for o in body_block(fn).ops if isinstance(o, coco.MatmulOp)]:
                if mm.parent_block() is not body_block(fn):
                    continue
                try:
                    site = self._site(fn, mm)
                    self._check(site)
                except PassFailedException:
                    continue
                self._rewrite(site)

    def _site(self, fn: func.FuncOp, named: Operation) -> _Site:
        block = body_block(fn)
        if isinstance(named, coco.MatmulOp):
            users = {ancestor_in(block, u.operation) for u in named.result.uses}
            if not users:
                raise fail(f"{RULE}-consumer", f"nothing reads {op_name(named)}")
            if len(users) != 1:
                raise fail(
                    f"{RULE}-consumer",
                    f"{op_name(named)} is read by {len(users)} ops: its result must go only to "
                    "the overlapped collective",
                )
            (consumer,) = users
            assert consumer is not None
            return _Site(fn, named, consumer)
        if not _is_collective_consumer(named):
            raise fail(
                f"{RULE}-producer",
                f"{op_name(named)} is neither a coco.matmul nor a collective consuming one",
            )
        producers = {
            v.owner
            for o in named.walk()
            for v in o.operands
            if isinstance(v.owner, coco.MatmulOp) and v.owner.parent_block() is block
        }
        if len(producers) != 1:
            raise fail(
                f"{RULE}-producer",
                f"{op_name(named)} reads {len(producers)} matmul results; overlap needs exactly one",
            )
        (producer,) = producers
        return _Site(fn, producer, named)  # type: ignore[arg-type]

    def _check(self, site: _Site) -> None:
        block = body_block(site.fn)
        mm, consumer = site.producer, site.consumer
        if not _is_collective_consumer(consumer):
            raise fail(
                f"{RULE}-consumer",
                f"{op_name(mm)} is consumed by {op_name(consumer)}, which is not a collective "
                "or a fused collective",
            )
        others = [u for u in mm.result.uses if ancestor_in(block, u.operation) is not consumer]
        if others:
            raise fail(
                f"{RULE}-consumer",
                f"{op_name(mm)} is also read by {op_name(others[0].operation)}: the matmul's "
                "result may only go to the overlapped collective",
            )
        shape = mm.result.type.get_shape()
        rows = math.prod(shape[:-1])
        if rows % self.chunks:
            raise fail(
                f"{RULE}-chunks",
                f"{self.chunks} chunks do not divide the {rows} rows of {op_name(mm)} "
                f"(shape {list(shape)})",
            )
        plan_contiguous(
            block,
            {mm, consumer},
            f"{RULE}-cycle",
            f"overlapping {op_name(mm)} with {op_name(consumer)}",
        )

    def _rewrite(self, site: _Site) -> None:
        block: Block = body_block(site.fn)
        hoisted, order = plan_contiguous(block, {site.producer, site.consumer}, f"{RULE}-cycle", "")

        def make(body: Region, types: list[Attribute]) -> comm.RegionOp:
            return comm.OverlapOp(self.chunks, body, types)

        wrap_in_region(block, hoisted, order, make)
