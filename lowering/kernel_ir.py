"""The kernel IR: the CUDA C kernels of a plan as typed data, printed by cuda_printer.py.

The lowering builds kernels out of these nodes instead of text, so that what other parts of
the compiler need to know about a kernel is read from the data: the executors type launch
arguments from each parameter's `CType` (carried by the plan as `KernelParam`s), the lowering
picks arguments by `ParamKind`, and the table form of a kernel is a rewrite of its body.

The node set is just what the kernels of the lowering use, in the shape of the device layer
(coco_device.h): block-level statements, the two phase kinds (`ForThreads`,
`BlockStrideLoop`), block synchronization, shared memory, and the cross-rank protocol of
fused collectives (`PeerSync`, whose steps are named functions of the header).

Values are `Var`s (identity objects: two variables may carry the same hint). A variable has
a `hint`, the program's SSA name where it has one, and a positional `fallback`; the printer
turns them into unique C identifiers. Printing with fallbacks only gives the kernel's text up
to naming; `structural_key` gives the same comparison without printing, which is how the
lowering finds identical kernels over differently named tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar, cast

from coconet.dialects.reduction import Reduction
from coconet.lowering.signature import (
    CType,
    ParamKind,
)

if TYPE_CHECKING:
    from xdsl.ir import SSAValue

# ---------------------------------------------------------------------------------------------
# Expressions
# ---------------------------------------------------------------------------------------------


class Expr:
    """A C expression. Arithmetic operators build `Binary` nodes (ints become literals)."""

    def __add__(self, other: Expr | int) -> Binary:
        return Binary("+", self, as_expr(other))

    def __radd__(self, other: int) -> Binary:
        return Binary("+", as_expr(other), self)

    def __sub__(self, other: Expr | int) -> Binary:
        return Binary("-", self, as_expr(other))

    def __rsub__(self, other: int) -> Binary:
        return Binary("-", as_expr(other), self)

    def __mul__(self, other: Expr | int) -> Binary:
        return Binary("*", self, as_expr(other))

    def __rmul__(self, other: int) -> Binary:
        return Binary("*", as_expr(other), self)

    def __truediv__(self, other: Expr | int) -> Binary:
        return Binary("/", self, as_expr(other))

    def __mod__(self, other: Expr | int) -> Binary:
        return Binary("%", self, as_expr(other))

    # No __getitem__: it would make every expression iterable (Python's legacy protocol).
    def at(self, index: Expr | int) -> Index:
        return Index(self, as_expr(index))


@dataclass(eq=False)
class Var(Expr):
    """A variable (a local or, as `Param`, a parameter). Identity matters, not the name."""

    ctype: CType
    # The program's SSA name of the value (or a name the lowering chose), if any.
    hint: str | None
    # The name when there is no hint, or when printing up to naming.
    fallback: str


@dataclass(eq=False)
class Param(Var):
    """A kernel parameter, with what the lowering needs to fill it (never printed)."""

    kind: ParamKind = ParamKind.IN
    value: SSAValue | None = field(default=None, repr=False)
    dim: int | None = None
    table: bool = False
    # DIM, GSTART, PEER_DIMS: how many iteration dims from `dim` on the parameter covers (the
    # kernel's coordinates run over collapsed dims: kernels/spec.py `dim_groups`).
    span: int = 1

    def for_value(self, value: SSAValue) -> Param:
        """This parameter filled from `value` instead (a kernel shared by another site): a
        copy of its fields, without `dataclasses.replace`'s pass through `__init__` (~4 us;
        a deep program's kernel sites copy thousands)."""
        copy = object.__new__(Param)
        copy.__dict__.update(self.__dict__)
        copy.value = value
        return copy


@dataclass(frozen=True)
class Lit(Expr):
    """A literal, spelled as it must appear (exact float literals are chosen by the lowering)."""

    text: str


