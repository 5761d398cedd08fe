"""The vector loop of an elementwise kernel: over whole vectors of the block's chunk, its
contiguous accesses (and the peers' pieces of a reduce_scatter) are read and written as
vectors -- 16-byte accesses on a GPU, a tile the compiler vectorizes on the host -- all loads
issued first, and the element body runs once per lane; the element loop does the rest."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coconet.dialects.coco import tensor_type_of
from coconet.lowering.kernel_ir import (
    PEER_BATCH,
    Assign,
    BlockStrideLoop,
    Cast,
    Combine,
    Decl,
    Expr,
    Field,
    For,
    Index,
    LaneLoop,
    Lit,
    LoadsIssued,
    LocalArray,
    Param,
    PeerSlots,
    PeerVecIn,
    Select,
    Stmt,
    Unused,
    Var,
    VecIn,
    VecOut,
    VecStore,
    all_of,
    binary,
    peer,
    rewrite,
    uses,
)
from coconet.lowering.kernels.builder_state import BuilderState, PeerReduction
from coconet.lowering.kernels.elements import (
    C_STORAGE,
    STORAGE_BYTES,
    accumulate_step,
    load_expr,
)
from coconet.lowering.kernels.statements import call, without_zeros
from coconet.lowering.signature import BOOL, I32, I64

# The most checks one statement ANDs together (vector_end): kernel IR nests as deep as a chain
# of operators is long, and the printer and the IR's walks recurse on it.
CONJUNCTION_TERMS = 32


class VectorBuilder(BuilderState):
    """The vector loop and the checks that choose it."""

    def contiguous_peers(self) -> bool:
        """Whether every peer access is at consecutive positions within a vector."""
        peers = [*self.peer_operands.values(), *(g.operand for g in self.gathers)]
        return all(self.contiguous(o) for o in peers)

    def vector_coords(self, extents: Sequence[Expr | None]) -> list[Expr]:
        """Block-uniform conditions under which the vectors of a chunk keep whole within the
        innermost collapsed dim (so each vector's coordinates are computed once, its lanes
        adding k along that dim) and every vector of a coordinate-mapped access is aligned
        when its first is: the innermost extent (`extents[-1]`) and the launch's first
        element are whole vectors, and every outer stride of such an access is a whole
        number of 16-byte units."""
        if not self.coords:
            return []
        conds: list[Expr] = []
        if len(self.coords) > 1:
            inner = extents[-1]
            assert inner is not None
            conds += [
                binary("==", inner % self.lanes, 0),
                binary("==", self.begin % self.lanes, 0),
            ]
        mapped = [*self.operands.values(), *self.peer_operands.values()]
        mapped += [g.operand for g in self.gathers]
        for o in mapped:
            if o.identity or o.linear or o.scalar or not self.contiguous(o):
                continue
            unit = 16 // STORAGE_BYTES[tensor_type_of(o.value).elt]
            if isinstance(o.strides[-1], Param):  # 1 (nothing after the innermost dim)
                conds.append(binary("==", o.strides[-1], 1))
            for stride in o.strides[:-1]:
                if stride is None or unit == 1:
                    continue
                if isinstance(stride, Lit):
                    if int(stride.text) % unit:
                        conds.append(Lit("false"))
                    continue
                conds.append(binary("==", stride % unit, 0))
        return conds

    def at_start(self, index: Expr) -> Expr:
        """An access's index at the launch's first element, up to whole vectors (where the
        alignment of its first vector is decided: `vector_coords`)."""
        zero = {id(c): Lit("0") for c in self.coords}
        at = rewrite(
            index,
            lambda x: (
                self.begin if x is self.i else zero.get(id(x)) if isinstance(x, Var) else None
            ),
        )
        return without_zeros(at)

    def vector_elements(self, *, all_accesses: bool) -> list[int]:
        """Bytes of the elements the kernel moves as vectors (the pull's, or every one)."""
        sizes = [STORAGE_BYTES[tensor_type_of(g.operand.value).elt] for g in self.gathers]
        if all_accesses:
            sizes += [STORAGE_BYTES[r.elt] for r in self.peer_reads.values()]
            accesses = [*self.vec_loads.values(), *self.vec_stores.values()]
            sizes += [STORAGE_BYTES[a.elt] for a in accesses]
        return sizes

    def whole_vectors(self, ok: Expr, chunk: Var | None = None) -> Expr:
        """Where the vectors of the block's chunk (or `chunk`) end (its start where `ok` does
        not hold)."""
        r = self.range if chunk is None else chunk
        begin, end = Field(r, "begin"), Field(r, "end")
        return Select(ok, begin + (end - begin) / self.lanes * self.lanes, begin)

    def at_element(self, index: Expr, element: Expr, coords: Sequence[Expr] = ()) -> Expr:
        """`index` at `element`, whose coordinates (if the index reads any) are `coords`."""
        at = {id(c): x for c, x in zip(self.coords, coords)}
        return rewrite(
            index,
            lambda x: element if x is self.i else at.get(id(x)) if isinstance(x, Var) else None,
        )

    def vector_end(self) -> tuple[list[Stmt], Var]:
        """Block-level statements that find where the chunk's whole vectors end: at its start
        unless every vector access is aligned (block-uniform: a GPU takes 16-byte accesses,
        which need it, and the host takes the same path); and that end."""
        p = Var(I32, None, "p_")

        def aligned(pointer: Expr, index: Expr) -> Expr:
            return call("coco_vec_aligned", pointer + self.at_start(index))

        mine = [aligned(a.pointer, a.index) for a in self.vec_loads.values()]
        mine += [aligned(a.pointer, a.index) for a in self.vec_stores.values()]
        mine += self.vector_coords(self.dims)
        peers = [
            aligned(
                peer(r.operand.param, p, C_STORAGE[r.elt], const=True), self.index_of(r.operand)
            )
            for r in self.peer_reads.values()
        ]
        ok = Var(BOOL, None, "vec_")
        vend = Var(I64, None, "vend_")
        # a kernel of many operands (a fused chain of hundreds of layers) ANDs its checks a
        # bounded number at a time: one `&&` chain of them all nests as deep as it is long,
        # past Python's recursion limit in the printer and the kernel IR's walks
        n = CONJUNCTION_TERMS
        stmts: list[Stmt] = [Decl(ok, all_of(mine[:n]), const=not peers and len(mine) <= n)]
        stmts += [Assign(ok, all_of([ok, *mine[i : i + n]])) for i in range(n, len(mine), n)]
        if peers:
            body = tuple(
                Assign(ok, all_of([ok, *peers[i : i + n]])) for i in range(0, len(peers), n)
            )
            stmts.append(For(p, Lit("0"), self.nranks, body))
        stmts.append(Decl(vend, self.whole_vectors(ok)))
        return stmts, vend

    def vector_loops(self, element: tuple[Stmt, ...]) -> list[Stmt]:
        """The vector loop over the chunk's whole vectors, then the element loop over the
        rest."""
        begin, end = Field(self.range, "begin"), Field(self.range, "end")
        stmts, vend = self.vector_end()
        v = Var(I64, None, "v_")
        return [
            *stmts,
            BlockStrideLoop(v, begin / self.lanes, vend / self.lanes, self.vector_body(v)),
            BlockStrideLoop(self.j, vend, end, element),
        ]

    def vector_body(
        self, v: Var, then: Callable[[Var], list[Stmt]] | None = None
    ) -> tuple[Stmt, ...]:
        """One vector of the chunk: the element body, its contiguous loads and stores done as
        vectors around a loop over the lanes (a fresh copy of the element body's variables);
        `then(k)`: statements ending lane k's body.

        Loads first (coco_device.h, VECTORS): every load of the vector is declared before any
        lane math -- the peers' pieces of each reduce_scatter (the farthest, first), then the
        other inputs in the body's order -- and only then are the peers combined (in rank
        order) and the lanes computed, so a GPU thread waits for memory once per vector."""
        L = self.lanes
        i0 = Var(I64, None, "i0_")
        k = Var(I32, None, "k_")
        prologue: list[Stmt] = []
        peer_loads: list[Stmt] = []
        loads: list[Stmt] = []
        outs: list[Stmt] = []
        combines: list[Stmt] = []
        lane: list[Stmt] = []
        epilogue: list[Stmt] = []
        # The vector's coordinates, once (the lanes are consecutive along the innermost
        # collapsed dim, which the vector does not cross: vector_coords).
        vc = [Var(I64, None, f"v{c.fallback}_") for c in self.coords]
        if self.coords:
            prologue += self.coordinates(i0, vc, self.dims)
            lane += [Decl(c, x) for c, x in zip(self.coords[:-1], vc[:-1])]
            lane += [Decl(self.coords[-1], vc[-1] + k), Unused(tuple(self.coords))]
        skipped = {id(r.combine) for r in self.peer_reads.values()}
        skipped |= {id(st) for st in self.index_stmts}
        self.vec_coords = vc
        for st in self.body:
            if id(st) in skipped:
                continue
            if id(st) in self.peer_reads:
                r = self.peer_reads[id(st)]
                arr = Var(r.acc.ctype, f"{r.acc.hint}_v" if r.acc.hint else None, "acc_v")
                load, combine = self.peer_vector(r, arr, i0)
                peer_loads += load
                combines += combine
                lane.append(Decl(r.acc, Index(arr, k)))
            elif id(st) in self.vec_loads:
                a = self.vec_loads[id(st)]
                arr = Var(C_STORAGE[a.elt], f"{a.name}_v", "in_v")
                loads.append(VecIn(arr, L, a.pointer + self.at_element(a.index, i0, vc)))
                assert a.target is not None
                lane.append(Decl(a.target, load_expr(a.elt, Index(arr, k))))
            elif id(st) in self.vec_stores:
                a = self.vec_stores[id(st)]
                arr = Var(C_STORAGE[a.elt], f"{a.name}_v", "out_v")
                dst = a.pointer + self.at_element(a.index, i0, vc)
                outs.append(VecOut(arr, L, dst))
                assert a.value is not None
                assert isinstance(st, Assign)
                lane.append(Assign(Index(arr, k), a.value, comment=st.comment))
                epilogue.append(VecStore(arr, dst))
            else:
                lane.append(st)
        if then is not None:
            lane += then(k)
        if uses(tuple(lane), self.i):
            lane.insert(0, Decl(self.i, i0 + k))
        body = (
            Decl(i0, self.begin + v * L),
            *prologue,
            *peer_loads,
            *loads,
            *self.loads_issued([*peer_loads, *loads]),
            *outs,
            *combines,
            LaneLoop(k, L, tuple(lane)),
            *epilogue,
        )
        # The element body's statements appear here and in the element loop after this one:
        # shared, each loop's scope declaring their variables (the printer scopes names).
        return body

    def loads_issued(self, loads: list[Stmt]) -> list[Stmt]:
        """The fence after the loads of a vector iteration (coco_device.h coco_loads_issued):
        where there are two loads or more, nothing computes on loaded data before all are
        issued."""
        vectors = tuple(st.var for st in loads if isinstance(st, VecIn | PeerVecIn))
        return [LoadsIssued(self.begin, vectors)] if len(vectors) > 1 else []

    def peer_vector(self, r: PeerReduction, arr: Var, i0: Var) -> tuple[list[Stmt], list[Stmt]]:
        """A reduce_scatter's vector `arr`: the statements that load every peer's piece (a
        batch of COCO_PEER_BATCH peers, in registers on a GPU), and those that combine them
        IN RANK ORDER (the oracle's order, whatever order the loads were issued in) -- the
        first batch, then, for groups larger than a batch, each further batch loaded and
        combined in turn."""
        L, elt, acc_t = self.lanes, r.elt, r.acc.ctype
        storage = C_STORAGE[elt]
        table = r.operand.param
        index = self.at_element(self.index_of(r.operand), i0, self.vec_coords)
        hint = r.acc.hint.removesuffix("_acc") + "_peers_v" if r.acc.hint else None

        def item(batch: Var, slot: Expr, k: Var) -> Expr:
            return Cast(acc_t, load_expr(elt, Index(Index(batch, slot), k)))

        def combined(batch: Var, first: Expr, start: int) -> PeerSlots:
            """The batch's slots from `start` on, each combined into `arr` if its peer
            exists: a select, not a branch, on a GPU (ptxas sinks loads issued before a
            branch past it, to their use after it). The host tests the same condition before
            the slot (COCO_FOR_PEER_SLOTS), so the compiler knows the select true, hoists the
            peer's address and vectorizes the lanes; through the select it loaded the
            address per lane, a gather, which has no AVX2 form for 8- and 16-bit values: an
            fp8 gradient's peers were widened one element at a time (Adam's fused step at 2
            ranks took 2x the f32 one)."""
            s, k = Var(I32, None, "s_"), Var(I32, None, "k_")
            exists = binary("<", s if isinstance(first, Lit) else first + s, self.group)
            combine = accumulate_step(
                r.acc_elt, Combine(r.kind, acc_t, Index(arr, k), item(batch, s, k))
            )
            step = Assign(Index(arr, k), Select(exists, combine, Index(arr, k)))
            return PeerSlots(s, Lit(str(start)), exists, (LaneLoop(k, L, (step,)),))

        x = Var(storage, hint, "peers_v")
        k0 = Var(I32, None, "k_")
        loads: list[Stmt] = [PeerVecIn(x, L, table, index, Lit("0"), self.group, self.me)]
        b, y = Var(I32, None, "b_"), Var(storage, None, "more_v")
        more = (PeerVecIn(y, L, table, index, b, self.group, self.me), combined(y, b, 0))
        combine: list[Stmt] = [
            LocalArray(arr, L),
            # Peer 0 (a group has one): the accumulator starts at its value, not at the
            # identity (-0.0 + 0.0 would be +0.0).
            LaneLoop(k0, L, (Assign(Index(arr, k0), item(x, Lit("0"), k0)),)),
            combined(x, Lit("0"), 1),
            For(b, PEER_BATCH, self.group, more, step=PEER_BATCH),
        ]
        return loads, combine
