"""`Value`, a tensor while a program is built, and the builder of that program: operands and
Python literals turned into IR, each op inserted and verified where the user wrote it (an
error names the rule, the operands and the line), the elementwise ops its operators make."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    IntegerType,
    ModuleOp,
    i1,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.utils.exceptions import VerifyException

from coconet.core.program import CocoError
from coconet.dialects import coco, layout_rules
from coconet.dialects.coco import (
    GRID_ATTR_NAME,
    GridAttr,
    TensorType,
    is_float_type,
)
from coconet.frontend.naming import (
    check_name,
    user_frames,
    user_location,
    valid_name,
    variable_holding,
)
from coconet.frontend.specs import TensorSpec, tensor_type


class Value:
    """A tensor while a program is built: a declared argument or the result of an op.

    Arithmetic (`+ - * / ** @`, unary `-`, `abs`) and comparisons (`< <= > >=`) build ops;
    `==` keeps Python's identity meaning (so values work in sets and dicts): use Eq/Ne."""

    __slots__ = ("_builder", "_spec", "_ssa")

    def __init__(
        self, ssa: SSAValue | None, builder: _Builder | None, spec: TensorSpec | None = None
    ):
        self._ssa = ssa
        self._builder = builder
        self._spec = spec

    # -- queries ---------------------------------------------------------------------------

    @property
    def ssa(self) -> SSAValue:
        if self._ssa is None:
            raise CocoError(
                f"{self!r} is a declaration outside any program: declare it as a parameter of "
                "a @program function (annotation or default) or inside its body"
            )
        return self._ssa

    @property
    def type(self) -> TensorType:
        if self._ssa is None:
            s = self._spec
            assert s is not None
            return TensorType(s.shape, s.dtype, s.layouts)
        return self._ssa.type  # type: ignore[return-value]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.get_shape()

    @property
    def dtype(self) -> Attribute:
        return self.type.element_type

    @property
    def layout(self) -> str:
        return self.type.layout_text()

    @property
    def name(self) -> str | None:
        if self._ssa is None:
            return self._spec.name if self._spec else None
        return self._ssa.name_hint

    def named(self, name: str) -> Value:
        """Name this value in the IR (`%name`); returns the value itself."""
        check_name(name, "a value")
        if isinstance(self.ssa, BlockArgument) and self.ssa.name_hint:
            raise CocoError(
                f"'{self.ssa.name_hint}' is a program argument: its name is fixed where it is "
                "declared"
            )
        self.ssa.name_hint = name
        return self

    def __repr__(self) -> str:
        name = self.name
        return f"<coconet Value {'%' + name if name else '(unnamed)'} : {self.type}>"

    def __bool__(self) -> bool:
        raise CocoError(
            f"{self!r} has no truth value while a program is built (its elements are only "
            "known when it runs): use Ite(cond, a, b) for an elementwise choice"
        )

    __hash__ = object.__hash__
    __array_ufunc__ = None  # `np.float32(2) * x` defers to Value.__rmul__ instead of NumPy

    # -- operators ---------------------------------------------------------------------------

    def __add__(self, o: Any) -> Value:
        return _binary(coco.AddOp, "+", self, o)

    def __radd__(self, o: Any) -> Value:
        return _binary(coco.AddOp, "+", o, self)

    def __sub__(self, o: Any) -> Value:
        return _binary(coco.SubOp, "-", self, o)

    def __rsub__(self, o: Any) -> Value:
        return _binary(coco.SubOp, "-", o, self)

    def __mul__(self, o: Any) -> Value:
        return _binary(coco.MulOp, "*", self, o)

    def __rmul__(self, o: Any) -> Value:
        return _binary(coco.MulOp, "*", o, self)

    def __truediv__(self, o: Any) -> Value:
        return _binary(coco.DivOp, "/", self, o)

    def __rtruediv__(self, o: Any) -> Value:
        return _binary(coco.DivOp, "/", o, self)

    def __pow__(self, o: Any) -> Value:
        return _binary(coco.PowOp, "**", self, o)

    def __rpow__(self, o: Any) -> Value:
        return _binary(coco.PowOp, "**", o, self)

    def __matmul__(self, o: Any) -> Value:
        return MatMul(self, o)

    def __neg__(self) -> Value:
        return _unary(coco.NegOp, "-", self)

    def __pos__(self) -> Value:
        return self

    def __abs__(self) -> Value:
        return _unary(coco.AbsOp, "abs", self)

    def __lt__(self, o: Any) -> Value:
        return _compare("lt", "<", self, o)

    def __le__(self, o: Any) -> Value:
        return _compare("le", "<=", self, o)

    def __gt__(self, o: Any) -> Value:
        return _compare("gt", ">", self, o)

    def __ge__(self, o: Any) -> Value:
        return _compare("ge", ">=", self, o)


