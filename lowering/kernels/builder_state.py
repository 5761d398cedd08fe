"""The state of building one elementwise kernel, which the builder's parts share: its
parameters, the per-element body and what the vector loop will do with each statement of it,
and the helpers every part uses (a parameter, an operand's index, the coordinates of an
element, a step of the cross-rank protocol)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.ir import SSAValue

from coconet.dialects import coco
from coconet.dialects.reduction import Reduction
from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    GRID_DIM,
    Assign,
    Decl,
    Expr,
    Lit,
    Param,
    PeerSync,
    Stmt,
    SyncStep,
    Unused,
    Var,
    sum_of,
)
from coconet.lowering.kernels.spec import ElementwiseSpec, Operand
from coconet.lowering.kernels.statements import peers_entry, scaled
from coconet.lowering.signature import I32, I64, RANGE, CType, ParamKind


@dataclass
class Gather:
    """An all_gather inside a fused collective kernel: `value` (this rank's piece) is stored
    in this rank's symmetric gathered buffer, and every peer's piece is pulled from its buffer
    into `dest` (the updated argument) or, without one, into this rank's gathered buffer
    (`operand` maps the element there: the whole gathered value, each piece at its place).
    With a `dest` (and the piece the iteration's) the symmetric buffer is only a staging copy
    of the rank's own piece, sized to it: the element at its index within the piece
    (`staged`). `bases[q]`: where member q's piece starts in the gathered value."""

    value: SSAValue
    operand: Operand
    bases: Param
    dest: Param | None = None
    # this rank's gathered buffer, found once per block (where the kernel declares it)
    mine: Var | None = None
    # the buffer stages this rank's piece only (ElementwiseSpec.staged)
    piece_only: bool = False
    # the buffer is `dest` itself, a symmetric argument (ElementwiseSpec.in_place): the
    # store into `dest` is the rank's only one
    in_place: bool = False

    def staged(self, element: Expr, gathered: Expr) -> Expr:
        """Where `element` of a piece sits in a gathered buffer: at its index within the
        piece in a staging buffer, else at `gathered`, its place in the whole value."""
        return element if self.piece_only else gathered


@dataclass
class VecAccess:
    """A load or store of the element body at the element's own contiguous position
    (`pointer[index]`), done as a vector access by the vector loop; `name` names the
    vector."""

    pointer: Expr
    index: Expr
    elt: str
    name: str
    target: Var | None = None  # a load: the variable it declares
    value: Expr | None = None  # a store: the value it writes


@dataclass
class PeerReduction:
    """A reduce_scatter element read from every peer (the statements of the element body
    that declare its accumulator and combine the peers, and what the vector loop needs)."""

    acc: Var
    kind: Reduction
    operand: Operand
    elt: str
    combine: Stmt
    # the collective's stated accumulation (comm.accumulation): each step rounds to it
    acc_elt: str | None = None


class BuilderState:
    """What the parts of an elementwise kernel's builder share: the kernel's parameters, the
    per-element body, the values computed so far, and which statements of the body the vector
    loop does as vector accesses (`vec_loads`, `vec_stores`, `peer_reads`: vectors.py). Each
    part is a subclass (params.py, body.py, vectors.py, pull.py, fused_reductions.py);
    elementwise.py's `ElementwiseBuilder` combines them."""

    # Set by ParamBuilder.build_params (the parameters every part reads), and by
    # ElementwiseBuilder.build (the alignment of chunks).
    begin: Param
    end: Param
    counts: Param | None
    need_coords: bool
    peer_dims: dict[int, Param]
    send_to: Param
    receives: Param
    partials: Param
    counter: Param
    exchange: Param
    flags: Param
    epoch_at: Param
    epoch: Var
    me: Param
    nranks: Param
    align: Expr

    def __init__(self, k: ElementwiseSpec):
        self.k = k
        it = k.iteration
        self.params: list[Param] = []
        self.operands: dict[SSAValue, Operand] = {}
        self.peer_operands: dict[SSAValue, Operand] = {}
        self.constants: dict[SSAValue, Operand] = {}  # dense constants' arrays
        self.gathers: list[Gather] = []
        self.out_params: list[Param] = []
        self.red_params: list[Param] = []
        self.send_params: list[Param] = []
        # Per collapsed dim: its local extent (None for the first: never needed), and the
        # global start of this rank's piece along it (None: 0, the dim is not cut).
        self.dims: list[Expr | None] = []
        self.gstarts: list[Param | None] = []
        self.goffset: Param | None = None
        self.dropouts = [op for op in k.ops if isinstance(op, coco.DropoutOp)]
        self.streams: list[Param] = []
        self.seeds: list[Param] = []
        sliced_iteration = any(it.slicing_axes(d) for d in range(it.rank))
        self.dim0_iteration = sliced_iteration and all(
            not it.slicing_axes(d) for d in range(1, it.rank)
        )
        self.need_global = bool(self.dropouts) and sliced_iteration and not self.dim0_iteration
        # The body's variables.
        self.range = Var(RANGE, None, "r_")
        self.j = Var(I64, None, "j_")  # the element's index in the launch's range
        self.i = Var(I64, None, "i")  # the element's index in the iteration
        self.coords: list[Var] = []
        self.gidx: Var | None = None
        self.local: dict[SSAValue, Var] = {}
        self.hoisted: list[Stmt] = []
        self.invariant: set[Var] = set()
        self.body: list[Stmt] = []
        self.index_stmts: list[Stmt] = []
        # Statements of `body` (by identity) that the vector loop does as vector accesses.
        self.vec_loads: dict[int, VecAccess] = {}
        self.vec_stores: dict[int, VecAccess] = {}
        self.peer_reads: dict[int, PeerReduction] = {}
        self.lanes = Var(I32, None, "lanes_")
        self.group = Var(I32, None, "group_")  # the vector loop's bound on the group
        self.vec_coords: list[Var] = []  # a vector's coordinates (vector_body)

    def param(
        self,
        ctype: CType,
        hint: str | None,
        fallback: str,
        kind: ParamKind,
        *,
        value: SSAValue | None = None,
        dim: int | None = None,
        table: bool = False,
        span: int = 1,
    ) -> Param:
        p = Param(ctype, hint, fallback, kind=kind, value=value, dim=dim, table=table, span=span)
        self.params.append(p)
        return p

    @staticmethod
    def coordinates(index: Expr, coords: list[Var], dims: Sequence[Expr | None]) -> list[Stmt]:
        """Statements declaring `coords` (one per collapsed dim) of the element at `index`
        of the iteration, whose collapsed dims after the first have extents `dims[1:]`."""
        if len(coords) == 1:
            return [Decl(coords[0], index), Unused(tuple(coords))]
        rem = Var(I64, None, "rem_")
        stmts: list[Stmt] = [Decl(rem, index, const=False)]
        for g in reversed(range(1, len(coords))):
            extent = dims[g]
            assert extent is not None
            stmts += [Decl(coords[g], rem % extent), Assign(rem, extent, op="/=")]
        stmts.append(Decl(coords[0], rem))
        # Not every coordinate is read by every kernel.
        stmts.append(Unused(tuple(coords)))
        return stmts

    def index_of(self, o: Operand) -> Expr:
        if o.identity:
            return self.i
        if o.scalar:
            return Lit("0")
        assert o.base is not None
        if o.linear:
            return o.base + self.i
        terms: list[Expr] = []
        for g, s in enumerate(o.strides):
            if s is None:
                continue
            at: Expr = self.coords[g]
            block = o.blocks[g] if o.blocks else None
            if block is not None:  # a block scale: the block of the element's coordinate
                size, offset = block
                at = (at if offset is None else at + offset) / Lit(str(size))
            terms.append(scaled(at, s))
        return sum_of([o.base, *terms])

    def peers_entry(self) -> list[Stmt]:
        return peers_entry(self.flags, self.me, self.nranks, self.epoch_at, self.epoch)

    def peer_sync(self, step: SyncStep) -> PeerSync:
        return PeerSync(step, self.flags, self.me, self.nranks, self.epoch, GRID_DIM, BLOCK_IDX)

    def contiguous(self, o: Operand) -> bool:
        """Whether consecutive elements of a vector read `o` at consecutive positions: along
        the iteration's own linear index, or along the innermost collapsed dim (stride 1:
        nothing after it), which a vector never crosses (`vector_end`)."""
        if o.identity or o.linear:
            return True
        if o.blocks and o.blocks[-1] is not None:
            return False  # lanes share a block scale's value: not a vector of values
        return not o.scalar and o.strides[-1] is not None