@dataclass(frozen=True)
class Call(Expr):
    fn: str
    args: tuple[Expr, ...] = ()


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True)
class Unary(Expr):
    op: str
    operand: Expr


@dataclass(frozen=True)
class Cast(Expr):
    ctype: CType
    operand: Expr


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    then: Expr
    otherwise: Expr


@dataclass(frozen=True)
class Index(Expr):
    """`base[index]`: a load, or a store as the target of an `Assign`."""

    base: Expr
    index: Expr


@dataclass(frozen=True)
class Field(Expr):
    base: Expr
    name: str


def as_expr(x: Expr | int) -> Expr:
    return x if isinstance(x, Expr) else Lit(str(x))


def peer(table: Expr, rank: Expr | int, elt: CType, *, const: bool = False) -> Expr:
    """Peer `rank`'s buffer, from a table of the group members' addresses (a symmetric
    buffer reached through CUDA IPC / a shared-memory window)."""
    return Cast(elt.ptr(const=const), Index(table, as_expr(rank)))


def binary(op: str, lhs: Expr | int, rhs: Expr | int) -> Binary:
    return Binary(op, as_expr(lhs), as_expr(rhs))


def all_of(conds: list[Expr]) -> Expr:
    if not conds:
        return Lit("true")
    out = conds[0]
    for c in conds[1:]:
        out = Binary("&&", out, c)
    return out


def sum_of(terms: list[Expr]) -> Expr:
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def product_of(factors: list[Expr]) -> Expr:
    out = factors[0]
    for f in factors[1:]:
        out = out * f
    return out


# The launch geometry. Block-level code may use them anywhere; `thread_idx` only inside a phase.
BLOCK_IDX = Call("coco_block_idx")
GRID_DIM = Call("coco_grid_dim")
BLOCK_DIM = Call("coco_block_dim")
THREAD_IDX = Call("coco_thread_idx")
# The threads that share a block's vectors where each accumulates its own (coco_device.h).
VECTOR_THREADS = Call("coco_vector_threads")


@dataclass(frozen=True)
class Combine(Expr):
    """One step of a reduction in accumulator type `acc` (double, or coco_i64 for integers):
    `lhs (+) rhs`, with NumPy's max/min (a NaN wins) for floats."""

    kind: Reduction
    acc: CType
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True)
class Identity(Expr):
    """The initial value of a reduction of kind `kind` in accumulator type `acc`."""

    kind: Reduction
    acc: CType


# ---------------------------------------------------------------------------------------------
# Statements
# ---------------------------------------------------------------------------------------------


class Stmt:
    pass


@dataclass(frozen=True)
class Decl(Stmt):
    """Declares `var` (initialised by `init`); `comment` says which op it computes."""

    var: Var
    init: Expr | None
    const: bool = True
    comment: str = ""


@dataclass(frozen=True)
class Assign(Stmt):
    """`target op value`, op one of "=", "+=", "/="."""

    target: Expr
    value: Expr
    op: str = "="
    comment: str = ""


@dataclass(frozen=True)
class ExprStmt(Stmt):
    expr: Expr


@dataclass(frozen=True)
class Unused(Stmt):
    """`(void)x;` for variables some kernels never read (no warnings on either compiler)."""

    vars: tuple[Var, ...]


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]


@dataclass(frozen=True)
class For(Stmt):
    """`for (T var = begin; var < end; ++var)`, or `var += step` when a step is given."""

    var: Var
    begin: Expr
    end: Expr
    body: tuple[Stmt, ...]
    step: Expr | None = None


