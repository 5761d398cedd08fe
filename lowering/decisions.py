"""The lowering's decisions as IR: the passes that run first in `lower()` and print in coco-opt.

The plan builder (lower_to_plan.py and its region lowerings) reads what these passes write on
the scheduled program instead of deciding inline, so `coco-opt -p` shows each decision and
FileCheck tests it (test/filecheck/lowering/):

* `coco-choose-topology` sets `comm.topology = #comm<topology flat|hierarchical>` on every
  collective a fused kernel runs: the reduce_scatters and all_gathers of `comm.fused
  all_reduce` (and `send`) regions, the all_reduce of a one-shot region, the send a send
  region runs as one kernel (`send_kernel_of`), the all_to_alls of an all_to_all region.
  Flat: every group of the collective lies within one node, so one kernel reaches its members
  over symmetric memory. Hierarchical: some group spans nodes, which symmetric memory does not
  reach: a two-shot all_reduce runs as node kernels around library collectives between nodes
  (hierarchical.py), a one-shot all_reduce, a send or an all_to_all region op by op around
  the library collective. What it depends on is the machine: the ranks and the node of each.
* `coco-defer` sets `comm.deferral` on the ops the plan builder does not compute where they
  stand. `#comm<deferral rematerialize>`: scalar arithmetic on arguments that only fused
  all_reduce regions read (an optimizer's bias corrections), and inside a two-shot fused
  all_reduce region without row reductions its scalar arithmetic (a trust ratio, a clipping
  factor) and its slices of arguments: every kernel reading one computes it itself
  (`PlanBuilder.rematerialized`), and a step reading it from memory gets it lowered just
  before (`value_buffer`); scalars that several kernels of one table launch read and that
  read many values (a global norm over many tensors' partials) are computed once, by a
  kernel before the launch (fused_collective.py `SHARED_SCALAR_INPUTS`).
  `#comm<deferral wire>`: a cast that widens exactly and that only the reduce_scatters of
  fused all_reduce regions (or a one-shot region's all_reduce) read: the peers pull its
  narrow input and widen it as they accumulate. Nothing is deferred where
  the plan spans several nodes (kernels across nodes read their inputs from memory).

`decided()` runs both, then `coco-segment` (segments.py: where each two-shot fused region is
cut into kernels, `comm.segment`), then `coco-table-form`: `comm.table_ready` on every fused
all_reduce region where the function's regions hold several reduce_scatters (an optimizer
over many tensors), whose kernels then take extents and counts as arguments so that kernels
of one text fold into one table launch (batching.py); extents are literals otherwise.

Both passes honour what they find: a topology already on a collective must be the one its
groups and the node map give (`[topology-one-node]`: hierarchical where every group is one
node's; `[topology-across-nodes]`: flat where a group spans nodes), and on no other op
(`[topology-op]`); deferrals already in a function are the user's choice, each one on an op
the pass could defer that way (`[deferral]`), and the pass adds none. `lower()` runs both on
its own copy of the program (`decided`) with the plan's ranks and node map, so a program
annotated for one machine and lowered for another is refused, not lowered wrong.

The machine is given as options: `ranks=N` (default: the grid's own size, or its fixed axes'
for a grid sized at launch), `ranks-per-node=K` (K consecutive ranks a node) or `nodes=0,0,1,1`
(each rank's node); neither: one node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.ir import Block, BlockArgument, Operation
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from coconet.core import values as V
from coconet.core.program import CocoError, Program
from coconet.dialects import coco, comm
from coconet.dialects.coco import exact_widening, readable_at, tensor_type_of
from coconet.dialects.comm import (
    DEFERRAL_ATTR_NAME,
    SEGMENT_ATTR_NAME,
    SEGMENTS_ATTR_NAME,
    TABLE_READY_ATTR_NAME,
    TOPOLOGY_ATTR_NAME,
    Deferral,
    DeferralAttr,
    Topology,
    TopologyAttr,
    deferral_of,
    topology_of,
)
from coconet.lowering.segments import (
    choose_segments,
    scalar_arithmetic,
    send_kernel_of,
    two_shot_regions,
)
from coconet.passes.common import Refusal, fail, op_name

# --------------------------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------------------------


def default_ranks(program: Program) -> int:
    """The rank count a plan is for when none is given: the grid's static size, or its fixed
    axes' for a grid sized at launch."""
    grid = program.grid
    if not grid.is_static():
        return int(np.prod([s for s in grid.shape if s > 0])) or 1
    return int(np.prod(grid.shape))


