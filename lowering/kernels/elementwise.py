"""The kernels of a plan, built as kernel IR (kernel_ir.py) against the device layer
(coco_device.h); cuda_printer.py prints them.

Every kernel is rank-independent: what depends on the rank count or the rank (local shapes,
the offset of a rank's slice, its dropout stream) arrives as kernel arguments, so one
translation unit serves every launch configuration and the kernel cache hits across runs.

Numerics follow the dialects exactly: each op computes in float (double, long long) and rounds
its result to its element type, constants are rounded to their element type at compile time,
and reductions accumulate in double. Each value of the program is one variable, named after
its SSA name, with a comment saying which op computes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.ir import Operation, SSAValue

from coconet.core.elementwise import COMPARISONS, ELEMENTWISE
from coconet.core.values import NUMPY_DTYPES
from coconet.dialects import coco
from coconet.dialects.coco import TensorType, tensor_type_of
from coconet.lowering.kernel_ir import (
    BLOCK_DIM,
    BLOCK_IDX,
    GRID_DIM,
    PEER_BATCH,
    THREAD_IDX,
    VECTOR_THREADS,
    Assign,
    Binary,
    BlockStrideLoop,
    Call,
    Cast,
    Combine,
    ConstArray,
    Decl,
    Expr,
    ExprStmt,
    Field,
    For,
    ForThreads,
    Identity,
    If,
    Index,
    Kernel,
    LaneLoop,
    Lit,
    LoadsIssued,
    LocalArray,
    Param,
    PeerSlots,
    PeerSync,
    PeerVecIn,
    ReduceKind,
    RowLanes,
    Select,
    SendPush,
    SharedArray,
    SharedDyn,
    Stmt,
    SyncBlock,
    SyncStep,
    Unary,
    Unused,
    Var,
    VecIn,
    VecOut,
    VecStore,
    While,
    all_of,
    binary,
    peer,
    product_of,
    rewrite,
    sum_of,
    uses,
)
from coconet.lowering.signature import BOOL, F32, F64, I32, I64, RANGE, U32, U64, CType, ParamKind

# The most checks one statement ANDs together (vector_end): kernel IR nests as deep as a chain
# of operators is long, and the printer and the IR's walks recurse on it.
CONJUNCTION_TERMS = 32

# How an element type is stored, and the type it is computed in.
C_STORAGE = {
    "f16": CType("coco_f16"),
    "bf16": CType("coco_bf16"),
    "f32": F32,
    "f64": F64,
    "i32": I32,
    "i64": I64,
    "i1": BOOL,
}
C_COMPUTE = {
    "f16": F32,
    "bf16": F32,
    "f32": F32,
    "f64": F64,
    "i32": I64,
    "i64": I64,
    "i1": BOOL,
}


# Bytes of one stored element (vector widths are counted in the narrowest element).
STORAGE_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i32": 4, "i64": 8, "i1": 1}


def _is_float(elt: str) -> bool:
    return elt in ("f16", "bf16", "f32", "f64")


def _hint(v: SSAValue, suffix: str = "") -> str | None:
    return f"{v.name_hint}{suffix}" if v.name_hint else None


def _call(fn: str, *args: Expr) -> Call:
    return Call(fn, args)


def c_float(value: float, elt: str) -> Expr:
    """An exact C literal of `value` rounded to element type `elt`, in its compute type."""
    # A literal beyond the type's range rounds to an infinity (printed below), as in the sim.
    with np.errstate(over="ignore"):
        rounded = float(np.array(value, dtype=NUMPY_DTYPES[elt]).astype(np.float64))
    sfx = "f" if C_COMPUTE[elt] == F32 else ""
    if np.isnan(rounded):
        return Binary("/", Lit(f"0.0{sfx}"), Lit(f"0.0{sfx}"))
    if np.isinf(rounded):
        sign = "-" if rounded < 0 else ""
        return Binary("/", Lit(f"{sign}1.0{sfx}"), Lit(f"0.0{sfx}"))
    return Lit(rounded.hex() + sfx)


def _int_literal(value: float | int, elt: str) -> Expr:
    """An integer constant wrapped to its element type, as a long long."""
    return Cast(I64, Lit(str(int(np.array(value).astype(NUMPY_DTYPES[elt])))))


def load_expr(elt: str, ref: Expr) -> Expr:
    """A stored element in its compute type."""
    if elt in ("f16", "bf16"):
        return _call("coco_to_f32", ref)
    if elt == "i32":
        return Cast(I64, ref)
    return ref


def store_expr(elt: str, value: Expr) -> Expr:
    """A compute-type value (already rounded to `elt`) in its storage type."""
    if elt == "f16":
        return _call("coco_f16_from_f32", value)
    if elt == "bf16":
        return _call("coco_bf16_from_f32", value)
    if elt == "i32":
        return Cast(I32, value)
    return value


def round_expr(elt: str, value: Expr) -> Expr:
    """Round a compute-type value to the element type, staying in the compute type."""
    if elt in ("f16", "bf16"):
        return _call(f"coco_round_{elt}", value)
    if elt == "i32":
        return Cast(I64, Cast(I32, value))
    return value


def store_from_double(elt: str, value: Expr) -> Expr:
    """Round a double to the element type ONCE (as NumPy does), in storage form. Going through
    float would round twice for f16/bf16; rounding to odd first makes the second rounding
    exact (float has more than twice the bits of either)."""
    if elt in ("f16", "bf16"):
        return store_expr(elt, _call("coco_f64_to_f32_odd", value))
    if elt == "i1":
        return binary("!=", value, 0)
    if elt == "i32":
        return store_expr(elt, Cast(I64, value))
    return Cast(C_STORAGE[elt], value)


def in_double(op: Operation) -> bool:
    """A transcendental op on a float narrower than double computes in double and rounds once
    (core/elementwise.py says which ops; the sim does the same)."""
    semantics = ELEMENTWISE.get(type(op))
    return (
        semantics is not None
        and semantics.transcendental
        and tensor_type_of(op.results[0]).elt in ("f16", "bf16", "f32")
    )


def round_from_double(elt: str, value: Expr) -> Expr:
    """Round a double to `elt` once, staying in the compute type (float)."""
    if elt in ("f16", "bf16"):
        return _call(f"coco_round_{elt}", _call("coco_f64_to_f32_odd", value))
    return Cast(F32, value)


def _arithmetic(op: coco.BinaryOp | coco.UnaryOp, operands: list[Var]) -> Expr:
    """The op as core/elementwise.py states it: a C operator or a coco_device.h function
    (overloaded for float, double and coco_i64), on double operands where it computes in
    double."""
    name, is_operator = ELEMENTWISE[type(op)].device_for(
        _is_float(tensor_type_of(op.results[0]).elt)
    )
    args: list[Expr] = [Cast(F64, x) for x in operands] if in_double(op) else list(operands)
    if not is_operator:
        return _call(name, *args)
    if len(args) == 1:
        return Unary(name, args[0])
    return Binary(name, args[0], args[1])


def _cast(dst_elt: str, x: Expr) -> Expr:
    if dst_elt == "i1":
        return binary("!=", x, 0)
    return Cast(C_COMPUTE[dst_elt], x)


def _accumulator(elt: str) -> CType:
    """Reductions accumulate floats in double, integers in long long."""
    return F64 if _is_float(elt) else I64


def _thread_zero(*body: Stmt, also: Expr | None = None) -> ForThreads:
    """A phase that thread 0 of the block runs alone (where `also` holds)."""
    cond = binary("==", THREAD_IDX, 0)
    return ForThreads((If(cond if also is None else Binary("&&", cond, also), body),))


def _without_zeros(x: Expr) -> Expr:
    """`x` without its terms `0 * y` and `y + 0` (an index at coordinates 0)."""
    if not isinstance(x, Binary) or x.op not in ("+", "*"):
        return x
    lhs, rhs = _without_zeros(x.lhs), _without_zeros(x.rhs)
    if x.op == "*" and Lit("0") in (lhs, rhs):
        return Lit("0")
    if x.op == "+" and lhs == Lit("0"):
        return rhs
    if x.op == "+" and rhs == Lit("0"):
        return lhs
    return Binary(x.op, lhs, rhs)


def _scaled(x: Expr, factor: Expr) -> Expr:
    """x * factor, or x where the factor is the literal 1."""
    return x if factor == Lit("1") else x * factor


def _at(k: int, stride: Expr, offset: Expr) -> Expr:
    """Element `offset` of the k-th row of `stride` elements."""
    return offset if k == 0 else k * stride + offset


# --------------------------------------------------------------------------------------------
# Index maps
# --------------------------------------------------------------------------------------------


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


@dataclass
class Store:
    """A value the kernel writes to memory of type `type`: a result the rest of the program
    reads, or (with `target`) the new value of an updated argument."""

    value: SSAValue
    type: TensorType
    target: SSAValue | None = None


class ElementwiseKernel:
    """Builds one kernel computing `ops` (elementwise, in program order) at every element of
    the iteration type, reading `inputs` from memory and writing `stores`.

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
        # Full reductions finished inside the kernel and all-reduced across the group
        # (LAMB's norms): (reduced value, kind, the all_reduce's result).
        self.reductions: list[tuple[SSAValue, str, SSAValue]] = []
        # A send fused into the kernel (fused_send.py): (value sent, the value received); each
        # rank stores its element straight into its receiver's symmetric receive buffer.
        self.sends: list[tuple[SSAValue, SSAValue]] = []
        # Uneven slices: group members iterate over different counts, so the pull takes
        # member q's count (a table) to find the chunk q's same-index block wrote.
        self.uneven = False
        # Extents and strides the types fix are literals in the text (div/mod by a literal is a
        # multiply and a shift); off where kernels over different shapes must print alike
        # (one table launch over many tensors: fused_collective.py).
        self.literal_shapes = True
        self._groups: list[tuple[int, int]] | None = None

    @property
    def is_collective(self) -> bool:
        return bool(self.peer_reductions or self.all_gathers or self.sends)

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
        for _first, d in self.dim_groups():
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
        return Operand(v, param, identity=False, scalar=False, strides=strides, base=base())

    def build(self) -> Kernel:
        return _ElementwiseBuilder(self).build()


