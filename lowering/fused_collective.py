"""Lowering of `comm.fused all_reduce` (CoCoNet's FusedAllReduce): reduce_scatter, the
computation on slices and the all_gathers of its results in ONE kernel over symmetric buffers.

Each rank's kernel computes its slice: block b reads chunk b of the reduce_scatter input from
every peer (combining in rank order, as the oracle does), computes the sliced chain in
registers, stores sliced results and optimizer state locally and its piece of every gathered
result in its own symmetric buffer, then -- after the same-index blocks of its peers have done
the same (the coco_peers_* flag protocol of coco_device.h) -- pulls the peers' pieces of chunk
b from their buffers. This is a direct (two-shot) all-reduce: every byte crosses the fabric
once each way, like a ring, with one kernel launch and no reduced-gradient round trip through
memory. Peer accesses are vectors where aligned (16-byte loads on a GPU).

A gathered result that updates an argument is assembled in that argument itself (the
pull writes it), not in a buffer copied into the argument after the kernel: every rank's
kernel only ever writes its own memory, so the argument needs no symmetric memory and is
passed without a copy.

Row reductions (RMSNorm, LayerNorm over the last dim of a slice of whole rows) stay in the
kernel: its row form (row_collective.py) gives each block whole rows, in phases.

A region whose computation needs a full reduction (LAMB's norms) cannot finish in one kernel:
blocks of one rank never wait for each other (the device layer's rule), so the region is cut
into segments (`coco-segment`, segments.py, decides where); each segment is one (collective)
kernel per tensor chain, an op it cannot hold runs as it would unfused, and values crossing
segments go through memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from xdsl.ir import Operation, SSAValue

from coconet.core import values as V
from coconet.core.program import CocoError
from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType, tensor_type_of
from coconet.dialects.coco_types import is_float_name
from coconet.lowering.hierarchical import emit_hierarchical
from coconet.lowering.kernel_ir import Param, structural_key
from coconet.lowering.kernel_site import kernel_site, op_description
from coconet.lowering.kernels.elementwise import ElementwiseKernel
from coconet.lowering.kernels.spec import Store, iteration_values
from coconet.lowering.plan import (
    MAX_COLLECTIVE_BLOCKS,
    PLAN_COLLECTIVE_BLOCKS,
    ArgTable,
    Epoch,
    KernelArg,
    Launch,
    PeerTable,
    RankValue,
)
from coconet.lowering.plan_builder import PlanBuilder, flags_buffer, needed_after
from coconet.lowering.row_collective import RowCollectiveKernel
from coconet.lowering.segments import pieces
from coconet.lowering.signature import ParamKind, range_positions


def lower_one_shot(lw: PlanBuilder, region: comm.FusedOp) -> None:
    """The one-shot form (`comm.fused all_reduce one_shot`): ONE kernel over the all_reduce's
    whole result. Block b of each rank reads chunk b of every peer's whole input from
    symmetric memory, combines it in rank order in double and rounds once (as the oracle's
    all_reduce does), then computes the region's computation on it and stores the results:
    the entry/done handshake of the flag protocol (the done step: no peer still reads this
    rank's input when the next launch overwrites it), no all_gather. Row reductions take the
    row form, a block per run of whole rows. Every rank reads (group - 1) whole inputs -- more
    bytes than the two-shot form, one handshake less: the form of small tensors.

    A group spanning nodes (symmetric memory reaches one node) lowers op by op: the library
    all_reduce, then the computation's kernels."""
    body = [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]
    reduce = next(o for o in body if isinstance(o, comm.AllReduceOp))
    updates = [o for o in body if isinstance(o, coco.UpdateOp)]
    if _hierarchical([reduce]):
        for op in body:
            if isinstance(op, coco.UpdateOp):
                lw.lower_update(op)
            else:
                lw.lower_op(op)
    else:
        compute = [o for o in body if o is not reduce and not isinstance(o, coco.UpdateOp)]
        members = {reduce, *compute}
        computed = {r for op in [reduce, *compute] for r in op.results}
        # An update of the all_reduce's input (which peers read) is a copy after the kernel.
        direct = [
            u
            for u in updates
            if u.value in computed
            and u.value.type == u.target.type
            and u.target is not wire_source(lw, reduce.input)
        ]
        emit_collective_kernel(lw, members, [reduce], [], compute, direct)
        for u in updates:
            if u not in direct:
                lw.lower_update(u)
    for res, v in zip(region.res, region.yield_op.values):
        lw.buffers[res] = lw.value_buffer(v)


def lower_fused_reduction(lw: PlanBuilder, region: comm.FusedOp) -> None:
    """A `comm.fused reduction`: one kernel computing its elementwise ops at every element,
    storing what is read after it, and finishing its reductions (across the all_reduces'
    group through symmetric memory, as a fused all_reduce finishes LAMB's norms). Op by op
    where the group spans nodes (the library all_reduce after a kernel of the computation)
    or a reduction is not of floats (the exchange is in double)."""
    body = [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]
    reductions = [o for o in body if isinstance(o, coco.ReduceOp | comm.AllReduceOp)]
    compute = [o for o in body if o not in reductions]
    finishers = [o for o in reductions if isinstance(o, comm.AllReduceOp)]
    floats = all(
        is_float_name(tensor_type_of(o.input).elt)
        for o in reductions
        if isinstance(o, coco.ReduceOp)
    )
    if floats and not (finishers and _hierarchical(finishers)):
        emit_collective_kernel(lw, set(body), [], [], compute, [], reductions)
    else:
        _emit_chain(lw, body, [])  # (no scatter or gather: a kernel, then op by op)
    for res, v in zip(region.res, region.yield_op.values):
        lw.buffers[res] = lw.value_buffer(v)


def lower_fused_collective(lw: PlanBuilder, region: comm.FusedOp) -> None:
    if region.is_one_shot:
        lower_one_shot(lw, region)
        return
    # Where the region is cut into kernels is `coco-segment`'s decision (segments.py): each
    # segment's kernels, and between them the ops running on their own, as unfused. Scalar
    # arithmetic `coco-defer` marked (a trust ratio, a clipping factor from a global norm)
    # is in no segment: every kernel reading it computes it (PlanBuilder.rematerialized), and
    # a step reading it from memory gets it lowered on demand. The slices of arguments it
    # marked move no data either: each kernel reading one reads the argument at this rank's
    # piece (LAMB's %w_s, read before and after its norms: 8 bytes more per element of the
    # slice otherwise).
    for piece in pieces(region):
        if isinstance(piece, Operation):
            lw.lower_op(piece)
        else:
            emit_segment(lw, *piece)
    for res, v in zip(region.res, region.yield_op.values):
        lw.buffers[res] = lw.value_buffer(v)


def wire_source(lw: PlanBuilder, v: SSAValue) -> SSAValue:
    """What peers read for a reduce_scatter of `v`: the narrow input of an exact widening cast
    `coco-defer` put on the wire (`#comm<deferral wire>`, decisions.py), else `v` itself."""
    op = v.owner
    if isinstance(op, coco.CastOp) and comm.deferral_of(op) == comm.Deferral.WIRE:
        return op.input
    return v


def _hierarchical(collectives: Sequence[comm.CollectiveOp]) -> bool:
    """Whether a fused kernel's collectives reach a group across nodes: the topology
    `coco-choose-topology` chose for them (decisions.py), one for all (they span the same
    axes)."""
    chosen = {comm.topology_of(op) for op in collectives}
    assert None not in chosen, "the lowering's decisions were not made (decisions.decided)"
    return comm.Topology.HIERARCHICAL in chosen


def _stored(
    lw: PlanBuilder,
    ops: list[Operation],
    members: set[Operation],
    updates: Sequence[coco.UpdateOp],
) -> list[SSAValue]:
    """The results of `ops` a kernel storing `updates` itself must also store: those needed
    after it, except deferred ops' (each kernel reading one computes it again)."""
    return [
        r
        for op in ops
        if op not in lw.deferred
        for r in op.results
        if needed_after(r, members, updates)
    ]


def emit_segment(lw: PlanBuilder, ops: list[Operation], updates: list[coco.UpdateOp]) -> None:
    """The segment's kernels: one per tensor chain it holds (a region coupling several
    reduce_scatter chains through scalars -- a global norm -- holds one chain per tensor,
    whose kernels then run as one table launch; a norm over many tensors computed once
    before them), then the updates no kernel stores."""
    # The tensor chains coco-segment marked (comm.chain; none where the segment holds one).
    by_chain: dict[int, list[Operation]] = {}
    for op in ops:
        by_chain.setdefault(comm.chain_of(op) or 0, []).append(op)
    chains = [by_chain[k] for k in sorted(by_chain)]
    _compute_shared_scalars(lw, chains)
    chain_index = {op: k for k, chain in enumerate(chains) for op in chain}
    mine: list[list[coco.UpdateOp]] = [[] for _ in chains]
    rest: list[coco.UpdateOp] = []
    for u in updates:
        k = chain_index.get(u.value.owner)  # type: ignore[arg-type]
        (rest if k is None else mine[k]).append(u)
    for chain, stored in zip(chains, mine, strict=True):
        _emit_chain(lw, chain, stored)
    rest = _emit_scalar_updates(lw, rest)
    for u in rest:
        lw.lower_update(u)


# Deferred scalar arithmetic that several kernels of one table launch read and that reads
# more values than this from memory (a global norm over many tensors reads every tensor's
# partial sum) is computed once, by one kernel before the launch, instead of by each kernel:
# otherwise each of N kernels takes the N partials, a table of N^2 arguments.
SHARED_SCALAR_INPUTS = 16


def _compute_shared_scalars(lw: PlanBuilder, chains: list[list[Operation]]) -> None:
    """One kernel of one element computing the deferred scalars that several of the
    segment's chains read (and what they are computed from), where those read more than
    SHARED_SCALAR_INPUTS values; the chains' kernels then read its results from memory."""
    if len(chains) < 2:
        return
    readers: dict[SSAValue, int] = {}  # deferred values read, by how many chains
    for chain in chains:
        mine = set(chain)
        read = {
            v
            for op in chain
            for o in op.walk()
            for v in o.operands
            if v.owner in lw.deferred and v.owner not in mine and v not in lw.buffers
        }
        for v in read:
            readers[v] = readers.get(v, 0) + 1
    # Scalars only (a slice of an argument is each kernel's own piece); what computes them
    # is scalar arithmetic, which reads scalars only (segments.scalar_arithmetic).
    ops = lw.rematerialized([v for v, n in readers.items() if n > 1 and _scalar(v)])
    shared = set(ops)
    inputs = {v for op in shared for v in op.operands if v.owner not in shared}
    if len(inputs) <= SHARED_SCALAR_INPUTS:
        return
    stores = [r for op in ops for r in op.results if any(u.operation not in shared for u in r.uses)]
    lw.lower_elementwise(ops, "shared_scalars", stores=stores)


def _scalar(v: SSAValue) -> bool:
    return tensor_type_of(v).get_shape() == ()


def _emit_scalar_updates(lw: PlanBuilder, updates: list[coco.UpdateOp]) -> list[coco.UpdateOp]:
    """Updates of scalar state from deferred scalar arithmetic (a loss scale and its growth
    counter, computed from the found-inf flag the segment's reductions finished): ONE kernel
    of one element computes that arithmetic and stores every such update into its target,
    not a launch per op and a copy per update. The other updates, returned."""
    scalar = [
        u
        for u in updates
        if tensor_type_of(u.target).get_shape() == ()
        and u.value not in lw.buffers
        and u.value.owner in lw.deferred
    ]
    ops = lw.rematerialized([u.value for u in scalar])
    if not ops or any(tensor_type_of(r).get_shape() != () for op in ops for r in op.results):
        return updates
    lw.lower_elementwise(ops, "scalar_updates", stores=[], updates=scalar)
    return [u for u in updates if u not in scalar]


def _emit_chain(lw: PlanBuilder, ops: list[Operation], updates: list[coco.UpdateOp]) -> None:
    members = set(ops)
    scatters = [op for op in ops if isinstance(op, comm.ReduceScatterOp)]
    gathers = [op for op in ops if isinstance(op, comm.AllGatherOp)]
    reductions = [op for op in ops if isinstance(op, coco.ReduceOp | comm.AllReduceOp)]
    compute = [
        op
        for op in ops
        if not isinstance(
            op, comm.ReduceScatterOp | comm.AllGatherOp | coco.ReduceOp | comm.AllReduceOp
        )
    ]
    computed = {r for op in compute + scatters for r in op.results}
    # An update of a value this kernel computes is a store of the kernel, and one of a value
    # it gathers is where the gather assembles it; any other update (of a value from
    # elsewhere) is a copy once the kernel is done.
    direct = [u for u in updates if u.value in computed and u.value.type == u.target.type]
    candidates = [u for u in updates if _assembled_in_target(u, gathers)]
    assembled: list[coco.UpdateOp] = []
    if scatters or gathers:
        assembled = emit_collective_kernel(
            lw, members, scatters, gathers, compute, direct, reductions, candidates
        )
    elif ops:
        # no collective to finish reductions in: the reductions are lowered after the kernel,
        # op by op, reading what it stores
        alone = set(compute)
        stores = _stored(lw, compute, alone, direct)
        remat = lw.rematerialized([v for op in compute for v in op.operands], alone)
        lw.lower_elementwise(remat + compute, "fused", stores=stores, updates=direct)
        for op in reductions:
            lw.lower_op(op)
    for u in updates:
        if u not in direct and u not in assembled:
            lw.lower_update(u)


def _collective_kernel(
    lw: PlanBuilder,
    kernel: ElementwiseKernel,
    scatters: Sequence[comm.ReduceScatterOp | comm.AllReduceOp],
    gathers: list[comm.AllGatherOp],
    reductions: Sequence[Operation],
    rows: bool,
    single: bool,
) -> tuple[str, Sequence[Param]]:
    """The name of `kernel` built (or of an earlier site's kernel of the same computation:
    kernel_site.py, a deep model's layers) and its parameters pointed at this site's values."""
    site = None
    if lw.memoize_kernels and not rows:
        extras: list[tuple[object, Sequence[SSAValue]]] = []
        extras += [(op_description(op), [wire_source(lw, op.input), op.result]) for op in scatters]
        extras += [(op_description(op), [op.input, op.result]) for op in gathers]
        extras += [(op_description(op), op.results) for op in reductions]
        extras += [("gather_target", [v, t]) for v, t in kernel.gather_targets.items()]
        extras += [(("reduction", kind), [v, out]) for v, kind, out in kernel.reductions]
        extras.append((("flags", kernel.uneven, kernel.literal_shapes, single), []))
        site = kernel_site(kernel.ops, kernel.iteration, kernel.inputs, kernel.stores, extras)
    built = lw.built_kernels.get(site.key) if site is not None else None
    if site is not None and built is not None:
        first_kernel, first, name = built
        params = site.params_of(first, first_kernel.params)
        if params is not None:
            return name, params
    new = kernel.build()
    key = structural_key(new, comments=False)
    name = lw.add_kernel(new, key)
    if not rows and name not in lw.collective_kernels:
        # Collective kernels of one text up to names fold into one table launch.
        lw.collective_kernels[name] = (key, new)
    if site is not None:
        lw.built_kernels[site.key] = (new, site, name)
    return name, new.params


def _assembled_in_target(u: coco.UpdateOp, gathers: list[comm.AllGatherOp]) -> bool:
    """Whether the update's value is gathered by this kernel into the target's type: the
    kernel then assembles it in the target directly, which holds the value from then on (no
    op reads the target after its update, and the kernel reads it, if at all, only at this
    rank's own elements, which no pull writes)."""
    return any(u.value is op.result for op in gathers) and u.value.type == u.target.type


def _table_ready(members: set[Operation]) -> bool:
    """Whether the fused region holding `members` is marked `comm.table_ready`."""
    region = next(iter(members)).parent_op()
    return region is not None and comm.TABLE_READY_ATTR_NAME in region.attributes


def emit_collective_kernel(
    lw: PlanBuilder,
    members: set[Operation],
    scatters: Sequence[comm.ReduceScatterOp | comm.AllReduceOp],
    gathers: list[comm.AllGatherOp],
    compute: list[Operation],
    updates: list[coco.UpdateOp],
    reductions: Sequence[Operation] = (),
    assembled: Sequence[coco.UpdateOp] = (),
) -> list[coco.UpdateOp]:
    """Emits the kernel; returns the updates of `assembled` (candidates) whose gathered value
    it assembles in the target. `scatters` are the reductions whose peers' inputs the kernel
    reads: reduce_scatters, or the one-shot form's all_reduce (its result is the whole
    tensor, which the kernel then iterates over: lower_one_shot)."""
    finishers = {r.operands[0]: r for r in reductions if isinstance(r, comm.AllReduceOp)}
    # A fused reduction's kernel (no scatter or gather): its all_reduces' group, or none.
    collectives = [*scatters, *gathers] or list(finishers.values())
    spans = {op.span() for op in collectives} if collectives else {()}
    if len(spans) != 1:
        raise CocoError(
            "[lower-fused-collective] the collectives of one fused region must span the same "
            f"grid axes, got {sorted(spans)}"
        )
    span = spans.pop()
    if collectives and _hierarchical(collectives):
        rss = [op for op in scatters if isinstance(op, comm.ReduceScatterOp)]
        assert len(rss) == len(scatters), "a one-shot form across nodes lowers op by op"
        stated = [op for op in rss if op.acc is not None]
        if stated:
            # The node kernel sums each node's part before the library sums across nodes:
            # not the rank order each step of a stated accumulation rounds in.
            raise CocoError(
                f"[fused-acc-across-nodes] a fused reduce_scatter accumulating in "
                f"{comm.accumulation(stated[0])} over a group that spans nodes: the "
                "hierarchical kernel cannot round in rank order; run it unfused (the library "
                "collective honours acc) or within one node"
            )
        return emit_hierarchical(lw, span, rss, gathers, compute, updates, reductions, assembled)

    # The kernel iterates over this rank's slice: the type of the sliced values.
    sliced = [op.result for op in scatters] + [r for op in compute for r in op.results]
    reduced = [op.input for op in reductions if isinstance(op, coco.ReduceOp)]
    sliced += [op.input for op in gathers] + reduced
    sliced = iteration_values(sliced, compute)
    iteration = lw.iteration_type(
        [v.owner for v in sliced if isinstance(v.owner, Operation)],
        [tensor_type_of(v) for v in sliced],
    )

    rows = any(isinstance(op, coco.ReduceDimsOp) for op in compute)
    # A group of one member (one rank, or a grid axis of size 1): every collective is the
    # identity on the rank's piece, so the kernel reads the reduce_scatter's input from the
    # rank's own memory and stores the gathered value where it is wanted -- no symmetric
    # buffer (an argument bound without a copy), no staging store, handshake or pull; the
    # row form too (RMSNorm at one rank: a plain row kernel).
    group = lw.group_size(span)
    single = group == 1
    # Scalar arithmetic on arguments that only fused collectives read: computed here.
    remat = (
        []
        if rows
        else lw.rematerialized([v for op in compute + gathers for v in op.operands], members)
    )
    inside = {r for op in [*members, *remat] for r in op.results}
    inputs: list[SSAValue] = []
    sources = [wire_source(lw, op.input) for op in scatters] if single else []
    for v in [v for op in remat + compute + gathers for v in op.operands] + sources + reduced:
        if v not in inside and v not in inputs:
            inputs.append(v)
    targets: dict[SSAValue, coco.UpdateOp] = {}
    for u in assembled:
        # A target peers read (a reduce_scatter input of this kernel) cannot take pulls.
        if u.value not in targets and not any(
            wire_source(lw, s.input) is u.target for s in scatters
        ):
            targets[u.value] = u
    # Values the rest of the program needs (gathered ones are pushed in place instead).
    stores = _stored(lw, [*compute, *scatters], members, updates)
    if single:
        # the gathered values: stored into the targets they update, or as results
        stores += [op.result for op in gathers if op.result not in targets]
        updates = [*updates, *targets.values()]
    # (a gathered value over one member is laid out as its input: stored as the iteration is)
    laid_out: dict[SSAValue, TensorType] = (
        {op.result: tensor_type_of(op.input) for op in gathers} if single else {}
    )
    store_specs = [Store(v, laid_out.get(v, tensor_type_of(v))) for v in stores]
    store_specs += [Store(u.value, laid_out.get(u.value, u.target.type), u.target) for u in updates]
    store_buffers = [lw.buffer_for(v) for v in stores] + [
        lw.value_buffer(u.target) for u in updates
    ]

    prefix = (
        "k_one_shot_all_reduce"
        if any(isinstance(op, comm.AllReduceOp) for op in scatters)
        else "k_fused_all_reduce"
        if scatters or gathers
        else "k_fused_reduction"
    )
    if rows:
        kernel = RowCollectiveKernel(
            lw.fresh(f"{prefix}_rows"), compute, iteration, inputs, store_specs
        )
    else:
        kernel = ElementwiseKernel(
            lw.fresh(prefix),
            remat + compute,
            iteration,
            inputs,
            store_specs,
        )
    kernel.group = group
    for op in scatters:
        if single:
            kernel.aliases[op.result] = wire_source(lw, op.input)
        else:
            kernel.peer_reductions[op.result] = (wire_source(lw, op.input), op.kind.data)
    for op in gathers:
        if single:
            kernel.aliases[op.result] = op.input
        else:
            kernel.all_gathers.append((op.input, op.result))
    if not single:
        for value, u in targets.items():
            kernel.gather_targets[value] = u.target
        # Assembled in an argument the caller keeps in symmetric memory: the peers pull
        # each owner's piece from the argument itself -- one store per element, the floor
        # (the vector form; the row form stores its targets in a later phase).
        kernel.in_place = {
            op.result
            for op in gathers
            if not rows
            and op.result in targets
            and lw.value_buffer(targets[op.result].target).symmetric
        }
        # Else a staging buffer of the rank's piece where the piece is the iteration's (its
        # elements are then the kernel's own, at their index i).
        kernel.staged = {
            op.result
            for op in gathers
            if op.result in targets
            and op.result not in kernel.in_place
            and kernel.coincides(tensor_type_of(op.input), iteration)
        }
    for op in reductions:
        if isinstance(op, coco.ReduceOp):
            # finished across the group by its all_reduce, or (a fused reduction without
            # one) on the rank itself: a group of one
            out = finishers[op.result].result if op.result in finishers else op.result
            kernel.reductions.append((op.input, op.kind.data, out))
    # Uneven slices take each member's count from a table. A region coco-table-form marked
    # (decisions.py: the program's regions hold several reduce_scatters, one per parameter
    # tensor) takes them even where its slices are even, so that every tensor's kernel is
    # one text and the regions run as one table launch; row kernels do not run as tables.
    table_ready = _table_ready(members) and not rows
    kernel.uneven = V.is_uneven(iteration, lw.grid_shape) or table_ready
    # Tensors of different shapes share one text (one table launch): extents as arguments.
    kernel.literal_shapes = not table_ready
    name, params = _collective_kernel(lw, kernel, scatters, gathers, reductions, rows, single)

    # Symmetric memory: reduce_scatter inputs and gathered results (peers read them); an
    # argument becomes symmetric too, the executor placing the caller's data.
    if not single:
        for op in scatters:
            lw.make_symmetric(wire_source(lw, op.input))
        for op in gathers:
            if op.result in kernel.in_place:
                lw.buffers[op.result] = lw.value_buffer(targets[op.result].target)
                continue
            # assembled in an argument: only a staging copy of this rank's piece
            staging = op.result in kernel.staged
            lw.buffers[op.result] = lw.new_buffer(
                op.result.name_hint or "gathered",
                tensor_type_of(op.input) if staging else op.result.type,
                symmetric=True,
            )
    # Flags: entry and done (nranks x grid each), one per rank for reductions, the epoch.
    flags = flags_buffer(lw, kernel.name, iteration, group) if kernel.is_collective else None
    n_red = len(kernel.reductions)
    partials = counter = exchange = None  # a kernel finishing reductions has these
    if n_red:
        partials = lw.new_buffer(
            f"{kernel.name}_partials",
            iteration,
            kind="scratch",
            elt="f64",
            shape=(n_red * MAX_COLLECTIVE_BLOCKS,),
        )
        counter = lw.new_buffer(
            f"{kernel.name}_counter", iteration, kind="scratch", elt="u32", shape=(1,)
        )
        exchange = lw.new_buffer(
            f"{kernel.name}_exchange",
            iteration,
            kind="scratch",
            symmetric=True,
            elt="f64",
            shape=(n_red * group,),
        )
        for _v, _kind, out in kernel.reductions:
            lw.buffer_for(out)
    count = 1
    for d in iteration.local_shape(lw.grid_shape):
        count *= d
    grid = lw.config.grid_for(count)
    if kernel.is_collective:
        grid = min(grid, PLAN_COLLECTIVE_BLOCKS)  # resident at once
    block = lw.config.block
    if rows:
        # a block per run of whole rows; no more threads than the rows' lanes
        n_rows = count // iteration.get_shape()[-1]
        grid = max(1, min(n_rows, lw.config.max_blocks, PLAN_COLLECTIVE_BLOCKS))
        block = min(block, coco.ROW_LANES)

    # Parameters of the collective machinery; the lowering fills the others as for any
    # elementwise kernel.
    special = {
        ParamKind.PEERS_IN,
        ParamKind.PEERS_OUT,
        ParamKind.FLAGS,
        ParamKind.EPOCH,
        ParamKind.ME,
        ParamKind.NRANKS,
        ParamKind.RED_OUT,
        ParamKind.PARTIALS,
        ParamKind.COUNTER,
        ParamKind.EXCHANGE,
        ParamKind.GATHER_OUT,
        ParamKind.PEER_BASES,
        ParamKind.PEER_COUNTS,
        ParamKind.PEER_DIMS,
    }
    generic = iter(
        lw.kernel_args([p for p in params if p.kind not in special], iteration, store_buffers)
    )
    args: list[KernelArg] = []
    for p in params:
        match p.kind:
            case ParamKind.PEERS_IN | ParamKind.PEERS_OUT:
                assert p.value is not None
                args.append(PeerTable(lw.value_buffer(p.value), span))
            case ParamKind.FLAGS:
                assert flags is not None
                args.append(PeerTable(flags, span))
            case ParamKind.EPOCH:
                assert flags is not None
                args.append(Epoch(flags.name))  # one flag array, one launch counter
            case ParamKind.ME:
                args.append(RankValue("me", tuple(lw.group_index(r, span) for r in range(lw.size))))
            case ParamKind.NRANKS:
                args.append(group)
            case ParamKind.RED_OUT:
                assert p.value is not None
                args.append(lw.value_buffer(p.value))
            case ParamKind.PARTIALS:
                assert partials is not None
                args.append(partials)
            case ParamKind.COUNTER:
                assert counter is not None
                args.append(counter)
            case ParamKind.EXCHANGE:
                assert exchange is not None
                args.append(PeerTable(exchange, span))
            case ParamKind.GATHER_OUT:
                assert p.value is not None
                args.append(lw.value_buffer(p.value))
            case ParamKind.PEER_BASES:
                assert p.value is not None
                args.append(member_bases(lw, tensor_type_of(p.value), iteration, span))
            case ParamKind.PEER_COUNTS:
                args.append(member_counts(lw, iteration, span))
            case ParamKind.PEER_DIMS:
                assert p.dim is not None
                args.append(member_dims(lw, iteration, span, p.dim, p.span))
            case _:
                args.append(next(generic))

    assembled_in = tuple(lw.value_buffer(t).name for t in kernel.gather_targets.values())
    lw.emit(
        Launch(
            name,
            grid,
            block,
            args,
            shared_bytes=8 * n_red * lw.config.block,
            writes=tuple(b.name for b in store_buffers)
            + tuple(lw.value_buffer(out).name for _, _, out in kernel.reductions)
            + assembled_in,
            # A kernel finishing reductions covers its whole slice: not split into chunks.
            range_positions=None if n_red else range_positions(params),
            iteration_shape=iteration.local_shape(lw.grid_shape),
            iteration_type=iteration,
        )
    )
    # Later uses of an assembled gathered value read it where it was assembled.
    for value, u in targets.items():
        lw.buffers[value] = lw.value_buffer(u.target)
    return list(targets.values())


def member_bases(
    lw: PlanBuilder, t: TensorType, iteration: TensorType, span: tuple[int, ...]
) -> ArgTable:
    """Where the iteration piece of each member of a rank's group starts in its piece of the
    gathered type `t` (the same piece for every member: `t` is replicated over the group), in
    group order: the offsets a rank pulls the members' pieces at."""
    # the tables depend on the types and span alone (rank_table's key): a deep stack's layers
    # share them
    group = lw.group_size(span)
    rows: list[KernelArg] = []
    for m in range(group):
        rows.append(
            lw.rank_table(
                f"base{m}",
                lambda r, m=m: lw.base_offset(t, iteration, V.group_of(lw.grid_shape, span, r)[m]),
                (t, iteration, span),
            )
        )
    return ArgTable(tuple(rows))


def member_counts(lw: PlanBuilder, iteration: TensorType, span: tuple[int, ...]) -> ArgTable:
    """How many iteration elements each member of a rank's group holds, in group order
    (uneven slices: the counts the pull of each member's piece covers)."""
    rows: list[KernelArg] = []
    for m in range(lw.group_size(span)):
        rows.append(
            lw.rank_table(
                f"count{m}",
                lambda r, m=m: lw.piece_count(iteration, V.group_of(lw.grid_shape, span, r)[m]),
                (iteration, span),
            )
        )
    return ArgTable(tuple(rows))


def member_dims(
    lw: PlanBuilder, iteration: TensorType, span: tuple[int, ...], dim: int, dims: int = 1
) -> ArgTable:
    """Each member's local size of iteration dims [dim, dim + dims) (a collapsed dim: their
    product), in group order (uneven slices: where a strided pull finds the coordinates of a
    member's elements)."""
    rows: list[KernelArg] = []
    for m in range(lw.group_size(span)):
        rows.append(
            lw.rank_table(
                f"dim{dim}_{m}",
                lambda r, m=m: math.prod(
                    lw.piece_shape(iteration, V.group_of(lw.grid_shape, span, r)[m])[
                        dim : dim + dims
                    ]
                ),
                (iteration, span, dims),
            )
        )
    return ArgTable(tuple(rows))
