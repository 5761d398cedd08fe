"""Full reductions finished inside a fused collective kernel and all-reduced across its group
(LAMB's norms).

Each thread accumulates its elements in double (in a fixed order; a max or min of floats in
float, which gives the same bits at twice the vector width), the block combines its
threads in order into partials[block]; the LAST block of the rank to finish (an atomic
ticket: no block ever waits for another block of its rank) combines the blocks in order,
rounds the rank's partial to the element type as the unfused reduce does, and exchanges it
with the last blocks of its peers through symmetric memory; every rank then combines the
partials in rank order, in double, and rounds once: the all_reduce. That exchange runs after
the done-flags, which depend only on same-index blocks, so no rank can wait on a block its
own rank has not started."""

from __future__ import annotations

from coconet.dialects.coco import tensor_type_of
from coconet.dialects.reduction import Reduction
from coconet.lowering.kernel_ir import (
    BLOCK_DIM,
    BLOCK_IDX,
    GRID_DIM,
    THREAD_IDX,
    Assign,
    Cast,
    Combine,
    Decl,
    Expr,
    ExprStmt,
    Field,
    For,
    ForThreads,
    Identity,
    Index,
    Lit,
    SharedArray,
    SharedDyn,
    Stmt,
    SyncBlock,
    SyncStep,
    Var,
    peer,
)
from coconet.lowering.kernels.elements import load_expr, reduce_accumulator, store_from_double
from coconet.lowering.kernels.reductions import lane_partials
from coconet.lowering.kernels.statements import call, row_element, thread_zero
from coconet.lowering.kernels.vectors import VectorBuilder
from coconet.lowering.signature import BOOL, F64, I32, U32, CType


class ReductionBuilder(VectorBuilder):
    """Full reductions inside the kernel, all-reduced across the group."""

    def kinds(self) -> list[tuple[Reduction, CType]]:
        """Each reduction's kind and accumulator type."""
        return [
            (Reduction(kind), reduce_accumulator(tensor_type_of(v).elt, Reduction(kind)))
            for v, kind, _ in self.k.reductions
        ]

    def terms(self, values: list[Var]) -> list[Expr]:
        """What each element adds to each reduction, in its accumulator type: its value, or
        for a norm (a fused reduction's kernel finishes one on the rank) its square."""
        out: list[Expr] = []
        for v, (kind, acc) in zip(values, self.kinds()):
            value = Cast(acc, v)
            out.append(value * value if kind == Reduction.NORM else value)
        return out

    def reducing_loop(
        self, element: tuple[Stmt, ...], values: list[Var], vector: bool
    ) -> list[Stmt]:
        self.last = Var(BOOL, None, "last_")
        red = Var(F64.ptr(), None, "red_")
        accs = [Var(acc, None, f"acc{n}_") for n, (_, acc) in enumerate(self.kinds())]
        accumulate = tuple(
            Assign(a, Combine(kind, acc, a, term))
            for a, (kind, acc), term in zip(accs, self.kinds(), self.terms(values))
        )
        r = self.range
        begin: Expr = Field(r, "begin")
        head: list[Stmt] = []
        starts: list[Expr] = [Identity(kind, acc) for kind, acc in self.kinds()]
        thread: list[Stmt] = [Decl(a, start, const=False) for a, start in zip(accs, starts)]
        if vector:
            # Whole vectors first (block-level: where they end), then the element loop.
            head, vend = self.vector_end()
            thread += self.vector_partials(accs, values, vend)
            begin = vend
        per_thread = ForThreads(
            (
                *thread,
                For(
                    self.j, begin + THREAD_IDX, Field(r, "end"), (*element, *accumulate), BLOCK_DIM
                ),
                *(
                    Assign(Index(red, row_element(n, BLOCK_DIM, THREAD_IDX)), Cast(F64, a))
                    for n, a in enumerate(accs)
                ),
            )
        )
        per_block: list[Stmt] = []
        for n, (kind, _) in enumerate(self.kinds()):
            # Threads' partials travel as doubles.
            a, t = Var(F64, None, f"a{n}_"), Var(U32, None, "t_")
            step = Assign(a, Combine(kind, F64, a, Index(red, row_element(n, BLOCK_DIM, t))))
            per_block += [
                Decl(a, Identity(kind, F64), const=False),
                For(t, Lit("0"), BLOCK_DIM, (step,)),
                Assign(Index(self.partials, row_element(n, GRID_DIM, BLOCK_IDX)), a),
            ]
        ticket = call("coco_block_is_last", self.counter, GRID_DIM)
        per_block.append(Assign(Index(self.last, Lit("0")), ticket))
        return [
            SharedArray(self.last, 1),
            SharedDyn(red),
            *head,
            per_thread,
            SyncBlock(),
            thread_zero(*per_block),
            SyncBlock(),
        ]

    def vector_partials(self, accs: list[Var], values: list[Var], vend: Var) -> list[Stmt]:
        """This thread's whole vectors into its accumulators (`lane_partials`), each vector
        the element body over its lanes (`vector_body`)."""
        kinds = self.kinds()
        L = self.lanes
        first = Field(self.range, "begin") / L + THREAD_IDX
        return [
            lane_partials(
                accs,
                kinds,
                L,
                first,
                vend / L,
                self.vector_body,
                lambda k: self.terms(values),
            )
        ]

    def finish_reductions(self) -> list[Stmt]:
        last: list[Stmt] = [ExprStmt(call("coco_threadfence_system"))]
        for n, ((v, _, _), (kind, _)) in enumerate(zip(self.k.reductions, self.kinds())):
            rank, b = Var(F64, None, f"rank{n}_"), Var(U32, None, "b_")
            step = Assign(
                rank, Combine(kind, F64, rank, Index(self.partials, row_element(n, GRID_DIM, b)))
            )
            # The unfused reduce rounds this rank's partial to the element type (a norm's
            # square root first).
            value = call("sqrt", rank) if kind == Reduction.NORM else rank
            partial = Cast(
                F64,
                load_expr(tensor_type_of(v).elt, store_from_double(tensor_type_of(v).elt, value)),
            )
            p = Var(I32, None, "p_")
            slot = Index(peer(self.exchange, p, F64), row_element(n, self.nranks, self.me))
            last += [
                Decl(rank, Identity(kind, F64), const=False),
                For(b, Lit("0"), GRID_DIM, (step,)),
                For(p, Lit("0"), self.nranks, (Assign(slot, partial),)),
            ]
        last.append(self.peer_sync(SyncStep.EXCHANGE))
        mine = Var(F64.ptr(const=True), None, "mine_")
        last.append(Decl(mine, peer(self.exchange, self.me, F64, const=True)))
        for n, ((_, _, out), (kind, _)) in enumerate(zip(self.k.reductions, self.kinds())):
            total, p = Var(F64, None, f"all{n}_"), Var(I32, None, "p_")
            step = Assign(
                total, Combine(kind, F64, total, Index(mine, row_element(n, self.nranks, p)))
            )
            last += [
                Decl(total, Index(mine, Lit("0") if n == 0 else n * self.nranks), const=False),
                For(p, Lit("1"), self.nranks, (step,)),
                Assign(
                    Index(self.red_params[n], Lit("0")),
                    store_from_double(tensor_type_of(out).elt, total),
                    comment="comm.all_reduce",
                ),
            ]
        last.append(
            Assign(Index(self.counter, Lit("0")), Lit("0u"), comment="the next launch's ticket")
        )
        return [thread_zero(*last, also=Index(self.last, Lit("0")))]