@dataclass
class _Gather:
    """An all_gather inside a fused collective kernel: `value` (this rank's piece) is stored
    in this rank's symmetric gathered buffer (`operand` maps the element there), and every
    peer's piece is pulled from its buffer into `dest` (the updated argument) or, without
    one, into this rank's gathered buffer. `bases[q]`: where member q's piece starts."""

    value: SSAValue
    operand: Operand
    bases: Param
    dest: Param | None = None
    # this rank's gathered buffer, found once per block (where the kernel declares it)
    mine: Var | None = None


@dataclass
class _VecAccess:
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
class _PeerReduction:
    """A reduce_scatter element read from every peer (the statements of the element body
    that declare its accumulator and combine the peers, and what the vector loop needs)."""

    acc: Var
    kind: ReduceKind
    operand: Operand
    elt: str
    combine: Stmt


class _ElementwiseBuilder:
    """The state of building one elementwise kernel: parameters, then the per-element body
    (loads and ops in program order, values that do not depend on the element hoisted out of
    the loop), then the kernel around it.

    Fused collective kernels also get a VECTOR loop (coco_device.h): over whole vectors of the
    block's chunk, peers' buffers (and the kernel's other contiguous accesses) are read and
    written as vectors -- 16-byte accesses on a GPU, a tile the compiler vectorizes on the
    host -- and the element body runs once per lane; the element loop does the rest (the
    chunk's tail, or all of it where an address is not 16-byte aligned). The vector loop is
    the element body rewritten: `vec_loads`, `vec_stores` and `peer_reads` say which of its
    statements become vector accesses."""

    def __init__(self, k: ElementwiseKernel):
        self.k = k
        it = k.iteration
        self.params: list[Param] = []
        self.operands: dict[SSAValue, Operand] = {}
        self.peer_operands: dict[SSAValue, Operand] = {}
        self.constants: dict[SSAValue, Operand] = {}  # dense constants' arrays
        self.gathers: list[_Gather] = []
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
        self.vec_loads: dict[int, _VecAccess] = {}
        self.vec_stores: dict[int, _VecAccess] = {}
        self.peer_reads: dict[int, _PeerReduction] = {}
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

    # -- parameters --------------------------------------------------------------------------

    def build_params(self) -> None:
        k, it = self.k, self.k.iteration
        # An update writes the buffer of an argument the kernel may also read (so does a
        # gathered value assembled in an argument): no pointer of such a kernel can promise
        # it is the only way to its memory.
        restrict = not any(s.target is not None for s in k.stores) and not k.gather_targets
        for n, v in enumerate(k.inputs):
            ctype = C_STORAGE[tensor_type_of(v).elt].ptr(const=True, restrict=restrict)
            p = self.param(ctype, _hint(v, "_in"), f"in{n}", ParamKind.IN, value=v)
            self.operands[v] = k.operand_of(v, p, v.name_hint)
        for op in k.ops:
            if isinstance(op, coco.ConstantOp) and op.is_dense:
                self.dense_constant(op)
        outs = updates = 0
        for s in k.stores:
            if s.target is None:
                hint, fallback, outs = _hint(s.value, "_out"), f"out{outs}", outs + 1
            else:
                hint, fallback, updates = _hint(s.target, "_out"), f"upd{updates}", updates + 1
            ctype = C_STORAGE[s.type.elt].ptr(restrict=restrict)
            self.out_params.append(self.param(ctype, hint, fallback, ParamKind.OUT, value=s.value))
        table = U64.ptr(const=True, restrict=True)
        for n, (res, (src, _kind)) in enumerate(k.peer_reductions.items()):
            p = self.param(table, _hint(src, "_peers"), f"rs{n}", ParamKind.PEERS_IN, value=src)
            self.peer_operands[res] = k.operand_of(src, p, src.name_hint)
        for n, (v, gathered) in enumerate(k.all_gathers):
            hint = _hint(gathered, "_peers")
            p = self.param(table, hint, f"ag{n}", ParamKind.PEERS_OUT, value=gathered)
            operand = k.operand_of(gathered, p, gathered.name_hint)
            bases = self.param(
                I64.ptr(const=True, restrict=True),
                _hint(gathered, "_bases"),
                f"ag{n}_bases",
                ParamKind.PEER_BASES,
                value=gathered,
            )
            dest = None
            target = k.gather_targets.get(gathered)
            if target is not None:
                # Not restrict: the kernel may read the argument too (its own piece).
                ctype = C_STORAGE[tensor_type_of(target).elt].ptr()
                dest = self.param(
                    ctype, _hint(target, "_out"), f"ag{n}_out", ParamKind.GATHER_OUT, value=target
                )
            self.gathers.append(_Gather(v, operand, bases, dest))
        for n, (_v, received) in enumerate(k.sends):
            hint = _hint(received, "_peers")
            received_peers = self.param(
                table, hint, f"send{n}", ParamKind.SEND_PEERS, value=received
            )
            self.send_params.append(received_peers)
        if k.sends:
            self.send_to = self.param(I32, None, "send_to", ParamKind.SEND_TO)
            self.receives = self.param(I32, None, "receives", ParamKind.RECEIVES)
        self.counts: Param | None = None
        if k.uneven and k.all_gathers:
            self.counts = self.param(
                I64.ptr(const=True, restrict=True), None, "counts", ParamKind.PEER_COUNTS
            )
        for n, (_v, _kind, out) in enumerate(k.reductions):
            ctype = C_STORAGE[tensor_type_of(out).elt].ptr(restrict=True)
            self.red_params.append(
                self.param(ctype, _hint(out, "_out"), f"red{n}", ParamKind.RED_OUT, value=out)
            )
        if k.reductions:
            self.partials = self.param(F64.ptr(restrict=True), None, "partials", ParamKind.PARTIALS)
            self.counter = self.param(U32.ptr(restrict=True), None, "counter", ParamKind.COUNTER)
            self.exchange = self.param(table, None, "exchange", ParamKind.EXCHANGE)
        if k.is_collective:
            self.flags = self.param(table, None, "flags", ParamKind.FLAGS)
            self.epoch = self.param(U32, None, "epoch", ParamKind.EPOCH)
            self.me = self.param(I32, None, "me", ParamKind.ME)
            self.nranks = self.param(I32, None, "nranks", ParamKind.NRANKS)
        self.begin = self.param(I64, None, "begin", ParamKind.BEGIN)
        self.end = self.param(I64, None, "end", ParamKind.END)

        mapped = [*self.operands.values(), *self.peer_operands.values()]
        mapped += self.constants.values()
        mapped += [g.operand for g in self.gathers]
        self.need_coords = (
            any(not o.identity and not o.scalar and not o.linear for o in mapped)
            or self.need_global
            or any(not k.coincides(s.type, it) for s in k.stores)
        )
        groups = k.dim_groups()
        if self.need_coords:
            # The extent of every collapsed dim but the first (which no coordinate divides
            # by): a literal unless the rank's piece of it depends on the rank.
            self.dims = [None]
            for first, last in groups[1:]:
                if k.literal_shapes and not k.group_sliced((first, last)):
                    self.dims.append(Lit(str(math.prod(it.get_shape()[first : last + 1]))))
                else:
                    self.dims.append(
                        self.param(
                            I64,
                            None,
                            f"dim{first}",
                            ParamKind.DIM,
                            dim=first,
                            span=last - first + 1,
                        )
                    )
        # Uneven slices, strided pull: member q's element coordinates come from q's sizes.
        self.peer_dims: dict[int, Param] = {}
        if self.counts is not None and self.need_coords:
            table = I64.ptr(const=True, restrict=True)
            self.peer_dims = {
                g: self.param(
                    table,
                    None,
                    f"dims{first}",
                    ParamKind.PEER_DIMS,
                    dim=first,
                    span=last - first + 1,
                )
                for g, (first, last) in enumerate(groups)
                if g > 0 and isinstance(self.dims[g], Param)
            }
        for o in mapped:
            if o.identity or o.scalar:
                continue
            self.params += [s for s in o.strides if isinstance(s, Param)]
            assert o.base is not None
            self.params.append(o.base)
        if self.need_global:
            self.gstarts = [
                self.param(
                    I64, None, f"gstart{first}", ParamKind.GSTART, dim=first, span=last - first + 1
                )
                if k.group_sliced((first, last))
                else None
                for first, last in groups
            ]
        elif self.dropouts and self.dim0_iteration:
            self.goffset = self.param(I64, None, "goffset", ParamKind.GOFFSET)
        for n, op in enumerate(self.dropouts):
            self.streams.append(
                self.param(
                    U64, _hint(op.result, "_stream"), f"stream{n}", ParamKind.STREAM, value=op.input
                )
            )
            # The seed is an argument, not a literal: the layers of a deep model differ in
            # their dropouts' seeds only, and share one kernel.
            self.seeds.append(
                self.param(
                    U64, _hint(op.result, "_seed"), f"seed{n}", ParamKind.SEED, value=op.result
                )
            )

    def dense_constant(self, op: coco.ConstantOp) -> None:
        """A dense constant's values become an array in the kernel's text (in the compute
        type, each value rounded to the element type), read at the element's position in
        the constant like an operand in memory: a slice or broadcast of it reads the
        matching values."""
        res = op.result
        elt = res.type.elt
        if _is_float(elt):
            values = [c_float(v, elt) for v in op.values()]
        elif elt == "i1":
            values = [Lit("true" if v else "false") for v in op.values()]
        else:
            values = [_int_literal(v, elt) for v in op.values()]
        array = Var(C_COMPUTE[elt], _hint(res, "_values"), f"const{len(self.constants)}_")
        self.hoisted.append(ConstArray(array, tuple(values)))
        self.constants[res] = self.k.operand_of(res, array, res.name_hint)

    # -- the element's coordinates and global index -------------------------------------------

    def build_indices(self) -> None:
        it = self.k.iteration
        groups = self.k.dim_groups()
        if self.need_coords:
            self.coords = [Var(I64, None, f"c{first}") for first, _ in groups]
            self.index_stmts = self.coordinates(self.i, self.coords, self.dims)
            self.body += self.index_stmts
        if not self.dropouts:
            return
        self.gidx = Var(U64, None, "gidx_")
        if self.need_global:
            gshape = it.get_shape()
            terms: list[Expr] = []
            for (_first, last), c, start in zip(groups, self.coords, self.gstarts):
                gstride = math.prod(gshape[last + 1 :])
                at: Expr = c if start is None else c + start
                terms.append(Cast(U64, at) * Lit(f"{gstride}ull"))
            self.body.append(Decl(self.gidx, sum_of(terms)))
        elif self.dim0_iteration:
            assert self.goffset is not None
            self.body.append(Decl(self.gidx, Cast(U64, self.goffset + self.i)))
        else:
            self.body.append(Decl(self.gidx, Cast(U64, self.i)))

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
        terms = [_scaled(self.coords[g], s) for g, s in enumerate(o.strides) if s is not None]
        return sum_of([o.base, *terms])

    # -- values ------------------------------------------------------------------------------

    def ref(self, v: SSAValue) -> Var:
        """The variable holding `v` at this element, loading it on first use."""
        if v in self.local:
            return self.local[v]
        if v in self.peer_operands:
            return self.reduce_from_peers(v)
        o = self.operands[v]
        var = Var(C_COMPUTE[tensor_type_of(v).elt], v.name_hint, f"x{len(self.local)}")
        decl = Decl(var, load_expr(tensor_type_of(v).elt, Index(o.param, self.index_of(o))))
        if o.scalar:
            self.hoisted.append(decl)
            self.invariant.add(var)
        else:
            self.body.append(decl)
            if self.contiguous(o):
                self.vec_loads[id(decl)] = _VecAccess(
                    o.param,
                    self.index_of(o),
                    tensor_type_of(v).elt,
                    var.hint or var.fallback,
                    target=var,
                )
        self.local[v] = var
        return var

    def reduce_from_peers(self, res: SSAValue) -> Var:
        # A reduce_scatter computed in place: this rank's element, combined from every
        # peer's input in rank order in double (long long), rounded once, as in the sim.
        src, kind = self.k.peer_reductions[res]
        o = self.peer_operands[res]
        elt = tensor_type_of(src).elt
        acc_t = _accumulator(elt)
        fallback = f"x{len(self.local)}"
        acc = Var(acc_t, _hint(res, "_acc"), f"{fallback}_acc")
        p = Var(I32, None, "p_")

        def item(rank: Expr) -> Expr:
            element = Index(peer(o.param, rank, C_STORAGE[elt], const=True), self.index_of(o))
            return Cast(acc_t, load_expr(elt, element))

        combine = Assign(acc, Combine(ReduceKind(kind), acc_t, acc, item(p)))
        first = Decl(acc, item(Lit("0")), const=False)
        rest = For(p, Lit("1"), self.nranks, (combine,))
        self.body += [first, rest]
        self.peer_reads[id(first)] = _PeerReduction(acc, ReduceKind(kind), o, elt, rest)
        var = Var(C_COMPUTE[tensor_type_of(res).elt], res.name_hint, fallback)
        rounded = load_expr(
            tensor_type_of(res).elt, store_from_double(tensor_type_of(res).elt, acc)
        )
        self.body.append(Decl(var, rounded, comment="comm.reduce_scatter"))
        self.local[res] = var
        return var

    def build_ops(self) -> None:
        for n, op in enumerate(self.k.ops):
            self.compute(op, f"t{n}")

    def compute(self, op: Operation, fallback: str | None = None) -> Var:
        """Declare `op`'s result, rounded to its element type, named after its SSA name (or
        `fallback`, by default `t` and the count of values declared so far)."""
        args = [self.ref(v) for v in op.operands]
        res = op.results[0]
        elt = tensor_type_of(res).elt
        expr = self.expression(op, args)
        rounded = round_from_double(elt, expr) if in_double(op) else round_expr(elt, expr)
        var = Var(C_COMPUTE[elt], res.name_hint, fallback or f"t{len(self.local)}")
        comment = op.name + (f" %{res.name_hint}" if res.name_hint else "")
        decl = Decl(var, rounded, comment=comment)
        # Values that do not depend on the element (scalars: bias corrections, constants)
        # are computed once per block (per thread on a GPU), outside the element loop.
        element_wise = isinstance(op, coco.DropoutOp) or (
            res in self.constants and not self.constants[res].scalar
        )
        if not element_wise and all(a in self.invariant for a in args):
            self.hoisted.append(decl)
            self.invariant.add(var)
        else:
            self.body.append(decl)
        self.local[res] = var
        return var

    def expression(self, op: Operation, args: list[Var]) -> Expr:
        match op:
            case coco.BinaryOp() | coco.UnaryOp():
                return _arithmetic(op, args)
            case coco.CmpOp():
                return Binary(COMPARISONS[op.predicate.data][1], args[0], args[1])
            case coco.SelectOp():
                return Select(args[0], args[1], args[2])
            case coco.SliceOp():
                # A re-indexing, not a computation: the operand is read at the slice's
                # coordinates by the iteration's index map.
                return args[0]
            case coco.CastOp():
                return _cast(op.result.type.elt, args[0])
            case coco.ConstantOp() if op.is_dense:
                o = self.constants[op.result]
                return Index(o.param, self.index_of(o))
            case coco.ConstantOp():
                elt = op.result.type.elt
                if _is_float(elt):
                    return c_float(op.number, elt)
                if elt == "i1":
                    return Lit("true" if op.number else "false")
                return _int_literal(op.number, elt)
            case coco.DropoutOp():
                from coconet.core.counter_rng import dropout_threshold

                assert self.gidx is not None
                n = self.dropouts.index(op)
                stream, seed = self.streams[n], self.seeds[n]
                elt = op.result.type.elt
                prob = op.prob.value.data
                scale = np.array(
                    1.0 / (1.0 - prob), dtype=np.float64 if elt == "f64" else np.float32
                )
                sfx = "" if elt == "f64" else "f"
                keep = _call(
                    "coco_dropout_keep",
                    seed,
                    self.gidx,
                    stream,
                    Lit(f"{dropout_threshold(prob)}u"),
                )
                return Select(keep, args[0] * Lit(scale.item().hex() + sfx), Lit(f"0.0{sfx}"))
            case _:
                raise NotImplementedError(f"no CUDA lowering for {op.name}")

    # -- stores and pushes -------------------------------------------------------------------

    def build_stores(self) -> None:
        it = self.k.iteration
        for s, p in zip(self.k.stores, self.out_params):
            value = store_expr(s.type.elt, self.ref(s.value))
            t = s.type
            if self.k.coincides(t, it):
                store = Assign(Index(p, self.i), value)
                self.body.append(store)
                self.vec_stores[id(store)] = _VecAccess(
                    p, self.i, t.elt, p.hint or p.fallback, value=value
                )
                continue
            # A smaller (broadcast) result: written once, by the elements at coordinate 0 of
            # every (collapsed) dim it is broadcast along.
            kept = [not self.k.broadcast(t, it, last) for _first, last in self.k.dim_groups()]
            guards: list[Expr] = [
                binary("==", c, 0) for c, keep in zip(self.coords, kept) if not keep
            ]
            terms: list[Expr] = []
            for g, c in enumerate(self.coords):
                if not kept[g]:
                    continue
                inner: list[Expr] = []
                for e in range(g + 1, len(self.coords)):
                    extent = self.dims[e]
                    if kept[e] and extent is not None:
                        inner.append(extent)
                terms.append(product_of([c, *inner]))
            index = sum_of(terms) if terms else Lit("0")
            self.body.append(If(all_of(guards), (Assign(Index(p, index), value),)))
        for g in self.gathers:
            # all_gather: this rank's element goes to its place in its own symmetric gathered
            # buffer, where the peers pull it from after the done-flags (and into the
            # updated argument the gathered value is assembled in, if any).
            o = g.operand
            t = tensor_type_of(o.value)
            value = store_expr(t.elt, self.ref(g.value))
            index = self.index_of(o)
            # This rank's own gathered buffer, found once per block (a table lookup left in
            # the vector loop would be a load between its math and its stores).
            name = o.value.name_hint or o.param.fallback
            mine = Var(C_STORAGE[t.elt].ptr(), f"{name}_mine", "mine_")
            self.hoisted.append(Decl(mine, peer(o.param, self.me, C_STORAGE[t.elt])))
            g.mine = mine
            own = Assign(Index(mine, index), value, comment="comm.all_gather")
            self.body.append(own)
            self.vec_stores[id(own)] = _VecAccess(mine, index, t.elt, name, value=value)
            if g.dest is not None:
                store = Assign(Index(g.dest, index), value)
                self.body.append(store)
                dest = g.dest.hint or g.dest.fallback
                self.vec_stores[id(store)] = _VecAccess(g.dest, index, t.elt, dest, value=value)

        for (v, received), table in zip(self.k.sends, self.send_params):
            # comm.send: the element goes straight into the receiver's buffer (between the
            # entry flags -- the receiver no longer reads its previous content -- and the
            # done flags, after which it may); a rank nobody sends to receives zeros.
            if not self.k.coincides(tensor_type_of(received), it):
                raise ValueError(f"a fused send of {received.type} over {it}")
            elt = tensor_type_of(received).elt
            storage = C_STORAGE[elt]
            value = store_expr(elt, self.ref(v))
            self.body.append(SendPush(table, self.send_to, self.i, value, storage))
            zero = store_expr(elt, c_float(0.0, elt) if _is_float(elt) else Lit("0"))
            mine = Index(peer(table, self.me, storage), self.i)
            self.body.append(
                If(binary("==", self.receives, 0), (Assign(mine, zero, comment="no sender"),))
            )

    # -- the kernel --------------------------------------------------------------------------

    def peer_sync(self, step: SyncStep) -> PeerSync:
        return PeerSync(step, self.flags, self.me, self.nranks, self.epoch, GRID_DIM, BLOCK_IDX)

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
        vector = (k.is_collective or bool(self.coords)) and self.contiguous_peers()
        vector = vector and bool(self.vector_elements(all_accesses=True))
        pull_vector = bool(self.gathers) and all(self.contiguous(g.operand) for g in self.gathers)
        stmts: list[Stmt] = []
        align: Expr = Lit("4")
        if vector or pull_vector:
            narrowest = min(self.vector_elements(all_accesses=vector))
            stmts.append(Decl(self.lanes, Lit(f"COCO_VEC_BYTES / {narrowest}")))
            align = self.lanes  # chunks start at whole vectors
        self.align = align
        chunk = _call("coco_chunk", self.end - self.begin, GRID_DIM, BLOCK_IDX, align)
        stmts += [Decl(self.range, chunk), *self.hoisted]
        if vector and self.peer_reads:
            # the group size bounded by the build's largest (coco_device.h coco_group)
            stmts.append(Decl(self.group, _call("coco_group", self.nranks)))
        if k.is_collective:
            # Entry: every earlier write of each peer is complete before any peer's input
            # is read (coco_device.h).
            stmts += [_thread_zero(self.peer_sync(SyncStep.ENTRY)), SyncBlock()]
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
            stmts += [SyncBlock(), _thread_zero(self.peer_sync(SyncStep.DONE))]
        if self.gathers:
            stmts += [SyncBlock(), *self.pull(pull_vector)]
        if k.reductions:
            stmts += self.finish_reductions()
        return Kernel(k.name, tuple(self.params), tuple(stmts))

    # -- vectors ---------------------------------------------------------------------------

    def contiguous(self, o: Operand) -> bool:
        """Whether consecutive elements of a vector read `o` at consecutive positions: along
        the iteration's own linear index, or along the innermost collapsed dim (stride 1:
        nothing after it), which a vector never crosses (`vector_end`)."""
        if o.identity or o.linear:
            return True
        return not o.scalar and o.strides[-1] is not None

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
        return _without_zeros(at)

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
            return _call("coco_vec_aligned", pointer + self.at_start(index))

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

    def peer_vector(self, r: _PeerReduction, arr: Var, i0: Var) -> tuple[list[Stmt], list[Stmt]]:
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
            exists: a select, not a branch (ptxas sinks loads issued before a branch past
            it, to their use after it)."""
            s, k = Var(I32, None, "s_"), Var(I32, None, "k_")
            exists = binary("<", s if isinstance(first, Lit) else first + s, self.group)
            combine = Combine(r.kind, acc_t, Index(arr, k), item(batch, s, k))
            step = Assign(Index(arr, k), Select(exists, combine, Index(arr, k)))
            return PeerSlots(s, Lit(str(start)), (LaneLoop(k, L, (step,)),))

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

    # -- the all_gather's pull ---------------------------------------------------------------

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
            head = [Decl(chunk, _call("coco_chunk", count, GRID_DIM, BLOCK_IDX, self.align))]
        begin, end = Field(chunk, "begin"), Field(chunk, "end")

        def src(g: _Gather) -> Expr:
            return peer(
                g.operand.param, q, C_STORAGE[tensor_type_of(g.operand.value).elt], const=True
            )

        def dst(g: _Gather) -> Expr:
            if g.dest is not None:
                return g.dest
            if g.mine is not None:
                return g.mine
            return peer(g.operand.param, self.me, C_STORAGE[tensor_type_of(g.operand.value).elt])

        def at(g: _Gather, element: Expr, coords: Sequence[Expr] = ()) -> Expr:
            """Where member q's element lands: its own base instead of this rank's."""
            base = g.operand.base
            index = rewrite(
                self.index_of(g.operand), lambda x: Index(g.bases, q) if x is base else None
            )
            return self.at_element(index, element, coords)

        # Member q's extents of the collapsed dims (uneven slices: its own).
        sizes = {id(self.dims[g]): Index(p, q) for g, p in self.peer_dims.items()}
        extents = [sizes.get(id(x), x) if x is not None else None for x in self.dims]

        def coordinates(element: Expr, coords: list[Var]) -> list[Stmt]:
            return self.coordinates(element, coords, extents) if coords else []

        j = Var(I64, None, "j_")
        # Strided pieces: the element's coordinates as in the element body.
        i = self.i
        copies = [Assign(Index(dst(g), at(g, i)), Index(src(g), at(g, i))) for g in self.gathers]
        element = (Decl(i, self.begin + j), *coordinates(i, self.coords), *copies)
        if not vector:
            per_peer: list[Stmt] = [*head, BlockStrideLoop(j, begin, end, element)]
        else:
            ok, qend = Var(BOOL, None, "qvec_"), Var(I64, None, "qend_")
            checks: list[Expr] = []
            for g in self.gathers:
                checks.append(_call("coco_vec_aligned", src(g) + self.at_start(at(g, self.i))))
                checks.append(_call("coco_vec_aligned", dst(g) + self.at_start(at(g, self.i))))
            checks += self.vector_coords(extents)
            v, i0 = Var(I64, None, "v_"), Var(I64, None, "i0_")
            vc = [Var(I64, None, f"v{c.fallback}_") for c in self.coords]
            vec_body: list[Stmt] = [Decl(i0, self.begin + v * self.lanes), *coordinates(i0, vc)]
            for g in self.gathers:
                storage = C_STORAGE[tensor_type_of(g.operand.value).elt]
                x, y, k = Var(storage, None, "x_"), Var(storage, None, "y_"), Var(I32, None, "k_")
                vec_body += [
                    VecIn(x, self.lanes, src(g) + at(g, i0, vc)),
                    VecOut(y, self.lanes, dst(g) + at(g, i0, vc)),
                    LaneLoop(k, self.lanes, (Assign(Index(y, k), Index(x, k)),)),
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

    # -- full reductions inside the kernel ------------------------------------------------
    # Each thread accumulates its elements in double (in a fixed order), the block combines
    # its threads in order into partials[block]; the LAST block of the rank to finish (an
    # atomic ticket: no block ever waits for another block of its rank) combines the blocks
    # in order, rounds the rank's partial to the element type as the unfused reduce does,
    # and exchanges it with the last blocks of its peers through symmetric memory; every
    # rank then combines the partials in rank order, in double, and rounds once: the
    # all_reduce. That exchange runs after the done-flags, which depend only on same-index
    # blocks, so no rank can wait on a block its own rank has not started.

    def kinds(self) -> list[tuple[ReduceKind, CType]]:
        """Each reduction's kind and accumulator type."""
        return [
            (ReduceKind(kind), _accumulator(tensor_type_of(v).elt))
            for v, kind, _ in self.k.reductions
        ]

    def reducing_loop(
        self, element: tuple[Stmt, ...], values: list[Var], vector: bool
    ) -> list[Stmt]:
        self.last = Var(BOOL, None, "last_")
        red = Var(F64.ptr(), None, "red_")
        accs = [Var(acc, None, f"acc{n}_") for n, (_, acc) in enumerate(self.kinds())]
        accumulate = tuple(
            Assign(a, Combine(kind, acc, a, Cast(acc, value)))
            for a, (kind, acc), value in zip(accs, self.kinds(), values)
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
                    Assign(Index(red, _at(n, BLOCK_DIM, THREAD_IDX)), Cast(F64, a))
                    for n, a in enumerate(accs)
                ),
            )
        )
        per_block: list[Stmt] = []
        for n, (kind, _) in enumerate(self.kinds()):
            # Threads' partials travel as doubles.
            a, t = Var(F64, None, f"a{n}_"), Var(U32, None, "t_")
            step = Assign(a, Combine(kind, F64, a, Index(red, _at(n, BLOCK_DIM, t))))
            per_block += [
                Decl(a, Identity(kind, F64), const=False),
                For(t, Lit("0"), BLOCK_DIM, (step,)),
                Assign(Index(self.partials, _at(n, GRID_DIM, BLOCK_IDX)), a),
            ]
        ticket = _call("coco_block_is_last", self.counter, GRID_DIM)
        per_block.append(Assign(Index(self.last, Lit("0")), ticket))
        return [
            SharedArray(self.last, 1),
            SharedDyn(red),
            *head,
            per_thread,
            SyncBlock(),
            _thread_zero(*per_block),
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
                lambda k: [Cast(acc, v) for v, (_, acc) in zip(values, kinds)],
            )
        ]

    def finish_reductions(self) -> list[Stmt]:
        last: list[Stmt] = [ExprStmt(_call("coco_threadfence_system"))]
        for n, ((v, _, _), (kind, _)) in enumerate(zip(self.k.reductions, self.kinds())):
            rank, b = Var(F64, None, f"rank{n}_"), Var(U32, None, "b_")
            step = Assign(rank, Combine(kind, F64, rank, Index(self.partials, _at(n, GRID_DIM, b))))
            # The unfused reduce rounds this rank's partial to the element type.
            partial = Cast(
                F64,
                load_expr(tensor_type_of(v).elt, store_from_double(tensor_type_of(v).elt, rank)),
            )
            p = Var(I32, None, "p_")
            slot = Index(peer(self.exchange, p, F64), _at(n, self.nranks, self.me))
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
            step = Assign(total, Combine(kind, F64, total, Index(mine, _at(n, self.nranks, p))))
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
        return [_thread_zero(*last, also=Index(self.last, Lit("0")))]


