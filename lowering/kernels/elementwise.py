"""Elementwise kernels: `ElementwiseKernel` (what the kernel computes: spec.py) built by
`ElementwiseBuilder`, the public base of the other region kernels' builders
(row_collective.py). The builder's parts live in their own modules -- parameters and
coordinates (params.py), the element body (body.py), the vector loop (vectors.py), the
all_gather's pull (pull.py), in-kernel full reductions (fused_reductions.py) -- over one shared
state (builder_state.py); this module puts the kernel together.

Each value of the program is one variable, named after its SSA name, with a comment saying
which op computes it."""

from __future__ import annotations

from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    GRID_DIM,
    BlockStrideLoop,
    Decl,
    Expr,
    Field,
    Kernel,
    Lit,
    Stmt,
    SyncBlock,
    SyncStep,
)
from coconet.lowering.kernels.body import BodyBuilder
from coconet.lowering.kernels.fused_reductions import ReductionBuilder
from coconet.lowering.kernels.params import ParamBuilder
from coconet.lowering.kernels.pull import PullBuilder
from coconet.lowering.kernels.spec import ElementwiseSpec
from coconet.lowering.kernels.statements import call, thread_zero


class ElementwiseBuilder(ParamBuilder, BodyBuilder, PullBuilder, ReductionBuilder):
    """Builds one elementwise kernel: parameters, then the per-element body (loads and ops in
    program order, values that do not depend on the element hoisted out of the loop), then
    the kernel around it (the protocol of a fused collective, the vector and element loops,
    the pull, the reductions). Other region kernels subclass it (row_collective.py)."""

    def build(self) -> Kernel:
        k = self.k
        self.build_params()
        self.build_indices()
        self.build_ops()
        self.build_stores()
        reduced = [self.ref(v) for v, _, _ in k.reductions]
        # Vectors: a collective kernel's peer accesses, and a kernel reading through
        # coordinates (hoisted out of the lanes: vector_body), when its accesses are
        # contiguous within a vector.
        # (a kernel whose collectives have one member keeps the vector form of their kernel)
        vector = (k.is_collective or bool(k.aliases) or bool(self.coords)) and (
            self.contiguous_peers()
        )
        vector = vector and bool(self.vector_elements(all_accesses=True))
        pull_vector = bool(self.gathers) and all(self.contiguous(g.operand) for g in self.gathers)
        stmts: list[Stmt] = []
        align: Expr = Lit("4")
        if vector or pull_vector:
            narrowest = min(self.vector_elements(all_accesses=vector))
            lanes: Expr = Lit(f"COCO_VEC_BYTES / {narrowest}")
            inner = self.dims[-1] if self.dims else None
            plain = not (k.is_collective or k.reductions or self.gathers)
            if len(self.coords) > 1 and plain and inner is not None:
                # a broadcast's vectors stay within the innermost dim: on the host the tile
                # shrinks to fit it (coco_device.h coco_vec_lanes; no array is sized by it)
                lanes = call("coco_vec_lanes", lanes, inner)
            stmts.append(Decl(self.lanes, lanes))
            align = self.lanes  # chunks start at whole vectors
        self.align = align
        chunk = call("coco_chunk", self.end - self.begin, GRID_DIM, BLOCK_IDX, align)
        stmts += [Decl(self.range, chunk), *self.hoisted]
        if vector and self.peer_reads:
            # the group size bounded by the build's largest (coco_device.h coco_group)
            stmts.append(Decl(self.group, call("coco_group", self.nranks)))
        if k.is_collective:
            # Entry: every earlier write of each peer is complete before any peer's input
            # is read (coco_device.h).
            stmts += [*self.peers_entry(), SyncBlock()]
        element = (Decl(self.i, self.begin + self.j), *self.body)
        if k.reductions:
            stmts += self.reducing_loop(element, reduced, vector)
        elif vector:
            stmts += self.vector_loops(element)
        else:
            begin, end = Field(self.range, "begin"), Field(self.range, "end")
            stmts.append(BlockStrideLoop(self.j, begin, end, element))
        if k.is_collective:
            # Done: this block's piece of every gathered value is in this rank's buffer, the
            # peers' pieces are in theirs, and no peer still reads this rank's inputs.
            stmts += [SyncBlock(), thread_zero(self.peer_sync(SyncStep.DONE))]
        if self.gathers:
            stmts += [SyncBlock(), *self.pull(pull_vector)]
        if any(g.in_place for g in self.gathers):
            # Exit: the peers have pulled this rank's piece from the argument, which the
            # caller may write once the launch ends.
            stmts += [SyncBlock(), thread_zero(self.peer_sync(SyncStep.EXIT))]
        if k.reductions:
            stmts += self.finish_reductions()
        return Kernel(k.name, tuple(self.params), tuple(stmts))


class ElementwiseKernel(ElementwiseSpec):
    """Builds one kernel computing `ops` (elementwise, in program order) at every element of
    the iteration type, reading `inputs` from memory and writing `stores` (spec.py)."""

    def build(self) -> Kernel:
        return ElementwiseBuilder(self).build()
