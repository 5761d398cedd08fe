"""The intra-node kernels of a hierarchical fused collective (hierarchical.py).

A group spanning nodes works in two parts: the members on this rank's node (these kernels, over
symmetric memory, with the cross-rank protocol) and one member per node (a library collective
between nodes). Each rank handles the `parts` pieces of its members across nodes, packed one
after the other (part k = the piece of its across-nodes member k): `bases[k]` says where that
piece lies in the tensor."""

from __future__ import annotations

from collections.abc import Callable

from coconet.dialects.reduction import Reduction
from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    GRID_DIM,
    Assign,
    BlockStrideLoop,
    Cast,
    Combine,
    Decl,
    Expr,
    Field,
    For,
    Index,
    Kernel,
    Lit,
    Param,
    PeerSync,
    Stmt,
    SyncBlock,
    SyncStep,
    Unused,
    Var,
    peer,
)
from coconet.lowering.kernels.elements import C_STORAGE, accumulator, load_expr
from coconet.lowering.kernels.statements import call, peers_entry, thread_zero
from coconet.lowering.signature import I32, I64, RANGE, U32, U64, ParamKind


def _node_kernel_params(kind: ParamKind, elt: str, table_hint: str) -> dict[str, Param]:
    storage = C_STORAGE[elt]
    table = U64.ptr(const=True, restrict=True)
    return {
        "peers": Param(table, None, table_hint, kind=kind),
        "out": Param(storage.ptr(restrict=True), None, "out", kind=ParamKind.OUT),
        "bases": Param(I64.ptr(const=True, restrict=True), None, "bases", ParamKind.PEER_BASES),
        "count": Param(I64, None, "count", kind=ParamKind.COUNT),
        "run": Param(I64, None, "run", kind=ParamKind.COUNT),
        "stride": Param(I64, None, "stride", kind=ParamKind.COUNT),
        "parts": Param(I32, None, "parts", kind=ParamKind.PARTS),
        "flags": Param(table, None, "flags", kind=ParamKind.FLAGS),
        "epoch_at": Param(U32.ptr(restrict=True), None, "epoch_at", kind=ParamKind.EPOCH),
        "me": Param(I32, None, "me", kind=ParamKind.ME),
        "nranks": Param(I32, None, "nranks", kind=ParamKind.NRANKS),
        "begin": Param(I64, None, "begin", kind=ParamKind.BEGIN),
        "end": Param(I64, None, "end", kind=ParamKind.END),
    }


def _node_kernel(
    name: str, p: dict[str, Param], loop: Callable[[Var, Var, Var], list[Stmt]]
) -> Kernel:
    """A kernel over the packed pieces [begin, end) with the protocol around `loop(i, part,
    at)`'s statements (packed element i is at offset `at` from its piece's base): entry (every
    node peer's earlier writes are complete), the block's chunk, done (no node peer still reads
    this rank's buffers)."""
    r_ = Var(RANGE, None, "r_")
    j, i = Var(I64, None, "j_"), Var(I64, None, "i")
    part, e, at = Var(I64, None, "part"), Var(I64, None, "e"), Var(I64, None, "at")
    epoch = Var(U32, None, "epoch")

    def sync(step: SyncStep) -> Stmt:
        return thread_zero(
            PeerSync(step, p["flags"], p["me"], p["nranks"], epoch, GRID_DIM, BLOCK_IDX)
        )

    element = (
        Decl(i, p["begin"] + j),
        Decl(part, i / p["count"]),
        Decl(e, i % p["count"]),
        # A piece is runs of `run` elements `stride` apart (its sliced dim and the dims after).
        Decl(at, e / p["run"] * p["stride"] + e % p["run"]),
        *loop(i, part, at),
    )
    chunk = call("coco_chunk", p["end"] - p["begin"], GRID_DIM, BLOCK_IDX, Lit("1"))
    body = (
        Decl(r_, chunk),
        *peers_entry(p["flags"], p["me"], p["nranks"], p["epoch_at"], epoch),
        SyncBlock(),
        BlockStrideLoop(j, Field(r_, "begin"), Field(r_, "end"), element),
        SyncBlock(),
        sync(SyncStep.DONE),
        Unused((p["parts"],)),
    )
    return Kernel(name, tuple(p.values()), body)


def node_reduce_kernel(name: str, elt: str, kind: Reduction) -> Kernel:
    """The intra-node reduce_scatter of a hierarchical fused collective: out[part, e] = the
    node's members' inputs at bases[part] + e, combined in member order in double (long long)
    -- the node's partial of the piece of this rank's member `part` across nodes, kept in
    double so that the reduce_scatter between nodes, which finishes it, rounds once."""
    acc_t, storage = accumulator(elt), C_STORAGE[elt]
    p = _node_kernel_params(ParamKind.PEERS_IN, elt, "x_peers")
    p["out"] = Param(acc_t.ptr(restrict=True), None, "out", kind=ParamKind.OUT)
    rkind = Reduction(kind)

    def loop(i: Var, part: Var, e: Var) -> list[Stmt]:
        acc, q = Var(acc_t, None, "acc"), Var(I32, None, "q_")
        at = Index(p["bases"], part) + e

        def item(rank: Expr) -> Expr:
            return Cast(
                acc_t, load_expr(elt, Index(peer(p["peers"], rank, storage, const=True), at))
            )

        return [
            Decl(acc, item(Lit("0")), const=False),
            For(q, Lit("1"), p["nranks"], (Assign(acc, Combine(rkind, acc_t, acc, item(q))),)),
            Assign(Index(p["out"], i), acc, comment="comm.reduce_scatter within the node"),
        ]

    return _node_kernel(name, p, loop)


def node_gather_kernel(name: str, elt: str) -> Kernel:
    """The intra-node all_gather of a hierarchical fused collective: after the library
    all_gather between nodes, every node member q holds the pieces of its members across nodes
    packed in its symmetric buffer; this rank copies all of them (its own too) to their places
    in the gathered tensor, `bases[q * parts + part]`."""
    p = _node_kernel_params(ParamKind.PEERS_OUT, elt, "gathered_peers")
    storage = C_STORAGE[elt]

    def loop(i: Var, part: Var, e: Var) -> list[Stmt]:
        # The members in the order rotated by this rank (its own first), so that the
        # members are not all read by everyone at once.
        d, q = Var(I32, None, "d_"), Var(I32, None, "q_")
        src = Index(peer(p["peers"], q, storage, const=True), i)
        dst = Index(p["out"], Index(p["bases"], q * p["parts"] + part) + e)
        rotated = Decl(q, (p["me"] + d) % p["nranks"])
        body = (rotated, Assign(dst, src, comment="comm.all_gather"))
        return [For(d, Lit("0"), p["nranks"], body)]

    return _node_kernel(name, p, loop)
