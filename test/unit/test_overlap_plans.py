"""Every overlap schedule the enumerator lists, for every example, pipelines: its plan runs the
matmul and the collective chunk by chunk on two streams, interleaved (lowering/overlap.py).

Producer form (matmul -> collective): chunk k's matmul on the compute stream, then an event
recorded there, waited on the communication stream, and chunk k's collective steps issued on
the communication stream -- all before chunk k+1's matmul. Gather form (all_gather -> matmul):
chunk k+1's gather is issued on the communication stream before chunk k's matmul, which waits
on the compute stream for the event recorded after chunk k's gather. All_to_all forms
(`ol(mm,a2a)`, `ol(a2a,mm)`): the same order, per block of the chunked dim.

What each chunk's collective reads (or each matmul chunk needs) is computed here
independently of the lowering: a tensor of row numbers is cut into every rank's piece by the
sim's own `piece_of`, and the piece's rows in the step's range are the rows it touches. A
chunk must only touch rows that earlier matmul chunks (or gathers) produced, and the chunks
must cover the rows exactly once. A schedule that cannot pipeline is not listed (the pass
refuses it) or refuses to lower with `[overlap-chunks]`; it never runs unpipelined.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import example_params

import coconet
from coconet.core import values as V
from coconet.core.program import CocoError, Program, parse_module
from coconet.dialects import comm
from coconet.dialects.coco import TensorType
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import (
    COMM_STREAM,
    COMPUTE_STREAM,
    ArgTable,
    Collective,
    Launch,
    Matmul,
    PeerTable,
    Plan,
    RecordEvent,
    WaitEvent,
)
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_pipeline, apply_schedule, enumerate_scheduled_programs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.mlir"))
RANKS = (2, 4)


@functools.cache
def schedule_space(name: str) -> list[tuple[str, str, Program]]:
    return enumerate_scheduled_programs(coconet.load(EXAMPLES / f"{name}.mlir"))


def overlap_space(name: str) -> list[tuple[str, str, Program]]:
    return [
        (n, pipe, p)
        for n, pipe, p in schedule_space(name)
        if any(isinstance(op, comm.OverlapOp) for op in p.func.walk())
    ]


def fused_space(name: str) -> list[tuple[str, str, Program]]:
    """The listed schedules with a fused collective or fused send and no overlap region
    (overlaps: test_every_listed_overlap_schedule_pipelines)."""
    return [
        (n, pipe, p)
        for n, pipe, p in schedule_space(name)
        if any(
            isinstance(op, comm.FusedOp) and op.kind.data != comm.FusionKind.ELEMENTWISE
            for op in p.func.walk()
        )
        and not any(isinstance(op, comm.OverlapOp) for op in p.func.walk())
    ]


def row_ids(t: TensorType, grid: tuple[int, ...]) -> np.ndarray:
    """A logical value of type `t` (a leading dim per local axis) holding at every element the
    number of its row (flattened leading dims) in a rank's whole buffer."""
    shape = t.get_shape()
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    ids = np.broadcast_to(np.arange(rows).reshape(*shape[:-1], 1), shape)
    local = tuple(grid[a] for a in t.local_axes())
    return np.broadcast_to(ids, (*local, *shape))


def touched(ids_of: TensorType, piece: TensorType, grid, lo: int, hi: int) -> set[int]:
    """Rows of the whole buffer (of type `ids_of`) holding rows [lo, hi) of any rank's piece
    of type `piece`."""
    assert ids_of.get_shape() == piece.get_shape()
    ids = row_ids(piece, grid)
    out: set[int] = set()
    for r in range(int(np.prod(grid))):
        p = V.piece_of(ids, piece, V.coords_of(r, grid), grid)
        out |= set(np.asarray(p).reshape(-1, p.shape[-1])[lo:hi].ravel().tolist())
    return out


def rows_of(ranges) -> set[int]:
    return {i for lo, hi in ranges for i in range(lo, hi)}


def reads(step, name: str) -> bool:
    if isinstance(step, Collective):
        return step.src.name == name
    if isinstance(step, Launch):
        return any(
            getattr(a, "name", None) == name or (isinstance(a, PeerTable) and a.buffer.name == name)
            for a in step.args
        )
    return False


