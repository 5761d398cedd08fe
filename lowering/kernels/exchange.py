"""The fused all_to_all's kernel (lowering/fused_all_to_all.py): ONE kernel per rank computes
the sender's side of the exchange into its symmetric staging buffer, meets its peers, then
pulls from every peer the part of its piece that belongs to this rank and computes the
receiver's side on it.

Each side is an elementwise kernel's element body (`ElementwiseBuilder`: loads, ops in
program order, stores), built over its own iteration type -- the all_to_all's input for the
sender, its result for the receiver -- and run over *boxes* instead of a flat range. What
member m sends member j is a box (core/values.py `shared_region`); the boxes m sends
partition m's input piece, the boxes j receives partition j's result piece. Block b of the
sender computes chunk b of each box it sends (its rows, in row-major order), block b of the
receiver pulls chunk b of each box it receives -- the same elements, cut by the same
`coco_chunk` of the same count -- so the flag protocol between same-index blocks
(coco_device.h `coco_peers_entry` / `coco_peers_done`) is the only synchronization: entry
(the peers no longer read this rank's staging buffer from the previous launch), the sender's
side, done (the chunks are staged), the receiver's side.

A box is walked row by row (a row: its extent along the innermost dim, contiguous in both
pieces), so each row costs one division for its coordinates and its elements are a
contiguous loop. Per member the kernel reads the box from a table (`SEND_BOXES` /
`RECV_BOXES`, per rank: uneven cuts give each pair its own extents and strides):

    send: count, inner, extents 1..R-2, base, strides 0..R-2     (in this rank's input piece)
    recv: count, inner, extents 1..R-2, base, strides 0..R-2     (in member q's input piece)
          base, strides 0..R-2                                  (in this rank's result piece)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from xdsl.ir import SSAValue

from coconet.dialects.coco import tensor_type_of
from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    GRID_DIM,
    Assign,
    BlockStrideLoop,
    Decl,
    Expr,
    Field,
    For,
    Index,
    Kernel,
    Lit,
    Param,
    PeerSync,
    Select,
    Stmt,
    SyncBlock,
    SyncStep,
    Unused,
    Var,
    binary,
    peer,
    sum_of,
)
from coconet.lowering.kernels.builder_state import BuilderState
from coconet.lowering.kernels.elements import (
    C_COMPUTE,
    C_STORAGE,
    NARROW_FLOATS,
    load_expr,
    store_expr,
)
from coconet.lowering.kernels.elementwise import ElementwiseBuilder
from coconet.lowering.kernels.spec import ElementwiseSpec
from coconet.lowering.kernels.statements import call, peers_entry, thread_zero, value_hint
from coconet.lowering.signature import I32, I64, RANGE, U32, U64, ParamKind


def send_fields(rank: int) -> int:
    """Fields per member of a send box table: count, inner, extents 1..R-2, base, strides."""
    return 2 + _middle(rank) + 1 + (rank - 1)


def recv_fields(rank: int) -> int:
    """Fields per member of a receive box table: a send box's, then the result's base and
    strides."""
    return send_fields(rank) + 1 + (rank - 1)


class FusedAllToAllKernel:
    """`send` computes the sender's side over the all_to_all's input type (its stores: values
    the program reads later); `sent` is staged. `recv` computes the receiver's side over the
    result type, where `received` is the element pulled from the peer (not one of its
    inputs). `build` returns the kernel; `send_params` and `recv_params` are the
    parameters each side's values and index maps fill (lower_to_plan's `kernel_args` over
    that side's iteration type), the rest the exchange's own."""

    def __init__(
        self,
        name: str,
        send: ElementwiseSpec,
        recv: ElementwiseSpec,
        sent: SSAValue,
        received: SSAValue,
        exchange: str = "comm.all_to_all",
    ):
        self.name = name
        self.exchange = exchange  # the op exchanged (comm.all_to_all, comm.all_gather)
        self.send = send
        self.recv = recv
        self.sent = sent
        self.received = received
        self.send_params: list[Param] = []
        self.recv_params: list[Param] = []

    def build(self) -> Kernel:
        rank = self.send.iteration.rank
        elt = tensor_type_of(self.sent).elt
        storage = C_STORAGE[elt]

        # The sender's side: the element body, then the staged element.
        s = ElementwiseBuilder(self.send)
        s.build_params()
        s.build_indices()
        s.build_ops()
        s.build_stores()
        # The exchanged value as the sender's side has it: an input of the kernel no op of
        # that side computes is staged as a copy of its bits (NaN payloads kept), else the
        # computed value in its storage type.
        operand = s.operands.get(self.sent)
        raw = operand is not None and not operand.scalar and self.sent not in s.local
        if operand is not None and raw:
            staged_value: Expr = Index(operand.param, s.index_of(operand))
        else:
            staged_value = store_expr(elt, s.ref(self.sent))

        # The receiver's side: the pulled element is a value of its body.
        r = ElementwiseBuilder(self.recv)
        r.build_params()
        pulled = Var(C_COMPUTE[elt], self.received.name_hint, "x_recv")
        r.local[self.received] = pulled
        r.build_indices()
        r.build_ops()
        r.build_stores()

        ranged = (ParamKind.BEGIN, ParamKind.END)
        self.send_params = [p for p in s.params if p.kind not in ranged]
        self.recv_params = [p for p in r.params if p.kind not in ranged]
        table = U64.ptr(const=True, restrict=True)
        ints = I64.ptr(const=True, restrict=True)
        staging = Param(
            table, value_hint(self.sent, "_peers"), "staged", ParamKind.PEERS_IN, value=self.sent
        )
        send_boxes = Param(ints, None, "send_boxes", ParamKind.SEND_BOXES)
        recv_boxes = Param(ints, None, "recv_boxes", ParamKind.RECV_BOXES)
        flags = Param(table, None, "flags", ParamKind.FLAGS)
        epoch_at = Param(U32.ptr(restrict=True), None, "epoch_at", ParamKind.EPOCH)
        epoch = Var(U32, None, "epoch")
        me = Param(I32, None, "me", ParamKind.ME)
        nranks = Param(I32, None, "nranks", ParamKind.NRANKS)
        params = [*self.send_params, *self.recv_params]
        params += [staging, send_boxes, recv_boxes, flags, epoch_at, me, nranks, s.begin, s.end]

        def sync(step: SyncStep) -> Stmt:
            return thread_zero(PeerSync(step, flags, me, nranks, epoch, GRID_DIM, BLOCK_IDX))

        name = self.sent.name_hint or "staged"
        mine = Var(storage.ptr(), f"{name}_mine", "mine_")
        # The range [begin, end) only sizes the grid (the cuda backend's grown_grid): the
        # boxes cut the work.
        stmts: list[Stmt] = [Unused((s.begin, s.end)), *s.hoisted, *r.hoisted]
        stmts.append(Decl(mine, peer(staging, me, storage)))
        stmts += [*peers_entry(flags, me, nranks, epoch_at, epoch), SyncBlock()]

        def send_row(at: Sequence[Var], k: Var) -> tuple[list[Stmt], tuple[Stmt, ...]]:
            staged = Assign(Index(mine, s.i), staged_value, comment=self.exchange)
            if raw:
                staged = _copied(staged, staged_value, elt, self.exchange)
            row, element = along_row(s, at[0], k)
            return row, (*element, staged)

        stmts.append(walk_boxes(send_boxes, send_fields(rank), rank, 1, me, nranks, _no, send_row))
        # Done: this block's chunks are staged here, the peers' same-index block's there; the
        # block's threads wait for thread 0 to see them before pulling.
        stmts += [SyncBlock(), sync(SyncStep.DONE), SyncBlock()]

        source = Var(storage.ptr(const=True), f"{name}_from", "from_")

        # A store of the pulled element itself, in its own type, copies the peer's bits (no
        # round trip through the compute type: NaN payloads kept, no conversions on the
        # receiver's side of a bare all_gather); the element is only converted where an op
        # reads it.
        converted = store_expr(elt, pulled)
        read = any(self.received in op.operands for op in self.recv.ops)

        def recv_row(at: Sequence[Var], k: Var) -> tuple[list[Stmt], tuple[Stmt, ...]]:
            element = Index(source, at[0] + k)
            row, body = along_row(r, at[1], k)
            body = tuple(
                _copied(st, element, elt, self.exchange)
                if isinstance(st, Assign) and st.value == converted
                else st
                for st in body
            )
            if not read:
                return row, body
            pulled_decl = Decl(pulled, load_expr(elt, element), comment=self.exchange)
            return row, (pulled_decl, *body)

        def recv_head(q: Var) -> list[Stmt]:
            return [Decl(source, peer(staging, q, storage, const=True))]

        stmts.append(
            walk_boxes(recv_boxes, recv_fields(rank), rank, 2, me, nranks, recv_head, recv_row)
        )
        return Kernel(self.name, tuple(params), tuple(stmts))


def _copied(store: Assign, element: Expr, elt: str, comment: str) -> Assign:
    """`store` of the pulled `element` as a copy of its bits: a narrow float's through its
    `bits` member (a struct assignment is one aggregate copy, which g++ does not
    vectorize)."""
    if elt in NARROW_FLOATS:
        return Assign(Field(store.target, "bits"), Field(element, "bits"), comment=comment)
    return replace(store, value=element, comment=comment)


def along_row(b: ElementwiseBuilder, start: Var, k: Var) -> tuple[list[Stmt], tuple[Stmt, ...]]:
    """One side's element body at element `k` of a row starting at `start` (its iteration's
    linear index): the row-level statements (the row start's coordinates, once per row: a
    row lies along the innermost dim, so only the innermost coordinate moves, by k) and the
    element's."""
    element: list[Stmt] = [Decl(b.i, start + k)]
    row: list[Stmt] = []
    if b.coords:
        at = [Var(I64, None, f"r{c.fallback}_") for c in b.coords]
        row += b.coordinates(start, at, b.dims)
        element += [Decl(c, x) for c, x in zip(b.coords[:-1], at[:-1])]
        element += [Decl(b.coords[-1], at[-1] + k), Unused(tuple(b.coords))]
    skipped = {id(st) for st in b.index_stmts}
    element += [st for st in b.body if id(st) not in skipped]
    return row, tuple(element)


