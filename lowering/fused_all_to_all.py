"""Lowering of `comm.fused all_to_all` and `comm.fused all_gather`: the elementwise producers
of the exchange's input, the exchange and the elementwise consumers of its result in ONE kernel
over symmetric memory (lowering/kernels/exchange.py). An all_gather is the exchange in which
every receiver's box of a sender is the sender's whole piece, staged once; an overlapped
fused all_gather launches the kernel per chunk of rows (`exchange_launcher`).

Each rank's kernel computes the producers on its input piece and writes the all_to_all's
input into its own symmetric staging buffer (the sender's side), meets its peers (the flag
protocol of the fused collectives: entry, then done once the chunks are staged), pulls from
every peer the box of that peer's piece this rank holds under the result's layout
(core/values.py `shared_region`: uneven cuts, any pair of dims, several grid axes; the
dispatch form's dim-0 blocks) and computes the consumers on each pulled element before
storing what the program reads later (the receiver's side). Neither side's values go
through memory between them, and no library call, packing or unpacking runs.

The staging buffer is the kernel's own: a peer may still pull from it after this rank's
kernel ended, so it must not be a buffer the program writes later (the input itself, an
argument an update overwrites). The next launch's entry flags wait for the peers' previous
pulls.

An update the receiver's side stores into an argument the sender's side reads would race
with the sender's other blocks (a block only waits for its peers' same-index blocks): it is
a copy after the kernel. Where the group spans nodes, the region lowers op by op (the
producers' kernel, the library all_to_all, the consumers' kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from xdsl.ir import Operation, SSAValue

from coconet.core import values as V
from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType, tensor_type_of
from coconet.lowering.kernels.exchange import FusedAllToAllKernel, recv_fields, send_fields
from coconet.lowering.kernels.spec import ElementwiseSpec, Store
from coconet.lowering.plan import (
    ArgTable,
    Buffer,
    Epoch,
    KernelArg,
    Launch,
    PeerTable,
    RankValue,
)
from coconet.lowering.plan_builder import PlanBuilder, flags_buffer, needed_after
from coconet.lowering.signature import ParamKind, range_positions

Box = tuple[slice, ...]


Exchange = comm.AllToAllOp | comm.AllGatherOp


def lower_fused_all_to_all(lw: PlanBuilder, region: comm.FusedOp) -> None:
    """A `comm.fused all_to_all` or `comm.fused all_gather` region: an all_gather is the
    exchange whose receiver's box of each sender is the sender's whole piece (every member
    gets all of it), which the sender stages once."""
    body = [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]
    exchanges = [o for o in body if isinstance(o, Exchange)]
    if len(exchanges) != 1 or not in_one_kernel(lw, exchanges[0], body):
        _lower_unfused(lw, region, body)
        return
    emit_exchange_kernel(lw, exchanges[0], body)
    for res, v in zip(region.res, region.yield_op.values):
        lw.buffers[res] = lw.value_buffer(v)


def in_one_kernel(lw: PlanBuilder, a2a: Exchange, body: list[Operation]) -> bool:
    """Whether the region runs as one kernel: its group within one node, its ops elementwise
    (the receiver's side reading of the sender's ops only constants, slices and scalars,
    none of them a dropout: those it computes again)."""
    if comm.topology_of(a2a) != comm.Topology.FLAT:  # decisions.py: its group spans nodes
        return False
    kernel_ops = coco.ElementwiseOp | coco.ConstantOp | coco.SliceOp
    if not all(isinstance(o, kernel_ops | coco.UpdateOp | Exchange) for o in body):
        return False
    before, after = _sides(a2a, body)
    again = [o for o in after if o in before]
    return all(
        not isinstance(o, coco.DropoutOp)
        and (isinstance(o, coco.ConstantOp | coco.SliceOp) or _scalar(o))
        for o in again
    )


def _scalar(op: Operation) -> bool:
    return all(tensor_type_of(r).get_shape() == () for r in op.results)


def _sides(a2a: Exchange, body: list[Operation]) -> tuple[list[Operation], list[Operation]]:
    """The ops of the sender's side and of the receiver's, in program order: the receiver
    computes the ops reading the exchange's result (transitively) and what they read of the
    other ops; the sender what the exchange, the updates and the rest of the program read
    of the other ops. An op both read (a constant, a slice) is computed on both sides."""
    compute = [o for o in body if not isinstance(o, coco.UpdateOp | Exchange)]
    reached: set[SSAValue] = {a2a.result}
    downstream: set[Operation] = set()
    for o in compute:
        if any(v in reached for v in o.operands):
            downstream.add(o)
            reached.update(o.results)
    rest = [o for o in compute if o not in downstream]
    inner = set(compute)
    roots = [o for o in rest if any(u.operation not in inner for r in o.results for u in r.uses)]
    return (
        [o for o in compute if o in _feeding(roots, rest)],
        [o for o in compute if o in downstream or o in _feeding(list(downstream), rest)],
    )


def _feeding(ops: list[Operation], among: list[Operation]) -> set[Operation]:
    """`ops` and the ops of `among` they read, transitively (`ops` that are not in `among`
    themselves excepted)."""
    pool = set(among)
    found = {o for o in ops if o in pool}
    work = [v for o in ops for v in o.operands]
    while work:
        owner = work.pop().owner
        if isinstance(owner, Operation) and owner in pool and owner not in found:
            found.add(owner)
            work.extend(owner.operands)
    return found


def _lower_unfused(lw: PlanBuilder, region: comm.FusedOp, body: list[Operation]) -> None:
    for op in body:
        lw.lower_op(op)
    for res, v in zip(region.res, region.yield_op.values):
        lw.buffers[res] = lw.value_buffer(v)


def _inputs(ops: Sequence[Operation], also: Sequence[SSAValue] = ()) -> list[SSAValue]:
    """The values `ops` read from outside them, in order of first use (and `also`)."""
    inside = {r for op in ops for r in op.results}
    out: list[SSAValue] = []
    for op in ops:
        for v in op.operands:
            if v not in inside and v not in out:
                out.append(v)
    for v in also:
        if v not in inside and v not in out:
            out.append(v)
    return out


def emit_exchange_kernel(lw: PlanBuilder, a2a: Exchange, body: list[Operation]) -> None:
    launch, later = exchange_launcher(lw, a2a, body)
    launch(None)
    for u in later:
        lw.lower_update(u)


Rows = tuple[int, int]


def exchange_launcher(
    lw: PlanBuilder, a2a: Exchange, body: list[Operation]
) -> tuple[Callable[[Rows | None], None], list[coco.UpdateOp]]:
    """The exchange kernel of `body` built, and a function emitting a launch of it: over
    the whole exchange (None), or over rows [lo, hi) (dim 0) of every sender's piece -- a
    chunk of an overlapped fused all_gather (lowering/overlap.py): the boxes cut to those
    rows, the same elements on both sides. With the updates the kernel does not store
    (copies after it)."""
    sent, received = a2a.input, a2a.result
    src: TensorType = sent.type
    dst: TensorType = received.type
    span = a2a.span()
    before, after = _sides(a2a, body)
    updates = [o for o in body if isinstance(o, coco.UpdateOp)]
    members = set(before) | set(after) | {a2a}
    send_inputs = _inputs(before, [sent])
    recv_inputs = [v for v in _inputs(after) if v is not received]

    # Updates each side stores itself: of a value it computes, into an argument of that
    # type the other side does not read.
    computed_before = {r for o in before for r in o.results}
    computed_after = {r for o in after for r in o.results} | {received}
    send_updates = [
        u
        for u in updates
        if u.value in computed_before
        and u.value.type == u.target.type
        and u.target not in recv_inputs
    ]
    recv_updates = [
        u
        for u in updates
        if u not in send_updates
        and u.value in computed_after
        and u.value.type == u.target.type
        and u.target not in send_inputs
    ]
    stored_updates = [*send_updates, *recv_updates]
    send_values: list[SSAValue] = [
        r for o in before for r in o.results if needed_after(r, members, stored_updates)
    ]
    recv_values: list[SSAValue] = [
        r
        for o in after
        for r in o.results
        if r not in computed_before and needed_after(r, members, stored_updates)
    ]
    if needed_after(received, members, stored_updates):
        recv_values.insert(0, received)

    def spec(
        side: str,
        ops: list[Operation],
        it: TensorType,
        inputs: list[SSAValue],
        values: list[SSAValue],
        ups: list[coco.UpdateOp],
    ) -> tuple[ElementwiseSpec, list[Buffer]]:
        stores = [Store(v, tensor_type_of(v)) for v in values]
        stores += [Store(u.value, u.target.type, u.target) for u in ups]
        buffers = [lw.buffer_for(v) for v in values] + [lw.value_buffer(u.target) for u in ups]
        return ElementwiseSpec(side, ops, it, inputs, stores), buffers

    send, send_buffers = spec("send", before, src, send_inputs, send_values, send_updates)
    recv, recv_buffers = spec("recv", after, dst, recv_inputs, recv_values, recv_updates)
    gather = isinstance(a2a, comm.AllGatherOp)
    kind = "all_gather" if gather else "all_to_all"
    kernel = FusedAllToAllKernel(lw.fresh(f"k_fused_{kind}"), send, recv, sent, received, a2a.name)
    built = kernel.build()
    name = lw.add_kernel(built)

    staging = lw.new_buffer(f"{sent.name_hint or 'sent'}_staged", src, symmetric=True)
    group = lw.group_size(span)
    flags = flags_buffer(lw, kernel.name, src, group)
    count = max(max(lw.piece_count(src, r), lw.piece_count(dst, r)) for r in range(lw.size))
    send_args = list(lw.kernel_args(kernel.send_params, src, send_buffers))
    recv_args = list(lw.kernel_args(kernel.recv_params, dst, recv_buffers))
    send_ids = {id(p) for p in kernel.send_params}
    recv_ids = {id(p) for p in kernel.recv_params}
    writes = [b.name for b in send_buffers + recv_buffers] + [staging.name]

    # a chunk's [begin, end): its part of the elements, which sizes a GPU's grid and tells
    # the traffic report and the cost model what the chunk moves
    piece_rows = max(lw.piece_shape(src, r)[0] if src.rank else 1 for r in range(lw.size))
    ranged = range_positions(built.params)

    def launch(rows: Rows | None) -> None:
        lw.emit(
            Launch(
                name,
                # One block: the host runs a rank's blocks one after another, and each block's
                # handshake with its peers' costs a scheduling delay where ranks share cores
                # (64 blocks at 4 ranks on 2 cores: 80 ms a step); a GPU grows the grid by the
                # kernel's [begin, end) (runtime/cuda.py grown_grid), to what it holds at once.
                1,
                lw.config.block,
                arguments(rows),
                writes=tuple(writes),
                iteration_shape=dst.local_shape(lw.grid_shape),
                iteration_type=dst,
                range_positions=None if rows is None else ranged,
            )
        )

    def arguments(rows: Rows | None) -> list[KernelArg]:
        sends, recvs = iter(send_args), iter(recv_args)
        args: list[KernelArg] = []
        for p in built.params:
            if id(p) in send_ids:
                args.append(next(sends))
            elif id(p) in recv_ids:
                args.append(next(recvs))
            else:
                args.append(exchange_arg(p.kind, rows))
        return args

    def exchange_arg(kind: ParamKind, rows: Rows | None) -> KernelArg:
        match kind:
            case ParamKind.PEERS_IN:
                return PeerTable(staging, span)
            case ParamKind.SEND_BOXES:
                return box_table(lw, src, dst, span, sending=True, gather=gather, rows=rows)
            case ParamKind.RECV_BOXES:
                return box_table(lw, src, dst, span, sending=False, gather=gather, rows=rows)
            case ParamKind.FLAGS:
                return PeerTable(flags, span)
            case ParamKind.EPOCH:
                return Epoch(flags.name)
            case ParamKind.ME:
                return RankValue("me", tuple(lw.group_index(r, span) for r in range(lw.size)))
            case ParamKind.NRANKS:
                return group
            case ParamKind.BEGIN:
                return 0
            case ParamKind.END:
                return count if rows is None else count * (rows[1] - rows[0]) // piece_rows
            case _:
                raise AssertionError(f"a fused {a2a.name} has no {kind} parameter")

    return launch, [u for u in updates if u not in stored_updates]


# --------------------------------------------------------------------------------------------
# The boxes
# --------------------------------------------------------------------------------------------


def exchange_box(
    lw: PlanBuilder,
    src: TensorType,
    dst: TensorType,
    span: tuple[int, ...],
    sender: int,
    receiver: int,
) -> tuple[Box, Box]:
    """What rank `sender` sends rank `receiver` (members of one group): the box of the
    sender's input piece and of the receiver's result piece that hold the same elements.
    Sliced form: where their pieces meet. Dispatch form (local tensors): block `receiver`
    of dim 0 of the sender's piece is block `sender` of the receiver's."""
    if set(span) <= set(src.local_axes()):
        n = lw.group_size(span)
        shape = lw.piece_shape(src, sender)
        blk = shape[0] // n
        i, j = lw.group_index(sender, span), lw.group_index(receiver, span)
        rest = tuple(slice(0, e) for e in shape[1:])
        return (slice(j * blk, (j + 1) * blk), *rest), (slice(i * blk, (i + 1) * blk), *rest)
    return V.shared_region(src, lw.coords[sender], dst, lw.coords[receiver], lw.grid_shape)


def _strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[d + 1 :]) for d in range(len(shape))]


def _place(box: Box, shape: Sequence[int]) -> list[int]:
    """A box's first element in a piece of `shape`, and the piece's strides (but the last)."""
    strides = _strides(shape)
    base = sum(s.start * st for s, st in zip(box, strides))
    return [base, *strides[:-1]]


def box_entry(
    lw: PlanBuilder,
    src: TensorType,
    dst: TensorType,
    span: tuple[int, ...],
    rank: int,
    member: int,
    sending: bool,
    gather: bool = False,
    rows: Rows | None = None,
) -> list[int]:
    """Rank `rank`'s table entry for group member `member` (kernels/exchange.py's layout).
    An all_gather's sender stages its piece once, as its own box (its receivers' boxes of
    it are the whole piece too: the same elements, cut into the same chunks); its boxes for
    the other members are empty."""
    sender, receiver = (rank, member) if sending else (member, rank)
    have, want = exchange_box(lw, src, dst, span, sender, receiver)
    if gather and sending and member != rank:
        have = tuple(slice(0, 0) for _ in have)
    if rows is not None:  # only rows [lo, hi) of the sender's piece: the box's part there
        lo = max(have[0].start, rows[0])
        hi = max(lo, min(have[0].stop, rows[1]))
        at = want[0].start + lo - have[0].start
        have = (slice(lo, hi), *have[1:])
        want = (slice(at, at + hi - lo), *want[1:])
    extents = [s.stop - s.start for s in have]
    count = math.prod(extents)
    inner = max(1, extents[-1]) if count else 1
    entry = [count, inner, *extents[1:-1]]
    entry += _place(have, lw.piece_shape(src, sender))
    if not sending:
        entry += _place(want, lw.piece_shape(dst, receiver))
    return entry


def box_table(
    lw: PlanBuilder,
    src: TensorType,
    dst: TensorType,
    span: tuple[int, ...],
    sending: bool,
    gather: bool = False,
    rows: Rows | None = None,
) -> ArgTable:
    """Every rank's box per member of its group, in group order, flattened (one table per
    field and member, shared by the sites of an all_to_all of the same types)."""
    fields = send_fields(src.rank) if sending else recv_fields(src.rank)
    group = lw.group_size(span)
    entries: dict[int, list[list[int]]] = {}

    def entry(r: int, m: int) -> list[int]:
        if r not in entries:
            members = V.group_of(lw.grid_shape, span, r)
            entries[r] = [
                box_entry(lw, src, dst, span, r, x, sending, gather, rows) for x in members
            ]
        return entries[r][m]

    label = "send_box" if sending else "recv_box"
    if rows is not None:
        label += f"_r{rows[0]}to{rows[1]}_"
    items: list[KernelArg] = []
    for m in range(group):
        for f in range(fields):
            items.append(
                lw.rank_table(
                    f"{label}{m}_{f}",
                    lambda r, m=m, f=f: entry(r, m)[f],
                    (src, dst, span, sending, gather, rows),
                )
            )
    return ArgTable(tuple(items))
