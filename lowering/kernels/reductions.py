"""The reduction kernels of unfused reductions: a full reduction (per-block partials, then
one block that combines them in block order and rounds once) and a row reduction
(coco.reduce_dims: a block per row, `ROW_LANES` lanes combined in lane order; or, for short or
strided rows, a thread per row walking the same lanes in the same order), and the order in
which a thread's vectors accumulate (`lane_partials`, which fused kernels share)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coconet.dialects import coco
from coconet.dialects.reduction import Reduction
from coconet.lowering.kernel_ir import (
    BLOCK_DIM,
    BLOCK_IDX,
    GRID_DIM,
    THREAD_IDX,
    VECTOR_THREADS,
    Assign,
    Binary,
    Cast,
    Combine,
    Decl,
    Expr,
    Field,
    For,
    ForThreads,
    Identity,
    If,
    Index,
    Kernel,
    LaneLoop,
    Lit,
    LocalArray,
    Param,
    RowLanes,
    Select,
    SharedArray,
    SharedDyn,
    Stmt,
    SyncBlock,
    Var,
    VecIn,
    While,
    binary,
)
from coconet.lowering.kernels.elements import (
    C_STORAGE,
    STORAGE_BYTES,
    load_expr,
    reduce_accumulator,
    store_from_double,
)
from coconet.lowering.kernels.statements import call, thread_zero
from coconet.lowering.signature import BOOL, I32, I64, RANGE, U32, CType, ParamKind


def lane_partials(
    accs: Sequence[Var],
    kinds: Sequence[tuple[Reduction, CType]],
    lanes: Expr,
    first: Expr,
    vectors_end: Expr,
    vector: Callable[[Var, Callable[[Var], list[Stmt]]], Sequence[Stmt]],
    values_at: Callable[[Var], Sequence[Expr]],
) -> Stmt:
    """A thread's whole vectors v = `first`, `first` + coco_vector_threads(), ... below
    `vectors_end` with one accumulator per lane and reduction, the lanes then combined
    pairwise (lane k with lane k + s, for s = lanes/2, lanes/4, ..., 1) into the thread's
    accumulators `accs` (declared before, at the identity; an element loop continues them).
    `vector(v, then)` is vector v's statements, `then(k)` ending lane k's; `values_at(k)` is
    what lane k adds to each reduction, in its accumulator type. A fixed order on each
    target, and one the host vectorizes: in lane order it would be one long chain of
    dependent additions.

    Only a thread with a vector keeps lane accumulators, and on the host thread 0 takes all
    of a block's vectors (coco_vector_threads): a host vector is a tile of hundreds of lanes,
    and 256 threads setting up and combining them for a vector or two each spent ~100x the
    vectors' own time (LAMB's fused kernel at 4,096 elements: a 264 us launch). A thread
    without one would combine identities into the identity its accumulator holds."""
    lane_accs = [Var(a.ctype, None, f"{a.fallback}v") for a in accs]
    stmts: list[Stmt] = []
    for la, (kind, acc) in zip(lane_accs, kinds):
        k = Var(I32, None, "k_")
        identity = (Assign(Index(la, k), Identity(kind, acc)),)
        stmts += [LocalArray(la, lanes), LaneLoop(k, lanes, identity)]

    def into_lanes(k: Var) -> list[Stmt]:
        return [
            Assign(Index(la, k), Combine(kind, acc, Index(la, k), value))
            for la, (kind, acc), value in zip(lane_accs, kinds, values_at(k))
        ]

    v = Var(I64, None, "v_")
    stmts.append(For(v, first, vectors_end, tuple(vector(v, into_lanes)), step=VECTOR_THREADS))
    half = Var(I32, None, "s_")
    pairwise: list[Stmt] = []
    for la, (kind, acc) in zip(lane_accs, kinds):
        k = Var(I32, None, "k_")
        pair = Combine(kind, acc, Index(la, k), Index(la, k + half))
        pairwise.append(LaneLoop(k, half, (Assign(Index(la, k), pair),)))
    pairwise.append(Assign(half, Lit("2"), op="/="))
    stmts += [Decl(half, lanes / 2, const=False), While(binary(">", half, 0), tuple(pairwise))]
    stmts += [Assign(a, Index(la, Lit("0"))) for a, la in zip(accs, lane_accs)]
    has_vectors = Binary(
        "&&", binary("<", THREAD_IDX, VECTOR_THREADS), binary("<", first, vectors_end)
    )
    return If(has_vectors, tuple(stmts))


def reduction_kernels(name: str, kind: Reduction, elt: str) -> tuple[Kernel, Kernel]:
    """Two kernels for a full reduction: per-block partials (in `reduce_accumulator`'s type:
    double, long long, float for a max or min; in a fixed order) and a one-block finish that
    combines them in block order and rounds once."""
    rkind = Reduction(kind)
    acc = reduce_accumulator(elt, rkind)
    storage = C_STORAGE[elt]

    x = Param(storage.ptr(const=True, restrict=True), None, "x", kind=ParamKind.IN)
    partials = Param(acc.ptr(restrict=True), None, "partials", kind=ParamKind.PARTIALS)
    n = Param(I64, None, "n", kind=ParamKind.COUNT)
    shared, r = Var(acc.ptr(), None, "acc_"), Var(RANGE, None, "r_")
    a, i = Var(acc, None, "a"), Var(I64, None, "i")

    def term(value: Expr) -> Expr:
        load = Cast(acc, load_expr(elt, value))
        return load * load if rkind == Reduction.NORM else load

    # Whole vectors first, as fused kernels take them (lane_partials), then the elements after
    # the last vector. One element per thread at a time, in one dependent chain, ran at a
    # tenth of the host's memory bandwidth (a norm of 2^24 f32: 29 ms against a 2.7 ms
    # floor); 16-byte loads suit a GPU too. Chunks start at whole vectors.
    lanes, ok, vend = Var(I32, None, "lanes_"), Var(BOOL, None, "vec_"), Var(I64, None, "vend_")
    begin, end = Field(r, "begin"), Field(r, "end")
    xv = Var(storage, None, "x_v")

    def vector(v: Var, then: Callable[[Var], list[Stmt]]) -> list[Stmt]:
        k = Var(I32, None, "k_")
        return [VecIn(xv, lanes, x + v * lanes), LaneLoop(k, lanes, tuple(then(k)))]

    per_thread = ForThreads(
        (
            Decl(a, Identity(rkind, acc), const=False),
            lane_partials(
                [a],
                [(rkind, acc)],
                lanes,
                begin / lanes + THREAD_IDX,
                vend / lanes,
                vector,
                lambda k: [term(Index(xv, k))],
            ),
            For(
                i,
                vend + THREAD_IDX,
                end,
                (Assign(a, Combine(rkind, acc, a, term(Index(x, i)))),),
                step=BLOCK_DIM,
            ),
            Assign(Index(shared, THREAD_IDX), a),
        )
    )
    a2, t = Var(acc, None, "a"), Var(U32, None, "t")
    partial = Kernel(
        f"{name}_partial",
        (x, partials, n),
        (
            SharedDyn(shared),
            Decl(lanes, Lit(f"COCO_VEC_BYTES / {STORAGE_BYTES[elt]}")),
            Decl(r, call("coco_chunk", n, GRID_DIM, BLOCK_IDX, lanes)),
            Decl(ok, call("coco_vec_aligned", x + begin)),
            Decl(vend, Select(ok, begin + (end - begin) / lanes * lanes, begin)),
            per_thread,
            SyncBlock(),
            thread_zero(
                Decl(a2, Identity(rkind, acc), const=False),
                For(
                    t, Lit("0"), BLOCK_DIM, (Assign(a2, Combine(rkind, acc, a2, Index(shared, t))),)
                ),
                Assign(Index(partials, BLOCK_IDX), a2),
            ),
        ),
    )

    partials_in = Param(acc.ptr(const=True, restrict=True), None, "partials", ParamKind.PARTIALS)
    count = Param(I64, None, "count", kind=ParamKind.COUNT)
    out = Param(storage.ptr(restrict=True), None, "out", kind=ParamKind.OUT)
    total, b = Var(acc, None, "total"), Var(I64, None, "b")
    value = call("sqrt", total) if rkind == Reduction.NORM else total
    finish = Kernel(
        f"{name}_finish",
        (partials_in, count, out),
        (
            thread_zero(
                Decl(total, Identity(rkind, acc), const=False),
                For(
                    b,
                    Lit("0"),
                    count,
                    (Assign(total, Combine(rkind, acc, total, Index(partials_in, b))),),
                ),
                Assign(Index(out, Lit("0")), store_from_double(elt, value)),
                also=binary("==", BLOCK_IDX, 0),
            ),
        ),
    )
    return partial, finish


def row_kind(kind: Reduction, elt: str) -> tuple[bool, Reduction, CType]:
    """(whether it is a mean, the combining kind -- a mean sums --, the accumulator type)."""
    mean = kind == Reduction.MEAN
    rkind = Reduction.SUM if mean else Reduction(kind)
    return mean, rkind, reduce_accumulator(elt, rkind)


def _row_params(elt: str) -> tuple[Param, Param, Param, Param, Param]:
    """A row reduction's parameters: x, out, and the rows of `count` elements `inner` apart."""
    storage = C_STORAGE[elt]
    return (
        Param(storage.ptr(const=True, restrict=True), None, "x", kind=ParamKind.IN),
        Param(storage.ptr(restrict=True), None, "out", kind=ParamKind.OUT),
        Param(I64, None, "rows", kind=ParamKind.COUNT),
        Param(I64, None, "count", kind=ParamKind.COUNT),
        Param(I64, None, "inner", kind=ParamKind.COUNT),
    )


