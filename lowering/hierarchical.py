"""Lowering of a fused collective whose group spans nodes: the hierarchical path.

Symmetric memory only reaches the ranks of one node, so a `comm.fused all_reduce` over a
group spread across nodes runs in two parts of that group (core/values.py `group_part`):
its members on this rank's node ("node": kernels over symmetric memory, with the cross-rank
protocol of coco_device.h) and its members across nodes ("across": one per node, those with
this rank's index among their node's members; a library collective, NCCL or MPI).

Rank r, with members across nodes X = (X_0, ..., X_{N-1}) in node order, handles the N pieces
of X's slices (each piece of a reduce_scatter result / all_gather input: its place in the
tensor: runs of its sliced dim and the dims after it), packed one after the other:

1. reduce_scatter: a node kernel sums, for each piece k, the node members' inputs at X_k's
   slice (member order, in double / long long), then a reduce_scatter across nodes of the
   packed partials gives r its own slice, fully reduced: the nodes' partials are exchanged
   and combined in node order in double and rounded once to the element type (the
   collectives' exact path: partials and result differ in type). Inter-node traffic per rank
   is (N-1)/N of its N pieces -- the node's share of the tensor split over the node's ranks --
   in double: 2x the bytes of f32 data, the price of rounding once.
2. the computation on the slice (one elementwise kernel; a full reduction in the region,
   LAMB's norms, is a reduction kernel and a library all_reduce over the whole group);
3. all_gather: a library all_gather across nodes of each gathered slice into a packed
   symmetric buffer, then a node kernel copies every node member's packed pieces to their
   places in the result (assembled in the updated argument where there is one).

Reduction order: the oracle combines the group's members in rank order in double and rounds
once; here each node's members are combined first, then the nodes, all in double, rounded
once. The double sum is reassociated (((a+b)+c)+d vs (a+b)+(c+d)): exact for the few terms of
f16/bf16/f32 data in all but rare cases, so results equal the oracle's almost always bit for
bit; the checks compare them within the per-dtype tolerance (coconet/equivalence.py), as for
any reassociated reduction.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.ir import Operation, SSAValue

from coconet.core import values as V
from coconet.core.program import CocoError
from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType, tensor_type_of
from coconet.lowering.kernels.node import node_gather_kernel, node_reduce_kernel
from coconet.lowering.plan import (
    PLAN_COLLECTIVE_BLOCKS,
    ArgTable,
    Buffer,
    Collective,
    Epoch,
    KernelArg,
    Launch,
    PeerTable,
    RankValue,
)
from coconet.lowering.plan_builder import PlanBuilder, flags_buffer, needed_after


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class _Parts:
    """The node and across-nodes parts of every rank's group over `span`."""

    def __init__(self, lw: PlanBuilder, span: tuple[int, ...]):
        self.lw = lw
        self.node: list[list[int]] = []
        self.across: list[list[int]] = []
        for r in range(lw.size):
            group = V.group_of(lw.grid_shape, span, r)
            if not V.even_over_nodes(group, lw.nodes):
                per_node = [len(ms) for ms in V.members_per_node(group, lw.nodes)]
                raise CocoError(
                    f"[fused-across-nodes] the fused collective's group {group} has {per_node} "
                    "rank(s) on its nodes: a hierarchical fused collective needs as many on "
                    "every node (schedule the split collectives instead)"
                )
            self.node.append(V.group_part(group, lw.nodes, "node", r))
            self.across.append(V.group_part(group, lw.nodes, "across", r))
        sizes = {(len(n), len(a)) for n, a in zip(self.node, self.across)}
        if len(sizes) != 1:
            raise CocoError(
                "[fused-across-nodes] the fused collective's groups span different numbers of "
                "nodes: one plan cannot serve them all (schedule the split collectives instead)"
            )
        self.q, self.n = sizes.pop()

    def me(self) -> RankValue:
        return RankValue("node_me", tuple(self.node[r].index(r) for r in range(self.lw.size)))


def _piece_layout(
    lw: PlanBuilder, whole: SSAValue, piece: SSAValue, what: str
) -> tuple[int, int, int]:
    """How a rank's piece of `piece` lies in its piece of `whole` (the same tensor, sliced
    along one more dim d): (elements, run, stride) -- runs of `run` contiguous elements
    (dims d.. of the piece), `stride` apart (dims d.. of the whole). Every rank's piece must be
    the same size: the library collectives between nodes move equal blocks."""
    wt, pt = tensor_type_of(whole), tensor_type_of(piece)
    name = piece.name_hint or "value"
    if wt.get_shape() != pt.get_shape():
        raise CocoError(f"[fused-across-nodes] %{name} and its {what} differ in shape")
    layouts: set[tuple[int, int, int]] = set()
    for r in range(lw.size):
        ws = _local(lw, wt, r)
        ps = _local(lw, pt, r)
        cut = [d for d in range(len(ps)) if ps[d] != ws[d]]
        if len(cut) > 1:
            raise CocoError(
                f"[fused-across-nodes] the {what} %{name} is cut along more than one "
                "dimension: the hierarchical path handles slices of one dimension"
            )
        d = cut[0] if cut else 0
        layouts.add((_count(ps), _count(ps[d:]), _count(ws[d:])))
    if len(layouts) != 1:
        raise CocoError(
            f"[fused-across-nodes] the pieces of %{name} differ in size between ranks: the "
            "library collectives between nodes need equal pieces"
        )
    return layouts.pop()