def consumer_rows(step, c_type: TensorType, grid) -> set[int]:
    """Rows of the matmul's result a chunked consumer step reads."""
    if isinstance(step, Collective):
        assert step.rows is not None, f"an unchunked collective in the pipeline: {step}"
        lo, hi = step.rows
        piece = step.dst.type if step.op == "reduce_scatter" else step.src.type
        return touched(c_type, piece, grid, lo, hi)
    assert isinstance(step, Launch), step
    assert step.range_positions, step
    b, e = step.range_positions
    row = step.iteration_shape[-1]
    lo, hi = step.args[b], step.args[e]
    assert lo % row == 0, f"a chunk that is not whole rows: {step}"
    assert hi % row == 0, f"a chunk that is not whole rows: {step}"
    return touched(c_type, step.iteration_type, grid, lo // row, hi // row)


def check_producer_form(plan: Plan) -> list[int]:
    """Checks every producer-form pipeline of `plan`; returns their chunk counts."""
    steps = plan.steps
    by_result: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        if isinstance(s, Matmul) and s.rows is not None and not _gathered(steps, s):
            by_result.setdefault(s.c.name, []).append(i)
    for c_name, idx in by_result.items():
        c_type = steps[idx[0]].c.type
        whole = int(np.prod(steps[idx[0]].c.shape[:-1]))
        done: set[int] = set()
        covered: list[set[int]] = []
        for k, i in enumerate(idx):
            mm = steps[i]
            assert mm.stream == COMPUTE_STREAM
            mine = rows_of(mm.rows)
            assert not mine & done, f"chunk {k} of %{c_name} recomputes rows"
            done |= mine
            rec = steps[i + 1]
            assert isinstance(rec, RecordEvent), rec
            assert rec.stream == COMPUTE_STREAM, rec
            end = idx[k + 1] if k + 1 < len(idx) else len(steps)
            window = steps[i + 2 : end]
            waits = [
                j
                for j, s in enumerate(window)
                if isinstance(s, WaitEvent) and s.event == rec.event and s.stream == COMM_STREAM
            ]
            assert waits, f"no wait on the communication stream for {rec.event}"
            consumers = [s for s in window[waits[0] + 1 :] if reads(s, c_name)]
            assert consumers, f"chunk {k} of %{c_name}: no collective before the next matmul"
            read: set[int] = set()
            for s in consumers:
                assert s.stream == COMM_STREAM, f"chunk {k}'s collective on stream {s.stream}"
                read |= consumer_rows(s, c_type, plan.grid_shape)
            assert read <= done, f"chunk {k} of %{c_name} reads rows not computed yet"
            covered.append(read)
        assert done == set(range(whole)), f"the matmul chunks of %{c_name} miss rows"
        assert set().union(*covered) == set(range(whole)), f"%{c_name}'s consumer misses rows"
    return [len(idx) for idx in by_result.values()]


def _gathered(steps, mm: Matmul) -> bool:
    return any(
        isinstance(s, Collective) and s.op == "all_gather" and s.rows and s.dst.name == mm.a.name
        for s in steps
    )


def _reads_gathered(m, g: str) -> bool:
    """A matmul chunk reading the gathered %g: as its rows (left) or its reduction dim."""
    return isinstance(m, Matmul) and (m.a.name == g or (m.b.name == g and m.k_rows is not None))


def check_gather_form(plan: Plan) -> list[int]:
    """Checks every gather-form pipeline of `plan` (the gathered value the left operand, or
    the right one: chunks of the reduction dim summed into the result); returns their chunk
    counts."""
    steps = plan.steps
    found = []
    # chunked all_gathers feeding a matmul (a pipeline boundary's gathers: check_boundary_form)
    names = {
        s.dst.name
        for s in steps
        if isinstance(s, Collective)
        and s.op == "all_gather"
        and s.rows
        and any(_reads_gathered(m, s.dst.name) for m in steps)
    }
    for g in sorted(names):
        gathers = [i for i, s in enumerate(steps) if isinstance(s, Collective) and s.dst.name == g]
        mms = [i for i, s in enumerate(steps) if _reads_gathered(s, g)]
        assert len(gathers) == len(mms), (len(gathers), len(mms))
        reduction = steps[mms[0]].b.name == g
        if reduction:  # the first chunk writes the sum, the others add; the last rounds it
            assert [steps[i].accumulate for i in mms] == [False] + [True] * (len(mms) - 1)
            accs = {steps[i].acc for i in mms}
            assert len(accs) == 1, accs
            if steps[mms[0]].acc is not None:
                assert [steps[i].final for i in mms] == [False] * (len(mms) - 1) + [True]
        chunks = len(mms)
        found.append(chunks)
        step = steps[gathers[0]]
        ids_type = step.dst.type
        have: set[int] = set()
        for k, (gi, mi) in enumerate(zip(gathers, mms)):
            gs, mm = steps[gi], steps[mi]
            assert gs.stream == COMM_STREAM
            assert mm.stream == COMPUTE_STREAM
            rec = steps[gi + 1]
            assert isinstance(rec, RecordEvent)
            assert rec.stream == COMM_STREAM
            wait = steps[mi - 1]
            assert isinstance(wait, WaitEvent)
            assert wait.event == rec.event
            assert wait.stream == COMPUTE_STREAM
            if k + 1 < chunks:
                assert gathers[k + 1] < mi, f"chunk {k + 1} is gathered after chunk {k}'s matmul"
            lo, hi = gs.rows
            have |= touched(ids_type, gs.src.type, plan.grid_shape, lo, hi)
            read = mm.k_rows if reduction else mm.rows
            assert rows_of(read) <= have, f"matmul chunk {k} reads rows not gathered yet"
        whole = int(np.prod(step.dst.shape[:-1]))
        read = [r for i in mms for r in (steps[i].k_rows if reduction else steps[i].rows)]
        assert have == set(range(whole)) == rows_of(read), f"the chunks of %{g} miss rows"
        assert sum(hi - lo for lo, hi in read) == whole, f"the chunks of %{g} share rows"
    return found


def check_fused_gather_form(plan: Plan) -> list[int]:
    """Checks every pipeline of a fused all_gather (ol(fuse(ag),mm)): chunk k's exchange
    kernel on the communication stream, then its event; chunk k+1's kernel issued before
    chunk k's matmul, which waits for chunk k's event; the matmuls' rows (or runs of the
    reduction dim) cover the gathered matrix once. Returns their chunk counts."""
    steps = plan.steps
    found = []
    kernels = [
        i
        for i, s in enumerate(steps)
        if isinstance(s, Launch) and s.kernel.startswith("k_fused_all_gather")
    ]
    by_buffer: dict[str, list[int]] = {}
    for i in kernels:
        for w in steps[i].writes:
            if any(isinstance(m, Matmul) and w in (m.a.name, m.b.name) for m in steps):
                by_buffer.setdefault(w, []).append(i)
    for g, launches in sorted(by_buffer.items()):
        if len(launches) == 1 and steps[launches[0]].stream != COMM_STREAM:
            continue  # fuse(ag) alone: one kernel, no pipeline
        mms = [
            i for i, s in enumerate(steps) if isinstance(s, Matmul) and g in (s.a.name, s.b.name)
        ]
        assert len(launches) == len(mms), (g, len(launches), len(mms))
        found.append(len(mms))
        read: list[tuple[int, int]] = []
        for k, (li, mi) in enumerate(zip(launches, mms)):
            assert steps[li].stream == COMM_STREAM
            rec, wait = steps[li + 1], steps[mi - 1]
            assert isinstance(rec, RecordEvent)
            assert isinstance(wait, WaitEvent)
            assert wait.event == rec.event, f"chunk {k}'s matmul waits for {wait.event}"
            if k + 1 < len(mms):
                assert launches[k + 1] < mi, f"chunk {k + 1} is gathered after chunk {k}'s matmul"
            mm = steps[mi]
            read += list(mm.k_rows if mm.k_rows is not None else mm.rows)
        whole = next(b for b in plan.buffers if b.name == g)
        assert sorted(read) == sorted(set(read)), f"the chunks of %{g} share rows"
        assert rows_of(read) == set(range(whole.shape[0])), f"the chunks of %{g} miss rows"
    return found


def check_exchange_form(plan: Plan) -> list[int]:
    """Checks every all_to_all-form pipeline of `plan` (`ol(mm,a2a)`, `ol(a2a,mm)`); returns
    their chunk counts. Chunk k is a block of one dim, the same for the exchange (on the
    communication stream) and the matmul (on the compute stream) and the blocks cover the dim
    in order; the second of each pair waits for the event recorded after the first; and the
    exchange of chunk k is issued before the matmul of chunk k+1 (`ol(mm,a2a)`), the exchange
    of chunk k+1 before the matmul of chunk k (`ol(a2a,mm)`)."""
    steps = plan.steps
    found = []
    exchanged = {
        s.dst.name: s
        for s in steps
        if isinstance(s, Collective) and s.op == "all_to_all" and s.block
    }
    for dst, a2a in sorted(exchanged.items()):
        xs = [i for i, s in enumerate(steps) if isinstance(s, Collective) and s.dst.name == dst]
        into = [  # the matmul reads what the exchange delivers, or writes what it sends
            i
            for i, s in enumerate(steps)
            if isinstance(s, Matmul)
            and s.block is not None
            and getattr(s, s.block_of).name in (dst, a2a.src.name)
        ]
        assert len(xs) == len(into), (len(xs), len(into))
        gathers = steps[into[0]].block_of == "a"
        firsts, seconds = (xs, into) if gathers else (into, xs)
        chunks = len(xs)
        found.append(chunks)
        d, lo, _ = steps[xs[0]].block
        assert lo == 0
        for k in range(chunks):
            x, mm = steps[xs[k]], steps[into[k]]
            assert x.stream == COMM_STREAM
            assert mm.stream == COMPUTE_STREAM
            assert x.block == mm.block, f"chunk {k}: {x.block} exchanged, {mm.block} multiplied"
            assert x.block[0] == d
            if k:
                assert x.block[1] == steps[xs[k - 1]].block[2], f"chunk {k} is not the next block"
            rec, wait = steps[firsts[k] + 1], steps[seconds[k] - 1]
            assert isinstance(rec, RecordEvent)
            assert isinstance(wait, WaitEvent)
            assert wait.event == rec.event, f"chunk {k}'s second step does not wait for its first"
            if k + 1 < chunks:
                if gathers:
                    assert xs[k + 1] < into[k], f"chunk {k + 1} exchanged after chunk {k}'s matmul"
                else:
                    assert xs[k] < into[k + 1], f"chunk {k} exchanged after chunk {k + 1}'s matmul"
        last = steps[xs[-1]]
        assert last.block[2] == last.src.shape[d], f"the chunks of %{dst} miss a block"
    return found


def launch_rows(step: Launch) -> tuple[int, int]:
    """The rows [lo, hi) of its iteration a chunked launch covers."""
    assert step.range_positions, f"an unchunked launch in the pipeline: {step}"
    b, e = step.range_positions
    row = step.iteration_shape[-1]
    lo, hi = step.args[b], step.args[e]
    assert lo % row == 0, f"a chunk that is not whole rows: {step}"
    assert hi % row == 0, f"a chunk that is not whole rows: {step}"
    return lo // row, hi // row


def _waits(steps, lo: int, hi: int, stream: int) -> list[str]:
    return [s.event for s in steps[lo:hi] if isinstance(s, WaitEvent) and s.stream == stream]


def check_boundary_form(plan: Plan) -> list[int]:
    """Checks every pipeline-boundary (RS/send/AG) pipeline of `plan`; returns their chunk
    counts. Issue order per chunk k: send k (the fused kernel on rows k of the slice, on the
    compute stream, waiting only for reduce_scatter k's event), reduce_scatter k+1 (on the
    communication stream, not waiting for send k: they run side by side), the next stage's
    all_gather of k (communication stream, waiting for send k's event), send k+1 (not waiting
    for the gather of k: side by side). Across nodes the kernel computes chunk k and a library
    send of its rows on the communication stream precedes the gather."""
    steps = plan.steps
    found = []
    gathered = sorted(
        {s.src.name for s in steps if isinstance(s, Collective) and s.op == "all_gather" and s.rows}
    )
    for g in gathered:

        def pushes(s, g=g) -> bool:
            if isinstance(s, Launch):
                return g in s.writes
            return isinstance(s, Collective) and s.op == "send" and s.dst.name == g

        ags = [
            i
            for i, s in enumerate(steps)
            if isinstance(s, Collective) and s.op == "all_gather" and s.src.name == g
        ]
        # (what writes g after its gathers -- FSDP's update of the gathered weight -- sends
        # nothing to them)
        push = [i for i, s in enumerate(steps) if pushes(s) and i < ags[-1]]
        if not push:
            continue  # an all_gather fed by no send: the gather form's (check_gather_form)
        computes = [i for i in push if isinstance(steps[i], Launch)]
        if not computes:  # across nodes: the computation kernel before the library send
            computes = [
                max(j for j in range(i) if isinstance(steps[j], Launch) and steps[j].stream == 0)
                for i in push
            ]
        first = steps[computes[0]]
        rss = [
            i
            for i, s in enumerate(steps)
            if isinstance(s, Collective)
            and s.op == "reduce_scatter"
            and s.rows
            and reads(first, s.dst.name)
        ]
        chunks = len(rss)
        found.append(chunks)
        assert len(push) == len(ags) == len(computes) == chunks, (rss, push, ags)
        covered: list[int] = []
        for k in range(chunks):
            rs, comp, sent, ag = steps[rss[k]], steps[computes[k]], steps[push[k]], steps[ags[k]]
            assert rs.stream == COMM_STREAM
            assert ag.stream == COMM_STREAM
            assert comp.stream == COMPUTE_STREAM, f"chunk {k}'s send kernel on {comp.stream}"
            scattered = steps[rss[k] + 1]
            assert isinstance(scattered, RecordEvent), scattered
            assert scattered.stream == COMM_STREAM
            before = _waits(steps, rss[k] + 2, computes[k], COMPUTE_STREAM)
            assert before, f"chunk {k}'s send does not wait for anything"
            assert before[-1] == scattered.event, "the send waits for another chunk"
            sent_event = next(
                s.event
                for s in steps[computes[k] + 1 :]
                if isinstance(s, RecordEvent) and s.stream == COMPUTE_STREAM
            )
            assert sent_event in _waits(steps, computes[k], ags[k], COMM_STREAM), (
                f"chunk {k}'s gather does not wait for its send"
            )
            if isinstance(sent, Collective):  # across nodes
                assert sent.rows == rs.rows
                assert sent.stream == COMM_STREAM
                assert computes[k] < push[k] < ags[k]
            if k + 1 < chunks:
                assert computes[k] < rss[k + 1] < ags[k] < computes[k + 1], (
                    f"chunk {k}: send, next reduce_scatter, gather, next send out of order"
                )
                assert sent_event not in _waits(steps, computes[k], rss[k + 1], COMM_STREAM), (
                    f"reduce_scatter {k + 1} waits for send {k}: they do not overlap"
                )
                gathered_waits = _waits(steps, ags[k], computes[k + 1], COMPUTE_STREAM)
                nxt = steps[rss[k + 1] + 1]
                assert gathered_waits == [nxt.event], (
                    f"send {k + 1} waits for {gathered_waits}: not beside gather {k}"
                )
            assert rs.rows == ag.rows == launch_rows(comp), (rs, comp, ag)
            covered += range(*rs.rows)
        rows = int(np.prod(steps[rss[0]].dst.shape[:-1]))
        assert sorted(covered) == list(range(rows)), f"the chunks of %{g} miss rows"
    return found


def overlap_chunks(p: Program) -> list[int]:
    return [op.chunks.value.data for op in p.func.walk() if isinstance(op, comm.OverlapOp)]


def boundary_chunks(p: Program) -> list[int]:
    """Chunk counts of the overlap regions that pipeline a fused send (RS/send/AG)."""
    return [
        op.chunks.value.data
        for op in p.func.walk()
        if isinstance(op, comm.OverlapOp)
        and any(
            isinstance(o, comm.FusedOp) and o.kind.data == comm.FusionKind.SEND
            for o in op.body.block.ops
        )
    ]


@pytest.mark.parametrize("name", example_params(NAMES))
def test_every_listed_overlap_schedule_pipelines(name: str) -> None:
    space = overlap_space(name)
    if name.startswith(("model_parallel", "pipeline", "sequence_parallel")):
        assert space, f"{name}: the enumerator lists no overlap schedule"
    for sched, pipeline, p in space:
        regions = overlap_chunks(p)
        lowered = 0
        for ranks in RANKS:
            try:
                plan = lower(p, ranks)
            except CocoError as e:
                assert "[empty-slice]" in str(e), f"{sched} at {ranks} ranks: {e}"
                continue
            lowered += 1
            found = (
                check_producer_form(plan)
                + check_gather_form(plan)
                + check_fused_gather_form(plan)
                + check_exchange_form(plan)
            )
            assert sorted(found) == sorted(regions), f"{sched} at {ranks} ranks: {found} chunks"
            boundary = boundary_chunks(p)
            assert check_boundary_form(plan) == boundary, f"{sched} at {ranks} ranks"
            if boundary and ranks == 4:  # stages on two nodes: a library send per chunk
                across = lower(p, ranks, None, (0, 0, 1, 1))
                assert any(isinstance(s, Collective) and s.op == "send" for s in across.steps)
                assert check_boundary_form(across) == boundary, f"{sched} across nodes"
                assert check_producer_form(across) == boundary
        assert lowered, f"{sched} lowers at none of {RANKS} ranks"


def test_named_overlap_schedules_pipeline_at_the_example_sizes() -> None:
    """The issue's case: ol(mm,fuse(rs-c-ag)) splits the MLP along dim 1 and still pipelines
    (each chunk a block of rows per member), as does the pipeline boundary's ol(mm,rs)."""
    for name, schedule in [
        ("model_parallel_mlp", "ol(mm,fuse(rs-c-ag))"),
        ("model_parallel_attention", "ol(mm,fuse(rs-c-ag))"),
        ("pipeline_boundary", "ol(mm,fuse(rs-c-ag))"),
        ("pipeline_boundary", "ol(mm,rs)+fuse(sliced-send)"),
        ("pipeline_boundary", "ol(mm,rs,fuse(sliced-send),ag)"),
    ]:
        p = apply_schedule(coconet.load(EXAMPLES / f"{name}.mlir"), schedule)
        for ranks in RANKS:
            plan = lower(p, ranks)
            assert check_producer_form(plan) == [4], f"{name} {schedule} at {ranks} ranks"
            assert sum(s.stream == COMM_STREAM for s in plan.steps) >= 4


def test_too_few_rows_per_rank_refuses_instead_of_running_unpipelined() -> None:
    # dim 1 (16) split over 16 ranks leaves 2 rows per rank's piece: 4 chunks cannot be cut
    p = apply_pipeline(
        coconet.load(EXAMPLES / "model_parallel_mlp.mlir"),
        "coco-split-allreduce{dim=1},coco-reorder,coco-fuse{mode=all_reduce},coco-overlap",
    )
    with pytest.raises(CocoError, match=r"\[overlap-chunks\] 4 chunks need at least 4 rows"):
        lower(p, 16)
    # the launch check the enumerator and the sim make says so before any lowering
    from coconet.schedule.enumerator import launch_refusal

    assert "[overlap-chunks]" in (launch_refusal(p, 16) or "")
    assert launch_refusal(p, 4) is None
    lower(p, 4)
    plan = lower(
        apply_pipeline(
            coconet.load(EXAMPLES / "model_parallel_mlp.mlir"),
            "coco-split-allreduce{dim=1},coco-reorder,coco-fuse{mode=all_reduce},coco-overlap{chunks=2}",
        ),
        16,
    )
    assert check_producer_form(plan) == [2]


REFUSED = """
func.func @refused(%x: !coco.tensor<8x16xf32, sliced<1>>, %w: !coco.tensor<16x16xf32, sliced<0>>,
                   %v: !coco.tensor<16x16xf32, sliced<1>>, %y: !coco.tensor<8x16xf32>,
                   %s: !coco.tensor<8x16xf32, sliced<0>>, %u: !coco.tensor<16x16xf32, sliced<0>>)
    -> (!coco.tensor<8x16xf32>, !coco.tensor<8x16xf32>, !coco.tensor<8x16xf32, sliced<1>>,
        !coco.tensor<8x16xf32, sliced<1>>, !coco.tensor<8x16xf32>)
    attributes {coco.grid = #coco.grid<[?]>} {
  %p = coco.matmul %x, %w : !coco.tensor<8x16xf32, sliced<1>>, !coco.tensor<16x16xf32, sliced<0>> -> !coco.tensor<8x16xf32, local>
  %bc = comm.reduce sum %p root 0 : !coco.tensor<8x16xf32, local> -> !coco.tensor<8x16xf32, local>
  %col = coco.matmul %y, %v : !coco.tensor<8x16xf32>, !coco.tensor<16x16xf32, sliced<1>> -> !coco.tensor<8x16xf32, sliced<1>>
  %colg = comm.all_gather %col : !coco.tensor<8x16xf32, sliced<1>> -> !coco.tensor<8x16xf32>
  %g = comm.all_gather %s : !coco.tensor<8x16xf32, sliced<0>> -> !coco.tensor<8x16xf32>
  %twice = coco.matmul %g, %v : !coco.tensor<8x16xf32>, !coco.tensor<16x16xf32, sliced<1>> -> !coco.tensor<8x16xf32, sliced<1>>
  %again = coco.add %g, %y : !coco.tensor<8x16xf32>
  %ar = comm.all_reduce sum %bc : !coco.tensor<8x16xf32, local> -> !coco.tensor<8x16xf32>
  %sum = coco.add %ar, %again : !coco.tensor<8x16xf32>
  func.return %sum, %colg, %twice, %twice, %again : !coco.tensor<8x16xf32>, !coco.tensor<8x16xf32>, !coco.tensor<8x16xf32, sliced<1>>, !coco.tensor<8x16xf32, sliced<1>>, !coco.tensor<8x16xf32>
}
"""


@pytest.mark.parametrize(
    ("target", "rule"),
    [
        ("p", "overlap-consumer"),  # a reduce to a root cannot run per chunk of rows
        ("col", "overlap-consumer"),  # gathering a column-parallel result: not by rows
        ("twice", "overlap-producer"),  # the gathered value is read by another op too
    ],
)
def test_pairs_that_cannot_pipeline_are_refused(target: str, rule: str) -> None:
    from coconet.core.program import parse_module
    from coconet.schedule import Schedule, ScheduleError

    s = Schedule(Program(parse_module(REFUSED)))
    with pytest.raises(ScheduleError) as info:
        s.overlap(target)
    assert info.value.rule == rule, str(info.value)
    assert f"[{rule}]" in str(info.value)
    assert "\n" not in str(info.value)


def test_the_pipeline_boundary_overlaps_reduce_scatter_send_and_all_gather() -> None:
    """The issue's acceptance: the pipeline boundary's CoCoNet schedule (ol_RS_fuse_P2P_C_AG)
    has the computation inside the send kernel and RS/send/AG overlapped chunk by chunk."""
    p = apply_schedule(coconet.load(EXAMPLES / "pipeline_boundary.mlir"), "ol_RS_fuse_P2P_C_AG")
    for ranks in RANKS:
        plan = lower(p, ranks)
        assert check_boundary_form(plan) == [4]
        assert check_producer_form(plan) == [4]
        sends = [s for s in plan.steps if isinstance(s, Launch) and "send" in s.kernel]
        assert len(sends) == 4  # one fused send kernel per chunk, no library send
        assert not any(isinstance(s, Collective) and s.op == "send" for s in plan.steps)
        text = plan.cuda_source
        body = text[text.index(f"COCO_KERNEL({sends[0].kernel},") :]
        body = body[: body.index("COCO_KERNEL_BODY_END")]
        assert "coco.dropout" in body
        assert "// comm.send into the receiver" in body


def test_a_boundary_overlap_without_a_fused_send_is_refused() -> None:
    from coconet.schedule import Schedule, ScheduleError

    s = Schedule(coconet.load(EXAMPLES / "pipeline_boundary.mlir")).named("sliced-send")
    with pytest.raises(ScheduleError) as info:
        s.overlap("layer", send=True)
    assert info.value.rule == "overlap-send", str(info.value)
    assert "\n" not in str(info.value)


def check_fused(p: Program, plan: Plan) -> None:
    """Within one node, every collective inside a fused all_reduce or fused send region runs
    inside a kernel: the plan's library collectives are exactly the program's collectives
    outside those regions, and kernels reach the peers instead."""
    regions = [
        op
        for op in p.func.walk()
        if isinstance(op, comm.FusedOp) and op.kind.data != comm.FusionKind.ELEMENTWISE
    ]
    inside = {id(o) for r in regions for o in r.walk() if isinstance(o, comm.CollectiveOp)}
    outside = [o for o in p.func.walk() if isinstance(o, comm.CollectiveOp) and id(o) not in inside]
    library = [s for s in plan.steps if isinstance(s, Collective)]
    assert sorted(s.op for s in library) == sorted(o.name.split(".")[1] for o in outside)
    # the regions' kernels reach their peers (several regions of one kernel may be one
    # table-form launch: scattered tensors)
    peers = [
        s
        for s in plan.steps
        if isinstance(s, Launch)
        and any(
            isinstance(a, PeerTable)
            or (isinstance(a, ArgTable) and any(isinstance(x, PeerTable) for x in a.items))
            for a in s.args
        )
    ]
    # (a collective over a group of one member -- a grid axis of size 1 -- is the identity:
    # its kernel has no peers to reach)
    lonely = all(
        math.prod(plan.grid_shape[a] for a in o.span()) == 1
        for r in regions
        for o in r.walk()
        if isinstance(o, comm.CollectiveOp) and not isinstance(o, comm.SendOp)
    )
    assert peers or lonely, "no kernel reaches its peers"


def _fused_cases(name: str, every: int) -> None:
    space = fused_space(name)
    if name.startswith(("adam", "lamb", "sgd", "model_parallel", "pipeline", "allreduce")):
        assert space, f"{name}: the enumerator lists no fused schedule"
    for sched, _pipeline, p in space[::every]:
        for ranks in RANKS if every == 1 else (4,):
            try:
                plan = lower(p, ranks)
            except CocoError as e:
                assert "[empty-slice]" in str(e), f"{sched} at {ranks} ranks: {e}"
                continue
            try:
                check_fused(p, plan)
            except AssertionError as e:
                raise AssertionError(f"{sched} at {ranks} ranks: {e}") from None


@pytest.mark.parametrize("name", example_params(NAMES))
def test_listed_fused_schedules_fuse(name: str) -> None:
    """The issue's "Done when" for fusion: a listed fused schedule runs its fused collectives
    and sends as kernels, never as library calls (a sample here, every one at 2 and 4 ranks
    under COCONET_FULL=1; the pipeline boundary's fused sends all)."""
    _fused_cases(name, 1 if name == "pipeline_boundary" else 5)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_listed_fused_schedule_fuses(name: str) -> None:
    _fused_cases(name, 1)


UNEVEN_COLUMNS = """
func.func @mlp(%x: !coco.tensor<4x8xf32, sliced<1>>, %wt: !coco.tensor<8x8xf32, sliced<0>>,
               %b: !coco.tensor<8xf32>, %w0: !coco.tensor<4x8xf32>)
    attributes {coco.grid = #coco.grid<[?]>} {
  %h = coco.matmul %x, %wt : !coco.tensor<4x8xf32, sliced<1>>, !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<4x8xf32, local>
  %s = comm.all_reduce sum %h : !coco.tensor<4x8xf32, local> -> !coco.tensor<4x8xf32>
  %y = coco.add %s, %b : !coco.tensor<4x8xf32>, !coco.tensor<8xf32> -> !coco.tensor<4x8xf32>
  coco.update %w0, %y : !coco.tensor<4x8xf32>
  func.return
}
"""


def test_an_overlapped_fused_kernel_over_uneven_columns_is_refused():
    """ol(mm,fuse(rs-c-ag)) splitting the columns (8 over 3 ranks: 3, 3, 2): a chunk of rows is
    another element range on the rank with 2 columns, and the fused kernel pulls a peer's
    chunk at its own range -- the random-program sweep (COCONET_FULL=1) found it overrunning
    the smaller piece's heap buffer and computing wrong values there. Refused with the
    rule; at 2 and 4 ranks (even pieces) it runs as the sim computes."""
    program = apply_schedule(Program(parse_module(UNEVEN_COLUMNS)), "ol(mm,fuse(rs-c-ag))")
    with pytest.raises(CocoError, match=r"\[overlap-layout\] .*differ in size on a grid of \[3\]"):
        lower(program, 3)
    for ranks in (2, 4):
        plan = lower(program, ranks)
        inputs = sim.prepare_inputs(program, None, plan.grid_shape, seed=ranks)
        want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
        got = ThreadedExecutor(plan).run(inputs)
        # (the matmul sums in another order than NumPy: f32 tolerance)
        np.testing.assert_allclose(got["w0"], want.outputs["w0"], rtol=2e-5, atol=2e-5)