def row_reduction_kernel(name: str, kind: Reduction, elt: str) -> Kernel:
    """A reduction over a run of consecutive dims, viewed as [outer, count, inner] (row r of
    the result is element (r / inner, :, r % inner)): one block per row (a block-stride loop
    over rows), `ROW_LANES` lanes shared by the block's threads, each lane accumulating its
    elements in order in double (long long), lane partials in shared memory combined in lane
    order by thread 0 and rounded once. This is the fixed order of the oracle
    (runtime/sim.py `reduce_rows`), so results are bit-identical for any block size."""
    mean, rkind, acc = row_kind(kind, elt)
    lanes = coco.ROW_LANES
    x, out, rows, count, inner = _row_params(elt)

    partial = Var(acc, None, "lane_acc_")
    row, base = Var(I64, None, "row"), Var(I64, None, "base")
    lane, j, a = Var(I64, None, "lane"), Var(I64, None, "j"), Var(acc, None, "a")
    total, k = Var(acc, None, "total"), Var(I64, None, "k")
    element = Cast(acc, load_expr(elt, Index(x, base + j * inner)))
    per_lane = RowLanes(
        lane,
        j,
        count,
        lanes,
        (Decl(a, Identity(rkind, acc), const=False),),
        (Assign(a, Combine(rkind, acc, a, element)),),
        (Assign(Index(partial, lane), a),),
    )
    value: Expr = Binary("/", total, Cast(acc, count)) if mean else total
    finish = thread_zero(
        Decl(total, Identity(rkind, acc), const=False),
        For(
            k,
            Lit("0"),
            Lit(str(lanes)),
            (Assign(total, Combine(rkind, acc, total, Index(partial, k))),),
        ),
        Assign(Index(out, row), store_from_double(elt, value)),
    )
    body = (
        SharedArray(partial, lanes),
        For(
            row,
            Cast(I64, BLOCK_IDX),
            rows,
            (
                Decl(base, (row / inner) * count * inner + row % inner),
                per_lane,
                SyncBlock(),
                finish,
                SyncBlock(),  # the lane partials are reused by the next row
            ),
            step=Cast(I64, GRID_DIM),
        ),
    )
    return Kernel(name, (x, out, rows, count, inner), body)