_state = threading.local()


def _stack() -> list[_Builder]:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


class _Builder:
    """One program under construction: a func.func inside a module, filled op by op."""

    # Locals looked at to name values, over all builds (a work count for the scaling test).
    locals_examined = 0

    def __init__(self, name: str, grid: GridAttr, code: Any):
        self.grid = grid
        self.block = Block()
        self.func = func.FuncOp(name, ([], []), Region(self.block))
        self.func.attributes[GRID_ATTR_NAME] = grid
        self.module = ModuleOp([self.func])
        # Ops go before a placeholder terminator, so the block is well formed whenever an op
        # is verified; the program's real func.return replaces it at the end.
        self.terminator = func.ReturnOp()
        self.block.add_op(self.terminator)
        self.code = code  # the program function's code: its frame bounds the name scan
        self.updated: dict[SSAValue, str] = {}  # target -> where it was updated
        self.arg_names: dict[str, str] = {}  # name -> where declared
        self.symmetric: set[int] = set()  # arguments declared symmetric=True
        self.constants: dict[tuple[str, Attribute], Value] = {}  # literal constants
        self.unnamed: dict[int, Value] = {}  # id -> an op result no variable has named yet

    # -- arguments -----------------------------------------------------------------------

    def declare(self, spec: TensorSpec, where: str) -> Value:
        t = tensor_type(spec)
        try:
            layout_rules.check_type_fits_grid(t, self.grid, f"tensor '{spec.name or '?'}'")
        except VerifyException as e:
            raise CocoError(f"{where}: " + _layout_hint(str(e), self.grid)) from None
        arg = self.block.insert_arg(t, len(self.block.args))
        if spec.symmetric:
            self.symmetric.add(arg.index)
        if spec.name is not None:
            self.name_argument(arg, spec.name, where)
        return self.track(Value(arg, self))

    def name_argument(self, arg: BlockArgument, name: str, where: str) -> None:
        check_name(name, "a program argument")
        if name in self.arg_names:
            raise CocoError(
                f"{where}: a second program argument named '{name}' (the first was declared "
                f"at {self.arg_names[name]}): argument names must be unique, inputs are "
                "passed by name"
            )
        self.arg_names[name] = where
        arg.name_hint = name

    # -- ops -------------------------------------------------------------------------------

    def insert(self, op: Operation, expr: str, operands: Sequence[Value]) -> Operation:
        """Append `op` and verify it where it stands; a violation is a CocoError."""
        self.block.insert_op_before(op, self.terminator)
        try:
            op.verify()
        except VerifyException as e:
            self.block.detach_op(op)
            op.erase(safe_erase=False)
            raise _build_error(expr, operands, str(e)) from None
        return op

    def track(self, value: Value) -> Value:
        """`value` (an op's result, an argument declared without a name), to be named after
        the first local variable that holds it."""
        if value._ssa is not None and value._ssa.name_hint is None:
            self.unnamed[id(value)] = value
        return value

    def name_from_frames(self) -> None:
        """Name unnamed values after the local variables that hold them, outer frames first
        (so a helper's parameter name does not shadow the caller's variable). Each op's
        emission does this, so it looks up only the values still unnamed: a scan per op that
        tested every local (a 400-layer program's 800 weights) made building quadratic."""
        if not self.unnamed:
            return
        frames = user_frames(self.code)
        if frames is None:
            return
        for frame in reversed(frames):
            self.name_from_locals(frame.f_locals)

    def name_from_locals(self, local_vars: dict[str, Any]) -> None:
        unnamed = self.unnamed
        # Latest locals first: a frame lists its parameters (a deep model's many weights)
        # before the variables its body assigns, which are the ones that hold new results.
        for var, obj in reversed(local_vars.items()):
            _Builder.locals_examined += 1
            if (
                id(obj) in unnamed
                and unnamed[id(obj)] is obj
                and valid_name(var)
                and var.strip("_")  # `_` is a throwaway, not a name
            ):
                del unnamed[id(obj)]
                ssa = obj._ssa
                if ssa is not None and ssa.name_hint is None:
                    ssa.name_hint = var
                if not unnamed:
                    return