# --------------------------------------------------------------------------------------------
# Full reductions, and the table form of a kernel
# --------------------------------------------------------------------------------------------


def lane_partials(
    accs: Sequence[Var],
    kinds: Sequence[tuple[ReduceKind, CType]],
    lanes: Expr,
    first: Expr,
    vectors_end: Expr,
    vector: Callable[[Var, Callable[[Var], list[Stmt]]], Sequence[Stmt]],
    values_at: Callable[[Var], Sequence[Expr]],
) -> Stmt:
    """A thread's whole vectors v = `first`, `first` + coco_vector_threads(), ... below
    `vectors_end` with one accumulator per lane and reduction, the lanes then combined
    pairwise (lane k with lane k + s, for s = lanes/2, lanes/4, ..., 1) into the thread's
    accumulators `accs` (declared before, at the identity; an element loop continues them).
    `vector(v, then)` is vector v's statements, `then(k)` ending lane k's; `values_at(k)` is
    what lane k adds to each reduction, in its accumulator type. A fixed order on each
    target, and one the host vectorizes: in lane order it would be one long chain of
    dependent additions.

    Only a thread with a vector keeps lane accumulators, and on the host thread 0 takes all
    of a block's vectors (coco_vector_threads): a host vector is a tile of hundreds of lanes,
    and 256 threads setting up and combining them for a vector or two each spent ~100x the
    vectors' own time (LAMB's fused kernel at 4,096 elements: a 264 us launch). A thread
    without one would combine identities into the identity its accumulator holds."""
    lane_accs = [Var(a.ctype, None, f"{a.fallback}v") for a in accs]
    stmts: list[Stmt] = []
    for la, (kind, acc) in zip(lane_accs, kinds):
        k = Var(I32, None, "k_")
        identity = (Assign(Index(la, k), Identity(kind, acc)),)
        stmts += [LocalArray(la, lanes), LaneLoop(k, lanes, identity)]

    def into_lanes(k: Var) -> list[Stmt]:
        return [
            Assign(Index(la, k), Combine(kind, acc, Index(la, k), value))
            for la, (kind, acc), value in zip(lane_accs, kinds, values_at(k))
        ]

    v = Var(I64, None, "v_")
    stmts.append(For(v, first, vectors_end, tuple(vector(v, into_lanes)), step=VECTOR_THREADS))
    half = Var(I32, None, "s_")
    pairwise: list[Stmt] = []
    for la, (kind, acc) in zip(lane_accs, kinds):
        k = Var(I32, None, "k_")
        pair = Combine(kind, acc, Index(la, k), Index(la, k + half))
        pairwise.append(LaneLoop(k, half, (Assign(Index(la, k), pair),)))
    pairwise.append(Assign(half, Lit("2"), op="/="))
    stmts += [Decl(half, lanes / 2, const=False), While(binary(">", half, 0), tuple(pairwise))]
    stmts += [Assign(a, Index(la, Lit("0"))) for a, la in zip(accs, lane_accs)]
    has_vectors = Binary(
        "&&", binary("<", THREAD_IDX, VECTOR_THREADS), binary("<", first, vectors_end)
    )
    return If(has_vectors, tuple(stmts))


