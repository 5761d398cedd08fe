"""`coco-overlap`: pipeline a matmul with the collective next to it (CoCoNet's `overlap`;
async tensor parallelism for an all_gather feeding a matmul)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Block, Operation, Region
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.dialects.coco import SlicedAttr, TensorType, tensor_type_of
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

RULE = "overlap"

# Ops a fused all_reduce runs inside its one collective kernel: a region of only these can
# run chunk by chunk (lowering/fused_collective.py; updates are stores of that kernel).
_IN_KERNEL = (
    coco.ElementwiseOp,
    coco.ConstantOp,
    coco.SliceOp,
    coco.UpdateOp,
    comm.ReduceScatterOp,
    comm.AllGatherOp,
)


@dataclass
class _Site:
    """An overlap pair in program order: `first` runs chunk by chunk before `second` does
    (the matmul before its consumer; an all_gather before the matmul reading it)."""

    fn: func.FuncOp
    first: Operation
    second: Operation
    # The pipeline-boundary form's tail: the fused send of the reduce_scatter's slice and the
    # next stage's all_gather of what it receives, chunked with the pair.
    tail: tuple[Operation, ...] = ()
    # The all_to_all forms: a reshape between the pair (keeping the last dim), and the dim of
    # the all_to_all's tensor the chunks cut (chosen by _check_exchange).
    via: coco.ReshapeOp | None = None
    dim: int | None = None

    @property
    def gathers(self) -> bool:
        return isinstance(
            self.first, comm.AllGatherOp | comm.AllToAllOp
        ) or comm.is_fused_all_gather(self.first)

    @property
    def exchange(self) -> comm.AllToAllOp | None:
        """The all_to_all of an all_to_all form."""
        for op in (self.first, self.second):
            if isinstance(op, comm.AllToAllOp):
                return op
        return None

    @property
    def matmul(self) -> coco.MatmulOp:
        mm = self.second if self.gathers else self.first
        assert isinstance(mm, coco.MatmulOp)
        return mm


def _is_collective_consumer(op: Operation) -> bool:
    if isinstance(op, comm.CollectiveOp):
        return True
    return isinstance(op, comm.FusedOp) and op.kind.data != comm.FusionKind.ELEMENTWISE.value


def _whole(t: Attribute, what: str, op: Operation) -> None:
    """Overlap chunks a value by rows that every rank holds whole (no grid axis slices it)."""
    if isinstance(t, TensorType) and any(isinstance(lay, SlicedAttr) for lay in t.layouts.data):
        raise fail(
            f"{RULE}-layout",
            f"{what} is sliced ({t}): overlap chunks, by rows, a value every rank holds whole",
            at=op,
        )


@dataclass(frozen=True)
class OverlapPass(ModulePass):
    """Wrap a matmul and the collective next to it in `comm.overlap chunks N`, run as a
    pipeline of N chunks of rows on two streams (lowering/overlap.py):

    * producer form (CoCoNet's overlapped GEMM + AllReduce; row-parallel GEMM + reduce_scatter
      in sequence parallelism): the matmul's result goes only to an all_reduce, a
      reduce_scatter, or a fused all_reduce (`comm.fused all_reduce`: RS + computation + AG
      in one kernel); chunk c's collective runs while chunk c+1 multiplies.
    * gather form (async tensor parallelism: all_gather + column-parallel GEMM): an all_gather
      whose result only the matmul reads, as its left operand; chunk c multiplies while chunk
      c+1 is gathered. Or as its right operand, one matrix (FSDP / ZeRO-3's parameter
      all_gather feeding the layer's GEMM): a chunk of its rows is a run of the reduction
      dim, multiplied by the same columns of the left operand and summed into the result.
      The gather may be a `comm.fused all_gather` region (fuse(ag): the cast of the master
      shard in its kernel) of a matrix: each chunk is its kernel on those rows.

    * pipeline-boundary form (`send=true`; CoCoNet's overlap of reduce_scatter, send and
      all_gather at a pipeline-stage boundary): a producer-form pair whose reduce_scatter's
      slice goes only to a fused send (`comm.fused send`: computation + send), whose received
      slice goes only to the next stage's all_gather. The four run chunk by chunk: chunk k is
      sent while chunk k+1 is reduce-scattered, and gathered while chunk k+1 is sent.

    * all_to_all forms (expert parallelism): a matmul whose result only an all_to_all reads
      (`ol(mm,a2a)`: MoE's dispatch buffers, the expert output), chunk c exchanged while
      chunk c+1 multiplies; an all_to_all whose result only a matmul's left operand reads
      (`ol(a2a,mm)`: the experts' input), chunk c multiplied while chunk c+1 is exchanged;
      either through a `coco.reshape` that keeps the last dim (the rows stay the rows).
      Chunking rule: the chunks are equal runs of one dim d of the exchanged tensor, the
      outermost that `chunks` divides among `comm.a2a_chunk_dims`: a row dim (not the last)
      that no grid axis slices before or after the all_to_all (so it neither splits nor
      gathers it, and every rank holds it whole: the same range on every rank, however the
      other dims are cut), not dim 0 of the dispatch form. Chunk k is then the all_to_all of
      that block and the matmul of its rows, independent of the other chunks' rows (the
      matmul broadcasts neither operand over its batch dims). The region records d
      (`comm.overlap chunks N dim d`). A named all_to_all pairs with the matmul reading it
      first, a named matmul with the collective reading it first.

    Chunks follow the rows (flattened leading dims) of each rank's piece of the collective,
    whichever tensor dim its layout slices. Ops between the pair move above the region, or
    below it if they depend on the first op's chain.

    Options: `chunks` (default 4); `send` (default false): the pipeline-boundary form only;
    `ops` names matmuls, their consuming collectives / fused regions, or gathers feeding them
    (targeted); none: every matmul with a legal partner, the producer form first (greedy).

    Legality (refusals name the rule; greedy mode skips what they refuse):
    * [overlap-producer]  the pair holds a `coco.matmul` in a function body; a named
                          all_gather feeds one operand of a matmul and nothing else (the
                          left one where both are gathered and the matmul is named).
    * [overlap-rows]      a gathered right operand is one matrix (rank 2).
    * [overlap-consumer]  every use of the matmul's result lies in one op, an all_reduce, a
                          reduce_scatter of it, or a fused all_reduce whose ops all run in its
                          one kernel and that reads the matmul by a reduce_scatter (what can
                          run per chunk of rows); others (a send, a broadcast, a fused send,
                          a region finishing a full reduction, a one-shot fused all_reduce)
                          cannot be pipelined.
    * [overlap-layout]    the value chunked by rows (the matmul's result; the gathered value)
                          is sliced on no grid axis.
    * [overlap-chunks]    `chunks` >= 1 and divides the rows of that value (the product of
                          all dims but the last, M = B*S for [B, S, H]); at lowering, each
                          rank's piece has at least `chunks` rows.
    * [overlap-cycle]     no op between them depends on the first and feeds the second.
    * [overlap-send]      (`send=true`) the matmul's reduce_scatter feeds only a fused send
                          region of one send, whose result only an all_gather reads.
    * all_to_all forms: [overlap-consumer] / [overlap-producer] the exchanged value goes only
      to the all_to_all (the matmul's left operand), through the reshape if any;
      [overlap-rows] the matmul broadcasts no operand over its batch dims, and the reshape
      keeps the last dim; [overlap-layout] the all_to_all has a dim to chunk;
      [overlap-chunks] `chunks` divides one (each rank holds it whole, so at launch its
      piece has `chunks` of it: `OverlapOp.check_rows_on_grid` checks it all the same).
    """

    name = "coco-overlap"

    chunks: int = 4
    ops: tuple[str, ...] = ()
    send: bool = False

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
            if self.send:
                sites = [self._through_send(s) for s in sites]
            sites = list({(s.first, s.second): s for s in sites}.values())
            seconds = [s.second for s in sites]
            firsts = [s.first for s in sites]
            if len(set(seconds)) != len(seconds) or len(set(firsts)) != len(firsts):
                raise fail(
                    f"{RULE}-consumer",
                    "two named pairs share an op: overlap pairs one matmul with one collective",
                )
            for fn in {s.fn for s in sites}:
                groups = [{s.first, s.second} for s in sites if s.fn is fn]
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
                    continue  # already inside a region made in this walk
                forms = (
                    (self._producer_site,)
                    if self.send
                    else (self._producer_site, self._gather_site, self._exchange_site)
                )
                for form in forms:
                    try:
                        site = form(fn, mm)
                        self._check(site)
                        if self.send:
                            site = self._through_send(site)
                    except PassFailedException:
                        continue
                    self._rewrite(site)
                    break

    # -- finding the pair ------------------------------------------------------------------

    def _site(self, fn: func.FuncOp, named: Operation) -> _Site:
        block = body_block(fn)
        if isinstance(named, coco.MatmulOp):
            # the producer form when a collective reads it, else the gather form when an
            # all_gather feeds it; else the producer form's refusal
            site, refusal = None, None
            try:
                site = self._producer_site(fn, named)
            except PassFailedException as e:
                refusal = e
            if site is not None and _is_collective_consumer(site.second):
                return site
            gather = named.lhs.owner
            if any(
                (isinstance(v.owner, comm.AllGatherOp) or comm.is_fused_all_gather(v.owner))
                and v.owner.parent_block() is block
                for v in (named.lhs, named.rhs)
            ):
                return self._gather_site(fn, named)
            if isinstance(gather, coco.ReshapeOp):
                gather = gather.input.owner
            if isinstance(gather, comm.AllToAllOp) and gather.parent_block() is block:
                return self._exchange_site(fn, named)
            if site is not None:
                return site  # _check refuses its consumer
            assert refusal is not None
            raise refusal
        if isinstance(named, comm.AllGatherOp) or comm.is_fused_all_gather(named):
            result = named.results[0]
            readers = {ancestor_in(block, u.operation) for u in result.uses}
            mms = [r for r in readers if isinstance(r, coco.MatmulOp)]
            if len(readers) == 1 and mms and result in (mms[0].lhs, mms[0].rhs):
                return self._gather_site(fn, mms[0])
            if comm.is_fused_all_gather(named):
                raise fail(
                    f"{RULE}-producer",
                    f"{op_name(named)} does not feed an operand of one matmul (and nothing else)",
                    at=named,
                )
            producers = [v.owner for v in named.operands if isinstance(v.owner, coco.MatmulOp)]
            if not producers:
                raise fail(
                    f"{RULE}-producer",
                    f"{op_name(named)} neither feeds an operand of one matmul (and nothing "
                    "else) nor gathers a matmul's result",
                    at=named,
                )
        if isinstance(named, comm.AllToAllOp):
            return self._named_exchange(fn, named)
        if not _is_collective_consumer(named):
            raise fail(
                f"{RULE}-producer",
                f"{op_name(named)} is neither a coco.matmul nor a collective consuming one",
                at=named,
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
                f"{op_name(named)} reads {len(producers)} matmul results; "
                "overlap needs exactly one",
                at=named,
            )
        (producer,) = producers
        return _Site(fn, producer, named)  # type: ignore[arg-type]

    def _producer_site(self, fn: func.FuncOp, mm: coco.MatmulOp) -> _Site:
        block = body_block(fn)
        users = {ancestor_in(block, u.operation) for u in mm.result.uses}
        if not users:
            raise fail(f"{RULE}-consumer", f"nothing reads {op_name(mm)}", at=mm)
        if len(users) != 1:
            raise fail(
                f"{RULE}-consumer",
                f"{op_name(mm)} is read by {len(users)} ops: its result must go only to "
                "the overlapped collective",
                at=mm,
            )
        (consumer,) = users
        assert consumer is not None
        if isinstance(consumer, coco.ReshapeOp):
            # the all_to_all form through a reshape (MoE's expert output regrouped)
            readers = {ancestor_in(block, u.operation) for u in consumer.result.uses}
            a2a = next(iter(readers)) if len(readers) == 1 else None
            if isinstance(a2a, comm.AllToAllOp):
                return _Site(fn, mm, a2a, via=consumer)
        return _Site(fn, mm, consumer)

    def _gather_site(self, fn: func.FuncOp, mm: coco.MatmulOp) -> _Site:
        """The all_gather (or fused all_gather region) feeding `mm`'s left operand, else its
        right one (the weight)."""
        block = body_block(fn)
        for index, operand in enumerate((mm.lhs, mm.rhs)):
            gather = operand.owner
            if (
                isinstance(gather, comm.AllGatherOp) or comm.is_fused_all_gather(gather)
            ) and gather.parent_block() is block:
                break
        else:
            raise fail(
                f"{RULE}-producer",
                f"neither operand of {op_name(mm)} is an all_gather in the function body",
                at=mm,
            )
        side = ("left", "right")[index]
        assert isinstance(gather, Operation)
        gathered = operand
        others = [u for u in gathered.uses if u.operation is not mm or u.index != index]
        if others:
            raise fail(
                f"{RULE}-producer",
                f"{op_name(gather)} is also read by {op_name(others[0].operation)}: overlap "
                f"gathers a value only the matmul's {side} operand reads",
                at=gather,
            )
        if index == 1 and tensor_type_of(gathered).rank != 2:
            raise fail(
                f"{RULE}-rows",
                f"{op_name(gather)} gathers a batch of matrices ({gathered.type}) for "
                f"the right operand of {op_name(mm)}: overlap chunks the rows of one matrix, "
                "a run of the reduction dim",
                at=gather,
            )
        if comm.is_fused_all_gather(gather) and tensor_type_of(gathered).rank != 2:
            raise fail(
                f"{RULE}-rows",
                f"{op_name(gather)} is a fused all_gather of {gathered.type}: its chunks are "
                "boxes of rows of a matrix (rank 2), which this value is not",
                at=gather,
            )
        return _Site(fn, gather, mm)

    def _exchange_site(self, fn: func.FuncOp, mm: coco.MatmulOp) -> _Site:
        """The all_to_all whose result (or its reshape) only `mm`'s left operand reads."""
        block = body_block(fn)
        src, via = mm.lhs.owner, None
        if isinstance(src, coco.ReshapeOp) and src.parent_block() is block:
            via, src = src, src.input.owner
        if not isinstance(src, comm.AllToAllOp) or src.parent_block() is not block:
            raise fail(
                f"{RULE}-producer",
                f"the left operand of {op_name(mm)} is not an all_to_all (or a reshape of one) "
                "in the function body",
                at=mm,
            )
        reader = via if via is not None else mm
        others = [u.operation for u in src.result.uses if u.operation is not reader]
        if via is not None:
            others += [u.operation for u in via.result.uses if u.operation is not mm]
        others += [u.operation for u in mm.lhs.uses if u.operation is mm and u.index != 0]
        if others:
            raise fail(
                f"{RULE}-producer",
                f"{op_name(src)} is also read by {op_name(others[0])}: overlap exchanges a "
                "value only the matmul's left operand reads",
                at=src,
            )
        return _Site(fn, src, mm, via=via)

    def _named_exchange(self, fn: func.FuncOp, a2a: comm.AllToAllOp) -> _Site:
        """A named all_to_all: with the matmul reading it (through a reshape or not), else
        with the matmul whose result it exchanges (a named matmul pairs the other way first:
        naming one or the other picks the form where a matmul sits on both sides)."""
        block = body_block(fn)
        for use in a2a.result.uses:
            reader = use.operation
            if isinstance(reader, coco.ReshapeOp):
                reader = next((u.operation for u in reader.result.uses), None)
            if isinstance(reader, coco.MatmulOp) and reader.parent_block() is block:
                lhs = reader.lhs.owner
                if lhs is a2a or (isinstance(lhs, coco.ReshapeOp) and lhs.input is a2a.result):
                    return self._exchange_site(fn, reader)  # (refusing what else reads it)
        src = a2a.input.owner
        if isinstance(src, coco.ReshapeOp) and src.parent_block() is block:
            src = src.input.owner
        if isinstance(src, coco.MatmulOp) and src.parent_block() is block:
            site = self._producer_site(fn, src)
            if site.second is a2a:
                return site
        raise fail(
            f"{RULE}-producer",
            f"{op_name(a2a)} neither exchanges a matmul's result (that nothing else reads) nor "
            "feeds the left operand of one matmul (and nothing else), through a reshape or not",
            at=a2a,
        )

    # -- legality ------------------------------------------------------------------------

    def _check(self, site: _Site) -> None:
        block = body_block(site.fn)
        if site.exchange is not None:
            self._check_exchange(site)
            plan_contiguous(
                block,
                self._members(site),
                f"{RULE}-cycle",
                f"overlapping {op_name(site.first)} with {op_name(site.second)}",
            )
            return
        if site.gathers:
            chunked = site.first.results[0]
            _whole(chunked.type, f"the gathered value {op_name(site.first)}", site.first)
        else:
            self._check_consumer(block, site.matmul, site.second)
            chunked = site.matmul.result
            _whole(chunked.type, f"the result of {op_name(site.matmul)}", site.matmul)
        shape = tensor_type_of(chunked).get_shape()
        rows = math.prod(shape[:-1])
        if rows % self.chunks:
            raise fail(
                f"{RULE}-chunks",
                f"{self.chunks} chunks do not divide the {rows} rows of {op_name(site.first)}"
                f" (shape {list(shape)})",
                at=site.first,
            )
        plan_contiguous(
            block,
            {site.first, site.second},
            f"{RULE}-cycle",
            f"overlapping {op_name(site.first)} with {op_name(site.second)}",
        )

    def _check_exchange(self, site: _Site) -> None:
        """The all_to_all forms' legality; chooses the chunked dim (see the class doc)."""
        a2a, mm, via = site.exchange, site.matmul, site.via
        assert a2a is not None
        block = body_block(site.fn)
        if site.first is mm:
            reader = via if via is not None else a2a
            others = [u for u in mm.result.uses if ancestor_in(block, u.operation) is not reader]
            if via is not None:
                others += [u for u in via.result.uses if u.operation is not a2a]
            if others:
                raise fail(
                    f"{RULE}-consumer",
                    f"{op_name(mm)} is also read by {op_name(others[0].operation)}: the "
                    "matmul's result may only go to the overlapped all_to_all",
                    at=mm,
                )
        lhs, rhs, res = (tensor_type_of(v) for v in (mm.lhs, mm.rhs, mm.result))
        if lhs.get_shape()[:-1] != res.get_shape()[:-1] or (
            rhs.rank > 2 and rhs.get_shape()[:-2] != res.get_shape()[:-2]
        ):
            raise fail(
                f"{RULE}-rows",
                f"{op_name(mm)} broadcasts an operand over its batch dims ({lhs} @ {rhs}): a "
                "chunk of its result's rows must be the same rows of its left operand, each "
                "multiplied by its own matrix of the right one",
                at=mm,
            )
        if via is not None and via.input.type.get_shape()[-1] != via.result.type.get_shape()[-1]:
            raise fail(
                f"{RULE}-rows",
                f"{op_name(via)} regroups the last dim ({via.input.type} -> "
                f"{via.result.type}): the matmul's rows must stay the exchanged tensor's rows",
                at=via,
            )
        legal = comm.a2a_chunk_dims(a2a)
        if not legal:
            raise fail(
                f"{RULE}-layout",
                f"{op_name(a2a)} ({a2a.input.type} -> {a2a.result.type}) has no dim to chunk: "
                "every dim but the last is split or gathered by it or sliced on a grid axis "
                "(or is dim 0 of the dispatch form)",
                at=a2a,
            )
        shape = tensor_type_of(a2a.input).get_shape()
        fits = [d for d in legal if shape[d] % self.chunks == 0]
        if not fits:
            raise fail(
                f"{RULE}-chunks",
                f"{self.chunks} chunks divide none of the dims {op_name(a2a)} can be chunked "
                f"along ({', '.join(f'dim {d}: {shape[d]}' for d in legal)})",
                at=a2a,
            )
        site.dim = fits[0]

    def _check_consumer(self, block: Block, mm: coco.MatmulOp, consumer: Operation) -> None:
        if not _is_collective_consumer(consumer):
            raise fail(
                f"{RULE}-consumer",
                f"{op_name(mm)} is consumed by {op_name(consumer)}, which is not a collective "
                "or a fused collective",
                at=mm,
            )
        others = [u for u in mm.result.uses if ancestor_in(block, u.operation) is not consumer]
        if others:
            raise fail(
                f"{RULE}-consumer",
                f"{op_name(mm)} is also read by {op_name(others[0].operation)}: the matmul's "
                "result may only go to the overlapped collective",
                at=mm,
            )
        if isinstance(consumer, comm.AllReduceOp | comm.ReduceScatterOp):
            return
        if isinstance(consumer, comm.FusedOp) and consumer.is_one_shot:
            raise fail(
                f"{RULE}-consumer",
                f"{op_name(consumer)} is a one-shot fused all_reduce: its kernel reduces the "
                "whole tensor in one step, with no chunk of rows to pipeline (the two-shot "
                "fuse(rs-c-ag) overlaps)",
                at=consumer,
            )
        if isinstance(consumer, comm.FusedOp) and consumer.kind.data == comm.FusionKind.ALL_REDUCE:
            inner = consumer.body.block
            strangers = [o for o in inner.ops if not isinstance(o, (*_IN_KERNEL, comm.YieldOp))]
            readers = [ancestor_in(inner, u.operation) for u in mm.result.uses]
            if strangers:
                raise fail(
                    f"{RULE}-consumer",
                    f"{op_name(consumer)} holds {op_name(strangers[0])}, which ends its "
                    "collective kernel: a region of several kernels cannot run per chunk of "
                    "rows",
                    at=consumer,
                )
            if not all(isinstance(r, comm.ReduceScatterOp) for r in readers):
                raise fail(
                    f"{RULE}-consumer",
                    f"{op_name(consumer)} reads {op_name(mm)} other than by its "
                    "reduce_scatter: only the scattered rows can run per chunk",
                    at=consumer,
                )
            return
        raise fail(
            f"{RULE}-consumer",
            f"{op_name(mm)} is consumed by {op_name(consumer)}: overlap pipelines an "
            "all_reduce, a reduce_scatter or a fused all_reduce by rows; this collective "
            "cannot run chunk by chunk",
            at=mm,
        )

    def _through_send(self, site: _Site) -> _Site:
        """`site` (a matmul and its reduce_scatter) extended by the fused send of the
        reduce_scatter's slice and the all_gather of the received slice, or [overlap-send]."""
        block = body_block(site.fn)
        rs = site.second
        if site.gathers or not isinstance(rs, comm.ReduceScatterOp):
            raise fail(
                f"{RULE}-send",
                f"{op_name(site.second)} is not a reduce_scatter of {op_name(site.first)}: the "
                "pipeline-boundary overlap chunks a matmul, its reduce_scatter, the fused send "
                "of the slice and the next stage's all_gather",
                at=site.second,
            )
        readers = {ancestor_in(block, u.operation) for u in rs.result.uses}
        sender = next(iter(readers)) if len(readers) == 1 else None
        if not (isinstance(sender, comm.FusedOp) and sender.kind.data == comm.FusionKind.SEND):
            raise fail(
                f"{RULE}-send",
                f"the slice {op_name(rs)} goes to {len(readers)} op(s), not only to a fused "
                "send region (fuse(sliced-send)): there is no send to pipeline",
                at=rs,
            )
        sends = [o for o in sender.body.block.ops if isinstance(o, comm.SendOp)]
        received = [u for r in sender.res for u in r.uses]
        gather = received[0].operation if len(received) == 1 else None
        if (
            len(sends) != 1
            or len(sender.res) != 1
            or not isinstance(gather, comm.AllGatherOp)
            or gather.parent_block() is not block
        ):
            raise fail(
                f"{RULE}-send",
                f"{op_name(sender)} must hold one send whose received slice only an all_gather "
                "of the next stage reads (fuse(sliced-send)), to be pipelined with it",
                at=sender,
            )
        plan_contiguous(
            block,
            {site.first, site.second, sender, gather},
            f"{RULE}-cycle",
            f"overlapping {op_name(site.first)} with the send of its slice",
        )
        return _Site(site.fn, site.first, site.second, (sender, gather))

    @staticmethod
    def _members(site: _Site) -> set[Operation]:
        members = {site.first, site.second, *site.tail}
        if site.via is not None:
            members.add(site.via)
        return members

    def _rewrite(self, site: _Site) -> None:
        block: Block = body_block(site.fn)
        members = self._members(site)
        hoisted, order = plan_contiguous(block, members, f"{RULE}-cycle", "")

        def make(body: Region, types: list[Attribute]) -> comm.RegionOp:
            return comm.OverlapOp(self.chunks, body, types, dim=site.dim)

        wrap_in_region(block, hoisted, order, make)
