"""The recipes of the named schedules (CoCoNet's variants): each a sequence of schedule steps,
that is of passes, chosen from the program's structure; a step the program refuses is undone
where the recipe can go on without it (slicing the optimizer state)."""

from __future__ import annotations

from coconet.dialects import coco, comm
from coconet.passes.fuse.reduction import fusable_reductions
from coconet.schedule.errors import VERIFY_RULE, ScheduleError, schedule_error
from coconet.schedule.pipeline import make_pass
from coconet.schedule.steps import ScheduleSteps
from coconet.schedule.structure import Structure


def _scatter_sliced(s: ScheduleSteps, info: Structure) -> None:
    """Reduce-scatter what an all_reduce's only reader slices (ZeRO-3 written naively)."""
    if info.sliced_all_reduces:
        s.canonicalize(*(info.names(info.sliced_all_reduces) or ()))


def _split_reorder(s: ScheduleSteps, info: Structure) -> None:
    _scatter_sliced(s, info)
    names = info.names(info.all_reduces)
    if names is None:
        s.split(dim="auto")
        s.reorder()
        return
    # One split per dim (not one per all_reduce: each schedule step verifies the program).
    s.split(*names, dim="auto")
    # One reorder of every gather: reordering one gather can carry its slices through the
    # next all_reduce's consumers (a residual stack's `x + 1 = dropout(...) + x`), taking that
    # gather with it; a reorder per name would then find it gone.
    try:
        with s._attempt():
            s.reorder(list(names))
    except ScheduleError as e:
        # a lone all_reduce (coco-bench's, a result returned as is) has no computation to
        # move before its gather: rs-c-ag is the split alone, named or not
        if e.rule != "reorder-nothing":
            raise


def _slice_state(s: ScheduleSteps, info: Structure) -> None:
    """as-slice the optimizer state where it can be sliced (all together if legal, else each
    one that is)."""
    names = info.names(info.state)
    if not names:
        return
    try:
        with s._attempt():
            s.as_slice(*names)
        return
    except ScheduleError as e:
        if e.rule == VERIFY_RULE:
            raise
    for n in names:
        try:
            with s._attempt():
                s.as_slice(n)
        except ScheduleError as e:
            if e.rule == VERIFY_RULE:
                raise


def _rs_names(s: ScheduleSteps) -> tuple[str, ...] | None:
    rss = [op for op in s.program.func.body.block.ops if isinstance(op, comm.ReduceScatterOp)]
    return Structure.names(rss)


def _fuse_all_reduce(s: ScheduleSteps) -> None:
    names = _rs_names(s)
    s.fuse(*(names or ()), mode="all_reduce")


def _overlap(s: ScheduleSteps, info: Structure, chunks: int = 4) -> None:
    names = info.names(info.matmuls)
    if names is None:
        s.overlap(chunks=chunks)
        return
    _overlap_named(s, names, chunks)


def _overlap_named(s: ScheduleSteps, names: tuple[str, ...], chunks: int) -> None:
    """Overlap each named matmul with the collective consuming it: one coco-overlap step
    naming them all. That is what a step per matmul does (the pass checks every pair, and that
    the pairs form no cycle together, before it rewrites them one by one in program order),
    without a step's walks of the whole program per matmul (its snapshot, the search for the
    name): a deep stack's ol(...) schedules were quadratic in the layers. A step per matmul
    where the matmuls no longer stand in the order named, which the pass would not keep."""
    wanted = set(names)
    current = [
        r.name_hint
        for op in s.program.func.body.block.ops
        for r in op.results[:1]
        if r.name_hint in wanted
    ]
    if list(dict.fromkeys(current)) != list(names):
        for n in names:
            s.overlap(n, chunks=chunks)
        return
    s._run(make_pass("coco-overlap", ops=names, chunks=None if chunks == 4 else chunks))


def _sliced_send(s: ScheduleSteps, info: Structure) -> None:
    names = info.names(info.sends)
    s.sliced_send(*(names or ()))


def _sent_slices(s: ScheduleSteps) -> tuple[str, ...] | None:
    sends = [op for op in s.program.func.body.block.ops if isinstance(op, comm.SendOp)]
    return Structure.names(sends)


def _fuse_rest(s: ScheduleSteps) -> None:
    """What no collective's kernel holds: the full reductions with their computation and the
    all_reduces of their partials (an fp8 scale's amax, a clipping's norm), then elementwise
    kernels over the rest."""
    _fuse_reductions(s)
    s.fuse(mode="elementwise")


def _fuse_reductions(s: ScheduleSteps) -> None:
    """coco-fuse{mode=reduction}, where the program has a full reduction with computation or
    an all_reduce to fuse (a step only then: other programs' pipelines keep their text)."""
    if fusable_reductions(s.program.func.body.block):
        s.fuse(mode="reduction")


def recipe_ar_c(s: ScheduleSteps, info: Structure) -> None:
    _fuse_rest(s)


def recipe_fuse_ar_c(s: ScheduleSteps, info: Structure) -> None:
    """The one-shot fused all_reduce: each all_reduce as written with the computation on its
    whole result as one kernel in which every rank reduces every peer's whole input (one
    handshake, no all_gather), then the rest of the computation fused as ar-c fuses it."""
    names = info.names(info.all_reduces)
    s.fuse(*(names or ()), mode="all_reduce", form="one_shot")
    _fuse_rest(s)


def recipe_fuse_rs_c(s: ScheduleSteps, info: Structure) -> None:
    """ZeRO-3 / FSDP: each reduce_scatter with the sliced update it feeds as one fused
    collective kernel (no all_gather: parameters and state stay sliced); the full reductions
    no chain holds with their computation."""
    _scatter_sliced(s, info)
    _fuse_all_reduce(s)
    _fuse_reductions(s)


