"""Lowering of `comm.fused send`: computation fused into the pipeline send (CoCoNet's fused
P2P).

The region computes a value on this rank's slice and sends it `shift` steps along a grid axis
(the same rank of the next pipeline stage). Where every sender and its receiver share a node,
ONE kernel computes each element and stores it straight into the receiver's receive buffer
(symmetric memory: CUDA IPC over NVLink / a shared-memory window): the sent value never goes
through the sender's memory nor a library call. The ranks of the send's axis synchronize with
the flag protocol of coco_device.h (entry: the receiver no longer reads its buffer's previous
content; done: the elements have landed), block b with block b. A rank nobody sends to
receives zeros (the sim's semantics), written by its own kernel.

Where a sender and its receiver are on different nodes, the send is a library send (NCCL /
MPI) of what the computation kernel stored: the region lowers as a fused collective region
does (fused_collective.py), and the plan says so by its `send` step.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from coconet.core import values as V
from coconet.dialects import coco, comm
from coconet.dialects.coco import tensor_type_of
from coconet.lowering.fused_collective import lower_fused_collective
from coconet.lowering.kernels.elementwise import ElementwiseKernel
from coconet.lowering.kernels.spec import Store
from coconet.lowering.plan import (
    PLAN_COLLECTIVE_BLOCKS,
    Epoch,
    KernelArg,
    Launch,
    PeerTable,
    RankValue,
)
from coconet.lowering.plan_builder import PlanBuilder, flags_buffer
from coconet.lowering.segments import send_kernel_of
from coconet.lowering.signature import ParamKind, range_positions


def _partner(lw: PlanBuilder, rank: int, along: int, shift: int) -> int | None:
    """The rank `shift` steps from `rank` along grid axis `along`, if any."""
    return V.send_partner(lw.coords[rank], lw.grid_shape, along, shift)


def lower_fused_send(lw: PlanBuilder, region: comm.FusedOp) -> None:
    # One send of a value computed elementwise in the region, received only by the region's
    # result (or updates), its sender and receiver on one node (decisions.py): one kernel.
    # Anything else lowers as a fused collective region (across nodes: the computation
    # kernel, then a library send).
    send = send_kernel_of(region)
    if send is None or comm.topology_of(send) != comm.Topology.FLAT:
        lower_fused_collective(lw, region)
        return
    body = [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]
    updates = [o for o in body if isinstance(o, coco.UpdateOp)]
    compute = [o for o in body if not isinstance(o, comm.SendOp | coco.UpdateOp)]
    emit_send_kernel(lw, compute, send, updates)
    for res, v in zip(region.res, region.yield_op.values):
        lw.buffers[res] = lw.value_buffer(v)


def emit_send_kernel(
    lw: PlanBuilder, compute: list[Operation], send: comm.SendOp, updates: list[coco.UpdateOp]
) -> None:
    along, shift = send.along.value.data, send.shift.value.data
    span = (along,)
    sent, received = send.input, send.result
    inside = {r for op in compute for r in op.results}
    inputs: list[SSAValue] = []
    for op in compute:
        for v in op.operands:
            if v not in inside and v not in inputs:
                inputs.append(v)
    if sent not in inside and sent not in inputs:
        inputs.append(sent)
    members = set(compute)
    stores = [
        r
        for op in compute
        for r in op.results
        if any(
            u.operation not in members and not isinstance(u.operation, coco.UpdateOp | comm.SendOp)
            for u in r.uses
        )
    ]
    direct = [u for u in updates if u.value in inside and u.value.type == u.target.type]
    store_specs = [Store(v, tensor_type_of(v)) for v in stores]
    store_specs += [Store(u.value, u.target.type, u.target) for u in direct]
    store_buffers = [lw.buffer_for(v) for v in stores] + [lw.value_buffer(u.target) for u in direct]
    iteration = received.type
    kernel = ElementwiseKernel(lw.fresh("k_fused_send"), compute, iteration, inputs, store_specs)
    kernel.sends.append((sent, received))
    built = kernel.build()
    name = lw.add_kernel(built)

    receive = lw.new_buffer(received.name_hint or "received", received.type, symmetric=True)
    lw.buffers[received] = receive
    group = lw.grid_shape[along]
    flags = flags_buffer(lw, kernel.name, iteration, group)
    me = tuple(lw.coords[r][along] for r in range(lw.size))

    def to(r: int) -> int:
        partner = _partner(lw, r, along, shift)
        return -1 if partner is None else lw.coords[partner][along]

    def receives(r: int) -> int:
        return int(_partner(lw, r, along, -shift) is not None)

    special = {
        ParamKind.SEND_PEERS,
        ParamKind.SEND_TO,
        ParamKind.RECEIVES,
        ParamKind.FLAGS,
        ParamKind.EPOCH,
        ParamKind.ME,
        ParamKind.NRANKS,
    }
    generic = iter(
        lw.kernel_args([p for p in built.params if p.kind not in special], iteration, store_buffers)
    )
    args: list[KernelArg] = []
    for p in built.params:
        match p.kind:
            case ParamKind.SEND_PEERS:
                args.append(PeerTable(receive, span))
            case ParamKind.SEND_TO:
                args.append(lw.rank_table("send_to", to))
            case ParamKind.RECEIVES:
                args.append(lw.rank_table("receives", receives))
            case ParamKind.FLAGS:
                args.append(PeerTable(flags, span))
            case ParamKind.EPOCH:
                args.append(Epoch(flags.name))
            case ParamKind.ME:
                args.append(RankValue("me", me))
            case ParamKind.NRANKS:
                args.append(group)
            case _:
                args.append(next(generic))

    count = 1
    for d in iteration.local_shape(lw.grid_shape):
        count *= d
    lw.emit(
        Launch(
            name,
            min(lw.config.grid_for(count), PLAN_COLLECTIVE_BLOCKS),
            lw.config.block,
            args,
            writes=tuple(b.name for b in store_buffers) + (receive.name,),
            range_positions=range_positions(built.params),
            iteration_shape=iteration.local_shape(lw.grid_shape),
            iteration_type=iteration,
        )
    )
    for u in updates:
        if u not in direct:
            lw.lower_update(u)
