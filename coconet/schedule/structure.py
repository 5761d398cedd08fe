"""The structure of a program that decides which schedules fit it (what the named schedules
and the enumeration look at), and the tensor dim a split slices."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from xdsl.ir import BlockArgument, Operation, SSAValue

from coconet.core.program import Program
from coconet.dialects import coco, comm
from coconet.dialects.coco import ReplicatedAttr, TensorType, tensor_type_of
from coconet.passes.common import reaches_effect

# A dynamic (`?`) process-grid axis is sized at launch: a split then slices the lowest tensor
# dim that divides by this many ranks (a node of 8 GPUs), so the schedule runs on 1, 2, 4 and 8
# ranks; failing that, the dim with the largest power-of-two factor among those with an element
# for each of them.
PREFERRED_GROUP = 8


def _v2(n: int) -> int:
    return (n & -n).bit_length() - 1 if n > 0 else 0


def _parts(t: TensorType, dim: int, span: Iterable[int], grid_shape: tuple[int, ...]) -> int:
    """How many pieces a split over `span` cuts tensor dim `dim` into: the span's ranks times
    those of the axes already slicing it (a split nests inside them), an axis sized at launch
    counted as PREFERRED_GROUP ranks."""
    parts = 1
    for a in {*span, *t.slicing_axes(dim)}:
        parts *= grid_shape[a] if grid_shape[a] > 0 else PREFERRED_GROUP
    return parts


def auto_split_dim(ar: comm.AllReduceOp) -> int:
    """The tensor dim a split of `ar` slices, among the dims the split accepts
    (`split_refusal`: holding a rank's element on every static axis). Dims no grid axis
    slices yet come first; failing those, a dim only outer axes already cut (the split nests
    inside them in grid order); failing those, a dim an inner axis cuts (the split cuts each
    of its pieces: `sliced<d, level L>`). Among them: the lowest dim that divides into its
    pieces (the group's ranks times those of the axes already cutting it, an axis sized at
    launch counted as PREFERRED_GROUP ranks: a node of 8 GPUs, so the schedule runs on 1, 2,
    4 and 8 ranks); failing that, on a group sized at launch the dim with the largest
    power-of-two factor among those holding an element per piece (lowest first), on a static
    group the lowest, cut unevenly. With no legal dim, the lowest dim no axis slices (or 0):
    the pass then refuses it with its rule."""
    from coconet.dialects.layout_rules import grid_of
    from coconet.passes.split_allreduce import split_refusal

    t: TensorType = ar.input.type
    shape = t.get_shape()
    if not shape:
        return 0
    legal = [d for d in range(len(shape)) if split_refusal(ar, d) is None]
    fresh = [d for d in range(len(shape)) if not t.slicing_axes(d)]
    if not legal:
        return fresh[0] if fresh else 0
    grid = grid_of(ar)
    span = ar.span()
    # A dim only outer axes cut nests the split in grid order; one an inner axis cuts takes
    # a stated nesting (`sliced<d, level L>`), which Megatron's flat buffer needs.
    outer = [d for d in legal if d not in fresh and max(t.slicing_axes(d)) < min(span)]
    dims = [d for d in legal if d in fresh] or outer or legal
    parts = {d: _parts(t, d, span, grid.shape) for d in dims}
    for d in dims:
        if shape[d] % parts[d] == 0:
            return d
    if all(grid.shape[a] > 0 for a in span):
        return dims[0]
    roomy = [d for d in dims if shape[d] >= parts[d]] or dims
    return max(roomy, key=lambda d: (_v2(shape[d]), -d))


def _only_reader(v: SSAValue) -> Operation | None:
    users = {u.operation for u in v.uses}
    return next(iter(users)) if len(users) == 1 else None


def computed_gather(op: Operation) -> bool:
    """An all_gather with elementwise computation of its input (FSDP's cast of the master
    shard to bf16) or of its result: what `fuse(ag)` makes one exchange kernel with it."""
    return isinstance(op, comm.AllGatherOp) and (
        isinstance(op.input.owner, coco.ElementwiseOp)
        or any(isinstance(u.operation, coco.ElementwiseOp) for u in op.result.uses)
    )


def feeds_exchange(op: Operation) -> bool:
    """A matmul whose only reader is an all_to_all, through a reshape or not (`ol(mm,a2a)`)."""
    if not isinstance(op, coco.MatmulOp):
        return False
    reader = _only_reader(op.result)
    if isinstance(reader, coco.ReshapeOp):
        reader = _only_reader(reader.result)
    return isinstance(reader, comm.AllToAllOp)


def exchange_feeds_matmul(op: Operation) -> bool:
    """An all_to_all only a matmul's left operand reads, through a reshape or not
    (`ol(a2a,mm)`)."""
    if not isinstance(op, comm.AllToAllOp):
        return False
    value, reader = op.result, _only_reader(op.result)
    if isinstance(reader, coco.ReshapeOp):
        value, reader = reader.result, _only_reader(reader.result)
    return isinstance(reader, coco.MatmulOp) and reader.lhs is value


class Structure:
    """The shape of a program that decides which schedules fit it."""

    def __init__(self, program: Program):
        fn = program.func
        block = fn.body.block
        ops = list(block.ops)
        # ZeRO-3 written naively: all_reduces whose only reader keeps a slice, which the
        # schedules that scatter reduce-scatter first (coco-canonicalize)
        self.sliced_all_reduces = [
            op
            for op in ops
            if isinstance(op, comm.AllReduceOp) and comm.scatter_for_sliced_all_reduce(op)
        ]
        scattered = set(self.sliced_all_reduces)
        self.all_reduces = [
            op
            for op in ops
            if isinstance(op, comm.AllReduceOp)
            and isinstance(op.input.type, TensorType)
            and op.input.type.rank > 0
            and op not in scattered
        ]
        self.has_matmul = any(isinstance(op, coco.MatmulOp) for op in ops)
        # matmuls whose only reader is an all_reduce (Megatron's row-parallel layer)
        self.matmuls = []
        for op in ops:
            if isinstance(op, coco.MatmulOp):
                users = {u.operation for u in op.result.uses}
                if len(users) == 1 and next(iter(users)) in self.all_reduces:
                    self.matmuls.append(op)
        # async tensor parallelism (sequence parallelism): matmuls reading an all_gather that
        # nothing else reads (column-parallel GEMM), matmuls whose only reader is a
        # reduce_scatter (row-parallel GEMM)
        self.gathered_matmuls = []
        self.scattered_matmuls = []
        for op in ops:
            if not isinstance(op, coco.MatmulOp):
                continue
            # an all_gather only this matmul reads: its rows (left) or its weight (right)
            if any(
                isinstance(v.owner, comm.AllGatherOp)
                and {u.operation for u in v.uses} == {op}
                and (v is op.lhs or tensor_type_of(v).rank == 2)
                for v in (op.lhs, op.rhs)
            ):
                self.gathered_matmuls.append(op)
            users = {u.operation for u in op.result.uses}
            if len(users) == 1 and isinstance(next(iter(users)), comm.ReduceScatterOp):
                self.scattered_matmuls.append(op)
        # sends of a value computed (elementwise) from an all_reduce
        derived: set[SSAValue] = {ar.result for ar in self.all_reduces}
        self.sends = []
        for op in ops:
            if isinstance(op, comm.SendOp):
                if op.input in derived:
                    self.sends.append(op)
            elif isinstance(op, coco.ElementwiseOp) and any(v in derived for v in op.operands):
                derived.update(op.results)
        # all_to_alls (MoE dispatch and combine, Ulysses' re-cuts): each can run as one kernel
        # with the elementwise computation of its input and of its result
        # (a dead one, whose result reaches nothing, is dce's: coco-fuse refuses it)
        self.all_to_alls = [
            op for op in ops if isinstance(op, comm.AllToAllOp) and reaches_effect(op)
        ]
        # all_gathers with elementwise computation of their input (FSDP's cast of the master
        # shard to bf16) or of their result: each can run as one exchange kernel with it
        self.computed_gathers = [op for op in ops if computed_gather(op) and reaches_effect(op)]
        # expert parallelism's overlaps: matmuls whose only reader is an all_to_all, through a
        # reshape or not (the dispatch buffers, the expert output), and all_to_alls that only
        # a matmul's left operand reads, through a reshape or not (the expert FFN's input)
        self.exchanged_matmuls = [op for op in ops if feeds_exchange(op)]
        self.exchanges_into_matmuls = [op for op in ops if exchange_feeds_matmul(op)]
        # ZeRO-3 / FSDP: reduce_scatters in a program that updates sliced arguments (the
        # parameters and state each rank keeps only a slice of)
        sliced_updates = any(
            isinstance(op, coco.UpdateOp)
            and isinstance(op.target.type, TensorType)
            and any(op.target.type.slicing_axes(d) for d in range(op.target.type.rank))
            for op in ops
        )
        self.sliced_scatters = (
            [op for op in ops if isinstance(op, comm.ReduceScatterOp)] + self.sliced_all_reduces
            if sliced_updates
            else []
        )
        # optimizer state: arguments whose new value (the one their update stores) the
        # program also reads (m, v of Adam feed the weight update; the weights do not),
        # replicated on every axis an all_reduce spans, whatever their layout on the other
        # axes (sliced on a tensor-parallel axis, local on a pipeline axis): what a split of
        # that all_reduce slices and as-slice keeps sliced
        # (with no all_reduce: replicated on every axis)
        spans = {ar.span() for ar in self.all_reduces}
        self.state: list[BlockArgument] = []
        for a in block.args:
            t = a.type
            if not isinstance(t, TensorType) or t.rank == 0:
                continue
            if not any(
                all(isinstance(t.layout_on(ax), ReplicatedAttr) for ax in span)
                for span in spans or {tuple(range(len(t.layouts)))}
            ):
                continue
            for use in a.uses:
                up = use.operation
                if isinstance(up, coco.UpdateOp) and use.index == 0:
                    if any(u.operation is not up for u in up.value.uses):
                        self.state.append(a)
                        break

    @staticmethod
    def names(ops: Iterable[Any]) -> tuple[str, ...] | None:
        """The ops' (or values') names, each once, in order; None if one is unnamed (then use
        greedy mode). Ops may share a name (`%gsum_1` reads back as `gsum`): a targeted pass
        acts on all of them at once."""
        out: list[str] = []
        for op in ops:
            v = op if isinstance(op, SSAValue) else op.results[0]
            if not v.name_hint:
                return None
            if v.name_hint not in out:
                out.append(v.name_hint)
        return tuple(out)

    @staticmethod
    def unique_names(ops: Iterable[Any]) -> list[str]:
        """The names of the named ones of `ops` (or values), each once, in order."""
        out: list[str] = []
        for op in ops:
            v = op if isinstance(op, SSAValue) else op.results[0]
            if v.name_hint and v.name_hint not in out:
                out.append(v.name_hint)
        return out