def recipe_fuse_a2a(s: ScheduleSteps, info: Structure) -> None:
    """Each all_to_all with the elementwise computation of its input (on the sender's
    piece: a scale, a cast to bf16 before dispatch) and of its result (on the receiver's: a
    weighted combine, a residual add) as one kernel over symmetric memory; full reductions
    with their computation (a router's statistics)."""
    names = info.names(info.all_to_alls)
    s.fuse(*(names or ()), mode="all_to_all")
    _fuse_reductions(s)


def recipe_fuse_ag(s: ScheduleSteps, info: Structure) -> None:
    """Each all_gather with the elementwise computation of its input (on the sender's piece:
    the cast of an f32 master shard to bf16) and of its result as one exchange kernel; full
    reductions with their computation and all_reduce (an fp8 scale's amax: one kernel)."""
    s.fuse(*(info.names(info.computed_gathers) or ()), mode="all_gather")
    _fuse_reductions(s)


def recipe_ol_fuse_ag_mm(s: ScheduleSteps, info: Structure) -> None:
    """fuse(ag), then each matmul reading a fused all_gather's result (the bf16 weight, an fp8
    weight dequantized in the kernel) pipelined with it: the kernel's chunks of rows gathered
    while the matmul multiplies the ones already there."""
    recipe_fuse_ag(s, info)
    fused = [
        op
        for op in s.program.func.body.block.ops
        if isinstance(op, coco.MatmulOp)
        and any(comm.is_fused_all_gather(v.owner) for v in (op.lhs, op.rhs))
    ]
    if not fused:
        raise schedule_error(
            "schedule-target", "ol(fuse(ag),mm): no matmul reads a fused all_gather's result"
        )
    _overlap_each(s, fused)


def recipe_rs_c_ag(s: ScheduleSteps, info: Structure) -> None:
    _split_reorder(s, info)
    _slice_state(s, info)
    _fuse_rest(s)


def recipe_fuse_rs_c_ag(s: ScheduleSteps, info: Structure) -> None:
    _split_reorder(s, info)
    _slice_state(s, info)
    _fuse_all_reduce(s)
    # What no chain holds (a vocab-parallel softmax's exp(x - max) between its all_reduces)
    # is fused as ar-c fuses it, not left one kernel an op.
    _fuse_rest(s)


def recipe_ol_mm_fuse_rs_c_ag(s: ScheduleSteps, info: Structure) -> None:
    recipe_fuse_rs_c_ag(s, info)
    _overlap(s, info)


def _overlap_each(s: ScheduleSteps, matmuls: list, chunks: int = 4) -> None:
    names = Structure.names(matmuls)
    if names is None:
        raise schedule_error("schedule-target", "overlap: the matmuls to overlap have no SSA names")
    _overlap_named(s, names, chunks)


def recipe_ol_ag_mm(s: ScheduleSteps, info: Structure) -> None:
    _overlap_each(s, info.gathered_matmuls)


def recipe_ol_mm_rs(s: ScheduleSteps, info: Structure) -> None:
    _overlap_each(s, info.scattered_matmuls)


# The all_to_all forms' chunk counts, preferred first: 4 where they divide the chunked dim,
# else 3 (a MoE capacity of 3 slots), else 2.
EXCHANGE_CHUNKS = (4, 3, 2)


def _overlap_exchanges(s: ScheduleSteps, ops: list) -> None:
    """Overlap each named op with its all_to_all partner in the first of EXCHANGE_CHUNKS
    its pass accepts: a step per op; none accepted, the 4-chunk refusal."""
    names = Structure.names(ops)
    if names is None:
        raise schedule_error("schedule-target", "overlap: the ops to overlap have no SSA names")
    for n in dict.fromkeys(names):
        refusal: ScheduleError | None = None
        for chunks in EXCHANGE_CHUNKS:
            try:
                with s._attempt():
                    s.overlap(n, chunks=chunks)
                refusal = None
                break
            except ScheduleError as e:
                if e.rule == VERIFY_RULE:
                    raise
                refusal = refusal or e
        if refusal is not None:
            raise refusal


def recipe_ol_mm_a2a(s: ScheduleSteps, info: Structure) -> None:
    _overlap_exchanges(s, info.exchanged_matmuls)


def recipe_ol_a2a_mm(s: ScheduleSteps, info: Structure) -> None:
    # named by the all_to_all: a named matmul pairs with the collective reading it first
    _overlap_exchanges(s, info.exchanges_into_matmuls)


def recipe_ol_ag_mm_ol_mm_rs(s: ScheduleSteps, info: Structure) -> None:
    recipe_ol_ag_mm(s, info)
    recipe_ol_mm_rs(s, info)


def recipe_sliced_send(s: ScheduleSteps, info: Structure) -> None:
    _split_reorder(s, info)
    _slice_state(s, info)
    _sliced_send(s, info)
    _fuse_rest(s)


def recipe_fuse_sliced_send(s: ScheduleSteps, info: Structure) -> None:
    _split_reorder(s, info)
    _slice_state(s, info)
    _sliced_send(s, info)
    s.fuse(*(_sent_slices(s) or ()), mode="send")


def recipe_ol_rs_fuse_sliced_send(s: ScheduleSteps, info: Structure) -> None:
    recipe_fuse_sliced_send(s, info)
    _overlap(s, info)


def recipe_ol_rs_send_ag(s: ScheduleSteps, info: Structure) -> None:
    recipe_fuse_sliced_send(s, info)
    names = info.names(info.matmuls)
    for n in names or (None,):
        s.overlap(n, send=True)
