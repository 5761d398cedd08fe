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
  read in shared memory (one row each), stores results and pushes its piece of each gathered
  value into this rank's symmetric buffer;
* between phases, thread 0 combines each reduction's lane partials in lane order, rounds once,
  and computes the row values that depend on it (rsqrt(mean + eps)) into shared memory.

After its rows, the block runs the done step of the cross-rank protocol and pulls its rows
of every peer's pieces, as the elementwise form does (cuda_kernels.py). The order of every
sum is the oracle's (runtime/sim.py `reduce_rows`), so the kernel is bit-exact.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from coconet.core.program import CocoError
from coconet.dialects import coco
from coconet.dialects.coco import TensorType, tensor_type_of
from coconet.lowering.cuda_kernels import (
    C_COMPUTE,
    C_STORAGE,
    ElementwiseKernel,
    # the row form extends the elementwise kernel builder: one kernel family over two files
    _accumulator,  # pyright: ignore[reportPrivateUsage]
    _ElementwiseBuilder,  # pyright: ignore[reportPrivateUsage]
    _thread_zero,  # pyright: ignore[reportPrivateUsage]
    load_expr,
    store_expr,
    store_from_double,
)
from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    GRID_DIM,
    I64,
    Assign,
    Binary,
    Call,
    Cast,
    Combine,
    CType,
    Decl,
    Expr,
    Field,
    For,
    Identity,
    Index,
    Kernel,
    Lit,
    ReduceKind,
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

ELEMENT, ROW, SCALAR = "element", "row", "scalar"


def row_space_of(t: TensorType) -> TensorType:
    """The type a keepdims reduction over the last dim of `t` has."""
    return t.with_shape((*t.get_shape()[:-1], 1))


class RowCollectiveKernel(ElementwiseKernel):
    """A fused collective kernel whose ops include row reductions over the iteration's last
    dim (`count` elements per row)."""

    def build(self) -> Kernel:
        return _RowBuilder(self).build()


