"""Lowering of `comm.overlap chunks C`: a matmul producer and the collective (or fused
collective) consuming it, pipelined over C chunks of rows.

The matmul runs chunk by chunk on the compute stream (cuBLAS on a GPU, BLAS on a CPU); after
each chunk an event lets the communication stream run the consumer on that chunk (a library
all_reduce of those rows, or the fused collective kernel on the matching range of its slice)
while the next chunk multiplies. Steps of the consumer that cannot run per chunk (copies into
updated arguments, collectives whose rows do not line up) run once every chunk is done.

Row correspondence: a consumer iterating over the matmul's own rows takes chunk c as rows
[c M/C, (c+1) M/C). A fused all_reduce whose reduce_scatter slices dim 0 iterates over M/g rows
(g ranks in the group): its chunk c needs rows k M/g + [c M/(gC), (c+1) M/(gC)) of every
member k, so that chunk's matmul computes those g row blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coconet.dialects import coco, comm
from coconet.lowering.plan import (
    COMM_STREAM,
    COMPUTE_STREAM,
    Collective,
    Launch,
    Matmul,
    RecordEvent,
    Step,
    WaitEvent,
)

if TYPE_CHECKING:
    from coconet.lowering.lower_to_plan import Lowering


def _rows(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def lower_overlap(lw: Lowering, region: comm.OverlapOp) -> None:
    body = [o for o in region.body.block.ops if not isinstance(o, comm.YieldOp)]
    producers = [o for o in body if isinstance(o, coco.MatmulOp)]
    if not producers:  # emptied by dead-code elimination: nothing to pipeline
        for op in body:
            lw.lower_op(op)
        for res, v in zip(region.res, region.yield_op.values):
            lw.buffers[res] = lw.value_buffer(v)
        return
    producer = producers[0]
    chunks = region.chunks.value.data
    c_buf = lw.buffer_for(producer.result)
    a_buf, b_buf = lw.value_buffer(producer.lhs), lw.value_buffer(producer.rhs)
    m = _rows(c_buf.shape)

    # Lower the consumer once, then replay its steps chunk by chunk.
    saved, lw.steps = lw.steps, []
    for op in body:
        if op is not producer:
            lw.lower_op(op)
    consumer_steps, lw.steps = lw.steps, saved
    for res, v in zip(region.res, region.yield_op.values):
        lw.buffers[res] = lw.value_buffer(v)

    chunked: list[tuple[Step, int]] = []  # (step, rows it iterates over)
    for step in consumer_steps:
        per_chunk_rows = _chunkable_rows(step, m, chunks)
        if per_chunk_rows is None:
            break
        chunked.append((step, per_chunk_rows))
    rest = consumer_steps[len(chunked) :]
    groups = {m // rows for _, rows in chunked}
    if len(groups) > 1 or not chunked:
        # Nothing lines up with the matmul's rows: run unpipelined (same meaning).
        lw.emit(Matmul(a_buf, b_buf, c_buf))
        for step in consumer_steps:
            lw.emit(step)
        return
    g = groups.pop()
    mi = m // g
    for c in range(chunks):
        lo, hi = c * mi // chunks, (c + 1) * mi // chunks
        lw.stream = COMPUTE_STREAM
        lw.emit(
            Matmul(a_buf, b_buf, c_buf, rows=tuple((k * mi + lo, k * mi + hi) for k in range(g)))
        )
        lw.emit(RecordEvent(f"{c_buf.name}_chunk{c}"))
        lw.stream = COMM_STREAM
        lw.emit(WaitEvent(f"{c_buf.name}_chunk{c}"))
        for step, rows in chunked:
            lw.emit(_chunk_of(step, rows, lo, hi))
    lw.emit(RecordEvent(f"{c_buf.name}_done"))
    lw.stream = COMPUTE_STREAM
    lw.emit(WaitEvent(f"{c_buf.name}_done"))
    for step in rest:
        lw.emit(step)


def _chunkable_rows(step: Step, m: int, chunks: int) -> int | None:
    """The number of rows `step` iterates over if it can run per chunk, else None."""
    if isinstance(step, Collective) and step.op == "all_reduce" and step.rows is None:
        rows = _rows(step.src.shape)
        return rows if rows == m and rows % chunks == 0 else None
    if isinstance(step, Launch) and step.range_positions and step.iteration_shape:
        rows = _rows(step.iteration_shape)
        t = step.iteration_type
        leading_cut = {d for d in range(t.rank - 1) if t.slicing_axes(d)} if t else set()
        # Fewer rows than the matmul: only slices of dim 0 keep each member's rows one block.
        if rows != m and leading_cut != {0}:
            return None
        if rows and m % rows == 0 and rows % chunks == 0:
            return rows
    return None


def _chunk_of(step: Step, rows: int, lo: int, hi: int) -> Step:
    import dataclasses

    if isinstance(step, Collective):
        return dataclasses.replace(step, rows=(lo, hi))
    assert isinstance(step, Launch) and step.iteration_shape and step.range_positions
    row_len = step.iteration_shape[-1]
    args = list(step.args)
    b, e = step.range_positions
    args[b], args[e] = lo * row_len, hi * row_len
    return dataclasses.replace(step, args=args)