@dataclass(frozen=True)
class While(Stmt):
    cond: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class ForThreads(Stmt):
    """A phase in which every thread of the block runs `body` once."""

    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class BlockStrideLoop(Stmt):
    """A phase in which the threads of the block share the elements [begin, end)."""

    var: Var
    begin: Expr
    end: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class RowLanes(Stmt):
    """A phase that walks one row of `count` elements in the fixed order of row reductions
    (coco.ROW_LANES): `lane` in [0, lanes) shared by the block's threads (thread t takes
    lanes t, t + blockDim, ...), and for each lane `before`, then `body` at `element` =
    lane, lane + lanes, ... < count in order, then `after` (a lane's accumulators live in
    its thread between them). The oracle (runtime/sim.py `reduce_rows`) sums in this order,
    so a row kernel is bit-exact at any block size."""

    lane: Var
    element: Var
    count: Expr
    lanes: int
    before: tuple[Stmt, ...]
    body: tuple[Stmt, ...]
    after: tuple[Stmt, ...]


@dataclass(frozen=True)
class SyncBlock(Stmt):
    pass


@dataclass(frozen=True)
class LocalArray(Stmt):
    """`T var[size];`: a per-thread array (registers on a GPU once its loops are unrolled)."""

    var: Var
    size: Expr


@dataclass(frozen=True)
class ConstArray(Stmt):
    """`static const T var[n] = {values};`: a dense constant's values in the kernel's own
    text (global memory on a GPU, read-only data on the host), read at each element's
    position in the constant."""

    var: Var
    values: tuple[Expr, ...]


@dataclass(frozen=True)
class VecIn(Stmt):
    """`var` holds the vector of `lanes` elements at `src` (COCO_VEC_IN of the device layer:
    16-byte loads into registers on a GPU, a view of the memory on the host)."""

    var: Var
    lanes: Expr
    src: Expr


@dataclass(frozen=True)
class PeerVecIn(Stmt):
    """`var[s]` holds the vector of `lanes` elements at `index` of peer `first` + s, for the
    slots s < COCO_PEER_BATCH whose peer exists (`first` + s < `nranks`); `table` holds the
    peers' addresses (COCO_PEERS_VEC_IN: on a GPU every slot's 16-byte loads issued at once,
    in the order rotated by `me`, each slot in registers; views on the host)."""

    var: Var
    lanes: Expr
    table: Expr
    index: Expr
    first: Expr
    nranks: Expr
    me: Expr


@dataclass(frozen=True)
class PeerSlots(Stmt):
    """The slots of a batch of peers, `var` in [start, COCO_PEER_BATCH) in order (a
    compile-time count: unrolled on a GPU, so each slot is its own registers, and the body
    selects on the slot's peer existing); `exists`, that condition, which the host tests
    before the body (its slots are views, not registers)."""

    var: Var
    start: Expr
    exists: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class LoadsIssued(Stmt):
    """After the loads of a vector iteration (`vectors`: VecIn and PeerVecIn variables),
    before its math: on a GPU nothing may compute on loaded data until every one of them is
    issued (coco_loads_issued; `zero` is a kernel argument >= 0 that it turns into a 0 the
    compiler cannot see). Nothing on the host."""

    zero: Expr
    vectors: tuple[Var, ...]


# The peers a PeerVecIn loads at once (a compile-time constant of the device layer).
PEER_BATCH = Lit("COCO_PEER_BATCH_")


@dataclass(frozen=True)
class VecOut(Stmt):
    """`var` is the vector of `lanes` elements that a `VecStore` writes to `dst`."""

    var: Var
    lanes: Expr
    dst: Expr


@dataclass(frozen=True)
class VecStore(Stmt):
    """Writes the lanes of `vec` (a `VecOut` of the same `dst`) to memory."""

    vec: Var
    dst: Expr


@dataclass(frozen=True)
class LaneLoop(Stmt):
    """The lanes of a vector, `var` in [0, lanes): independent elements (unrolled on a GPU,
    one vectorized loop on the host)."""

    var: Var
    lanes: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class SharedArray(Stmt):
    """A fixed-size shared-memory array of `size` elements of `var`'s type."""

    var: Var
    size: int


@dataclass(frozen=True)
class SharedDyn(Stmt):
    """`var` points `offset` bytes into the launch's dynamic shared memory."""

    var: Var
    offset: int = 0