def node_map(nodes: Sequence[int], size: int) -> tuple[int, ...]:
    """The node of every rank of a plan for `size` ranks, () where one node holds them all."""
    if nodes and len(nodes) != size:
        raise CocoError(
            f"[ranks-per-node] the node map names {len(nodes)} rank(s), the plan has {size}"
        )
    return tuple(int(n) for n in nodes) if len(set(nodes)) > 1 else ()


@dataclass(frozen=True)
class MachinePass(ModulePass):
    """A pass deciding for a machine: options `ranks`, `ranks-per-node`, `nodes`."""

    ranks: int | None = None
    ranks_per_node: int = 0
    nodes: tuple[int, ...] = ()

    def decide(self, fn: func.FuncOp, grid_shape: tuple[int, ...], nodes: tuple[int, ...]) -> None:
        raise NotImplementedError

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.ranks_per_node and self.nodes:
            raise fail(
                "machine",
                "give the nodes as ranks-per-node or as a node map (nodes=...), not both",
            )
        for fn in op.ops:
            if not isinstance(fn, func.FuncOp):
                continue
            program = Program(op, fn.sym_name.data)
            ranks = self.ranks if self.ranks is not None else default_ranks(program)
            nodes = self.nodes
            try:
                grid_shape = tuple(program.grid.bind(ranks))
                if self.ranks_per_node:
                    nodes = V.nodes_of(ranks, self.ranks_per_node)
                self.decide(fn, grid_shape, node_map(nodes, int(np.prod(grid_shape))))
            except ValueError as e:  # the grid does not take the ranks
                raise fail("machine", f"@{fn.sym_name.data}: {e}", at=fn) from None
            except CocoError as e:  # the node map: its own rule
                raise Refusal(f"@{fn.sym_name.data}: {e}", fn) from None


# --------------------------------------------------------------------------------------------
# Topology
# --------------------------------------------------------------------------------------------


def kernel_collectives(region: comm.FusedOp) -> Sequence[comm.CollectiveOp]:
    """The collectives of `region` a fused kernel runs, whose topology the plan builder
    reads, in program order."""
    body = [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]
    match region.kind.data:
        case comm.FusionKind.ALL_REDUCE if region.is_one_shot:
            return [o for o in body if isinstance(o, comm.AllReduceOp)][:1]
        case comm.FusionKind.ALL_REDUCE:
            return [o for o in body if isinstance(o, comm.ReduceScatterOp | comm.AllGatherOp)]
        case comm.FusionKind.SEND:
            send = send_kernel_of(region)
            return [
                o
                for o in body
                if isinstance(o, comm.ReduceScatterOp | comm.AllGatherOp)
                or (isinstance(o, comm.SendOp) and o is send)
            ]
        case comm.FusionKind.ALL_TO_ALL:
            return [o for o in body if isinstance(o, comm.AllToAllOp)]
        case comm.FusionKind.ALL_GATHER:
            return [o for o in body if isinstance(o, comm.AllGatherOp)]
        case comm.FusionKind.REDUCTION:
            return [o for o in body if isinstance(o, comm.AllReduceOp)]
        case _:
            return []


def _crossing(
    op: comm.CollectiveOp, grid_shape: tuple[int, ...], nodes: tuple[int, ...]
) -> str | None:
    """How `op` reaches across nodes (a group, a send's pair of ranks), None if it does not."""
    if not nodes:
        return None
    if isinstance(op, comm.SendOp):
        along, shift = op.along.value.data, op.shift.value.data
        for r in range(len(nodes)):
            to = V.send_partner(V.coords_of(r, grid_shape), grid_shape, along, shift)
            if to is not None and nodes[r] != nodes[to]:
                return f"rank {r} sends to rank {to} on another node"
        return None
    for group in V.groups_of(grid_shape, op.span()):
        if V.spans_nodes(group, nodes):
            return f"its group {group} spans nodes"
    return None