class _RowBuilder(_ElementwiseBuilder):
    def __init__(self, k: RowCollectiveKernel):
        super().__init__(k)
        it = k.iteration
        self.count = it.get_shape()[-1]
        self.row_type = row_space_of(it)
        self.row_start = Var(I64, None, "row_")
        self.lane = Var(I64, None, "lane_")
        self.element = Var(I64, None, "e_")
        self.phase = 0
        self.level: dict[SSAValue, int] = {}
        self.kind: dict[SSAValue, str] = {}
        self.row_slots: dict[SSAValue, Var] = {}  # row values, one shared slot each
        self.carried: dict[SSAValue, Var] = {}  # element values later phases read: a row each
        self.shared: list[Stmt] = []

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

    # -- values --------------------------------------------------------------------------

    def ref(self, v: SSAValue) -> Var:
        if v in self.local:
            return self.local[v]
        if v in self.row_slots:
            var = Var(C_COMPUTE[tensor_type_of(v).elt], v.name_hint, f"row{len(self.local)}")
            self.body.append(Decl(var, Index(self.row_slots[v], Lit("0"))))
            self.local[v] = var
            return var
        if v in self.carried and self.level[v] < self.phase:
            var = Var(C_COMPUTE[tensor_type_of(v).elt], v.name_hint, f"c{len(self.local)}")
            self.body.append(Decl(var, Index(self.carried[v], self.element)))
            self.local[v] = var
            return var
        return super().ref(v)

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
        reductions = [op for op in k.ops if isinstance(op, coco.ReduceDimsOp)]
        # values read in a later phase than their own: a shared row each
        for op in k.ops:
            if isinstance(op, coco.ReduceDimsOp):
                continue  # its input is accumulated in the input's own phase
            for v in op.operands:
                later = self.kind.get(v) == ELEMENT and self.level[v] < self.level[op.results[0]]
                if later and v not in self.carried:
                    self.carried[v] = self.shared_array(
                        v, C_COMPUTE[tensor_type_of(v).elt], self.count, "row"
                    )
        stored = {s.value for s in k.stores}
        for op in k.ops:
            res = op.results[0]
            if self.kind[res] != ROW:
                continue
            # a row value read after the thread-0 step computing it: a shared slot
            if res in stored or any(
                self.kind[use.operation.results[0]] == ELEMENT
                or self.level[use.operation.results[0]] != self.level[res]
                for use in res.uses
                if use.operation in k.ops
            ):
                self.row_slots[res] = self.shared_array(
                    res, C_COMPUTE[tensor_type_of(res).elt], 1, "val"
                )
        lanes = coco.ROW_LANES
        partials = {
            r: self.shared_array(r.result, _accumulator(r.input.type.elt), lanes, "lanes")
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
            for op in k.ops:
                res = op.results[0]
                if self.kind[res] == ELEMENT and self.level[res] == p:
                    self.compute(op)
            for res in k.peer_reductions:
                if p == 0:
                    self.ref(res)
            accs: dict[Operation, Var] = {}
            before: list[Stmt] = []
            after: list[Stmt] = []
            for r in reductions:
                if self.level[r.input] != p:
                    continue
                acc_t = _accumulator(r.input.type.elt)
                rkind = (
                    ReduceKind.SUM
                    if r.kind.data == coco.DimReductionKind.MEAN
                    else ReduceKind(r.kind.data)
                )
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
            lanes_loop = RowLanes(
                self.lane,
                self.element,
                Lit(str(self.count)),
                lanes,
                tuple(before),
                element,
                tuple(after),
            )
            # each phase declares its own variables (a kernel declares each one once)
            per_row += fresh_copy((lanes_loop,))
            finish = self.finish_rows(p, reductions, partials)
            if finish:
                per_row += [SyncBlock(), _thread_zero(*finish), SyncBlock()]

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
        stmts += [_thread_zero(self.peer_sync(SyncStep.ENTRY)), SyncBlock()]
        begin, end = Field(self.range, "begin"), Field(self.range, "end")
        stmts.append(For(self.row_start, begin, end, tuple(per_row), step=Lit(str(self.count))))
        stmts += [SyncBlock(), _thread_zero(self.peer_sync(SyncStep.DONE))]
        if self.gathers:
            stmts += [SyncBlock(), *self.pull(pull_vector)]
        return Kernel(k.name, tuple(self.params), tuple(stmts))

    def element_stores(self, p: int) -> None:
        it = self.k.iteration
        for s, param in zip(self.k.stores, self.out_params):
            if self.kind.get(s.value, ELEMENT) != ELEMENT or self.level.get(s.value, 0) != p:
                continue
            if not self.k.coincides(s.type, it):
                raise CocoError(f"[lower-fused-rows] a fused row kernel stores {s.type} over {it}")
            self.body.append(
                Assign(Index(param, self.i), store_expr(s.type.elt, self.ref(s.value)))
            )
        for g in self.gathers:
            if self.level.get(g.value, 0) != p:
                continue
            o = g.operand
            t = tensor_type_of(o.value)
            value = store_expr(t.elt, self.ref(g.value))
            index = self.index_of(o)
            mine = peer(o.param, self.me, C_STORAGE[t.elt])
            self.body.append(Assign(Index(mine, index), value, comment="comm.all_gather"))
            if g.dest is not None:
                self.body.append(Assign(Index(g.dest, index), value))

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
            acc_t = _accumulator(r.input.type.elt)
            rkind = (
                ReduceKind.SUM
                if r.kind.data == coco.DimReductionKind.MEAN
                else ReduceKind(r.kind.data)
            )
            total = Var(acc_t, None, f"total{len(out)}_")
            elt = r.result.type.elt
            value: Expr = total
            if r.kind.data == coco.DimReductionKind.MEAN:
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