class SyncStep(Enum):
    """The steps of the cross-rank protocol of a fused collective kernel (coco_device.h)."""

    ENTRY = "coco_peers_entry"
    DONE = "coco_peers_done"
    EXIT = "coco_peers_exit"
    EXCHANGE = "coco_peers_exchange"


@dataclass(frozen=True)
class PeerSync(Stmt):
    """Thread 0 of a block runs one step of the cross-rank protocol with the same-index
    blocks of its peers (the exchange step: the last blocks of the ranks)."""

    step: SyncStep
    flags: Expr
    me: Expr
    nranks: Expr
    epoch: Expr
    grid: Expr
    block: Expr


@dataclass(frozen=True)
class SendPush(Stmt):
    """A `comm.send` inside a kernel: the element `value` stored straight into the receiver's
    buffer, `to`'s entry of the peer table `table` (symmetric memory: NVLink, shared memory),
    at `index` -- when this rank has a receiver (`to` >= 0)."""

    table: Expr
    to: Expr
    index: Expr
    value: Expr
    elt: CType


@dataclass(frozen=True)
class Kernel:
    """A `COCO_KERNEL`: its parameters and its body (between BODY_BEGIN and BODY_END)."""

    name: str
    params: tuple[Param, ...]
    body: tuple[Stmt, ...]


# ---------------------------------------------------------------------------------------------
# Rewriting
# ---------------------------------------------------------------------------------------------

N = TypeVar("N")


# The field names of each node type (dataclasses.fields is slow to ask per node).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


# Per node type, how `rewrite` treats it: a leaf fn never sees (a string, a number, a C
# type, ...), a variable (fn sees it; never descended into), or a node it descends into.
_LEAF, _VARIABLE, _NODE = 0, 1, 2
_REWRITE_KIND: dict[type, int] = {}


def _rewrite_kind(cls: type) -> int:
    kind = _REWRITE_KIND.get(cls)
    if kind is None:
        if not issubclass(cls, Expr | Stmt):
            kind = _LEAF
        elif issubclass(cls, Var) or not is_dataclass(cls):
            kind = _VARIABLE
        else:
            kind = _NODE
        _REWRITE_KIND[cls] = kind
    return kind


def rewrite(node: N, fn: Callable[[Any], Any | None]) -> N:
    """`node` with every expression or statement `x` (variables included) for which fn(x) is
    not None replaced by fn(x), top down (a replacement is not visited again). Variables are
    leaves: the body refers to them by identity. What does not change is shared, not copied
    (the nodes are immutable)."""
    cls = type(node)
    if cls is tuple:
        items = cast("tuple[object, ...]", node)
        new_items = [rewrite(x, fn) for x in items]
        if all(a is b for a, b in zip(new_items, items)):
            return node
        return tuple(new_items)  # type: ignore[return-value]
    kind = _rewrite_kind(cls)
    if kind == _LEAF:
        return node
    replaced = fn(node)
    if replaced is not None:
        return replaced
    if kind == _VARIABLE:
        return node
    fields_of = node.__dict__
    changes: dict[str, object] | None = None
    for name in _field_names(cls):
        old = fields_of[name]
        new = rewrite(old, fn)
        if new is not old:
            if changes is None:
                changes = {}
            changes[name] = new
    if changes is None:
        return node
    # A frozen dataclass's copy with some fields changed: `dataclasses.replace` without its
    # per-call field inspection and __init__ (these nodes have no __post_init__).
    copy = object.__new__(cls)
    copy.__dict__.update(fields_of)
    copy.__dict__.update(changes)
    return copy