def choose_topology(fn: func.FuncOp, grid_shape: tuple[int, ...], nodes: tuple[int, ...]) -> None:
    """Set (or check) the topology of every collective of `fn` that a fused kernel runs."""
    chosen: set[Operation] = set()
    for region in fn.walk():
        if not isinstance(region, comm.FusedOp):
            continue
        for op in kernel_collectives(region):
            chosen.add(op)
            crossing = _crossing(op, grid_shape, nodes)
            want = Topology.FLAT if crossing is None else Topology.HIERARCHICAL
            given = topology_of(op)
            if given is None:
                op.attributes[TOPOLOGY_ATTR_NAME] = TopologyAttr(want)
            elif given != want and crossing is None:
                where = f"on nodes {list(nodes)}" if nodes else "on one node"
                raise fail(
                    "topology-one-node",
                    f"{op_name(op)} asks for a hierarchical topology, but every group it "
                    f"works in lies within one node (the plan's {int(np.prod(grid_shape))} "
                    f"rank(s) {where}): there is nothing to run between nodes",
                    at=op,
                )
            elif given != want:
                raise fail(
                    "topology-across-nodes",
                    f"{op_name(op)} asks for a flat topology, but {crossing} "
                    f"(node map {list(nodes)}): symmetric memory reaches only the ranks of "
                    "one node",
                    at=op,
                )
    for op in fn.walk():
        if TOPOLOGY_ATTR_NAME in op.attributes and op not in chosen:
            raise fail(
                "topology-op",
                f"{op_name(op)} has a topology, but only the collectives a fused kernel runs "
                "choose one: the reduce_scatters and all_gathers of fused all_reduce and send "
                "regions, the all_reduce of a one-shot region, the send a send region runs "
                "as one kernel, the all_to_alls of an all_to_all region",
                at=op,
            )


@dataclass(frozen=True)
class ChooseTopologyPass(MachinePass):
    """Choose how each collective a fused kernel runs reaches its group [topology-*]:
    `comm.topology = #comm<topology flat>` where every group lies within one node (one
    kernel over symmetric memory), `hierarchical` where a group spans nodes.

    Options: `ranks` (default: the grid's size), `ranks-per-node` or `nodes` (the node of
    each rank; neither: one node). A topology already written must be the one the machine
    gives ([topology-one-node], [topology-across-nodes]) and sit on such a collective
    ([topology-op])."""

    name = "coco-choose-topology"

    def decide(self, fn: func.FuncOp, grid_shape: tuple[int, ...], nodes: tuple[int, ...]) -> None:
        choose_topology(fn, grid_shape, nodes)


# --------------------------------------------------------------------------------------------
# Deferral: scalars rematerialized in fused kernels, casts on the wire
# --------------------------------------------------------------------------------------------


def _fused_all_reduce(op: Operation | None) -> bool:
    return isinstance(op, comm.FusedOp) and op.kind.data == comm.FusionKind.ALL_REDUCE


def _top_level_scalars(block: Block) -> set[Operation]:
    """Scalar arithmetic on arguments (an optimizer's bias corrections: 1 - beta1**step)
    that only fused collectives read: each fused collective kernel computes it itself, once
    per block, instead of a launch per op before the regions."""
    scalar: list[Operation] = []
    chosen: set[Operation] = set()
    for op in block.ops:
        if scalar_arithmetic(op) and all(
            not isinstance(v.owner, Operation) or v.owner in chosen for v in op.operands
        ):
            scalar.append(op)
            chosen.add(op)

    def top(op: Operation) -> Operation:
        while op.parent_block() is not block:
            parent = op.parent_op()
            assert parent is not None
            op = parent
        return op

    for op in reversed(scalar):
        readers = [top(use.operation) for r in op.results for use in r.uses]
        if not readers or not all(r in chosen or _fused_all_reduce(r) for r in readers):
            chosen.discard(op)
    return chosen


