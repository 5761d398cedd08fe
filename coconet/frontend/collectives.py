"""The communication ops: collectives over grid axes (AllReduce, ReduceScatter, AllGather,
Broadcast, Reduce) and Send to a rank of the group."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import (
    DenseArrayBase,
    IntegerAttr,
    i64,
)
from xdsl.ir import Attribute
from xdsl.utils.exceptions import VerifyException

from coconet.core.program import CocoError
from coconet.dialects import comm, layout_rules
from coconet.dialects.reduction import Reduction
from coconet.frontend import dtypes
from coconet.frontend.compute import _axes
from coconet.frontend.naming import user_location
from coconet.frontend.values import Value, _build_error, _current, _finish, _lift, _token

_REDUCTIONS = {
    "+": Reduction.SUM, "sum": Reduction.SUM, "summation": Reduction.SUM, "add": Reduction.SUM,
    "*": Reduction.PROD, "prod": Reduction.PROD, "multiplication": Reduction.PROD,
    "mul": Reduction.PROD,
    "max": Reduction.MAX, "maximum": Reduction.MAX,
    "min": Reduction.MIN, "minimum": Reduction.MIN,
}  # fmt: skip


def _reduction_kind(op: object) -> Reduction:
    key = op.lower() if isinstance(op, str) else op
    if not isinstance(key, str) or key not in _REDUCTIONS:
        raise CocoError(
            f"{user_location()}: unknown reduction {op!r}: use '+' (sum), '*' (prod), 'max' or "
            "'min'"
        )
    return _REDUCTIONS[key]


def _op_and_tensor(name: str, op: object, x: object) -> tuple[Reduction, Value]:
    if isinstance(op, Value) and x is None:
        op, x = "+", op
    if not isinstance(x, Value):
        raise CocoError(f"{user_location()}: {name}(op, x) takes a reduction and a tensor")
    return _reduction_kind(op), x


def _over(over: object) -> str:
    return "" if over is None else f", over={over!r}"


def _acc(acc: object) -> str:
    return "" if acc is None else f", acc={acc}"


def _collective(
    expr: str,
    x: Value,
    cls: type[comm.CollectiveOp],
    props: dict[str, Attribute],
    dim: int | None = None,
    to_dim: int | None = None,
) -> Value:
    """`to_dim`: an all_to_all's target dim (a type, not a property, carries it)."""
    (a,) = _lift([x], expr, expr)
    b = _current(expr)

    if dim is not None:
        props = props | {"dim": IntegerAttr(dim, i64)}

    def make(result_type: Attribute) -> comm.CollectiveOp:
        return cls.build(operands=[a.ssa], result_types=[result_type], properties=dict(props))

    # A collective's result depends on the grid, which an op sees only once it sits in the
    # function: infer on a probe placed there, then build the op with the inferred type.
    probe = make(a.type)
    b.block.insert_op_before(probe, b.terminator)
    try:
        if isinstance(probe, comm.AllToAllOp):
            grid = layout_rules.grid_of(probe)
            target = comm.collective_result_type(
                comm.AllToAllOp, a.type, probe.span(), grid.rank, dim=to_dim or 0,
                operand=lambda: f"{a.type}",
            )  # fmt: skip
            result_type = layout_rules.check_all_to_all(probe, a.type, target, probe.span(), grid)
        else:
            result_type = probe.infer()
            comm.check_acc(probe, a.type.elt)
    except VerifyException as e:
        raise _build_error(expr, [a], str(e)) from None
    finally:
        b.block.detach_op(probe)
        probe.erase()
    op = make(result_type)
    b.insert(op, expr, [a])
    return _finish(op, b)


def _collective_props(
    kind: Reduction | None = None,
    over: object = None,
    root: int | None = None,
    *,
    acc: object = None,
) -> dict[str, Attribute]:
    props: dict[str, Attribute] = {}
    if acc is not None:
        props["acc"] = dtypes.element_type_of(acc)
    if kind is not None:
        props["kind"] = comm.CollectiveKindAttr(kind)
    if root is not None:
        if isinstance(root, bool) or not isinstance(root, int):
            raise CocoError(f"{user_location()}: the root is a rank index (an int), got {root!r}")
        props["root"] = IntegerAttr(root, i64)
    axes = _axes(over)
    if axes is not None:
        props["axes"] = DenseArrayBase.from_list(i64, axes)
    return props


def AllReduce(
    op: str | Value = "+", x: Value | None = None, *, over=None, acc: Attribute | None = None
) -> Value:
    """`AllReduce("+", g)`: the reduction over the ranks of every grid axis in `over` (all
    axes by default), replicated on them. Takes local or replicated tensors. `acc=F32` states
    the accumulation type (each partial rounded to it in rank order; default: f64, rounded
    once)."""
    kind, x = _op_and_tensor("AllReduce", op, x)
    expr = f"AllReduce({kind}, {_token(x)}{_over(over)}{_acc(acc)})"
    return _collective(expr, x, comm.AllReduceOp, _collective_props(kind, over, acc=acc))