def reduction_kernels(name: str, kind: str, elt: str) -> tuple[Kernel, Kernel]:
    """Two kernels for a full reduction: per-block partials (double / long long, in a fixed
    order) and a one-block finish that combines them in block order and rounds once."""
    acc = _accumulator(elt)
    rkind = ReduceKind(kind)
    storage = C_STORAGE[elt]

    x = Param(storage.ptr(const=True, restrict=True), None, "x", kind=ParamKind.IN)
    partials = Param(acc.ptr(restrict=True), None, "partials", kind=ParamKind.PARTIALS)
    n = Param(I64, None, "n", kind=ParamKind.COUNT)
    shared, r = Var(acc.ptr(), None, "acc_"), Var(RANGE, None, "r_")
    a, i = Var(acc, None, "a"), Var(I64, None, "i")

    def term(value: Expr) -> Expr:
        load = Cast(acc, load_expr(elt, value))
        return load * load if rkind == ReduceKind.NORM else load

    # Whole vectors first, as fused kernels take them (lane_partials), then the elements after
    # the last vector. One element per thread at a time, in one dependent chain, ran at a
    # tenth of the host's memory bandwidth (a norm of 2^24 f32: 29 ms against a 2.7 ms
    # floor); 16-byte loads suit a GPU too. Chunks start at whole vectors.
    lanes, ok, vend = Var(I32, None, "lanes_"), Var(BOOL, None, "vec_"), Var(I64, None, "vend_")
    begin, end = Field(r, "begin"), Field(r, "end")
    xv = Var(storage, None, "x_v")

    def vector(v: Var, then: Callable[[Var], list[Stmt]]) -> list[Stmt]:
        k = Var(I32, None, "k_")
        return [VecIn(xv, lanes, x + v * lanes), LaneLoop(k, lanes, tuple(then(k)))]

    per_thread = ForThreads(
        (
            Decl(a, Identity(rkind, acc), const=False),
            lane_partials(
                [a],
                [(rkind, acc)],
                lanes,
                begin / lanes + THREAD_IDX,
                vend / lanes,
                vector,
                lambda k: [term(Index(xv, k))],
            ),
            For(
                i,
                vend + THREAD_IDX,
                end,
                (Assign(a, Combine(rkind, acc, a, term(Index(x, i)))),),
                step=BLOCK_DIM,
            ),
            Assign(Index(shared, THREAD_IDX), a),
        )
    )
    a2, t = Var(acc, None, "a"), Var(U32, None, "t")
    partial = Kernel(
        f"{name}_partial",
        (x, partials, n),
        (
            SharedDyn(shared),
            Decl(lanes, Lit(f"COCO_VEC_BYTES / {STORAGE_BYTES[elt]}")),
            Decl(r, _call("coco_chunk", n, GRID_DIM, BLOCK_IDX, lanes)),
            Decl(ok, _call("coco_vec_aligned", x + begin)),
            Decl(vend, Select(ok, begin + (end - begin) / lanes * lanes, begin)),
            per_thread,
            SyncBlock(),
            _thread_zero(
                Decl(a2, Identity(rkind, acc), const=False),
                For(
                    t, Lit("0"), BLOCK_DIM, (Assign(a2, Combine(rkind, acc, a2, Index(shared, t))),)
                ),
                Assign(Index(partials, BLOCK_IDX), a2),
            ),
        ),
    )

    partials_in = Param(acc.ptr(const=True, restrict=True), None, "partials", ParamKind.PARTIALS)
    count = Param(I64, None, "count", kind=ParamKind.COUNT)
    out = Param(storage.ptr(restrict=True), None, "out", kind=ParamKind.OUT)
    total, b = Var(acc, None, "total"), Var(I64, None, "b")
    value = _call("sqrt", total) if rkind == ReduceKind.NORM else total
    finish = Kernel(
        f"{name}_finish",
        (partials_in, count, out),
        (
            _thread_zero(
                Decl(total, Identity(rkind, acc), const=False),
                For(
                    b,
                    Lit("0"),
                    count,
                    (Assign(total, Combine(rkind, acc, total, Index(partials_in, b))),),
                ),
                Assign(Index(out, Lit("0")), store_from_double(elt, value)),
                also=binary("==", BLOCK_IDX, 0),
            ),
        ),
    )
    return partial, finish


