"""The all_gather's pull of a fused collective kernel: after the done-flags, the same chunk
of every peer's piece of each gathered value, copied from the peer's gathered buffer into
this rank's destination (vectors where aligned), the peers in the order rotated by this
rank."""

from __future__ import annotations

from collections.abc import Sequence

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
    LaneLoop,
    Lit,
    Stmt,
    Var,
    VecIn,
    VecOut,
    VecStore,
    all_of,
    binary,
    peer,
    rewrite,
)
from coconet.lowering.kernels.builder_state import Gather
from coconet.lowering.kernels.elements import C_STORAGE, NARROW_FLOATS
from coconet.lowering.kernels.statements import call
from coconet.lowering.kernels.vectors import VectorBuilder
from coconet.lowering.signature import BOOL, I32, I64, RANGE


class PullBuilder(VectorBuilder):
    """The all_gather's pull after the done-flags."""

    def pull(self, vector: bool) -> list[Stmt]:
        """After the done-flags: the same chunk of every peer's piece of each gathered value,
        read from the peer's gathered buffer into this rank's destination (vectors where
        aligned), the peers in the order rotated by this rank."""
        q = Var(I32, None, "q_")
        chunk = self.range
        head: list[Stmt] = []
        if self.counts is not None:
            # Uneven slices: member q's block of this index wrote the chunk of q's count.
            chunk = Var(RANGE, None, "qr_")
            count = Index(self.counts, q) - self.begin
            head = [Decl(chunk, call("coco_chunk", count, GRID_DIM, BLOCK_IDX, self.align))]
        begin, end = Field(chunk, "begin"), Field(chunk, "end")

        def src(g: Gather) -> Expr:
            return peer(
                g.operand.param, q, C_STORAGE[tensor_type_of(g.operand.value).elt], const=True
            )

        def dst(g: Gather) -> Expr:
            if g.dest is not None:
                return g.dest
            if g.mine is not None:
                return g.mine
            return peer(g.operand.param, self.me, C_STORAGE[tensor_type_of(g.operand.value).elt])

        def at(g: Gather, element: Expr, coords: Sequence[Expr] = ()) -> Expr:
            """Where member q's element lands: its own base instead of this rank's."""
            base = g.operand.base
            index = rewrite(
                self.index_of(g.operand), lambda x: Index(g.bases, q) if x is base else None
            )
            return self.at_element(index, element, coords)

        def src_at(g: Gather, element: Expr, coords: Sequence[Expr] = ()) -> Expr:
            """Where member q's element is read: its index within q's piece in q's staging
            buffer, or its place in q's gathered buffer."""
            return g.staged(element, at(g, element, coords))

        # Member q's extents of the collapsed dims (uneven slices: its own).
        sizes = {id(self.dims[g]): Index(p, q) for g, p in self.peer_dims.items()}
        extents = [sizes.get(id(x), x) if x is not None else None for x in self.dims]

        def coordinates(element: Expr, coords: list[Var]) -> list[Stmt]:
            return self.coordinates(element, coords, extents) if coords else []

        j = Var(I64, None, "j_")
        # Strided pieces: the element's coordinates as in the element body.
        i = self.i
        copies = [
            Assign(Index(dst(g), at(g, i)), Index(src(g), src_at(g, i))) for g in self.gathers
        ]
        element = (Decl(i, self.begin + j), *coordinates(i, self.coords), *copies)
        if not vector:
            per_peer: list[Stmt] = [*head, BlockStrideLoop(j, begin, end, element)]
        else:
            ok, qend = Var(BOOL, None, "qvec_"), Var(I64, None, "qend_")
            checks: list[Expr] = []
            for g in self.gathers:
                checks.append(call("coco_vec_aligned", src(g) + self.at_start(src_at(g, self.i))))
                checks.append(call("coco_vec_aligned", dst(g) + self.at_start(at(g, self.i))))
            checks += self.vector_coords(extents)
            # the vectors count from the chunk's start: a block's chunk of whole rows (a row
            # kernel's) need not start at a whole vector
            checks.append(binary("==", begin % self.lanes, 0))
            v, i0 = Var(I64, None, "v_"), Var(I64, None, "i0_")
            vc = [Var(I64, None, f"v{c.fallback}_") for c in self.coords]
            vec_body: list[Stmt] = [Decl(i0, self.begin + v * self.lanes), *coordinates(i0, vc)]
            for g in self.gathers:
                storage = C_STORAGE[tensor_type_of(g.operand.value).elt]
                x, y, k = Var(storage, None, "x_"), Var(storage, None, "y_"), Var(I32, None, "k_")
                lane_x, lane_y = Index(x, k), Index(y, k)
                if tensor_type_of(g.operand.value).elt in NARROW_FLOATS:
                    # the bits of the storage struct: g++ vectorizes no struct copy
                    lane_x, lane_y = Field(lane_x, "bits"), Field(lane_y, "bits")
                vec_body += [
                    VecIn(x, self.lanes, src(g) + src_at(g, i0, vc)),
                    VecOut(y, self.lanes, dst(g) + at(g, i0, vc)),
                    LaneLoop(k, self.lanes, (Assign(lane_y, lane_x),)),
                    VecStore(y, dst(g) + at(g, i0, vc)),
                ]
            tail = element
            per_peer = [
                *head,
                Decl(ok, all_of(checks)),
                Decl(qend, self.whole_vectors(ok, chunk)),
                BlockStrideLoop(v, begin / self.lanes, qend / self.lanes, tuple(vec_body)),
                BlockStrideLoop(j, qend, end, tail),
            ]
        # The peers in the order rotated by this rank (me + 1, me + 2, ...): were every rank
        # to pull from member 0 first, then 1, ..., one member would serve all the others'
        # reads at a time while the rest idled.
        step = Var(I32, None, "d_")
        rotated = Decl(q, (self.me + step) % self.nranks)
        return [For(step, Lit("1"), self.nranks, (rotated, *per_peer))]