def _current(what: str) -> _Builder:
    stack = _stack()
    if not stack:
        raise CocoError(f"{what} builds IR, so it must run inside a @program function")
    return stack[-1]


def _python_name(v: Value) -> str | None:
    """The name a user knows `v` by: its SSA name, else a local variable holding it."""
    if v._ssa is not None and v._ssa.name_hint:
        return v._ssa.name_hint
    if v._builder is not None and id(v) in v._builder.unnamed:
        v._builder.name_from_frames()  # the values pending a name, at once
        if v._ssa is not None and v._ssa.name_hint:
            return v._ssa.name_hint
    return variable_holding(v)


def _describe(v: Value) -> str:
    name = _python_name(v)
    if name is not None:
        return f"'{name}' ({v.type})"
    if v._ssa is not None and isinstance(v._ssa.owner, Operation):
        return f"an unnamed {v._ssa.owner.name} result ({v.type})"
    return f"an unnamed value ({v.type})"


def _short(v: Value) -> str:
    return _python_name(v) or "_"


def _build_error(expr: str, operands: Sequence[Value], message: str) -> CocoError:
    involved = ", ".join(_describe(v) for v in operands)
    text = f"{user_location()}: cannot build `{expr}`"
    if involved:
        text += f" from {involved}"
    grid = _stack()[-1].grid if _stack() else None
    return CocoError(text + ":\n  " + (_layout_hint(message, grid) if grid else message))


def _layout_hint(message: str, grid: GridAttr) -> str:
    if "[element-types]" in message and "coco.cast" in message:
        message += " (in Python: Cast(F32, x))"
    if "[layouts-per-axis]" in message:
        message += f"; e.g. Tensor(F16, shape, [Local, Sliced(0)]) on the grid {grid}"
    return message


def _operand(x: Value, what: str) -> Value:
    b = _current(what)
    if x._builder is not b or x._ssa is None:
        if x._ssa is None:
            raise CocoError(
                f"{user_location()}: {what} uses a declaration made outside the program: "
                "declare tensors as parameters of the @program function or inside its body"
            )
        raise CocoError(f"{user_location()}: {what} uses {x!r}, a value of another program")
    if x._ssa in b.updated:
        name = x._ssa.name_hint or "the argument"
        raise CocoError(
            f"{user_location()}: `{what}` reads '{name}' after Update({name}, ...) at "
            f"{b.updated[x._ssa]}: read the new value (what Update returned) instead"
        )
    return x


def _is_literal(x: object) -> bool:
    return isinstance(x, int | float) or (type(x).__module__ == "numpy" and hasattr(x, "item"))


def _python_scalar(x: object) -> object:
    """A NumPy scalar as the Python number it holds (`item()`); anything else as it is."""
    item = getattr(x, "item", None)
    return item() if callable(item) else x