def table_form(kernel: Kernel, name: str, shared: frozenset[ParamKind] = frozenset()) -> Kernel:
    """The TABLE form of a kernel: one launch running the same computation over many tensors
    of different sizes (CoCoNet's scattered tensors: an optimizer step over every parameter
    tensor of a model) instead of one launch per tensor, with no flattening copy.

    Every parameter but those of a `shared` kind (one value for every tensor: a fused
    collective's epoch) becomes a per-tensor table (pointers travel as 64-bit addresses);
    `blocks` holds the prefix sums of the blocks each tensor gets, so block b serves tensor t
    with blocks[t] <= b < blocks[t + 1], as block b - blocks[t] of a grid of
    blocks[t + 1] - blocks[t]. The body is the single-tensor body, reading its block index
    and grid size from there (a fused collective's blocks meet the same block of the same
    tensor on their peers, through that tensor's flags)."""
    tensor = Var(I32, None, "t_")
    tables: list[Param] = []
    loads: list[Stmt] = []
    for p in kernel.params:
        if p.kind in shared:
            tables.append(p)
            continue
        if p.ctype.pointer:
            tab_t = U64.ptr(const=True, restrict=True)
        else:
            # Integers travel as 64-bit entries (the executor's tables hold i64 or u64):
            # a collective's epoch, rank and group size are read back as their own type.
            tab_t = I64.ptr(const=True, restrict=True)
        tab = Param(
            tab_t,
            f"{p.hint}_tab" if p.hint else None,
            f"{p.fallback}_tab",
            kind=p.kind,
            value=p.value,
            dim=p.dim,
            table=True,
            span=p.span,
        )
        tables.append(tab)
        entry: Expr = Index(tab, tensor)
        if p.ctype.pointer:
            entry = Cast(p.ctype.unrestricted(), entry)
        elif p.ctype != I64:
            entry = Cast(p.ctype, entry)
        loads.append(Decl(p, entry))
    blocks = Param(I64.ptr(const=True, restrict=True), None, "blocks", kind=ParamKind.BLOCKS)
    ntensors = Param(I32, None, "ntensors", kind=ParamKind.NTENSORS)
    block, grid = Var(U32, None, "tb_"), Var(U32, None, "tg_")
    next_start = Index(blocks, tensor + 1)
    head: list[Stmt] = [
        Decl(tensor, Lit("0"), const=False),
        While(
            all_of(
                [binary("<", tensor + 1, ntensors), binary("<=", next_start, Cast(I64, BLOCK_IDX))]
            ),
            (Assign(tensor, Lit("1"), op="+="),),
        ),
        *loads,
        Decl(block, Cast(U32, BLOCK_IDX - Index(blocks, tensor))),
        Decl(grid, Cast(U32, next_start - Index(blocks, tensor))),
        Unused((block, grid)),
    ]

    def per_tensor(node: object) -> Expr | None:
        if node == BLOCK_IDX:
            return block
        if node == GRID_DIM:
            return grid
        return None

    body = rewrite(kernel.body, per_tensor)
    return Kernel(name, (*tables, blocks, ntensors), (*head, *body))