def _local(lw: PlanBuilder, t: TensorType, rank: int) -> tuple[int, ...]:
    return tuple(V.piece_range(t, d, lw.coords[rank], lw.grid_shape)[1] for d in range(t.rank))


def _node_launch(
    lw: PlanBuilder,
    kernel: str,
    parts: _Parts,
    span: tuple[int, ...],
    table: Buffer,
    out: Buffer,
    bases: ArgTable,
    layout: tuple[int, int, int],
) -> Launch:
    flags = flags_buffer(lw, kernel, out.type, parts.q)
    count, run, stride = layout
    total = parts.n * count
    args: list[KernelArg] = [
        PeerTable(table, span, "node"),
        out,
        bases,
        count,
        run,
        stride,
        parts.n,
        PeerTable(flags, span, "node"),
        Epoch(flags.name),
        parts.me(),
        parts.q,
        0,
        total,
    ]
    grid = min(lw.config.grid_for(total), PLAN_COLLECTIVE_BLOCKS)
    return Launch(kernel, grid, lw.config.block, args, writes=(out.name,))


def emit_hierarchical(
    lw: PlanBuilder,
    span: tuple[int, ...],
    scatters: list[comm.ReduceScatterOp],
    gathers: list[comm.AllGatherOp],
    compute: list[Operation],
    updates: list[coco.UpdateOp],
    reductions: Sequence[Operation],
    assembled: Sequence[coco.UpdateOp],
) -> list[coco.UpdateOp]:
    """Emits one segment of a fused collective region hierarchically (module docstring);
    returns the updates of `assembled` whose gathered value it assembles in the target."""
    parts = _Parts(lw, span)

    # 1. reduce_scatter: within the node, then across nodes.
    for op in scatters:
        layout = _piece_layout(lw, op.input, op.result, "reduce_scatter result")
        count = layout[0]
        lw.make_symmetric(op.input)
        elt = op.result.type.elt
        name = lw.add_kernel(
            node_reduce_kernel(lw.fresh(f"k_node_reduce_{op.kind.data}_{elt}"), elt, op.kind.data)
        )
        x, t = op.input.type, op.result.type
        bases = ArgTable(
            tuple(
                lw.rank_table(
                    f"base{k}", lambda r, k=k, x=x, t=t: lw.base_offset(x, t, parts.across[r][k])
                )
                for k in range(parts.n)
            )
        )
        partials = lw.new_buffer(
            f"{op.result.name_hint or 'reduced'}_node",
            t,
            kind="scratch",
            elt="f64" if coco.is_float_name(elt) else "i64",
            shape=(parts.n * count,),
        )
        lw.emit(
            _node_launch(lw, name, parts, span, lw.value_buffer(op.input), partials, bases, layout)
        )
        lw.emit(
            Collective(
                "reduce_scatter",
                partials,
                lw.buffer_for(op.result),
                kind=op.kind.data,
                axes=span,
                part="across",
            )
        )

    # 2. the computation on this rank's slice.
    inside = set(compute)
    stores = [r for op in compute for r in op.results if needed_after(r, inside, updates)]
    if any(isinstance(op, coco.ReduceDimsOp) for op in compute):
        # row reductions (a norm): op by op on the slice, the row kernel for each reduction
        for op in compute:
            lw.lower_op(op)
        for u in updates:
            lw.lower_update(u)
    elif compute:
        lw.lower_elementwise(compute, "fused", stores=stores, updates=updates)
    else:
        for u in updates:
            lw.lower_update(u)
    finishers = {r.operands[0]: r for r in reductions if isinstance(r, comm.AllReduceOp)}
    for op in reductions:
        if isinstance(op, coco.ReduceOp):
            lw.lower_op(op)
            lw.lower_op(finishers[op.result])

    # 3. all_gather: across nodes, then within the node.
    targets: dict[SSAValue, coco.UpdateOp] = {}
    for op in gathers:
        layout = _piece_layout(lw, op.result, op.input, "all_gather input")
        count = layout[0]
        elt = op.input.type.elt
        packed = lw.new_buffer(
            f"{op.result.name_hint or 'gathered'}_node",
            op.input.type,
            symmetric=True,
            shape=(parts.n * count,),
        )
        lw.emit(
            Collective("all_gather", lw.value_buffer(op.input), packed, axes=span, part="across")
        )
        update = next(
            (
                u
                for u in assembled
                if u.value is op.result and not any(s.input is u.target for s in scatters)
            ),
            None,
        )
        if update is not None:
            dest = lw.value_buffer(update.target)
            targets[op.result] = update
        else:
            dest = lw.buffer_for(op.result)
        g, v = op.result.type, op.input.type
        bases = ArgTable(
            tuple(
                lw.rank_table(
                    f"base{q}_{k}",
                    lambda r, q=q, k=k, g=g, v=v: lw.base_offset(
                        g, v, parts.across[parts.node[r][q]][k]
                    ),
                )
                for q in range(parts.q)
                for k in range(parts.n)
            )
        )
        name = lw.add_kernel(node_gather_kernel(lw.fresh(f"k_node_gather_{elt}"), elt))
        lw.emit(_node_launch(lw, name, parts, span, packed, dest, bases, layout))
    for value, u in targets.items():
        lw.buffers[value] = lw.value_buffer(u.target)
    return list(targets.values())
