"""The row form of a fused collective kernel: reduce_scatter + computation with row-wise
reductions + all_gather in ONE kernel (AllReduce + residual + RMSNorm/LayerNorm + AllGather,
the fused kernel of inference engines and of Megatron's sequence parallelism).

The reduce_scatter slices the rows (a dim before the last), so each rank owns whole rows and
every row reduction (`coco.reduce_dims` over the last dim, keepdims) finishes inside one
block: block b of a rank takes a contiguous run of whole rows of its slice (the same rows of
every peer's input, as block b of every peer does), and for each row runs PHASES separated by
block synchronization:

* phase p walks the row in the fixed lane order of row reductions (`RowLanes`), computing the
  element values of level p (level = how many row reductions a value depends on): the first
  phase combines the row from every peer's input in rank order (the reduce_scatter), every
  phase accumulates its reductions in lane registers, keeps the element values later phases
  read in shared memory (one row each) where they fit, stores results and pushes its piece
  of each gathered value into this rank's symmetric buffer;
* a phase without reductions (the last: normalize and write) has no order to keep, so every
  thread of the block takes elements of the row (a block-stride loop: contiguous on the
  host, all of a GPU block's threads rather than ROW_LANES of them);
* between phases, thread 0 combines each reduction's lane partials in lane order, rounds once,
  and computes the row values that depend on it (rsqrt(mean + eps)) into shared memory.

Rows too long to keep every such value in shared memory (SHARED_ROW_BYTES) run in the
STREAMING form for the values that do not fit: a later phase derives them again from global
memory -- it re-reads the copy an earlier phase stored (this rank's piece of a gathered value
in its symmetric buffer, an output) or, where there is none, recomputes the value from its
operands (the reduce_scatter sum from the peers' symmetric inputs, a residual, ...). A value
is computed by the same expression from the same inputs in every phase and rounded alike,
and the order of every reduction is fixed by the lanes, not by where values are kept, so
both forms are bit-identical. The kernel keeps in shared memory first the values it could
only recompute, then those it could re-read, as long as they fit.

After its rows, the block runs the done step of the cross-rank protocol and pulls its rows
of every peer's pieces, as the elementwise form does (kernels/pull.py). The order of every
sum is the oracle's (runtime/sim.py `reduce_rows`), so the kernel is bit-exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.ir import Operation, SSAValue

from coconet.core.program import CocoError
from coconet.dialects import coco
from coconet.dialects.coco import TensorType, tensor_type_of
from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    GRID_DIM,
    Assign,
    Binary,
    BlockStrideLoop,
    Call,
    Cast,
    Combine,
    Decl,
    Expr,
    Field,
    For,
    Identity,
    Index,
    Kernel,
    Lit,
    RowLanes,
    SharedArray,
    Stmt,
    SyncBlock,
    SyncStep,
    Unused,
    Var,
    fresh_copy,
    peer,
    uses,
)
from coconet.lowering.kernels.elements import (
    C_COMPUTE,
    C_STORAGE,
    load_expr,
    store_expr,
    store_from_double,
)
from coconet.lowering.kernels.elementwise import ElementwiseBuilder, ElementwiseKernel
from coconet.lowering.kernels.reductions import row_kind
from coconet.lowering.kernels.statements import thread_zero
from coconet.lowering.signature import I64, CType

ELEMENT, ROW, SCALAR = "element", "row", "scalar"

# The static shared memory a row kernel may use (a GPU block gets 48 KiB without opting in):
# the element values it keeps between phases, its lane partials and row values. What does
# not fit is streamed: derived again from global memory by the phase that reads it.
SHARED_ROW_BYTES = 40 * 1024

# Bytes of one value in its compute type (C_COMPUTE), as a shared array holds it.
COMPUTE_BYTES = {
    "f16": 4,
    "bf16": 4,
    "f8E4M3FN": 4,
    "f8E5M2": 4,
    "f32": 4,
    "f64": 8,
    "i32": 8,
    "i64": 8,
    "i1": 1,
}


def row_space_of(t: TensorType) -> TensorType:
    """The type a keepdims reduction over the last dim of `t` has."""
    return t.with_shape((*t.get_shape()[:-1], 1))


class RowCollectiveKernel(ElementwiseKernel):
    """A fused collective kernel whose ops include row reductions over the iteration's last
    dim (`count` elements per row)."""

    def build(self) -> Kernel:
        return _RowBuilder(self).build()


class _RowBuilder(ElementwiseBuilder):
    def __init__(self, k: RowCollectiveKernel):
        super().__init__(k)
        it = k.iteration
        self.count = it.get_shape()[-1]
        self.row_type = row_space_of(it)
        self.row_start = Var(I64, None, "row_")
        self.lane = Var(I64, None, "lane_")
        self.element = Var(I64, None, "e_")
        self.phase = 0
        self.phases = 1
        self.level: dict[SSAValue, int] = {}
        self.kind: dict[SSAValue, str] = {}
        self.row_slots: dict[SSAValue, Var] = {}  # row values, one shared slot each
        self.carried: dict[SSAValue, Var] = {}  # element values later phases read: a row each
        # element values an earlier phase stored in this rank's memory: a later phase that
        # does not keep them re-reads them there
        self.copies: dict[SSAValue, Expr] = {}
        self.shared: list[Stmt] = []

    # -- the element's coordinates --------------------------------------------------------

    def build_indices(self) -> None:
        """The element's coordinates from its row's start, with the element's index in the row
        added to the innermost one (as a vector's lanes add theirs: kernels/vectors.py). Rows
        start at multiples of the row (ranks, blocks and overlap chunks take whole rows) and
        the innermost collapsed dim holds the last dim whole, so the coordinates of
        `begin + row_ + e_` are those of `begin + row_` with e_ added to the innermost. Its
        value is the same; but it is now affine in e_ (the rest is invariant over the row), so
        the host compiler vectorizes a phase reading an operand broadcast along the rows
        (RMSNorm's weight), which it did not through `i % count` for 8- and 16-bit types
        (the gather it would take has no AVX2 form): an f32 epilogue with a bf16 weight or an
        fp8 output ran its last phase scalar, 2-3x slower."""
        super().build_indices()
        if not self.coords:
            return
        at = next(n for n, st in enumerate(self.body) if st is self.index_stmts[0])
        base = [Var(I64, None, f"r{c.fallback}_") for c in self.coords]
        stmts = self.coordinates(self.begin + self.row_start, base, self.dims)
        stmts += [Decl(c, b) for c, b in zip(self.coords[:-1], base[:-1], strict=True)]
        stmts += [Decl(self.coords[-1], base[-1] + self.element), Unused(tuple(self.coords))]
        self.body[at : at + len(self.index_stmts)] = stmts
        self.index_stmts = stmts

    # -- classification ------------------------------------------------------------------

    def space(self, v: SSAValue) -> str:
        t = tensor_type_of(v)
        if t.rank == 0:
            return SCALAR
        if t.with_element_type(self.k.iteration.element_type) == self.row_type.with_element_type(
            self.k.iteration.element_type
        ):
            return ROW
        return ELEMENT

    def classify(self) -> None:
        for res in self.k.peer_reductions:
            self.level[res], self.kind[res] = 0, ELEMENT
        for op in self.k.ops:
            res = op.results[0]
            self.classify_aliases(op.operands)
            inner = [v for v in op.operands if v in self.level]
            if isinstance(op, coco.ReduceDimsOp):
                src = op.input
                if (
                    self.kind.get(src) != ELEMENT
                    or op.reduced_dims != (self.k.iteration.rank - 1,)
                    or not op.keeps_dims
                ):
                    raise CocoError(
                        f"[lower-fused-rows] {op.name} in a fused collective kernel reduces the "
                        "last dim of a value of the kernel's iteration space, keeping it"
                    )
                self.level[res], self.kind[res] = self.level[src] + 1, ROW
                continue
            kind = self.space(res)
            level = max((self.level[v] for v in inner), default=0)
            if kind == ROW and any(self.kind[v] == ELEMENT for v in inner):
                raise CocoError(
                    f"[lower-fused-rows] {op.name} computes a row value from element values"
                )
            if kind == SCALAR and inner and any(self.kind[v] != SCALAR for v in inner):
                raise CocoError(f"[lower-fused-rows] {op.name} reduces without a reduction op")
            self.level[res], self.kind[res] = level, kind
        self.classify_aliases(list(self.k.aliases))
        for v, _gathered in self.k.all_gathers:
            if self.kind.get(v) != ELEMENT:
                # the pull moves whole pieces of the iteration: a row value (one per row) has
                # no such piece
                raise CocoError(
                    f"[lower-fused-rows] the all_gather of %{v.name_hint or 'a row value'} "
                    f"({tensor_type_of(v)}) in a fused row kernel gathers one value per row, "
                    f"not the rows' elements; gather it outside the fused region"
                )

    def classify_aliases(self, values: Sequence[SSAValue]) -> None:
        """A collective over a group of one member (`aliases`) is its input's value: the
        input's phase and kind (an argument's: element values of phase 0)."""
        for v in values:
            src = self.k.aliases.get(v)
            if src is not None and v not in self.level:
                self.level[v] = self.level.get(src, 0)
                self.kind[v] = self.kind.get(src, ELEMENT)

    # -- values --------------------------------------------------------------------------

    def ref(self, v: SSAValue) -> Var:
        if v in self.local:
            return self.local[v]
        if v in self.row_slots:
            var = Var(C_COMPUTE[tensor_type_of(v).elt], v.name_hint, f"row{len(self.local)}")
            self.body.append(Decl(var, Index(self.row_slots[v], Lit("0"))))
            self.local[v] = var
            return var
        if self.kind.get(v) == ELEMENT and self.level[v] < self.phase:
            if v in self.carried:
                var = Var(C_COMPUTE[tensor_type_of(v).elt], v.name_hint, f"c{len(self.local)}")
                self.body.append(Decl(var, Index(self.carried[v], self.element)))
                self.local[v] = var
                return var
            return self.rederive(v)
        return super().ref(v)

    def rederive(self, v: SSAValue) -> Var:
        """An element value of an earlier phase that the kernel does not keep (the streaming
        form): re-read from the copy an earlier phase stored, or else recomputed by the
        same expression from its operands (each derived the same way in turn; the
        reduce_scatter sums the peers' inputs again), so it has the same bits."""
        elt = tensor_type_of(v).elt
        copy = self.copies.get(v)
        if copy is not None:
            var = Var(C_COMPUTE[elt], v.name_hint, f"s{len(self.local)}")
            self.body.append(Decl(var, load_expr(elt, copy), comment="re-read, not kept"))
            self.local[v] = var
            return var
        if v in self.k.peer_reductions or v in self.k.aliases:
            return super().ref(v)
        assert isinstance(v.owner, Operation)
        return self.compute(v.owner)

    def stored_copies(self) -> dict[SSAValue, Expr]:
        """Where this rank's phases store element values (an output or update over the
        iteration, this rank's piece of a gathered value), in their element types: only
        the storing thread writes there before the peers' pulls, so it reads them back."""
        it = self.k.iteration
        copies: dict[SSAValue, Expr] = {}
        for s, param in zip(self.k.stores, self.out_params):
            if (
                self.kind.get(s.value) == ELEMENT
                and not self.overwrites(s.target)  # written in the last phase only
                and self.k.coincides(s.type, it)
                and s.type.elt == tensor_type_of(s.value).elt
            ):
                copies.setdefault(s.value, Index(param, self.i))
        for g in self.gathers:
            t = tensor_type_of(g.operand.value)
            if self.kind.get(g.value) == ELEMENT and t.elt == tensor_type_of(g.value).elt:
                mine = peer(g.operand.param, self.me, C_STORAGE[t.elt])
                copies.setdefault(g.value, Index(mine, g.staged(self.i, self.index_of(g.operand))))
        return copies

    def overwrites(self, target: SSAValue | None) -> bool:
        """Whether writing `target` (an updated argument) overwrites an argument the kernel
        reads: such writes wait for the last phase (`element_stores`)."""
        if target is None:
            return False
        return target in self.k.inputs or any(
            src is target for src, _kind in self.k.peer_reductions.values()
        )

    def choose_kept(self, later: list[SSAValue], budget: int) -> list[SSAValue]:
        """The element values read in a later phase that the kernel keeps in shared memory:
        all of them when they fit `budget` bytes; otherwise, as long as they fit, first
        those a later phase would recompute, then those it would re-read (one load)."""
        size = {v: self.count * COMPUTE_BYTES[tensor_type_of(v).elt] for v in later}
        if sum(size.values()) <= budget:
            return later
        kept: set[SSAValue] = set()
        for v in sorted(later, key=lambda v: v in self.copies):
            if size[v] <= budget:
                kept.add(v)
                budget -= size[v]
        return [v for v in later if v in kept]

    def shared_array(self, v: SSAValue, ctype: CType, size: int, suffix: str) -> Var:
        hint = f"{v.name_hint}_{suffix}" if v.name_hint else None
        var = Var(ctype, hint, f"{suffix}{len(self.shared)}_")
        self.shared.append(SharedArray(var, size))
        return var

    # -- the kernel ----------------------------------------------------------------------

    def build(self) -> Kernel:
        k = self.k
        if k.reductions:
            raise CocoError(
                "[lower-fused-rows] a fused collective kernel with row reductions cannot also "
                "finish full reductions"
            )
        self.build_params()
        self.build_indices()
        prelude = tuple(self.body)
        if self.gidx is not None:  # dropout's index: not every phase draws
            prelude += (Unused((self.gidx,)),)
        self.classify()
        phases = 1 + max((lv for v, lv in self.level.items() if self.kind[v] == ELEMENT), default=0)
        self.phases = phases
        reductions = [op for op in k.ops if isinstance(op, coco.ReduceDimsOp)]
        # Element values read in a later phase than their own: a shared row each where
        # they fit, streamed (derived again in the phase reading them) otherwise.
        later: list[SSAValue] = []
        for op in k.ops:
            if isinstance(op, coco.ReduceDimsOp):
                continue  # its input is accumulated in the input's own phase
            for v in op.operands:
                if (
                    self.kind.get(v) == ELEMENT
                    and self.level[v] < self.level[op.results[0]]
                    and v not in later
                ):
                    later.append(v)
        deferred = [s.value for s in k.stores if self.overwrites(s.target)]
        deferred += [
            g.value for g in self.gathers if self.overwrites(k.gather_targets.get(g.operand.value))
        ]
        for v in deferred:  # written in the last phase
            if self.kind.get(v) == ELEMENT and self.level[v] < phases - 1 and v not in later:
                later.append(v)
        stored = {s.value for s in k.stores}
        # a row value read after the thread-0 step computing it: a shared slot
        slots = [
            op.results[0]
            for op in k.ops
            if self.kind[op.results[0]] == ROW
            and (
                op.results[0] in stored
                or any(
                    self.kind[use.operation.results[0]] == ELEMENT
                    or self.level[use.operation.results[0]] != self.level[op.results[0]]
                    for use in op.results[0].uses
                    if use.operation in k.ops
                )
            )
        ]
        lanes = coco.ROW_LANES
        fixed = sum(COMPUTE_BYTES[tensor_type_of(v).elt] for v in slots)
        fixed += lanes * 8 * len(reductions)  # lane partials, in double (int64)
        self.copies = self.stored_copies()
        for v in self.choose_kept(later, SHARED_ROW_BYTES - fixed):
            self.carried[v] = self.shared_array(
                v, C_COMPUTE[tensor_type_of(v).elt], self.count, "row"
            )
        for res in slots:
            self.row_slots[res] = self.shared_array(
                res, C_COMPUTE[tensor_type_of(res).elt], 1, "val"
            )
        partials = {
            r: self.shared_array(
                r.result, row_kind(r.kind.data, r.input.type.elt)[2], lanes, "lanes"
            )
            for r in reductions
        }
        # scalars (constants, scalar arithmetic) once per block
        self.body = []
        for op in k.ops:
            if self.kind[op.results[0]] == SCALAR:
                self.compute(op)
        if self.body:
            raise CocoError("[lower-fused-rows] scalar values must not depend on elements")

        per_row: list[Stmt] = []
        for p in range(phases):
            self.phase = p
            self.body = []
            self.local = {v: x for v, x in self.local.items() if x in self.invariant}
            needed = self.needed(p, reductions)
            for op in k.ops:
                if op.results[0] in needed:
                    self.compute(op)
            for res in k.peer_reductions:
                if p == 0 and (res in needed or not res.uses):
                    self.ref(res)
            accs: dict[Operation, Var] = {}
            before: list[Stmt] = []
            after: list[Stmt] = []
            for r in reductions:
                if self.level[r.input] != p:
                    continue
                _, rkind, acc_t = row_kind(r.kind.data, r.input.type.elt)
                acc = Var(acc_t, None, f"acc{len(accs)}_")
                accs[r] = acc
                before.append(Decl(acc, Identity(rkind, acc_t), const=False))
                self.body.append(
                    Assign(acc, Combine(rkind, acc_t, acc, Cast(acc_t, self.ref(r.input))))
                )
                after.append(Assign(Index(partials[r], self.lane), acc))
            for v, buf in self.carried.items():
                if self.level[v] == p:
                    self.body.append(Assign(Index(buf, self.element), self.ref(v)))
            self.element_stores(p)
            element: tuple[Stmt, ...] = (*prelude, *self.body)
            if uses(element, self.i):  # a phase may read only shared rows (softmax's last)
                element = (Decl(self.i, self.begin + self.row_start + self.element), *element)
            loop: Stmt
            if before:
                loop = RowLanes(
                    self.lane,
                    self.element,
                    Lit(str(self.count)),
                    lanes,
                    tuple(before),
                    element,
                    tuple(after),
                )
            else:
                # no reduction in this phase (the last: normalize and write), so no order to
                # keep: every thread of the block takes elements, contiguous on the host
                loop = BlockStrideLoop(self.element, Lit("0"), Lit(str(self.count)), element)
            # each phase declares its own variables (a kernel declares each one once)
            per_row += fresh_copy((loop,))
            finish = self.finish_rows(p, reductions, partials)
            if finish:
                per_row += [SyncBlock(), thread_zero(*finish), SyncBlock()]

        if phases > 1:
            per_row.append(SyncBlock())  # the next row reuses the shared rows and values
        stmts: list[Stmt] = [*self.shared]
        pull_vector = bool(self.gathers) and all(g.operand.linear for g in self.gathers)
        if pull_vector:
            narrowest = min(self.vector_elements(all_accesses=False))
            stmts.append(Decl(self.lanes, Lit(f"COCO_VEC_BYTES / {narrowest}")))
        chunk = Call(
            "coco_chunk", (self.end - self.begin, GRID_DIM, BLOCK_IDX, Lit(str(self.count)))
        )
        # Blocks take runs of whole rows; so does a pull of member q's uneven piece.
        self.align = Lit(str(self.count))
        stmts += [Decl(self.range, chunk), *self.hoisted]
        if k.is_collective:  # (over a group of one member: a plain kernel)
            stmts += [*self.peers_entry(), SyncBlock()]
        begin, end = Field(self.range, "begin"), Field(self.range, "end")
        stmts.append(For(self.row_start, begin, end, tuple(per_row), step=Lit(str(self.count))))
        if k.is_collective:
            stmts += [SyncBlock(), thread_zero(self.peer_sync(SyncStep.DONE))]
        if self.gathers:
            stmts += [SyncBlock(), *self.pull(pull_vector)]
        return Kernel(k.name, tuple(self.params), tuple(stmts))

    def phase_writes(self, p: int) -> list[tuple[Expr, SSAValue, str, str]]:
        """Phase p's element stores and pushes (place, value, element type, comment): each
        value's in its own phase, except writes over an argument the kernel reads (an
        update of it, a gathered value assembled in it), which wait for the last phase,
        after every phase has read the argument (a value derived from it again reads it as
        it was)."""
        it = self.k.iteration
        last = p == self.phases - 1
        writes: list[tuple[Expr, SSAValue, str, str]] = []
        for s, param in zip(self.k.stores, self.out_params):
            if self.kind.get(s.value, ELEMENT) != ELEMENT:
                continue
            if not (last if self.overwrites(s.target) else self.level.get(s.value, 0) == p):
                continue
            if not self.k.coincides(s.type, it):
                raise CocoError(f"[lower-fused-rows] a fused row kernel stores {s.type} over {it}")
            writes.append((Index(param, self.i), s.value, s.type.elt, ""))
        for g in self.gathers:
            o = g.operand
            elt = tensor_type_of(o.value).elt
            index = self.index_of(o)
            own = self.level.get(g.value, 0) == p
            if own:
                mine = peer(o.param, self.me, C_STORAGE[elt])
                writes.append(
                    (Index(mine, g.staged(self.i, index)), g.value, elt, "comm.all_gather")
                )
            if g.dest is not None:
                target = self.k.gather_targets.get(o.value)
                if last if self.overwrites(target) else own:
                    writes.append((Index(g.dest, index), g.value, elt, ""))
        return writes

    def element_stores(self, p: int) -> None:
        """Phase p's writes (`phase_writes`), every value read before any write."""
        writes = self.phase_writes(p)
        values = [self.ref(v) for _place, v, _elt, _comment in writes]
        for (place, _v, elt, comment), var in zip(writes, values):
            self.body.append(Assign(place, store_expr(elt, var), comment=comment))

    def needed(self, p: int, reductions: list[coco.ReduceDimsOp]) -> set[SSAValue]:
        """The element values of level p that phase p computes: those its reductions
        accumulate, it keeps for later phases or it writes, and the values of level p they
        are computed from. A value only a later phase reads, and does not keep, is left to
        that phase (streamed)."""
        work = [r.input for r in reductions if self.level[r.input] == p]
        work += [v for v in self.carried if self.level[v] == p]
        work += [v for _place, v, _elt, _comment in self.phase_writes(p)]
        ops = set(self.k.ops)
        needed: set[SSAValue] = set()
        while work:
            v = work.pop()
            if v in needed or self.kind.get(v) != ELEMENT or self.level[v] != p:
                continue
            needed.add(v)
            if isinstance(v.owner, Operation) and v.owner in ops:
                work += v.owner.operands
            elif v in self.k.aliases:  # (over one member: its input's element)
                work.append(self.k.aliases[v])
        return needed

    def finish_rows(
        self, p: int, reductions: list[coco.ReduceDimsOp], partials: dict[coco.ReduceDimsOp, Var]
    ) -> list[Stmt]:
        """Thread 0 after phase p: each reduction of the phase from its lane partials, in lane
        order, rounded once; then the row values that depend on them, into shared memory."""
        out: list[Stmt] = []
        self.body = out
        self.local = {v: x for v, x in self.local.items() if x in self.invariant}
        k_ = Var(I64, None, "k_")
        for r in reductions:
            if self.level[r.input] != p:
                continue
            mean, rkind, acc_t = row_kind(r.kind.data, r.input.type.elt)
            total = Var(acc_t, None, f"total{len(out)}_")
            elt = r.result.type.elt
            value: Expr = total
            if mean:
                value = Binary("/", total, Cast(acc_t, Lit(str(self.count))))
            out += [
                Decl(total, Identity(rkind, acc_t), const=False),
                For(
                    k_,
                    Lit("0"),
                    Lit(str(coco.ROW_LANES)),
                    (Assign(total, Combine(rkind, acc_t, total, Index(partials[r], k_))),),
                ),
            ]
            var = Var(C_COMPUTE[elt], r.result.name_hint, f"t{len(self.local)}")
            rounded = load_expr(elt, store_from_double(elt, value))
            out.append(Decl(var, rounded, comment=f"coco.reduce_dims {r.kind.data}"))
            self.local[r.result] = var
            if r.result in self.row_slots:
                out.append(Assign(Index(self.row_slots[r.result], Lit("0")), var))
        for op in self.k.ops:
            res = op.results[0]
            if isinstance(op, coco.ReduceDimsOp) or self.kind[res] != ROW:
                continue
            if self.level[res] != p + 1:
                continue
            var = self.compute(op)
            if res in self.row_slots:
                out.append(Assign(Index(self.row_slots[res], Lit("0")), var))
        row_index = (self.begin + self.row_start) / Lit(str(self.count))
        for s, param in zip(self.k.stores, self.out_params):
            if self.kind.get(s.value) == ROW and self.level[s.value] == p + 1:
                out.append(
                    Assign(Index(param, row_index), store_expr(s.type.elt, self.ref(s.value)))
                )
        return out