# ---------------------------------------------------------------------------------------------
# The intra-node kernels of a hierarchical fused collective (fused_collective.py)
# ---------------------------------------------------------------------------------------------
# A group spanning nodes works in two parts: the members on this rank's node (these kernels,
# over symmetric memory, with the cross-rank protocol) and one member per node (a library
# collective between nodes). Each rank handles the `parts` pieces of its members across nodes,
# packed one after the other (part k = the piece of its across-nodes member k): `bases[k]`
# says where that piece lies in the tensor.


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
        "epoch": Param(U32, None, "epoch", kind=ParamKind.EPOCH),
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

    def sync(step: SyncStep) -> Stmt:
        return _thread_zero(
            PeerSync(step, p["flags"], p["me"], p["nranks"], p["epoch"], GRID_DIM, BLOCK_IDX)
        )

    element = (
        Decl(i, p["begin"] + j),
        Decl(part, i / p["count"]),
        Decl(e, i % p["count"]),
        # A piece is runs of `run` elements `stride` apart (its sliced dim and the dims after).
        Decl(at, e / p["run"] * p["stride"] + e % p["run"]),
        *loop(i, part, at),
    )
    chunk = _call("coco_chunk", p["end"] - p["begin"], GRID_DIM, BLOCK_IDX, Lit("1"))
    body = (
        Decl(r_, chunk),
        sync(SyncStep.ENTRY),
        SyncBlock(),
        BlockStrideLoop(j, Field(r_, "begin"), Field(r_, "end"), element),
        SyncBlock(),
        sync(SyncStep.DONE),
        Unused((p["parts"],)),
    )
    return Kernel(name, tuple(p.values()), body)