def declared(node: Any) -> list[Var]:
    """The variables `node` (a statement or a tuple of them) declares, in order."""
    out: list[Var] = []

    def visit(x: Any) -> None:
        if isinstance(x, tuple):
            for y in cast("tuple[object, ...]", x):  # isinstance leaves its items unknown
                visit(y)
            return
        if not isinstance(x, Stmt):
            return
        if isinstance(x, RowLanes):
            out.extend((x.lane, x.element))
        for f in fields(x):  # type: ignore[arg-type]
            value = getattr(x, f.name)
            if f.name == "var" and isinstance(value, Var):
                out.append(value)
            elif isinstance(value, tuple | Stmt):
                visit(value)

    visit(node)
    return out


def fresh_copy(stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """`stmts` with every variable they declare replaced by a new one of the same type and
    names: a second copy of a body (each variable is declared once in a kernel)."""
    renamed = {id(v): Var(v.ctype, v.hint, v.fallback) for v in declared(stmts)}
    return rewrite(stmts, lambda x: renamed.get(id(x)) if isinstance(x, Var) else None)


def uses(node: Any, var: Var) -> bool:
    """Whether `var` occurs anywhere in `node` (a walk that stops at the first occurrence)."""
    if node is var:
        return True
    if isinstance(node, tuple):
        return any(uses(x, var) for x in cast("tuple[object, ...]", node))
    if isinstance(node, Var) or not isinstance(node, Expr | Stmt):
        return False
    return any(uses(getattr(node, name), var) for name in _field_names(type(node)))


# ---------------------------------------------------------------------------------------------
# Comparing kernels
# ---------------------------------------------------------------------------------------------

# A kernel's structure up to naming (structural_key): node types, fields and variables (by
# type, fallback and order of first occurrence) in preorder, hashable and comparable with ==.
KernelKey = tuple[object, ...]

# How structural_key reads each node type: None for a leaf (compared as it is), else the
# names of the fields it compares, in order (dataclasses.fields is slow to ask per node).
_KEY_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _key_fields(cls: type, comments: bool) -> tuple[str, ...] | None:
    if not issubclass(cls, Expr | Stmt) or not is_dataclass(cls):
        return None
    return tuple(f.name for f in fields(cls) if comments or f.name != "comment")


def structural_key(kernel: Kernel, *, comments: bool = True) -> KernelKey:
    """`kernel` up to its name and its variables' hints, as a hashable key: two kernels with
    equal keys print alike with positional names (`print_kernel(..., hints=False)`), so the
    lowering compares kernels by key instead of printing each one. A variable is its type,
    its fallback name and the order of its first occurrence (a binding, not a spelling);
    parameters count only what the printer shows of them. `comments=False` leaves out the
    comments naming the program's values a kernel computes.

    The key is the nodes in preorder, flat: each node's type and then its fields (a tuple:
    `tuple`, its length, then its items), which the types' fixed fields make unambiguous."""
    variables: dict[int, tuple[object, ...]] = {}
    table = _KEY_FIELDS if comments else _KEY_FIELDS_BARE
    out: list[object] = []
    emit = out.append

    def visit(x: object) -> None:
        cls = type(x)
        if cls in _LEAVES:
            emit(x)
        elif cls is tuple:
            items = cast("tuple[object, ...]", x)
            emit(tuple)
            emit(len(items))
            for y in items:
                visit(y)
        elif cls is Var or cls is Param:
            assert isinstance(x, Var)
            got = variables.get(id(x))
            if got is None:
                t = x.ctype
                got = (t.name, t.pointer, t.const, t.restrict, x.fallback, len(variables))
                variables[id(x)] = got
            emit(got)
        else:
            try:
                names = table[cls]
            except KeyError:
                names = table[cls] = _key_fields(cls, comments)
            if names is None:
                emit(x)  # a leaf: CType, an enum member
                return
            emit(cls)
            for name in names:
                visit(getattr(x, name))

    visit(kernel.params)
    visit(kernel.body)
    return tuple(out)


# Types compared as they are, without a lookup.
_LEAVES = frozenset({str, int, bool, type(None), CType})

_KEY_FIELDS_BARE: dict[type, tuple[str, ...] | None] = {}