def ReduceScatter(
    op: str | Value = "+",
    x: Value | None = None,
    *,
    dim: int = 0,
    over=None,
    acc: Attribute | None = None,
) -> Value:
    """Reduce, and keep this rank's part along `dim` (the result is sliced<dim>); `acc` as
    for AllReduce."""
    kind, x = _op_and_tensor("ReduceScatter", op, x)
    expr = f"ReduceScatter({kind}, {_token(x)}, dim={dim}{_over(over)}{_acc(acc)})"
    props = _collective_props(kind, over, acc=acc)
    return _collective(expr, x, comm.ReduceScatterOp, props, dim=dim)


def AllGather(x: Value, *, over=None) -> Value:
    """Gather a sliced tensor's parts: replicated on the spanned axes."""
    expr = f"AllGather({_token(x)}{_over(over)})"
    return _collective(expr, x, comm.AllGatherOp, _collective_props(over=over))


def AllToAll(x: Value, dim: int = 0, *, over=None) -> Value:
    """Re-cut a tensor sliced on the spanned axes along `dim` instead (each rank keeps its
    part of `dim`, whole along the dim it was sliced on); or, for a local tensor (dispatch
    buffers: `dim` unused), send block j of dim 0 to member j and receive member j's block
    for this rank as block j (torch's all_to_all_single)."""
    expr = f"AllToAll({_token(x)}, dim={dim}{_over(over)})"
    return _collective(expr, x, comm.AllToAllOp, _collective_props(over=over), to_dim=dim)


def Broadcast(x: Value, root: int = 0, *, over=None) -> Value:
    """The value of rank `root` (of each group) on every rank."""
    expr = f"Broadcast({_token(x)}, root={root}{_over(over)})"
    return _collective(expr, x, comm.BroadcastOp, _collective_props(over=over, root=root))


def Reduce(
    op: str | Value = "+",
    x: Value | None = None,
    root: int = 0,
    *,
    over=None,
    acc: Attribute | None = None,
) -> Value:
    """The reduction lands on rank `root`; the other ranks keep their input (local); `acc` as
    for AllReduce."""
    kind, x = _op_and_tensor("Reduce", op, x)
    expr = f"Reduce({kind}, {_token(x)}, root={root}{_over(over)}{_acc(acc)})"
    return _collective(expr, x, comm.ReduceOp, _collective_props(kind, over, root, acc=acc))


@dataclass(frozen=True)
class _GroupOffset:
    shift: int

    def __add__(self, k: int) -> _GroupOffset:
        return _GroupOffset(self.shift + int(k))

    def __sub__(self, k: int) -> _GroupOffset:
        return _GroupOffset(self.shift - int(k))

    def __repr__(self) -> str:
        if self.shift == 0:
            return "GROUP"
        return f"GROUP + {self.shift}" if self.shift > 0 else f"GROUP - {-self.shift}"


class _SameRank:
    def __repr__(self) -> str:
        return "RANK"


GROUP = _GroupOffset(0)
"""This rank's group (pipeline stage, grid axis 0); `GROUP + 1` is the next one."""
RANK = _SameRank()
"""This rank's position inside its group."""


@dataclass(frozen=True)
class GroupRank:
    """A point-to-point peer as CoCoNet writes it: `GroupRank(GROUP + 1, RANK)` is the rank at
    the same position of the next group (grid axis 0)."""

    group: _GroupOffset
    rank: _SameRank = RANK

    def __post_init__(self) -> None:
        if not isinstance(self.group, _GroupOffset) or not isinstance(self.rank, _SameRank):
            raise CocoError("GroupRank(GROUP + k, RANK) names the same rank k groups further on")
        if self.group.shift == 0:
            raise CocoError("GroupRank(GROUP, RANK) is this rank itself: send to GROUP + k")


def Send(x: Value, to: GroupRank | None = None, *, along: int = 0, shift: int = 1) -> Value:
    """Send `x` to the rank `shift` further along grid axis `along` (or `to`, a GroupRank) and
    return what this rank received (zeros where no rank sends to it); local along `along`."""
    if to is not None:
        if not isinstance(to, GroupRank):
            raise CocoError(f"{user_location()}: Send(x, to): `to` is a GroupRank, got {to!r}")
        along, shift = 0, to.group.shift
    expr = f"Send({_token(x)}, along={along}, shift={shift})"
    for what, n in (("along", along), ("shift", shift)):
        if isinstance(n, bool) or not isinstance(n, int):
            raise CocoError(f"{user_location()}: `{expr}`: `{what}` is an int, got {n!r}")
    props: dict[str, Attribute] = {
        "along": IntegerAttr(along, i64),
        "shift": IntegerAttr(shift, i64),
    }
    return _collective(expr, x, comm.SendOp, props)