def _wire_casts(block: Block) -> set[Operation]:
    """Casts that widen exactly (bf16, f16 or fp8 to f32, ...) whose only readers are the
    reduce_scatters of fused all_reduce regions (or the all_reduces of one-shot ones): their
    peers pull the cast's narrow input and widen it as they accumulate, so the wire carries
    the narrow type -- the sum is the same, bit for bit, as a widening that changes no value."""
    chosen: set[Operation] = set()
    for op in block.ops:
        if not isinstance(op, coco.CastOp) or not exact_widening(
            tensor_type_of(op.input).elt, tensor_type_of(op.result).elt
        ):
            continue
        readers = [use.operation for use in op.result.uses]
        if readers and all(
            _fused_all_reduce(parent := r.parent_op())
            and (
                isinstance(r, comm.ReduceScatterOp)
                # the one-shot form's all_reduce reads its peers' inputs the same way
                or (
                    isinstance(r, comm.AllReduceOp)
                    and isinstance(parent, comm.FusedOp)
                    and parent.is_one_shot
                )
            )
            for r in readers
        ):
            chosen.add(op)
    return chosen


def _region_deferrals(region: comm.FusedOp) -> set[Operation]:
    """In a two-shot region: its scalar arithmetic (a trust ratio, a clipping factor from a
    global norm: it belongs to no tensor's chain) and its slices of the function's arguments
    (each kernel reading one reads the argument at this rank's piece, rather than one kernel
    storing the slice for the next to read back), not where a reader runs after the
    argument's update. None in a region with row reductions (row kernels read scalars from
    memory)."""
    body = [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]
    if any(isinstance(op, coco.ReduceDimsOp) for op in body):
        return set()
    return {
        op
        for op in body
        if scalar_arithmetic(op)
        or (
            isinstance(op, coco.SliceOp)
            and isinstance(op.input, BlockArgument)
            and all(readable_at(op.input, use.operation) for use in op.result.uses)
        )
    }


def deferrable(fn: func.FuncOp, nodes: tuple[int, ...]) -> dict[Operation, Deferral]:
    """Every op of `fn` the plan builder may defer, and how."""
    if nodes:
        return {}
    block = fn.body.block
    out = {op: Deferral.REMATERIALIZE for op in _top_level_scalars(block)}
    out |= {op: Deferral.WIRE for op in _wire_casts(block)}
    for region in two_shot_regions(fn):
        out |= {op: Deferral.REMATERIALIZE for op in _region_deferrals(region)}
    return out


def choose_deferrals(fn: func.FuncOp, nodes: tuple[int, ...]) -> None:
    """Mark (or, where some are written, check) the ops of `fn` the plan builder defers."""
    written = [op for op in fn.walk() if DEFERRAL_ATTR_NAME in op.attributes]
    allowed = deferrable(fn, nodes)
    if not written:
        for op, how in allowed.items():
            op.attributes[DEFERRAL_ATTR_NAME] = DeferralAttr(how)
        return
    for op in written:
        how = deferral_of(op)
        if allowed.get(op) == how:
            continue
        if nodes:
            why = f"the plan spans nodes {list(nodes)}: kernels across nodes read it from memory"
        elif how == Deferral.WIRE:
            why = (
                "only a cast that widens exactly and that only fused reduce_scatters (or a "
                "one-shot region's all_reduce) read rides the wire"
            )
        else:
            why = (
                "only scalar arithmetic on arguments that only fused all_reduce regions read, "
                "and a two-shot fused region's scalar arithmetic and slices of arguments "
                "(without row reductions) are rematerialized"
            )
        raise fail("deferral", f"{op_name(op)} cannot be deferred as {how}: {why}", at=op)


@dataclass(frozen=True)
class DeferPass(MachinePass):
    """Mark the ops the plan builder computes where they are read [deferral]:
    `comm.deferral = #comm<deferral rematerialize>` on scalar arithmetic and argument slices
    each fused collective kernel computes itself, `#comm<deferral wire>` on an exact widening
    cast the peers apply as they accumulate.

    Options: `ranks`, `ranks-per-node`, `nodes` (as coco-choose-topology's: nothing is
    deferred on several nodes). Deferrals already written are kept, each one checked
    ([deferral]), and none is added."""

    name = "coco-defer"

    def decide(self, fn: func.FuncOp, grid_shape: tuple[int, ...], nodes: tuple[int, ...]) -> None:
        choose_deferrals(fn, nodes)


