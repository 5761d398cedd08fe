"""Small statement and expression builders every kernel uses: a value's name hint, a call of
the device layer, a phase of thread 0, and index arithmetic that leaves out its zeros and
ones (so the printed index reads as written by hand)."""

from __future__ import annotations

from xdsl.ir import SSAValue

from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    GRID_DIM,
    THREAD_IDX,
    Assign,
    Binary,
    Call,
    Decl,
    Expr,
    ForThreads,
    If,
    Lit,
    PeerSync,
    Stmt,
    SyncStep,
    Var,
    binary,
)


def value_hint(v: SSAValue, suffix: str = "") -> str | None:
    return f"{v.name_hint}{suffix}" if v.name_hint else None


def call(fn: str, *args: Expr) -> Call:
    return Call(fn, args)


def thread_zero(*body: Stmt, also: Expr | None = None) -> ForThreads:
    """A phase that thread 0 of the block runs alone (where `also` holds)."""
    cond = binary("==", THREAD_IDX, 0)
    return ForThreads((If(cond if also is None else Binary("&&", cond, also), body),))


def peers_entry(flags: Expr, me: Expr, nranks: Expr, epoch_at: Expr, epoch: Var) -> list[Stmt]:
    """The cross-rank protocol's entry: thread 0 takes this launch's epoch from its site's
    counter on the device (`epoch_at`, coco_device.h coco_epoch_next) into `epoch`, which the
    block's later protocol steps carry, and meets its peers' same block."""
    return [
        Decl(epoch, Lit("0u"), const=False),
        thread_zero(
            Assign(epoch, call("coco_epoch_next", epoch_at, GRID_DIM)),
            PeerSync(SyncStep.ENTRY, flags, me, nranks, epoch, GRID_DIM, BLOCK_IDX),
        ),
    ]


def without_zeros(x: Expr) -> Expr:
    """`x` without its terms `0 * y` and `y + 0` (an index at coordinates 0)."""
    if not isinstance(x, Binary) or x.op not in ("+", "*"):
        return x
    lhs, rhs = without_zeros(x.lhs), without_zeros(x.rhs)
    if x.op == "*" and Lit("0") in (lhs, rhs):
        return Lit("0")
    if x.op == "+" and lhs == Lit("0"):
        return rhs
    if x.op == "+" and rhs == Lit("0"):
        return lhs
    return Binary(x.op, lhs, rhs)


def scaled(x: Expr, factor: Expr) -> Expr:
    """x * factor, or x where the factor is the literal 1."""
    return x if factor == Lit("1") else x * factor


def row_element(k: int, stride: Expr, offset: Expr) -> Expr:
    """Element `offset` of the k-th row of `stride` elements."""
    return offset if k == 0 else k * stride + offset
