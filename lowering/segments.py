"""`coco-segment`: where a two-shot fused region is cut into kernels, as IR.

Blocks of one rank never wait for each other (the device layer's rule), so a fused region
whose computation needs a whole reduction (LAMB's norms, a global norm for clipping) cannot
finish in one kernel. The pass decides the cuts and writes them on the region's ops; the plan
builder (fused_collective.py `lower_fused_collective`) lowers what it reads:

* `comm.segment = k` on every op the region's k-th segment runs: its kernels (one per tensor
  chain it holds, run as one table launch) and the updates they store. A segment takes ops
  in program order until one reads the result of a reduction the segment finishes.
* An op of the region without a segment (a reduction the kernel cannot finish, a matmul)
  runs on its own between the segments around it, as it would unfused.
* A full reduction (`coco.reduce`, not a norm) of a value the segment's reduce_scatters
  produce, whose partials only an all_reduce of the same kind and span reads (one that
  states no accumulation), is finished inside the segment's kernel: both carry the segment.
* Each update moves up to just after the op computing its value where no op in between
  reads its target (itself or through a deferred op, which runs where its readers run), so
  the segment computing a value stores it in the target instead of storing it for a later
  segment to copy (LAMB written with `m` and `v` updated after its norms: two passes over
  each less).
* `comm.segments = N` on the region: how many segments it has.
* `comm.chain = j` on the ops of a segment that holds several tensor chains (a global norm
  coupling several tensors' chains through scalars): the j-th kernel of the segment, one per
  chain, which the plan builder runs as one table launch. None on a segment of one chain.

Scalar arithmetic `coco-defer` marked for rematerialization belongs to no segment (each
kernel reading it computes it). The pass runs after `coco-defer` (it reads `comm.deferral`)
and takes no options. Segments and chains already written must be the pass's own, in its
order ([segment]), and sit in two-shot regions ([segment-op]); a region holding them is kept
(its chains are written where none are).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass

from coconet.dialects import coco, comm
from coconet.dialects.comm import (
    CHAIN_ATTR_NAME,
    SEGMENT_ATTR_NAME,
    SEGMENTS_ATTR_NAME,
    chain_of,
    deferral_of,
    segment_of,
)
from coconet.dialects.reduction import Reduction
from coconet.passes.common import fail, op_name

# --------------------------------------------------------------------------------------------
# Which regions are segmented
# --------------------------------------------------------------------------------------------

_KERNEL_OPS = (coco.ElementwiseOp, coco.ConstantOp, coco.SliceOp)


def send_kernel_of(region: comm.FusedOp) -> comm.SendOp | None:
    """The send a `comm.fused send` region runs as ONE kernel (fused_send.py): its one send,
    of a value the region computes elementwise, received only by the region's results or
    updates. None: the region lowers as a fused collective region (a library send)."""
    body = [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]
    sends = [o for o in body if isinstance(o, comm.SendOp)]
    compute = [o for o in body if not isinstance(o, comm.SendOp | coco.UpdateOp)]
    if len(sends) != 1 or not all(isinstance(o, _KERNEL_OPS) for o in compute):
        return None
    send = sends[0]
    if any(
        u.operation is not region.yield_op and not isinstance(u.operation, coco.UpdateOp)
        for u in send.result.uses
    ):
        return None
    return send


def two_shot_regions(fn: func.FuncOp) -> Iterable[comm.FusedOp]:
    """The regions the plan builder lowers as two-shot fused collectives (fused_collective.py
    `lower_fused_collective`): fused all_reduce regions but one-shot ones, and send regions
    that are not one send kernel -- or whose send `coco-choose-topology` found to cross
    nodes (the computation's kernel, then a library send)."""
    for region in fn.walk():
        if not isinstance(region, comm.FusedOp):
            continue
        kind = region.kind.data
        if kind == comm.FusionKind.ALL_REDUCE and not region.is_one_shot:
            yield region
        elif kind == comm.FusionKind.SEND:
            send = send_kernel_of(region)
            if send is None or comm.topology_of(send) == comm.Topology.HIERARCHICAL:
                yield region


def scalar_arithmetic(op: Operation) -> bool:
    """An elementwise op or constant of scalars (no dropout: its mask is drawn once)."""
    return (
        isinstance(op, coco.ElementwiseOp | coco.ConstantOp)
        and not isinstance(op, coco.DropoutOp)
        and all(coco.tensor_type_of(r).get_shape() == () for r in op.results)
    )


def _rematerialized_scalars(body: list[Operation]) -> set[Operation]:
    """The region's scalar arithmetic each kernel reading it computes (`coco-defer`)."""
    return {op for op in body if deferral_of(op) is not None and scalar_arithmetic(op)}


def _deferred(body: list[Operation]) -> set[Operation]:
    return {op for op in body if deferral_of(op) is not None}


def _body(region: comm.FusedOp) -> list[Operation]:
    return [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]


# --------------------------------------------------------------------------------------------
# The cuts
# --------------------------------------------------------------------------------------------


def in_kernel(op: Operation) -> bool:
    """An op a segment's kernel computes as it goes (row reductions: the row form of the
    kernel, row_collective.py)."""
    return isinstance(
        op,
        coco.ElementwiseOp
        | coco.ConstantOp
        | coco.SliceOp
        | coco.ReduceDimsOp
        | comm.ReduceScatterOp
        | comm.AllGatherOp,
    )


def in_kernel_reduction(
    op: Operation, scatter: comm.ReduceScatterOp | None, produced: set[SSAValue]
) -> comm.AllReduceOp | None:
    """The all_reduce that finishes `op`, if `op` is a full reduction of a value of this
    collective segment (its first reduce_scatter `scatter`, the values its ops `produced`)
    whose partials only that all_reduce reads (LAMB's sliced norms)."""
    if not isinstance(op, coco.ReduceOp) or op.kind.data == Reduction.NORM:
        return None
    uses = list(op.result.uses)
    if scatter is None or op.input not in produced or len(uses) != 1:
        return None
    user = uses[0].operation
    if not isinstance(user, comm.AllReduceOp) or user.kind.data != op.kind.data:
        return None
    if user.acc is not None:
        return None  # its stated accumulation: the library step honours it (lower_collective)
    if user.span() != scatter.span():
        return None
    return user


@dataclass
class Segments:
    """A region's decision: its body in the order it runs, the segment of each op holding one."""

    order: list[Operation]
    segment: dict[Operation, int]

    @property
    def count(self) -> int:
        """How many segments the region has (numbered from 0 without gaps)."""
        return len(set(self.segment.values()))


def plan_segments(region: comm.FusedOp) -> Segments:
    """Cut `region` (a two-shot region) into segments: the module docstring's rules."""
    body = _body(region)
    deferred = _deferred(body)
    scalars = _rematerialized_scalars(body)
    order = updates_where_computed(body, deferred)
    index = 0
    # the current segment's first reduce_scatter and the values its ops compute
    scatter: comm.ReduceScatterOp | None = None
    produced: set[SSAValue] = set()
    segment: dict[Operation, int] = {}
    absorbed: set[Operation] = set()
    # Results of the reductions this segment's kernel finishes (at its end), and scalars
    # computed from them: an op reading one starts the next segment; until then, the kernel
    # takes more work and reductions.
    finished: set[SSAValue] = set()
    for op in order:
        if op in absorbed:
            continue
        if op in scalars:
            if any(v in finished for v in op.operands):
                finished.update(op.results)
            continue
        if isinstance(op, coco.UpdateOp):
            segment[op] = index  # stores: they never cut a segment
            continue
        if any(v in finished for v in op.operands):
            index, scatter, produced, finished = index + 1, None, set[SSAValue](), set[SSAValue]()
        if in_kernel(op):
            segment[op] = index
            produced.update(op.results)
            if scatter is None and isinstance(op, comm.ReduceScatterOp):
                scatter = op
            continue
        finisher = in_kernel_reduction(op, scatter, produced)
        if finisher is not None:
            # The reduction and the all_reduce of its partials finish in this segment's kernel.
            segment[op] = segment[finisher] = index
            produced.update((*op.results, *finisher.results))
            absorbed.add(finisher)
            finished.add(finisher.result)
            continue
        # `op` runs on its own
        index, scatter, produced, finished = index + 1, None, set[SSAValue](), set[SSAValue]()
    # segments numbered from 0 without gaps (a cut right before an op running on its own, or
    # two such ops in a row, leave an index with nothing in it)
    dense = {k: n for n, k in enumerate(sorted(set(segment.values())))}
    return Segments(order, {op: dense[k] for op, k in segment.items()})


def updates_where_computed(body: list[Operation], deferred: set[Operation]) -> list[Operation]:
    """`body` with each update moved up to just after the op computing its value, where no
    op in between reads the target (itself or through a deferred op, which runs where its
    readers run). One pass over the body: a region holding a model's every tensor (LAMB's
    segments) has hundreds of updates."""
    at = {op: i for i, op in enumerate(body)}
    targets: set[SSAValue] = {u.target for u in body if isinstance(u, coco.UpdateOp)}
    # the targets a deferred op reads, transitively (only targets: a global norm's every
    # reader reads the norm's whole running sum through it, which is no target)
    through: dict[Operation, set[SSAValue]] = {}
    readers: dict[SSAValue, list[int]] = {}  # positions reading each target, ascending
    for i, op in enumerate(body):
        for v in _read_targets(op, targets, deferred, through):
            readers.setdefault(v, []).append(i)
    key = {op: (i, 0, 0) for i, op in enumerate(body)}
    for u in body:
        if not isinstance(u, coco.UpdateOp):
            continue
        producer = u.value.owner
        if not isinstance(producer, Operation) or producer not in at or producer in deferred:
            continue
        start, end = at[producer], at[u]
        positions = readers.get(u.target, [])
        k = bisect.bisect_right(positions, start)
        if k < len(positions) and positions[k] < end:
            continue  # read in between: it stays where it is
        key[u] = (start, 1, end)  # right after its value, in program order among such
    return sorted(body, key=key.__getitem__)


def _read_targets(
    op: Operation,
    targets: set[SSAValue],
    deferred: set[Operation],
    through: dict[Operation, set[SSAValue]],
) -> set[SSAValue]:
    """The `targets` `op` reads: among its operands, and what the deferred ops producing
    them read (computed where read), memoized in `through`."""
    out: set[SSAValue] = set()
    for w in op.operands:
        if w in targets:
            out.add(w)
        owner = w.owner
        if isinstance(owner, Operation) and owner in deferred:
            if owner not in through:
                through[owner] = _read_targets(owner, targets, deferred, through)
            out |= through[owner]
    return out


# --------------------------------------------------------------------------------------------
# A segment's tensor chains
# --------------------------------------------------------------------------------------------


def tensor_chains(ops: list[Operation]) -> list[list[Operation]]:
    """The kernels of a segment (its ops as `pieces` gives them): one per tensor chain, two
    ops in one chain when one reads the other's result (scalar arithmetic links none), a
    reduction nothing else reads joining the chain that iterates over its slice. In program
    order. A region coupling several reduce_scatter chains through scalars (a global norm)
    holds one chain per tensor, whose kernels then run as one table launch."""
    return _joined_reductions(_linked(ops), ops)


def _linked(ops: list[Operation]) -> list[list[Operation]]:
    """`ops` grouped by the tensors they compute: two ops are in one chain when one reads the
    other's result (scalar arithmetic is in none, and so couples none). In program order."""
    parent: dict[Operation, Operation] = {op: op for op in ops}

    def root(op: Operation) -> Operation:
        while parent[op] is not op:
            parent[op] = parent[parent[op]]
            op = parent[op]
        return op

    for op in ops:
        for v in op.operands:
            if v.owner in parent:
                parent[root(op)] = root(v.owner)  # type: ignore[index]
    groups: dict[Operation, list[Operation]] = {}
    for op in ops:
        groups.setdefault(root(op), []).append(op)
    return list(groups.values())


def _joined_reductions(
    chains: list[list[Operation]], ops: list[Operation]
) -> list[list[Operation]]:
    """A chain with no collective of its own that finishes a reduction (the norm of a weight
    slice, which nothing else in the segment reads) joins the chain whose collective kernel
    iterates over the same slice, and finishes its reduction with that kernel's; without
    such a chain it is lowered op by op (fused_collective.py _emit_chain)."""

    def slice_type(chain: list[Operation]) -> Attribute | None:
        for op in chain:
            if isinstance(op, comm.ReduceScatterOp):
                return op.result.type
            if isinstance(op, comm.AllGatherOp):
                return op.input.type
        return None

    spaces = [slice_type(chain) for chain in chains]
    hosts = [(t, chain) for t, chain in zip(spaces, chains) if t is not None]
    out: list[list[Operation]] = []
    joined: set[int] = set()
    for t, chain in zip(spaces, chains):
        if t is None:
            reduced = {op.input.type for op in chain if isinstance(op, coco.ReduceOp)}
            host = next((h for ht, h in hosts if ht in reduced), None)
            if host is not None:
                host += chain
                joined.add(id(host))
                continue
        out.append(chain)
    order = {op: i for i, op in enumerate(ops)}
    for chain in out:
        if id(chain) in joined:
            chain.sort(key=order.__getitem__)
    return out


# --------------------------------------------------------------------------------------------
# The pass
# --------------------------------------------------------------------------------------------


def _written(region: comm.FusedOp) -> bool:
    return SEGMENTS_ATTR_NAME in region.attributes or any(
        SEGMENT_ATTR_NAME in op.attributes for op in _body(region)
    )


def _check_written(region: comm.FusedOp, want: Segments) -> None:
    """Segments written on `region` must be the pass's: its order and its indices."""
    body = _body(region)
    for have, op in zip(body, want.order, strict=True):
        if have is not op:
            raise fail(
                "segment",
                f"{op_name(have)} stands where the segmented order has {op_name(op)}: "
                "an update runs right after the op computing its value, where nothing in "
                "between reads its target",
                at=have,
            )
    for op in body:
        if segment_of(op) != want.segment.get(op):
            expected = want.segment.get(op)
            wanted = (
                "no segment (it runs on its own)" if expected is None else f"segment {expected}"
            )
            raise fail(
                "segment",
                f"{op_name(op)} has segment {segment_of(op)}, the cuts give it {wanted}",
                at=op,
            )
    count = region.attributes.get(SEGMENTS_ATTR_NAME)
    if not isinstance(count, IntegerAttr) or count.value.data != want.count:
        raise fail("segment", f"the region has {want.count} segment(s), it says {count}", at=region)


def choose_segments(fn: func.FuncOp) -> None:
    """Cut (or, where written, check) every two-shot region of `fn` into segments."""
    regions = list(two_shot_regions(fn))
    inside = {op for r in regions for op in _body(r)}
    for op in fn.walk():
        if (SEGMENT_ATTR_NAME in op.attributes or CHAIN_ATTR_NAME in op.attributes) and (
            op not in inside
        ):
            raise fail(
                "segment-op",
                f"{op_name(op)} has a {'segment' if segment_of(op) is not None else 'chain'}"
                ", but only the ops of two-shot fused regions (fused all_reduce regions but "
                "one-shot ones, send regions that do not run as one send kernel) run in "
                "segments",
                at=op,
            )
        if SEGMENTS_ATTR_NAME in op.attributes and op not in regions:
            raise fail(
                "segment-op",
                f"{op.name} has a segment count, but only two-shot fused regions have segments",
                at=op,
            )
    for region in regions:
        want = plan_segments(region)
        if _written(region):
            _check_written(region, want)
        else:
            block = region.body.block
            for op in want.order:  # the updates moved up; every other op keeps its place
                op.detach()
                block.insert_op_before(op, region.yield_op)
            for op, k in want.segment.items():
                op.attributes[SEGMENT_ATTR_NAME] = IntegerAttr(k, i64)
            region.attributes[SEGMENTS_ATTR_NAME] = IntegerAttr(want.count, i64)
        _mark_chains(region)


def _mark_chains(region: comm.FusedOp) -> None:
    """`comm.chain = j` on the ops of each segment holding several tensor chains (none where
    it holds one); where any is written, every op's must be the pass's ([segment])."""
    want: dict[Operation, int] = {}
    for piece in pieces(region):
        if isinstance(piece, tuple) and len(chains := tensor_chains(piece[0])) > 1:
            want |= {op: j for j, chain in enumerate(chains) for op in chain}
    body = _body(region)
    if not any(CHAIN_ATTR_NAME in op.attributes for op in body):
        for op, j in want.items():
            op.attributes[CHAIN_ATTR_NAME] = IntegerAttr(j, i64)
        return
    for op in body:
        if chain_of(op) != want.get(op):
            expected = want.get(op)
            wanted = "none (its segment holds one chain)" if expected is None else expected
            raise fail(
                "segment",
                f"{op_name(op)} has chain {chain_of(op)}, its segment's tensor chains give "
                f"it {wanted}",
                at=op,
            )


@dataclass(frozen=True)
class SegmentPass(ModulePass):
    """Cut each two-shot fused region into the kernels it runs as [segment, segment-op]:
    `comm.segment = k` on the ops of its k-th segment, updates moved up to where their value
    is computed, `comm.segments = N` on the region. Reads `coco-defer`'s marks."""

    name = "coco-segment"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for fn in op.ops:
            if isinstance(fn, func.FuncOp):
                choose_segments(fn)


# --------------------------------------------------------------------------------------------
# What the plan builder reads
# --------------------------------------------------------------------------------------------

Piece = tuple[list[Operation], list[coco.UpdateOp]] | Operation


def pieces(region: comm.FusedOp) -> list[Piece]:
    """What `region` runs, in order, as the pass wrote it: a segment as (its ops in program
    order, each finished reduction followed by the all_reduce finishing it; its updates),
    an op running on its own as itself. Rematerialized scalars are in none."""
    body = _body(region)
    scalars = _rematerialized_scalars(body)
    assert SEGMENTS_ATTR_NAME in region.attributes, "the region was not segmented (coco-segment)"
    out: list[Piece] = []
    ops: list[Operation] = []
    updates: list[coco.UpdateOp] = []
    current: int | None = None
    absorbed: set[Operation] = set()

    def flush() -> None:
        nonlocal ops, updates
        if ops or updates:
            out.append((ops, updates))
        ops, updates = [], []

    for op in body:
        if op in scalars or op in absorbed:
            continue
        k = segment_of(op)
        if k is None:
            flush()
            out.append(op)
            current = None
            continue
        if k != current:
            flush()
            current = k
        if isinstance(op, coco.UpdateOp):
            updates.append(op)
            continue
        ops.append(op)
        if isinstance(op, coco.ReduceOp):  # in a segment only with its finisher
            finisher = next((u.operation for u in op.result.uses), None)
            if isinstance(finisher, comm.AllReduceOp) and segment_of(finisher) == k:
                ops.append(finisher)
                absorbed.add(finisher)
    flush()
    return out