# --------------------------------------------------------------------------------------------
# What lower() runs
# --------------------------------------------------------------------------------------------


def several_fused_collectives(fn: func.FuncOp) -> bool:
    """Whether `fn`'s fused all_reduce regions hold more than one reduce_scatter between them
    (one per parameter tensor, or the coupled chains of one region)."""
    scatters = (
        inner
        for op in fn.body.block.ops
        if isinstance(op, comm.FusedOp) and op.kind.data == comm.FusionKind.ALL_REDUCE
        for inner in op.body.walk()
        if isinstance(inner, comm.ReduceScatterOp)
    )
    return next(scatters, None) is not None and next(scatters, None) is not None


def choose_table_form(fn: func.FuncOp) -> None:
    """`comm.table_ready` on every fused all_reduce region of `fn` (one-shot and nested ones
    included) where its regions hold several reduce_scatters: their kernels take extents and
    each member's count as arguments, so the kernels of one text (one region over tensors of
    other sizes) fold into one table launch (batching.py); none otherwise (extents as
    literals). Marks already written must be the pass's on every such region
    ([table-ready]), and sit on fused all_reduce regions only."""
    regions = [
        op
        for op in fn.walk()
        if isinstance(op, comm.FusedOp) and op.kind.data == comm.FusionKind.ALL_REDUCE
    ]
    for op in fn.walk():
        if TABLE_READY_ATTR_NAME in op.attributes and op not in regions:
            raise fail(
                "table-ready",
                f"{op_name(op)} is marked table-ready, but only fused all_reduce regions "
                "build their kernels for table launches",
                at=op,
            )
    want = several_fused_collectives(fn)
    if not any(TABLE_READY_ATTR_NAME in r.attributes for r in regions):
        if want:
            for r in regions:
                r.attributes[TABLE_READY_ATTR_NAME] = UnitAttr()
        return
    for r in regions:
        if (TABLE_READY_ATTR_NAME in r.attributes) != want:
            why = (
                "the function's fused regions hold several reduce_scatters: every region is"
                if want
                else "the function's fused regions hold one reduce_scatter: none is"
            )
            raise fail("table-ready", f"{why} table-ready, this one is not so marked", at=r)


@dataclass(frozen=True)
class TableFormPass(ModulePass):
    """Mark the fused all_reduce regions whose kernels are built for table launches
    ([table-ready]): every one, where the function's regions hold several reduce_scatters
    (an optimizer over many tensors); none otherwise. Takes no options."""

    name = "coco-table-form"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for fn in op.ops:
            if isinstance(fn, func.FuncOp):
                choose_table_form(fn)


def _to_decide(fn: func.FuncOp) -> bool:
    """Whether `fn` holds anything to decide or check: a fused region, or a decision."""
    return any(
        isinstance(op, comm.FusedOp)
        or TOPOLOGY_ATTR_NAME in op.attributes
        or DEFERRAL_ATTR_NAME in op.attributes
        or SEGMENT_ATTR_NAME in op.attributes
        or SEGMENTS_ATTR_NAME in op.attributes
        or TABLE_READY_ATTR_NAME in op.attributes
        for op in fn.walk()
    )


def decided(
    program: Program,
    grid_shape: tuple[int, ...],
    nodes: tuple[int, ...],
    in_place: bool = False,
) -> Program:
    """`program` with the lowering's decisions for the machine (`nodes`: node_map's) made
    or checked: a copy where it holds any (`in_place`: `program` itself, made for this
    lowering alone), `program` itself where there is nothing to decide. A refusal is a
    CocoError."""
    if not _to_decide(program.func):
        return program
    if not in_place:
        program = program.clone()
    try:
        choose_topology(program.func, grid_shape, nodes)
        choose_deferrals(program.func, nodes)
        choose_segments(program.func)
        choose_table_form(program.func)
    except PassFailedException as e:
        raise CocoError(f"@{program.name}: {e}") from None
    return program