def node_reduce_kernel(name: str, elt: str, kind: str) -> Kernel:
    """The intra-node reduce_scatter of a hierarchical fused collective: out[part, e] = the
    node's members' inputs at bases[part] + e, combined in member order in double (long long)
    -- the node's partial of the piece of this rank's member `part` across nodes, kept in
    double so that the reduce_scatter between nodes, which finishes it, rounds once."""
    acc_t, storage = _accumulator(elt), C_STORAGE[elt]
    p = _node_kernel_params(ParamKind.PEERS_IN, elt, "x_peers")
    p["out"] = Param(acc_t.ptr(restrict=True), None, "out", kind=ParamKind.OUT)
    rkind = ReduceKind(kind)

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


# --------------------------------------------------------------------------------------------
# Row reductions (coco.reduce_dims)
# --------------------------------------------------------------------------------------------


def row_reduction_kernel(name: str, kind: str, elt: str) -> Kernel:
    """A reduction over a run of consecutive dims, viewed as [outer, count, inner] (row r of
    the result is element (r / inner, :, r % inner)): one block per row (a block-stride loop
    over rows), `ROW_LANES` lanes shared by the block's threads, each lane accumulating its
    elements in order in double (long long), lane partials in shared memory combined in lane
    order by thread 0 and rounded once. This is the fixed order of the oracle
    (runtime/sim.py `reduce_rows`), so results are bit-identical for any block size."""
    mean = kind == "mean"
    rkind = ReduceKind.SUM if mean else ReduceKind(kind)
    acc = _accumulator(elt)
    storage = C_STORAGE[elt]
    lanes = coco.ROW_LANES

    x = Param(storage.ptr(const=True, restrict=True), None, "x", kind=ParamKind.IN)
    out = Param(storage.ptr(restrict=True), None, "out", kind=ParamKind.OUT)
    rows = Param(I64, None, "rows", kind=ParamKind.COUNT)
    count = Param(I64, None, "count", kind=ParamKind.COUNT)
    inner = Param(I64, None, "inner", kind=ParamKind.COUNT)

    partial = Var(acc, None, "lane_acc_")
    row, base = Var(I64, None, "row"), Var(I64, None, "base")
    lane, j, a = Var(I64, None, "lane"), Var(I64, None, "j"), Var(acc, None, "a")
    total, k = Var(acc, None, "total"), Var(I64, None, "k")
    element = Cast(acc, load_expr(elt, Index(x, base + j * inner)))
    per_lane = RowLanes(
        lane,
        j,
        count,
        lanes,
        (Decl(a, Identity(rkind, acc), const=False),),
        (Assign(a, Combine(rkind, acc, a, element)),),
        (Assign(Index(partial, lane), a),),
    )
    value: Expr = Binary("/", total, Cast(acc, count)) if mean else total
    finish = _thread_zero(
        Decl(total, Identity(rkind, acc), const=False),
        For(
            k,
            Lit("0"),
            Lit(str(lanes)),
            (Assign(total, Combine(rkind, acc, total, Index(partial, k))),),
        ),
        Assign(Index(out, row), store_from_double(elt, value)),
    )
    body = (
        SharedArray(partial, lanes),
        For(
            row,
            Cast(I64, BLOCK_IDX),
            rows,
            (
                Decl(base, (row / inner) * count * inner + row % inner),
                per_lane,
                SyncBlock(),
                finish,
                SyncBlock(),  # the lane partials are reused by the next row
            ),
            step=Cast(I64, GRID_DIM),
        ),
    )
    return Kernel(name, (x, out, rows, count, inner), body)
