"""What an elementwise kernel computes -- its ops (in program order) at every element of an
iteration type, the values it reads from memory and those it stores, and a fused collective's
peer reductions, gathers, full reductions and sends -- and the index maps by which it reads
each operand: at the iteration's own index, at a base plus it (slices of dim 0), or through
strides over collapsed dims (`dim_groups`), a block scale's block dims at the coordinate divided
by the block. elementwise.py builds the kernel from it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.ir import Operation, SSAValue

from coconet.dialects import coco
from coconet.dialects.coco import TensorType, tensor_type_of
from coconet.dialects.layout_rules import block_sizes
from coconet.lowering.kernel_ir import Expr, Lit, Param, Var
from coconet.lowering.signature import I64, ParamKind


def iteration_values(values: Sequence[SSAValue], ops: Sequence[Operation]) -> list[SSAValue]:
    """Of the values a kernel computing `ops` iterates over (its ops' results, a fused
    collective's slices), those whose types make its iteration type: all but a value that
    `ops` read only as a ScaleOp's scale of a block shape (a slice or a dense constant joined
    as a feeder), which does not broadcast against the iteration but is read through the
    block index map like an operand in memory (`Operand.blocks`)."""
    members = set(ops)

    def block_scale_only(v: SSAValue) -> bool:
        uses = [u for u in v.uses if u.operation in members]
        return bool(uses) and all(
            isinstance(op := u.operation, coco.ScaleOp)
            and u.index == 1
            and any(b > 1 for b in block_sizes(tensor_type_of(v), tensor_type_of(op.result)))
            for u in uses
        )

    return [v for v in values if not block_scale_only(v)]


@dataclass
class Operand:
    """How a kernel reads one value from memory at an iteration element."""

    value: SSAValue
    param: Var  # a pointer parameter, or a dense constant's array (`ConstArray`)
    identity: bool  # read at the iteration's own linear index
    scalar: bool  # a single element (rank-0 or all dims broadcast)
    linear: bool = False  # read at base + the iteration's linear index (slices of dim 0)
    # per collapsed iteration dim (`dim_groups`): the stride of this operand along it, a
    # literal where the type fixes it (None: broadcast)
    strides: list[Expr | None] = field(default_factory=list)
    base: Param | None = None
    # per collapsed iteration dim: where the operand holds one value per block of that many
    # elements (a block scale, coco.ScaleOp), the block and the offset added to the
    # coordinate before dividing by it (None: 0); None where it is read element by element
    blocks: list[tuple[int, Expr | None] | None] = field(default_factory=list)


@dataclass
class Store:
    """A value the kernel writes to memory of type `type`: a result the rest of the program
    reads, or (with `target`) the new value of an updated argument."""

    value: SSAValue
    type: TensorType
    target: SSAValue | None = None


class ElementwiseSpec:
    """One kernel computing `ops` (elementwise, in program order) at every element of the
    iteration type, reading `inputs` from memory and writing `stores` (built by
    elementwise.py's `ElementwiseKernel`, this class with a `build`).

    The iteration space is this rank's piece of `iteration` (a TensorType); operands whose
    piece does not coincide with it are read through per-dim strides plus a rank-dependent base
    offset (broadcasts, replicated operands of sliced results). `rows` splitting for overlap
    comes in as the [begin, end) element range every kernel takes.
    """

    def __init__(
        self,
        name: str,
        ops: Sequence[Operation],
        iteration: TensorType,
        inputs: Sequence[SSAValue],
        stores: Sequence[Store],
    ):
        self.name = name
        self.ops = list(ops)
        self.iteration = iteration
        self.inputs = list(inputs)
        self.stores = list(stores)
        # Fused collectives (fused_collective.py): values reduced from every peer's symmetric
        # buffer at the iteration element (result -> (input, reduction kind)), and values
        # all-gathered (value, gathered result): this rank stores its piece in its own
        # symmetric gathered buffer and pulls the peers' pieces from theirs.
        self.peer_reductions: dict[SSAValue, tuple[SSAValue, str]] = {}
        self.all_gathers: list[tuple[SSAValue, SSAValue]] = []
        # Gathered results assembled directly in the argument they update (gathered result ->
        # the update's target), instead of in the gathered buffer and copied after.
        self.gather_targets: dict[SSAValue, SSAValue] = {}
        # Gathered results whose symmetric buffer stages only this rank's piece (assembled in
        # an argument, their input's piece the iteration's): each element at its index `i`.
        self.staged: set[SSAValue] = set()
        # Gathered results assembled in a symmetric argument (`{coco.symmetric}`): this rank
        # stores its piece there only, and peers pull it from there -- no staging copy.
        self.in_place: set[SSAValue] = set()
        # Full reductions finished inside the kernel and all-reduced across the group
        # (LAMB's norms): (reduced value, kind, the all_reduce's result).
        self.reductions: list[tuple[SSAValue, str, SSAValue]] = []
        # A send fused into the kernel (fused_send.py): (value sent, the value received); each
        # rank stores its element straight into its receiver's symmetric receive buffer.
        self.sends: list[tuple[SSAValue, SSAValue]] = []
        # A collective over a group of one member (a grid axis of size 1) is the identity on
        # the rank's piece: its result is its input's element, converted to the result's type
        # as the reduction would round it (result -> input). Such a kernel reads the input
        # from the rank's own memory and stores the result where it is wanted: no symmetric
        # buffer, staging copy or pull.
        self.aliases: dict[SSAValue, SSAValue] = {}
        # Uneven slices: group members iterate over different counts, so the pull takes
        # member q's count (a table) to find the chunk q's same-index block wrote.
        self.uneven = False
        # The members its peer reductions combine (fused collectives): a sum of few enough fp8
        # codes is exact in float (elements.py `peer_accumulator`).
        self.group = 0
        # Extents and strides the types fix are literals in the text (div/mod by a literal is a
        # multiply and a shift); off where kernels over different shapes must print alike
        # (one table launch over many tensors: fused_collective.py).
        self.literal_shapes = True
        self._groups: list[tuple[int, int]] | None = None

    @property
    def is_collective(self) -> bool:
        # (a reduction finished in the kernel exchanges its partials through the group's flags)
        return bool(self.peer_reductions or self.all_gathers or self.sends or self.reductions)

    # An operand coincides with the iteration when it has the same shape and every dim is cut
    # by the same grid axes: then rank r's piece of both covers the same global elements.
    @staticmethod
    def coincides(t: TensorType, it: TensorType) -> bool:
        return t.get_shape() == it.get_shape() and all(
            t.slicing_axes(d) == it.slicing_axes(d) for d in range(t.rank)
        )

    # When both are cut (if at all) only along dim 0, the operand's piece is a contiguous run
    # of whole rows around the iteration's piece: one base offset maps every element.
    @staticmethod
    def dim0_only(t: TensorType, it: TensorType) -> bool:
        return t.get_shape() == it.get_shape() and all(
            not t.slicing_axes(d) and not it.slicing_axes(d) for d in range(1, t.rank)
        )

    @staticmethod
    def broadcast(t: TensorType, it: TensorType, d: int) -> bool:
        """Whether `t` (read or stored over iteration type `it`) is broadcast along dim d."""
        od = d - (it.rank - t.rank)
        return od < 0 or (t.get_shape()[od] == 1 and it.get_shape()[d] != 1)

    @staticmethod
    def block(t: TensorType, it: TensorType, d: int) -> int:
        """How many consecutive elements of iteration dim d one element of `t` covers: 1
        where `t` spans the dim or is broadcast along it, the block size where it is a block
        scale's block dim (layout_rules.block_sizes: only a ScaleOp reads a value so)."""
        od = d - (it.rank - t.rank)
        if od < 0 or t.get_shape()[od] in (1, it.get_shape()[d]):
            return 1
        return it.get_shape()[d] // t.get_shape()[od]

    def mapped_types(self) -> list[TensorType]:
        """The types of every value the kernel reads or writes in memory at an element."""
        types = [tensor_type_of(v) for v in self.inputs] + [s.type for s in self.stores]
        types += [tensor_type_of(src) for src, _ in self.peer_reductions.values()]
        types += [tensor_type_of(gathered) for _, gathered in self.all_gathers]
        types += [
            op.result.type for op in self.ops if isinstance(op, coco.ConstantOp) and op.is_dense
        ]
        return types

    def dim_groups(self) -> list[tuple[int, int]]:
        """The kernel's coordinates: runs [first, last] of iteration dims collapsed into one
        (dimension coalescing, as linalg's collapse_shape or TVM's loop fusion). Dims of size
        1 carry no coordinate. Adjacent dims a < b merge when every value mapped in memory
        agrees: broadcast along both, or along neither with its dim b of the iteration's
        size and cut by the same grid axes -- so on every rank its stride along a is its
        stride along b times the iteration's local extent of b, and one coordinate with the
        stride of b walks both. A dropout's global element index is one more such map (the
        whole, unsliced tensor): dims after a rank's sliced dim stay apart from it."""
        if self._groups is not None:
            return self._groups
        it = self.iteration
        shape = it.get_shape()
        kept = [d for d in range(it.rank) if shape[d] != 1] or list(range(it.rank))[-1:]
        types = self.mapped_types()
        sliced = any(it.slicing_axes(d) for d in range(it.rank))
        dim0 = all(not it.slicing_axes(d) for d in range(1, it.rank))
        global_index = (
            sliced and not dim0 and any(isinstance(op, coco.DropoutOp) for op in self.ops)
        )

        def agree(t: TensorType, a: int, b: int) -> bool:
            if self.block(t, it, a) > 1 or self.block(t, it, b) > 1:
                return False  # a block dim keeps its own coordinate, to divide it
            ba, bb = self.broadcast(t, it, a), self.broadcast(t, it, b)
            if ba or bb:
                return ba and bb
            ob = b - (it.rank - t.rank)
            return t.get_shape()[ob] == shape[b] and t.slicing_axes(ob) == it.slicing_axes(b)

        groups: list[tuple[int, int]] = []
        for d in kept:
            if groups and all(agree(t, groups[-1][1], d) for t in types):
                if not (global_index and it.slicing_axes(d)):
                    groups[-1] = (groups[-1][0], d)
                    continue
            groups.append((d, d))
        self._groups = groups
        return groups

    def group_sliced(self, g: tuple[int, int]) -> bool:
        """Whether a collapsed dim's local extent depends on the rank (a dim of it is cut)."""
        return any(self.iteration.slicing_axes(d) for d in range(g[0], g[1] + 1))

    def operand_of(self, v: SSAValue, param: Var, name: str | None) -> Operand:
        """How `v` is read through `param`; index parameters are named after `name`."""
        t = tensor_type_of(v)
        it = self.iteration

        def base() -> Param:
            hint = f"{name}_base" if name else None
            return Param(I64, hint, f"{param.fallback}_base", kind=ParamKind.BASE, value=v)

        if self.coincides(t, it):
            return Operand(v, param, identity=True, scalar=False)
        if self.dim0_only(t, it):
            return Operand(v, param, identity=False, scalar=False, linear=True, base=base())
        gap = it.rank - t.rank
        strides: list[Expr | None] = []
        blocks: list[tuple[int, Expr | None] | None] = []
        for _first, d in self.dim_groups():
            block = self.block(t, it, d)
            # A block dim's coordinate in `t` is (global coordinate) // block minus where the
            # piece of `t` starts: the local coordinate plus a per-rank offset (the
            # iteration's start less block times t's), then divided. The layout rules make
            # a block dim cut by the iteration's axes cut on block boundaries (offset 0);
            # a replicated one takes the iteration's global start.
            offset: Expr | None = None
            if block > 1 and t.slicing_axes(d - gap) != it.slicing_axes(d):
                hint = f"{name}_bstart{d}" if name else None
                offset = Param(
                    I64, hint, f"{param.fallback}_b{d}", ParamKind.BLOCK_START, value=v, dim=d
                )
            blocks.append((block, offset) if block > 1 else None)
            if self.broadcast(t, it, d):
                strides.append(None)
            elif self.literal_shapes and not any(
                t.slicing_axes(e) for e in range(d - gap + 1, t.rank)
            ):
                strides.append(Lit(str(math.prod(t.get_shape()[d - gap + 1 :]))))
            else:
                hint = f"{name}_stride{d}" if name else None
                strides.append(
                    Param(I64, hint, f"{param.fallback}_s{d}", ParamKind.STRIDE, value=v, dim=d)
                )
        if all(s is None for s in strides):
            return Operand(v, param, identity=False, scalar=True)
        return Operand(
            v, param, identity=False, scalar=False, strides=strides, base=base(), blocks=blocks
        )