def column_form(rows: int, count: int, inner: int) -> bool:
    """Whether a row reduction of `rows` rows of `count` elements, `inner` apart, runs a
    thread per row (`column_reduction_kernel`) rather than a block per row: rows no longer
    than a block's lanes a few times over (the block form's per-row barriers and lane
    combine cost more than the row), or strided rows with more rows than elements in each
    (the parallelism is across rows, and neighbouring threads read neighbouring elements).
    Only the speed depends on it: both forms give the same bits."""
    return count <= 4 * coco.ROW_LANES or (inner > 1 and rows >= count)


def column_reduction_kernel(name: str, kind: Reduction, elt: str) -> Kernel:
    """The row reduction of `row_reduction_kernel` (same parameters, same bits) with a thread
    per row instead of a block: for short rows (a block's lanes mostly idle, its barriers per
    row dominating) and strided ones (inner > 1: the threads of a warp read neighbouring
    elements of their rows, coalesced). The thread walks the lanes in order, each lane's
    elements lane, lane + ROW_LANES, ... in order, and combines each lane's partial into the
    total as it finishes: the block form's order exactly. Lanes with no element are skipped:
    they would combine the identity, which changes no total (a sum of +0.0-started lanes is
    never -0.0)."""
    mean, rkind, acc = row_kind(kind, elt)
    lanes = coco.ROW_LANES
    x, out, rows, count, inner = _row_params(elt)

    row, base = Var(I64, None, "row"), Var(I64, None, "base")
    lane, j = Var(I64, None, "lane"), Var(I64, None, "j")
    a, total = Var(acc, None, "a"), Var(acc, None, "total")
    used = Var(I64, None, "used")
    element = Cast(acc, load_expr(elt, Index(x, base + j * inner)))
    value: Expr = Binary("/", total, Cast(acc, count)) if mean else total
    first = Cast(I64, BLOCK_IDX) * Cast(I64, BLOCK_DIM) + Cast(I64, THREAD_IDX)
    per_row = (
        Decl(base, (row / inner) * count * inner + row % inner),
        Decl(total, Identity(rkind, acc), const=False),
        For(
            lane,
            Lit("0"),
            used,
            (
                Decl(a, Identity(rkind, acc), const=False),
                For(
                    j,
                    lane,
                    count,
                    (Assign(a, Combine(rkind, acc, a, element)),),
                    step=Lit(str(lanes)),
                ),
                Assign(total, Combine(rkind, acc, total, a)),
            ),
        ),
        Assign(Index(out, row), store_from_double(elt, value)),
    )
    body = (
        ForThreads(
            (
                Decl(used, Select(binary("<", count, lanes), count, Lit(str(lanes)))),
                For(row, first, rows, per_row, step=Cast(I64, GRID_DIM) * Cast(I64, BLOCK_DIM)),
            )
        ),
    )
    return Kernel(name, (x, out, rows, count, inner), body)