def _literal_value(x: object, like: TensorType, expr: str) -> float | int | bool:
    """Check a Python number against the element type it will take; normalize it."""
    value = _python_scalar(x)
    elt = like.element_type
    if isinstance(elt, IntegerType) and elt.width.data == 1:
        if not (isinstance(value, bool) or value in (0, 1)):
            raise CocoError(
                f"{user_location()}: `{expr}`: the literal {value!r} meets an i1 tensor; use "
                "True or False"
            )
        return bool(value)
    if isinstance(value, bool):
        raise CocoError(
            f"{user_location()}: `{expr}`: the literal {value!r} meets a tensor of {like.elt}; "
            "booleans only combine with i1 tensors"
        )
    if isinstance(value, float) and not is_float_type(elt):
        raise CocoError(
            f"{user_location()}: `{expr}`: the float literal {value!r} meets an integer "
            f"({like.elt}) tensor; use an int literal or Cast the tensor"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise CocoError(f"{user_location()}: `{expr}`: the literal {value!r} is not finite")
    if not isinstance(value, int | float):  # a NumPy complex, say
        raise CocoError(f"{user_location()}: `{expr}`: the literal {value!r} is not a real number")
    return value


def _literal(x: object, like: TensorType, expr: str) -> Value:
    """A Python number as a replicated scalar `coco.constant` of `like`'s element type."""
    b = _current(expr)
    value = _literal_value(x, like, expr)
    elt = like.element_type
    # One constant per (value, type) and program, placed at its first use, as a hand-written
    # program would: `1 - beta1` and `1 - beta2` share one `coco.constant 1.0`.
    key = (repr(float(value)) if is_float_type(elt) else repr(value), elt)
    cached = b.constants.get(key)
    if cached is not None:
        return cached
    op = coco.ConstantOp(value, TensorType((), elt))
    b.insert(op, expr, [])
    b.constants[key] = b.track(Value(op.results[0], b))
    return b.constants[key]


def _lift(xs: Sequence[object], expr: str, what: str) -> list[Value]:
    """Tensors stay, literals become constants typed like the first tensor among `xs`."""
    like = next((x for x in xs if isinstance(x, Value)), None)
    if like is None:
        raise CocoError(
            f"{user_location()}: `{expr}` needs at least one tensor operand (got only "
            "Python values): write the result as a Python number, or use Const(dtype, value)"
        )
    out = []
    for x in xs:
        if isinstance(x, Value):
            out.append(_operand(x, what))
        elif _is_literal(x):
            out.append(_literal(x, like.type, expr))
        else:
            raise CocoError(
                f"{user_location()}: `{expr}`: {x!r} ({type(x).__name__}) is neither a tensor "
                "nor a number"
            )
    return out


def _token(x: object) -> str:
    if isinstance(x, Value):
        return _short(x)
    return repr(_python_scalar(x))


def _finish(op: Operation, b: _Builder) -> Value:
    b.name_from_frames()
    return b.track(Value(op.results[0], b))


def _emit(
    expr: str,
    operands: Sequence[Value],
    make: Callable[[], Operation],
) -> Value:
    b = _current(expr)
    try:
        op = make()
    except VerifyException as e:
        raise _build_error(expr, operands, str(e)) from None
    except ValueError as e:
        raise _build_error(expr, operands, str(e)) from None
    b.insert(op, expr, operands)
    return _finish(op, b)


_INFIX = {"+", "-", "*", "/", "**"}


def _with_numerics(op: Operation, numerics: str | None) -> Operation:
    """`op` with its own numerics policy (`numerics=` of Exp, Pow, ...), where one is given."""
    if numerics is not None:
        assert isinstance(op, coco.PowOp | coco.PolicyUnaryOp)
        coco.set_numerics(op, numerics)
    return op


def _numerics_arg(numerics: str | None) -> str:
    return "" if numerics is None else f", numerics={numerics!r}"


def _binary(
    cls: type[coco.BinaryOp], sym: str, lhs: object, rhs: object, numerics: str | None = None
) -> Value:
    if sym in _INFIX:
        expr = f"{_token(lhs)} {sym} {_token(rhs)}"
    else:
        expr = f"{sym}({_token(lhs)}, {_token(rhs)}{_numerics_arg(numerics)})"
    a, b = _lift([lhs, rhs], expr, expr)

    def make() -> Operation:
        # Infer with the Python names first, so the rule's message names the operands.
        t = layout_rules.infer_elementwise([a.type, b.type], names=[_short(a), _short(b)])
        return _with_numerics(cls(a.ssa, b.ssa, t), numerics)

    return _emit(expr, [a, b], make)


def _unary(cls: type[coco.UnaryOp], fname: str, x: object, numerics: str | None = None) -> Value:
    expr = f"{fname}({_token(x)}{_numerics_arg(numerics)})"
    if not isinstance(x, Value):
        raise CocoError(f"{user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)

    def make() -> Operation:
        t = layout_rules.infer_unary(a.type, cls.FLOAT_ONLY, cls.name)
        return _with_numerics(cls(a.ssa, t), numerics)

    return _emit(expr, [a], make)


def _compare(pred: str, sym: str, lhs: object, rhs: object) -> Value:
    expr = f"{_token(lhs)} {sym} {_token(rhs)}"
    a, b = _lift([lhs, rhs], expr, expr)

    def make() -> Operation:
        t = layout_rules.infer_elementwise(
            [a.type, b.type], names=[_short(a), _short(b)]
        ).with_element_type(i1)
        return coco.CmpOp(pred, a.ssa, b.ssa, t)

    return _emit(expr, [a, b], make)


def MatMul(a: Value, b: Value) -> Value:
    """[..., M, K] x [K, N] -> [..., M, N] (batched over A's leading dims); also `a @ b`.
    Sliced(K) x Sliced(K) gives `local` partial sums, which an AllReduce combines."""
    expr = f"MatMul({_token(a)}, {_token(b)})"
    if not isinstance(a, Value) or not isinstance(b, Value):
        raise CocoError(f"{user_location()}: `{expr}` multiplies two tensors")
    x, y = _lift([a, b], expr, expr)
    return _emit(expr, [x, y], lambda: coco.MatmulOp(x.ssa, y.ssa))