def walk_boxes(
    boxes: Param,
    fields: int,
    rank: int,
    places: int,
    me: Param,
    nranks: Param,
    head: Callable[[Var], list[Stmt]],
    body: Callable[[Sequence[Var], Var], tuple[list[Stmt], tuple[Stmt, ...]]],
) -> Stmt:
    """Over every member q of the group (rotated by this rank: q = me, me + 1, ...), this
    block's chunk of q's box, row by row: `places` positions per row (a base plus the row's
    coordinates times strides, each from q's entry of `boxes`), then `body(starts, k)`: the
    row's statements and the element's at `k` along the row; `head(q)`: statements before
    q's rows."""
    d, q = Var(I32, None, "d_"), Var(I32, None, "q_")
    box = Var(I64.ptr(const=True), None, "box_")
    count, inner = Var(I64, None, "n_"), Var(I64, None, "inner_")
    chunk = Var(RANGE, None, "r_")
    row, first = Var(I64, None, "row_"), Var(I64, None, "first_")
    lo, hi = Var(I64, None, "lo_"), Var(I64, None, "hi_")
    k = Var(I64, None, "k_")
    begin, end = Field(chunk, "begin"), Field(chunk, "end")
    coords = [Var(I64, None, f"t{dim}_") for dim in range(rank - 1)]
    extents: list[Expr | None] = [None, *(Index(box, Lit(str(2 + e))) for e in range(rank - 2))]
    # (a 1-D box is one row: no coordinates)
    row_stmts: list[Stmt] = BuilderState.coordinates(row, coords, extents) if coords else []
    starts: list[Var] = []
    at = 2 + _middle(rank)  # the first place's base
    for n in range(places):
        base = Index(box, Lit(str(at)))
        strides = [Index(box, Lit(str(at + 1 + dim))) for dim in range(rank - 1)]
        start = Var(I64, None, f"at{n}_")
        row_stmts.append(Decl(start, sum_of([base, *(c * s for c, s in zip(coords, strides))])))
        starts.append(start)
        at += rank
    at_row, element = body(starts, k)
    row_stmts += [
        *at_row,
        Decl(first, row * inner),
        Decl(lo, _larger(begin, first) - first),
        Decl(hi, _smaller(end, first + inner) - first),
        BlockStrideLoop(k, lo, hi, element),
    ]
    member: list[Stmt] = [
        Decl(q, (me + d) % nranks),
        Decl(box, boxes + q * Lit(str(fields))),
        Decl(count, Index(box, Lit("0"))),
        Decl(inner, Index(box, Lit("1"))),
        Decl(chunk, call("coco_chunk", count, GRID_DIM, BLOCK_IDX, Lit("1"))),
        *head(q),
        For(row, begin / inner, (end + inner - Lit("1")) / inner, tuple(row_stmts)),
    ]
    return For(d, Lit("0"), nranks, tuple(member))


def _middle(rank: int) -> int:
    """How many extents a box entry holds: those of dims 1..R-2 (the rows' coordinates)."""
    return max(0, rank - 2)


def _no(q: Var) -> list[Stmt]:
    return []


def _larger(a: Expr, b: Expr) -> Expr:
    return Select(binary(">", a, b), a, b)


def _smaller(a: Expr, b: Expr) -> Expr:
    return Select(binary("<", a, b), a, b)
