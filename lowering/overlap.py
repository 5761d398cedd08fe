"""Lowering of `comm.overlap chunks C`: a matmul and the collective next to it, pipelined over
C chunks of rows on two streams. Two forms (passes/overlap.py makes both):

* producer form (CoCoNet's overlap; Megatron's row-parallel GEMM followed by its all_reduce or
  reduce_scatter): the matmul runs chunk by chunk on the compute stream (cuBLAS on a GPU, BLAS
  on a CPU); after each chunk an event lets the communication stream run the consumer on that
  chunk (a library all_reduce or reduce_scatter of those rows, or the fused collective kernel
  on the matching range of its slice) while the next chunk multiplies. Consumer steps after
  the chunked ones (copies into updated arguments) run once every chunk is done.
* gather form (async tensor parallelism, PyTorch's micro-pipeline TP: an all_gather feeding a
  column-parallel GEMM): the communication stream gathers chunk by chunk; the compute stream
  multiplies chunk c as soon as its event fires, while chunk c+1 is being gathered.
* pipeline-boundary form (CoCoNet's overlap of reduce_scatter, send and all_gather): the
  producer form whose reduce_scatter's slice is sent by a fused send (computation + send) and
  all_gathered by the next stage. Software-pipelined by one chunk: with chunk c's matmul,
  chunk c-1's send (the fused kernel, on the compute stream, once c-1's reduce_scatter is
  done) and, on the communication stream, chunk c's reduce_scatter and chunk c-1's
  all_gather (once c-1 is sent) -- so chunk c-1 is sent while chunk c is reduce-scattered,
  and gathered while chunk c is sent. Across nodes the send is the computation kernel and a
  library send on the communication stream, chunked the same way.

* all_to_all forms (expert parallelism): chunk k is a block of one dim of the exchanged
  tensor that every rank holds whole; the producer form multiplies chunk k+1 while chunk k
  is exchanged, the other form multiplies chunk k while chunk k+1 is exchanged
  (`_lower_exchange_form`). These cut no rows of a piece: the rest of this note is the other
  forms'.

Rows. Each form chunks a *piece*: the part of a *whole* tensor that one rank's collective
handles (the reduce_scatter's or the fused kernel's slice, the all_gather's input), by its rows
(the flattened leading dims), into C runs of consecutive rows. The whole tensor (the matmul's
result, the gathered value) is never sliced, so the rows of it that hold each member's piece
follow from the layouts alone, whichever dim is sliced (`piece_rows`): dim 0 puts each
member's piece in one block of rows, an inner leading dim in one block per index of the dims
before it, the last dim in every row (a block of columns). The matmul of chunk c computes the
union over members of the rows holding chunk c of their pieces, merged into ranges; chunks
never share a row, so a chunk's collective never races the next chunk's matmul. When the
pieces have fewer rows than C, the lowering refuses ([overlap-chunks]) instead of running
unpipelined.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from coconet.core import values as V
from coconet.core.program import CocoError
from coconet.dialects import coco, comm
from coconet.dialects.coco import SlicedAttr, TensorType, tensor_type_of
from coconet.lowering.fused_all_to_all import exchange_launcher, in_one_kernel
from coconet.lowering.plan import (
    COMM_STREAM,
    COMPUTE_STREAM,
    Buffer,
    Collective,
    Launch,
    Matmul,
    PeerTable,
    RecordEvent,
    Step,
    WaitEvent,
)
from coconet.lowering.plan_builder import PlanBuilder

if TYPE_CHECKING:
    from xdsl.ir import Operation

Ranges = tuple[tuple[int, int], ...]


def _refuse(rule: str, message: str) -> CocoError:
    return CocoError(f"[{rule}] {message}")


# Rows of an overlapped value a plan indexes: 2 GiB of host memory for its row table.
MAX_INDEXED_ROWS = 1 << 28


def _rows(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def piece_rows(
    grid_shape: tuple[int, ...], whole: TensorType, piece: TensorType
) -> list[np.ndarray]:
    """For each distinct member piece of `piece` (a layout of the same logical tensor as
    `whole`): the rows of a rank's buffer of `whole` (flattened leading dims) that hold the
    piece's rows, in the piece's row order. `whole` must be sliced on no grid axis, so that
    buffer is the same part of the tensor on every rank."""
    if any(isinstance(lay, SlicedAttr) for lay in whole.layouts.data):
        raise _refuse(
            "overlap-layout",
            f"the overlapped value {whole} is sliced: "
            "overlap chunks a value every rank holds whole",
        )
    if piece.rank != whole.rank or whole.rank < 1:
        raise _refuse("overlap-layout", f"{piece} is not a piece of {whole}")
    local = whole.local_shape(grid_shape)
    if _rows(local) > MAX_INDEXED_ROWS:
        # The rows are indexed in host memory (8 bytes each) to find each member's piece.
        raise _refuse(
            "overlap-layout",
            f"the overlapped value {whole} has {_rows(local)} rows per rank: overlap chunks "
            f"at most {MAX_INDEXED_ROWS}",
        )
    index = np.arange(_rows(local), dtype=np.int64).reshape(local[:-1])
    found: dict[tuple[tuple[int, int], ...], np.ndarray] = {}
    size = int(np.prod(grid_shape, dtype=np.int64))
    for k in range(size):
        coords = V.coords_of(k, grid_shape)
        spans = tuple(V.piece_range(piece, d, coords, grid_shape) for d in range(piece.rank))
        if spans not in found:
            region = tuple(slice(s, s + n) for s, n in spans[:-1])
            found[spans] = index[region].reshape(-1)
    rows = list(found.values())
    if len({len(r) for r in rows}) != 1:
        raise _refuse("overlap-layout", f"the pieces of {piece} differ in size")
    return rows


def chunk_bounds(rows: int, chunks: int, what: str) -> list[tuple[int, int]]:
    """`chunks` runs of consecutive rows covering [0, rows), as even as they go."""
    if rows < chunks:
        raise _refuse(
            "overlap-chunks",
            f"{chunks} chunks need at least {chunks} rows in each rank's piece of {what}, "
            f"which has {rows} here: choose fewer chunks (or more rows per rank)",
        )
    return [(c * rows // chunks, (c + 1) * rows // chunks) for c in range(chunks)]


def merged_ranges(rows: np.ndarray) -> Ranges:
    """Sorted row numbers as [begin, end) ranges of consecutive rows."""
    rows = np.unique(rows)
    if rows.size == 0:
        return ()
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [rows.size]))
    return tuple((int(rows[s]), int(rows[e - 1]) + 1) for s, e in zip(starts, ends))


def _same_rows(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _chunk_rows(members: list[np.ndarray], lo: int, hi: int) -> Ranges:
    return merged_ranges(np.concatenate([m[lo:hi] for m in members]))


def lower_overlap(lw: PlanBuilder, region: comm.OverlapOp) -> None:
    body = [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]
    matmuls = [o for o in body if isinstance(o, coco.MatmulOp)]
    if not matmuls:  # emptied by dead-code elimination: nothing to pipeline
        for op in body:
            lw.lower_op(op)
    else:
        mm = matmuls[0]
        gather = next(
            (v.owner for v in (mm.lhs, mm.rhs) if isinstance(v.owner, comm.AllGatherOp)), None
        )
        fused = next((v.owner for v in (mm.lhs, mm.rhs) if comm.is_fused_all_gather(v.owner)), None)
        if region.all_to_all is not None:
            _lower_exchange_form(lw, region, region.all_to_all, mm, body)
        elif isinstance(gather, comm.AllGatherOp) and gather in body:
            _lower_gather_form(lw, region, gather, mm, body)
        elif isinstance(fused, comm.FusedOp) and fused in body:
            _lower_fused_gather_form(lw, region, fused, mm, body)
        elif any(isinstance(o, comm.FusedOp) and o.kind.data == comm.FusionKind.SEND for o in body):
            _lower_boundary_form(lw, region, mm, body)
        else:
            _lower_producer_form(lw, region, mm, body)
    for res, v in zip(region.res, region.yield_op.values):
        lw.buffers[res] = lw.value_buffer(v)


def _reads(step: Step, buf: Buffer) -> bool:
    if isinstance(step, Collective):
        return step.src is buf
    if isinstance(step, Launch):
        return any(a is buf or (isinstance(a, PeerTable) and a.buffer is buf) for a in step.args)
    return False


def _consumer_piece(step: Step, c_buf: Buffer) -> TensorType | None:
    """The piece type a consumer step of the matmul's result iterates over by rows, or None
    if it cannot run chunk by chunk."""
    if not _reads(step, c_buf):
        return None
    if isinstance(step, Collective) and step.rows is None:
        if step.op == "all_reduce":
            return step.src.type
        if step.op == "reduce_scatter":
            return step.dst.type
    if isinstance(step, Launch) and step.range_positions and step.iteration_type is not None:
        return step.iteration_type
    return None


def _lowered_aside(lw: PlanBuilder, ops: list[Operation]) -> list[Step]:
    """The plan steps of `ops`, lowered apart from the plan (to be replayed chunk by chunk)."""
    saved, lw.steps = lw.steps, []
    for op in ops:
        lw.lower_op(op)
    lowered, lw.steps = lw.steps, saved
    return lowered


def _lower_producer_form(
    lw: PlanBuilder, region: comm.OverlapOp, producer: coco.MatmulOp, body: list[Operation]
) -> None:
    chunks = region.chunks.value.data
    c_buf = lw.buffer_for(producer.result)
    a_buf, b_buf = lw.value_buffer(producer.lhs), lw.value_buffer(producer.rhs)

    # Lower the consumer once, then replay its steps chunk by chunk.
    consumer_steps = _lowered_aside(lw, [op for op in body if op is not producer])

    piece = _consumer_piece(consumer_steps[0], c_buf) if consumer_steps else None
    if piece is None:
        first = str(consumer_steps[0]) if consumer_steps else "nothing"
        raise _refuse(
            "overlap-consumer",
            f"the consumer of %{c_buf.name} lowers to `{first}`, which cannot run chunk by "
            "chunk: overlap needs an all_reduce, a reduce_scatter or one fused collective "
            "kernel reading the matmul's result",
        )
    members = piece_rows(lw.grid_shape, c_buf.type, piece)
    chunked: list[Step] = []
    for step in consumer_steps:
        p = _consumer_piece(step, c_buf)
        if p is None or not _same_rows(piece_rows(lw.grid_shape, c_buf.type, p), members):
            break
        chunked.append(step)
    rest = consumer_steps[len(chunked) :]
    bounds = chunk_bounds(len(members[0]), chunks, f"%{c_buf.name}'s consumer")
    for c, (lo, hi) in enumerate(bounds):
        lw.stream = COMPUTE_STREAM
        lw.emit(Matmul(a_buf, b_buf, c_buf, rows=_chunk_rows(members, lo, hi)))
        lw.emit(RecordEvent(f"{c_buf.name}_chunk{c}"))
        lw.stream = COMM_STREAM
        lw.emit(WaitEvent(f"{c_buf.name}_chunk{c}"))
        for step in chunked:
            lw.emit(_chunk_of(lw, step, lo, hi))
    lw.emit(RecordEvent(f"{c_buf.name}_done"))
    lw.stream = COMPUTE_STREAM
    lw.emit(WaitEvent(f"{c_buf.name}_done"))
    for step in rest:
        lw.emit(step)


def _lower_boundary_form(
    lw: PlanBuilder, region: comm.OverlapOp, producer: coco.MatmulOp, body: list[Operation]
) -> None:
    chunks = region.chunks.value.data
    c_buf = lw.buffer_for(producer.result)
    a_buf, b_buf = lw.value_buffer(producer.lhs), lw.value_buffer(producer.rhs)
    steps = _lowered_aside(lw, [op for op in body if op is not producer])

    # reduce_scatter of the matmul's result; the send (one kernel pushing into the receiver,
    # or across nodes a computation kernel and a library send); the next stage's all_gather
    # of what arrived; then copies into updated arguments (after every chunk).
    def refuse(why: str) -> CocoError:
        shown = "; ".join(str(s) for s in steps[:4])
        return _refuse(
            "overlap-send",
            f"the pipeline boundary of %{c_buf.name} lowers to `{shown}`: {why}",
        )

    scatter = steps[0] if steps else None
    if not (
        isinstance(scatter, Collective)
        and scatter.op == "reduce_scatter"
        and scatter.src is c_buf
        and scatter.rows is None
    ):
        raise refuse("it does not start with the reduce_scatter of the matmul's result")
    at = next(
        (i for i, s in enumerate(steps) if isinstance(s, Collective) and s.op == "all_gather"), 0
    )
    if at < 2:
        raise refuse("there is no send followed by an all_gather of what it received")
    sends, gather, rest = steps[1:at], steps[at], steps[at + 1 :]
    assert isinstance(gather, Collective)
    members = piece_rows(lw.grid_shape, c_buf.type, scatter.dst.type)

    def piece_of(step: Step) -> TensorType | None:
        if isinstance(step, Launch) and step.range_positions and step.iteration_type:
            return step.iteration_type
        if isinstance(step, Collective) and step.op == "send" and step.rows is None:
            return step.src.type
        return None

    for step in [*sends, gather]:
        piece = gather.src.type if step is gather else piece_of(step)
        if piece is None or not _same_rows(piece_rows(lw.grid_shape, c_buf.type, piece), members):
            raise refuse(f"`{step}` cannot run on the reduce_scatter's chunks of rows")
    bounds = chunk_bounds(len(members[0]), chunks, f"%{c_buf.name}'s reduce_scatter")
    scattered, pushed = scatter.dst.name, gather.src.name

    kernels = [s for s in sends if isinstance(s, Launch)]
    library = [s for s in sends if not isinstance(s, Launch)]

    def send_chunk(k: int) -> None:
        # compute stream: chunk k's computation (and, within a node, its push into the
        # receiver), once chunk k's reduce_scatter is done -- nothing later is waited for
        lo, hi = bounds[k]
        lw.stream = COMPUTE_STREAM
        lw.emit(WaitEvent(f"{scattered}_chunk{k}"))
        for step in kernels:
            lw.emit(_chunk_of(lw, step, lo, hi))
        lw.emit(RecordEvent(f"{pushed}_chunk{k}"))

    def gather_chunk(k: int) -> None:
        # communication stream: across nodes the library send of chunk k, then the next
        # stage's all_gather of what arrived
        lo, hi = bounds[k]
        lw.stream = COMM_STREAM
        lw.emit(WaitEvent(f"{pushed}_chunk{k}"))
        for step in library:
            lw.emit(_chunk_of(lw, step, lo, hi))
        lw.emit(_chunk_of(lw, gather, lo, hi))
        # An event after the gather keeps it issued before the next chunk's matmul: events
        # bound the launch batching's reordering (batching.py).
        lw.emit(RecordEvent(f"{pushed}_gathered{k}"))

    # Issue order per step c: matmul c; send c-1 (compute stream); reduce_scatter c and the
    # gather of c-1 (communication stream). On a GPU the send of c-1 runs beside the
    # reduce_scatter of c and the gather of c-1 beside the send of c (different streams, no
    # event between them); the send kernel of c-1 is issued before the reduce_scatter of c
    # writes the next rows of the slice it reads.
    for c in range(len(bounds) + 1):
        if c < len(bounds):
            lw.stream = COMPUTE_STREAM
            lw.emit(Matmul(a_buf, b_buf, c_buf, rows=_chunk_rows(members, *bounds[c])))
            lw.emit(RecordEvent(f"{c_buf.name}_chunk{c}"))
        if c >= 1:
            send_chunk(c - 1)
        if c < len(bounds):
            lw.stream = COMM_STREAM
            lw.emit(WaitEvent(f"{c_buf.name}_chunk{c}"))
            lw.emit(_chunk_of(lw, scatter, *bounds[c]))
            lw.emit(RecordEvent(f"{scattered}_chunk{c}"))
        if c >= 1:
            gather_chunk(c - 1)
    lw.stream = COMM_STREAM
    lw.emit(RecordEvent(f"{c_buf.name}_done"))
    lw.stream = COMPUTE_STREAM
    lw.emit(WaitEvent(f"{c_buf.name}_done"))
    for step in rest:
        lw.emit(step)


def _lower_gather_form(
    lw: PlanBuilder,
    region: comm.OverlapOp,
    gather: comm.AllGatherOp,
    mm: coco.MatmulOp,
    body: list[Operation],
) -> None:
    chunks = region.chunks.value.data
    for op in body:
        if op is not gather and op is not mm:
            raise _refuse(
                "overlap-producer",
                f"an overlap of an all_gather with a matmul holds only those two, not {op.name}",
            )
    gather_steps = _lowered_aside(lw, [gather])
    if len(gather_steps) != 1 or not isinstance(gather_steps[0], Collective):
        raise _refuse("overlap-producer", "the all_gather does not lower to one collective")
    step = gather_steps[0]
    whole = step.dst
    members = piece_rows(lw.grid_shape, whole.type, step.src.type)
    bounds = chunk_bounds(len(members[0]), chunks, f"%{step.src.name}")
    multiply = _gathered_chunks(lw, mm, whole, mm.lhs is gather.result, len(bounds))
    _pipeline_gathers(
        lw,
        whole,
        members,
        bounds,
        lambda rows: lw.emit(dataclasses.replace(step, rows=rows)),
        multiply,
    )


def _pipeline_gathers(
    lw: PlanBuilder,
    whole: Buffer,
    members: list[np.ndarray],
    bounds: list[tuple[int, int]],
    gather: Callable[[tuple[int, int]], None],
    multiply: Callable[[int, Ranges], Matmul],
) -> None:
    """The gather forms' pipeline: chunk c+1 gathered (`gather` of its rows of every piece,
    on the communication stream, then its event) before chunk c multiplies (the compute
    stream waiting for chunk c's event)."""

    def gather_chunk(c: int) -> None:
        lw.stream = COMM_STREAM
        gather(bounds[c])
        lw.emit(RecordEvent(f"{whole.name}_chunk{c}"))

    gather_chunk(0)
    for c, (lo, hi) in enumerate(bounds):
        if c + 1 < len(bounds):
            gather_chunk(c + 1)  # in flight while chunk c multiplies
        lw.stream = COMPUTE_STREAM
        lw.emit(WaitEvent(f"{whole.name}_chunk{c}"))
        lw.emit(multiply(c, _chunk_rows(members, lo, hi)))


def _lower_fused_gather_form(
    lw: PlanBuilder,
    region: comm.OverlapOp,
    fused: comm.FusedOp,
    mm: coco.MatmulOp,
    body: list[Operation],
) -> None:
    """The gather form whose gather is a fused all_gather (fuse(ag): the cast of the master
    shard in the exchange kernel): chunk c is the exchange kernel on rows [lo, hi) of every
    member's piece of a matrix (its boxes cut to them; dim 0 of the piece is its rows), on
    the communication stream, while the compute stream multiplies chunk c-1."""
    chunks = region.chunks.value.data
    for op in body:
        if op is not fused and op is not mm:
            raise _refuse(
                "overlap-producer",
                f"an overlap of a fused all_gather with a matmul holds only those two, not "
                f"{op.name}",
            )
    inner = [o for o in fused.body.block.ops if not isinstance(o, comm.YieldOp)]
    (gather,) = [o for o in inner if isinstance(o, comm.AllGatherOp)]
    whole_t, piece_t = tensor_type_of(gather.result), tensor_type_of(gather.input)
    if whole_t.rank != 2 or not in_one_kernel(lw, gather, inner):
        raise _refuse(
            "overlap-producer",
            f"the fused all_gather of {whole_t} does not run as one kernel of a matrix's rows "
            "here (its group spans nodes, or the value is not a matrix): it cannot be chunked",
        )
    launch, later = exchange_launcher(lw, gather, inner)
    if later:
        raise _refuse(
            "overlap-producer",
            "the fused all_gather stores an update after its kernel: it cannot be chunked",
        )
    for res, v in zip(fused.res, fused.yield_op.values):
        lw.buffers[res] = lw.value_buffer(v)
    # what the matmul reads: the gathered value, or what the kernel computes from it (a
    # dequantized weight: the same rows, in the result's space)
    left = mm.lhs in fused.res
    whole = lw.value_buffer(mm.lhs if left else mm.rhs)
    members = piece_rows(lw.grid_shape, whole_t, piece_t)
    bounds = chunk_bounds(len(members[0]), chunks, f"%{gather.input.name_hint or 'piece'}")
    multiply = _gathered_chunks(lw, mm, whole, left, len(bounds))
    _pipeline_gathers(lw, whole, members, bounds, launch, multiply)


def _gathered_chunks(
    lw: PlanBuilder, mm: coco.MatmulOp, whole: Buffer, left: bool, chunks: int
) -> Callable[[int, Ranges], Matmul]:
    """The matmul's chunk k over the rows of the gathered `whole` it reads: as its left
    operand, those rows of it and of the result; as its right one, a run of the reduction
    dim (`_reduction_chunks`)."""
    c = lw.buffer_for(mm.result)
    if left:
        b = lw.value_buffer(mm.rhs)
        return lambda _k, rows: Matmul(whole, b, c, rows=rows)
    return _reduction_chunks(lw, lw.value_buffer(mm.lhs), whole, c, chunks)


def _reduction_chunks(
    lw: PlanBuilder, a: Buffer, b: Buffer, c: Buffer, chunks: int
) -> Callable[[int, Ranges], Matmul]:
    """The gathered right operand's chunks (FSDP's parameter all_gather): rows of b, one
    matrix, are a run of the reduction dim; each chunk multiplies them by the same columns
    of a and sums into c -- in an accumulator of c's compute type where c is narrower, which
    the last chunk rounds into c, once."""
    if b.type.rank != 2:
        raise _refuse(
            "overlap-rows",
            f"the gathered right operand %{b.name} ({b.type}) is not one matrix: a chunk of "
            "its rows must be a run of the reduction dim",
        )
    compute = V.compute_dtype(c.type)
    acc = None
    if compute.kind == "f" and compute != V.numpy_dtype(c.type):
        elt = {4: "f32", 8: "f64"}[compute.itemsize]
        acc = lw.new_buffer(f"{c.name}_acc", c.type, kind="scratch", elt=elt)
    return lambda k, rows: Matmul(
        a, b, c, k_rows=rows, accumulate=k > 0, acc=acc, final=k == chunks - 1
    )


def _lower_exchange_form(
    lw: PlanBuilder,
    region: comm.OverlapOp,
    a2a: comm.AllToAllOp,
    mm: coco.MatmulOp,
    body: list[Operation],
) -> None:
    """The all_to_all forms: chunk k is the sub-block [b_k, e_k) of dim `region.dim` of the
    exchanged tensor, a dim the all_to_all neither splits nor gathers and every rank holds
    whole, so each chunk is the all_to_all of that block (a Collective with `block`: its
    strided boxes packed and unpacked) and the matmul of the same rows (a Matmul with
    `block`, found on each rank's own piece, uneven cuts of other dims included). A reshape
    between the pair keeps the last dim, so it moves no row: the matmul reads (writes) the
    exchanged buffer directly and the reshape runs nowhere."""
    chunks = region.chunks.value.data
    if region.dim is None:
        raise _refuse("overlap-dim", "an overlap of an all_to_all names the dim it chunks")
    dim = region.dim.value.data
    producer = a2a.input.owner is mm or any(
        isinstance(o, coco.ReshapeOp) and o.input is mm.result for o in body
    )
    if producer:
        lw.buffer_for(a2a.input)  # what the chunks of the matmul write
    exchanged = _lowered_aside(lw, [a2a])
    step = exchanged[0] if len(exchanged) == 1 else None
    if not isinstance(step, Collective) or step.op != "all_to_all":
        shown = "; ".join(str(s) for s in exchanged[:3])
        raise _refuse(
            "overlap-producer", f"the all_to_all lowers to `{shown}`, not one library all_to_all"
        )
    b_buf = lw.value_buffer(mm.rhs)
    if producer:
        a_buf, c_buf, cut = lw.value_buffer(mm.lhs), step.src, "c"
    else:
        a_buf, c_buf, cut = step.dst, lw.buffer_for(mm.result), "a"
    for r in range(lw.size):
        a_rows, c_rows = (_rows(x.shape_at(r)) for x in (a_buf, c_buf))
        if a_rows != c_rows:
            raise _refuse(
                "overlap-rows",
                f"rank {r}'s piece of %{a_buf.name} has {a_rows} rows and its piece of "
                f"%{c_buf.name} {c_rows}: a chunk of the matmul's rows must be the same rows "
                "of both",
            )
    bounds = chunk_bounds(step.src.shape[dim], chunks, f"dim {dim} of %{step.src.name}")
    event = (step.src if producer else step.dst).name

    def exchange(c: int) -> None:
        lw.stream = COMM_STREAM
        lw.emit(dataclasses.replace(step, block=(dim, *bounds[c])))

    def multiply(c: int) -> None:
        lw.stream = COMPUTE_STREAM
        lw.emit(Matmul(a_buf, b_buf, c_buf, block=(dim, *bounds[c]), block_of=cut))

    if producer:  # chunk c is exchanged while chunk c+1 multiplies
        for c in range(len(bounds)):
            multiply(c)
            lw.emit(RecordEvent(f"{event}_chunk{c}"))
            lw.stream = COMM_STREAM
            lw.emit(WaitEvent(f"{event}_chunk{c}"))
            exchange(c)
        lw.emit(RecordEvent(f"{event}_done"))
        lw.stream = COMPUTE_STREAM
        lw.emit(WaitEvent(f"{event}_done"))
        return
    # chunk c multiplies while chunk c+1 is exchanged
    for c in range(len(bounds) + 1):
        if c < len(bounds):
            exchange(c)
            lw.emit(RecordEvent(f"{event}_chunk{c}"))
        if c >= 1:
            lw.stream = COMPUTE_STREAM
            lw.emit(WaitEvent(f"{event}_chunk{c - 1}"))
            multiply(c - 1)


def _chunk_of(lw: PlanBuilder, step: Step, lo: int, hi: int) -> Step:
    if isinstance(step, Collective):
        return dataclasses.replace(step, rows=(lo, hi))
    assert isinstance(step, Launch)
    assert step.iteration_shape
    assert step.range_positions
    if step.iteration_type is not None:
        shapes = {lw.piece_shape(step.iteration_type, r) for r in range(lw.size)}
        if len(shapes) > 1:
            # Rows [lo, hi) are other element ranges on ranks whose pieces differ, and a fused
            # kernel pulls a peer's chunk at this rank's range: the largest piece's would run
            # past a smaller one.
            raise _refuse(
                "overlap-layout",
                f"`{step.kernel}` iterates over pieces of {step.iteration_type} that differ "
                f"between ranks on {lw.size} ranks ({', '.join(map(str, sorted(shapes)))}): "
                "its chunks need even pieces",
            )
    row_len = step.iteration_shape[-1]
    args = list(step.args)
    b, e = step.range_positions
    args[b], args[e] = lo * row_len, hi * row_len
    return dataclasses.replace(step, args=args)
