"""CoCoNet's DSL embedded in Python: build coco/comm programs with operators and functions.

    from coconet.frontend import *

    @program(grid=[None])                    # a 1-D world, sized at launch
    def sgd(g: Tensor(F32, [4096], Local), w: Tensor(F32, [4096], Replicated), lr: Scalar(F32)):
        g1 = AllReduce("+", g)
        w1 = w - lr * g1
        Update(w, w1)

`sgd` is then a `coconet.core.program.Program` holding the same IR as the `.mlir` form:

    func.func @sgd(%g: !coco.tensor<4096xf32, local>, %w: ..., %lr: ...) attributes {...} {
      %g1 = comm.all_reduce sum %g : ...
      %0 = coco.mul %lr, %g1 : ...
      %w1 = coco.sub %w, %0 : ...
      coco.update %w, %w1 : ...
      func.return
    }

Tensors are declared as a parameter's annotation or default (named after the parameter unless
the declaration names itself), or inside the body (`g = Tensor(F16, [N], Local, "g")`); they
become the function's arguments in that order. Layouts are `Replicated`, `Local`, `Sliced(d)`,
or one per grid axis on an N-D grid (`[Local, Sliced(2)]`).

Python names become SSA names (`name_hint`): a declared tensor's name, else the local variable
an intermediate value was first assigned to (read from the function's frames while it runs and
when it returns), else `.named("x")`. Python numbers become `coco.constant`s of the other
operand's element type (each distinct literal is one constant per program). A layout (or any
other) rule violation raises `CocoError` at the line that commits it, naming the rule and the
Python values involved.

In a file that `coconet.load()` reads, `program` is the name load() looks up, so use the
decorator as `@frontend.program(...)` (`from coconet import frontend`) and end the file with
`program = sgd`, or define `build()` returning the Program; see examples/*.py.
"""

from __future__ import annotations

import inspect
import math
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DenseArrayBase,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.utils.exceptions import DiagnosticException, VerifyException

from coconet.core.gc_pause import gc_paused
from coconet.core.program import CocoError, Program
from coconet.core.values import NUMPY_DTYPES
from coconet.dialects import coco, comm, layout_rules
from coconet.dialects.coco import (
    DYNAMIC,
    GRID_ATTR_NAME,
    LOCAL,
    REPLICATED,
    GridAttr,
    LayoutAttr,
    ReplicatedAttr,
    SlicedAttr,
    TensorType,
    element_type_name,
    is_float_type,
    layout_str,
)

__all__ = [
    "BF16",
    # element types
    "F16",
    "F32",
    "F64",
    "FP16",
    "FP32",
    "FP64",
    "GROUP",
    "I1",
    "I32",
    "I64",
    "RANK",
    "AMax",
    "AMin",
    "Abs",
    "AllGather",
    # communication
    "AllReduce",
    "AllToAll",
    "Bool",
    "Broadcast",
    "Cast",
    "CocoError",
    "Const",
    "Constant",
    "Dropout",
    "Eq",
    "Exp",
    "Float16",
    "Float32",
    "Float64",
    "Gelu",
    "GroupRank",
    "Int32",
    "Int64",
    "Ite",
    "LayerNorm",
    "Local",
    "Log",
    "MatMul",
    "Max",
    "Mean",
    "Min",
    "Ne",
    "Neg",
    "Norm",
    "Pow",
    "RMSNorm",
    "Reduce",
    "ReduceMax",
    "ReduceMin",
    "ReduceScatter",
    "ReduceSum",
    "Relu",
    # layouts
    "Replicated",
    "Reshape",
    "Rsqrt",
    "Scalar",
    "Scatter",
    "Send",
    "Sigmoid",
    "Slice",
    "Sliced",
    "Softmax",
    "Sqrt",
    "Sum",
    "Tanh",
    # declarations and programs
    "Tensor",
    # computation
    "Update",
    "Value",
    "Variable",
    "build_program",
    "program",
]  # fmt: skip

# --------------------------------------------------------------------------------------------
# Element types and layouts
# --------------------------------------------------------------------------------------------

F16: Attribute = f16
BF16: Attribute = bf16
F32: Attribute = f32
F64: Attribute = f64
I32: Attribute = i32
I64: Attribute = i64
I1: Attribute = i1
# CoCoNet's spellings
FP16, FP32, FP64 = F16, F32, F64
Float16, Float32, Float64, Int32, Int64, Bool = F16, F32, F64, I32, I64, I1

Replicated: LayoutAttr = REPLICATED
Local: LayoutAttr = LOCAL


def Sliced(dim: int) -> SlicedAttr:
    """Equal contiguous parts along tensor dim `dim`, one per rank (CoCoNet's `Sliced(dim)`)."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
        raise CocoError(f"Sliced(dim) takes a tensor dim (an int >= 0), got {dim!r}")
    return SlicedAttr(dim)


def _elt_name(dtype: object) -> str:
    try:
        return element_type_name(dtype)  # type: ignore[arg-type]
    except Exception:
        raise CocoError(
            f"{dtype!r} is not an element type: use F16, BF16, F32, F64, I32, I64 or I1"
        ) from None


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """A tensor declared outside a program (a parameter's annotation or default)."""

    dtype: Attribute
    shape: tuple[int, ...]
    layouts: tuple[LayoutAttr, ...]
    name: str | None


class Value:
    """A tensor while a program is built: a declared argument or the result of an op.

    Arithmetic (`+ - * / ** @`, unary `-`, `abs`) and comparisons (`< <= > >=`) build ops;
    `==` keeps Python's identity meaning (so values work in sets and dicts): use Eq/Ne."""

    __slots__ = ("_builder", "_spec", "_ssa")

    def __init__(self, ssa: SSAValue | None, builder: _Builder | None, spec: _Spec | None = None):
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
        _check_name(name, "a value")
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


# --------------------------------------------------------------------------------------------
# Building a program
# --------------------------------------------------------------------------------------------

_FRONTEND_FILE = __file__
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
        self.constants: dict[tuple[str, Attribute], Value] = {}  # literal constants
        self.unnamed: dict[int, Value] = {}  # id -> an op result no variable has named yet

    # -- arguments -----------------------------------------------------------------------

    def declare(self, spec: _Spec, where: str) -> Value:
        t = _tensor_type(spec)
        try:
            layout_rules.check_type_fits_grid(t, self.grid, f"tensor '{spec.name or '?'}'")
        except VerifyException as e:
            raise CocoError(f"{where}: " + _layout_hint(str(e), self.grid)) from None
        arg = self.block.insert_arg(t, len(self.block.args))
        if spec.name is not None:
            self.name_argument(arg, spec.name, where)
        return self.track(Value(arg, self))

    def name_argument(self, arg: BlockArgument, name: str, where: str) -> None:
        _check_name(name, "a program argument")
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
        frames = []
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename != _FRONTEND_FILE:
                frames.append(frame)
            if frame.f_code is self.code:
                break
            frame = frame.f_back
        else:
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
                and _valid_name(var)
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


def _user_location() -> str:
    """`file:line` of the innermost frame outside this module."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == _FRONTEND_FILE:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _valid_name(name: str) -> bool:
    try:
        SSAValue.extract_valid_name(name)
    except ValueError:
        return False
    return True


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not _valid_name(name):
        raise CocoError(
            f"{name!r} cannot name {what}: use letters, digits, '_', '$', '.', '-' and do not "
            "start with a digit"
        )
    if SSAValue.extract_valid_name(name) != name:
        raise CocoError(
            f"{name!r} cannot name {what}: MLIR reads a trailing '_<digits>' as a printer "
            "suffix and drops it, so the name would not survive; rename it"
        )


def _python_name(v: Value) -> str | None:
    """The name a user knows `v` by: its SSA name, else a local variable holding it."""
    if v._ssa is not None and v._ssa.name_hint:
        return v._ssa.name_hint
    if v._builder is not None and id(v) in v._builder.unnamed:
        v._builder.name_from_frames()  # the values pending a name, at once
        if v._ssa is not None and v._ssa.name_hint:
            return v._ssa.name_hint
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename != _FRONTEND_FILE:
            for var, obj in frame.f_locals.items():
                if obj is v:
                    return var
        frame = frame.f_back
    return None


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
    text = f"{_user_location()}: cannot build `{expr}`"
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


# --------------------------------------------------------------------------------------------
# Declarations
# --------------------------------------------------------------------------------------------


def _as_layouts(layout: object) -> tuple[LayoutAttr, ...]:
    if isinstance(layout, LayoutAttr):
        return (layout,)
    if layout is Sliced:
        raise CocoError("write Sliced(dim), e.g. Sliced(0), not bare Sliced")
    if isinstance(layout, list | tuple):
        out = []
        for lay in layout:
            if lay is Sliced:
                raise CocoError("write Sliced(dim), e.g. Sliced(0), not bare Sliced")
            if not isinstance(lay, LayoutAttr):
                raise CocoError(f"{lay!r} is not a layout: use Replicated, Local or Sliced(dim)")
            out.append(lay)
        if not out:
            raise CocoError("a per-axis layout list needs one layout per grid axis, got []")
        return tuple(out)
    raise CocoError(
        f"{layout!r} is not a layout: use Replicated, Local, Sliced(dim), or a list of them "
        "(one per grid axis)"
    )


def _as_shape(shape: object) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = [shape]
    if not isinstance(shape, list | tuple):
        raise CocoError(f"a tensor shape is a list of sizes, got {shape!r}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or (not isinstance(d, int) and not hasattr(d, "__index__")):
            raise CocoError(f"tensor dims are positive ints, got {d!r} in shape {list(shape)}")
        d = int(d.__index__())
        if d < 1:
            raise CocoError(f"tensor dims are positive ints, got {d} in shape {list(shape)}")
        dims.append(d)
    return tuple(dims)


def _tensor_type(spec: _Spec) -> TensorType:
    try:
        return TensorType(spec.shape, spec.dtype, spec.layouts)
    except VerifyException as e:
        raise CocoError(f"tensor '{spec.name or '?'}': {e}") from None


def Tensor(
    dtype: Attribute,
    shape: Sequence[int] | int,
    layout: LayoutAttr | Sequence[LayoutAttr] = REPLICATED,
    name: str | None = None,
) -> Value:
    """Declare a program argument: `Tensor(F16, [B, S, H], Sliced(2), "x")`.

    Inside a @program body it becomes the next argument at once; as a parameter's annotation
    or default it is a declaration that each build turns into an argument."""
    _elt_name(dtype)
    if name is not None:
        _check_name(name, "a tensor")
    spec = _Spec(dtype, _as_shape(shape), _as_layouts(layout), name)
    _tensor_type(spec)  # reject e.g. sliced<3> of a rank-2 tensor where it is written
    stack = _stack()
    if stack:
        return stack[-1].declare(spec, _user_location())
    return Value(None, None, spec)


def Scalar(dtype: Attribute, name: str | None = None) -> Value:
    """Declare a scalar argument (a replicated rank-0 tensor): `Scalar(F32, "lr")`."""
    return Tensor(dtype, [], REPLICATED, name)


Variable = Scalar  # CoCoNet's name


# --------------------------------------------------------------------------------------------
# Operands and literals
# --------------------------------------------------------------------------------------------


def _operand(x: Value, what: str) -> Value:
    b = _current(what)
    if x._builder is not b or x._ssa is None:
        if x._ssa is None:
            raise CocoError(
                f"{_user_location()}: {what} uses a declaration made outside the program: "
                "declare tensors as parameters of the @program function or inside its body"
            )
        raise CocoError(f"{_user_location()}: {what} uses {x!r}, a value of another program")
    if x._ssa in b.updated:
        name = x._ssa.name_hint or "the argument"
        raise CocoError(
            f"{_user_location()}: `{what}` reads '{name}' after Update({name}, ...) at "
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
                f"{_user_location()}: `{expr}`: the literal {value!r} meets an i1 tensor; use "
                "True or False"
            )
        return bool(value)
    if isinstance(value, bool):
        raise CocoError(
            f"{_user_location()}: `{expr}`: the literal {value!r} meets a tensor of {like.elt}; "
            "booleans only combine with i1 tensors"
        )
    if isinstance(value, float) and not is_float_type(elt):
        raise CocoError(
            f"{_user_location()}: `{expr}`: the float literal {value!r} meets an integer "
            f"({like.elt}) tensor; use an int literal or Cast the tensor"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise CocoError(f"{_user_location()}: `{expr}`: the literal {value!r} is not finite")
    if not isinstance(value, int | float):  # a NumPy complex, say
        raise CocoError(f"{_user_location()}: `{expr}`: the literal {value!r} is not a real number")
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
            f"{_user_location()}: `{expr}` needs at least one tensor operand (got only "
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
                f"{_user_location()}: `{expr}`: {x!r} ({type(x).__name__}) is neither a tensor "
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


# --------------------------------------------------------------------------------------------
# Computation
# --------------------------------------------------------------------------------------------


_INFIX = {"+", "-", "*", "/", "**"}


def _binary(cls: type[coco.BinaryOp], sym: str, lhs: object, rhs: object) -> Value:
    if sym in _INFIX:
        expr = f"{_token(lhs)} {sym} {_token(rhs)}"
    else:
        expr = f"{sym}({_token(lhs)}, {_token(rhs)})"
    a, b = _lift([lhs, rhs], expr, expr)

    def make() -> Operation:
        # Infer with the Python names first, so the rule's message names the operands.
        t = layout_rules.infer_elementwise([a.type, b.type], names=[_short(a), _short(b)])
        return cls(a.ssa, b.ssa, t)

    return _emit(expr, [a, b], make)


def _unary(cls: type[coco.UnaryOp], fname: str, x: object) -> Value:
    expr = f"{fname}({_token(x)})"
    if not isinstance(x, Value):
        raise CocoError(f"{_user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)

    def make() -> Operation:
        t = layout_rules.infer_unary(a.type, cls.FLOAT_ONLY, cls.name)
        return cls(a.ssa, t)

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


def Max(a: object, b: object) -> Value:
    """Elementwise maximum (coco.max)."""
    return _binary(coco.MaxOp, "Max", a, b)


def Min(a: object, b: object) -> Value:
    """Elementwise minimum (coco.min)."""
    return _binary(coco.MinOp, "Min", a, b)


def Pow(a: object, b: object) -> Value:
    """Elementwise power (coco.pow), also `a ** b`."""
    return _binary(coco.PowOp, "**", a, b)


def Eq(a: object, b: object) -> Value:
    """Elementwise `a == b` as an i1 tensor (Python's `==` keeps its identity meaning)."""
    return _compare("eq", "==", a, b)


def Ne(a: object, b: object) -> Value:
    """Elementwise `a != b` as an i1 tensor."""
    return _compare("ne", "!=", a, b)


def Sqrt(x: Value) -> Value:
    return _unary(coco.SqrtOp, "Sqrt", x)


def Rsqrt(x: Value) -> Value:
    return _unary(coco.RsqrtOp, "Rsqrt", x)


def Exp(x: Value) -> Value:
    return _unary(coco.ExpOp, "Exp", x)


def Log(x: Value) -> Value:
    return _unary(coco.LogOp, "Log", x)


def Tanh(x: Value) -> Value:
    return _unary(coco.TanhOp, "Tanh", x)


def Relu(x: Value) -> Value:
    return _unary(coco.ReluOp, "Relu", x)


def Gelu(x: Value) -> Value:
    """tanh-approximated GELU."""
    return _unary(coco.GeluOp, "Gelu", x)


def Sigmoid(x: Value) -> Value:
    return _unary(coco.SigmoidOp, "Sigmoid", x)


def Abs(x: Value) -> Value:
    return _unary(coco.AbsOp, "Abs", x)


def Neg(x: Value) -> Value:
    return _unary(coco.NegOp, "Neg", x)


def Ite(cond: Value, a: object, b: object) -> Value:
    """Elementwise `cond ? a : b` (coco.select); `cond` is an i1 tensor, e.g. `x > 0`."""
    expr = f"Ite({_token(cond)}, {_token(a)}, {_token(b)})"
    if not isinstance(cond, Value):
        raise CocoError(f"{_user_location()}: `{expr}`: the condition must be an i1 tensor")
    (c,) = _lift([cond], expr, expr)
    x, y = _lift([a, b], expr, expr)

    def make() -> Operation:
        t = layout_rules.infer_select(c.type, x.type, y.type)
        return coco.SelectOp(c.ssa, x.ssa, y.ssa, t)

    return _emit(expr, [c, x, y], make)


def Cast(dtype: Attribute | Value, x: Value | Attribute) -> Value:
    """Element type conversion, CoCoNet's `Cast(F32, x)` (`Cast(x, F32)` works too)."""
    if isinstance(dtype, Value) and not isinstance(x, Value):
        dtype, x = x, dtype
    _elt_name(dtype)
    expr = f"Cast({_elt_name(dtype)}, {_token(x)})"
    if not isinstance(x, Value):
        raise CocoError(f"{_user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)
    assert isinstance(dtype, Attribute)  # _elt_name took it as an element type
    return _emit(expr, [a], lambda: coco.CastOp(a.ssa, a.type.with_element_type(dtype)))


def Const(dtype: Attribute, value: float | int | bool) -> Value:
    """A replicated scalar constant of an explicit element type (CoCoNet's `Const<T>`)."""
    _elt_name(dtype)
    expr = f"Const({_elt_name(dtype)}, {value!r})"
    if not _is_literal(value):
        raise CocoError(f"{_user_location()}: `{expr}` takes a Python number")
    b = _current(expr)
    like = TensorType((), dtype)
    op = coco.ConstantOp(_literal_value(value, like, expr), like)
    b.insert(op, expr, [])
    return _finish(op, b)


_ELEMENT_TYPES: dict[str, Attribute] = {
    "f16": F16,
    "bf16": BF16,
    "f32": F32,
    "f64": F64,
    "i32": I32,
    "i64": I64,
    "i1": I1,
}


def Constant(values: object, dtype: Attribute | None = None) -> Value:
    """A replicated tensor constant holding a NumPy array's values, one per element (an
    attention mask, a position bias): `coco.constant dense<...>`. Its element type is
    `dtype`, else the array's; each value is rounded to it. A 0-d array is a splat."""
    expr = f"Constant({type(values).__name__}{'' if dtype is None else ', ' + _elt_name(dtype)})"
    b = _current(expr)
    array = np.asarray(values)
    if dtype is None:
        by_dtype = {d: name for name, d in NUMPY_DTYPES.items()}
        name = by_dtype.get(array.dtype)
        if name is None:
            raise CocoError(
                f"{_user_location()}: `{expr}`: no element type holds {array.dtype} values: "
                "pass dtype="
            )
        dtype = _ELEMENT_TYPES[name]
    _elt_name(dtype)
    t = TensorType(array.shape, dtype)
    if array.size == 0:
        raise CocoError(f"{_user_location()}: `{expr}` needs at least one value")
    if is_float_type(dtype):
        if array.dtype.kind not in "fiub":
            raise CocoError(f"{_user_location()}: `{expr}` needs numbers, got {array.dtype}")
        flat: list[float | int] = [float(v) for v in array.astype(np.float64).ravel()]
    else:
        if array.dtype.kind not in "iub":
            raise CocoError(
                f"{_user_location()}: `{expr}`: an integer tensor needs integer values, got "
                f"{array.dtype}"
            )
        flat = [int(v) for v in array.astype(np.int64).ravel()]
    op = coco.ConstantOp(flat[0], t) if array.ndim == 0 else coco.ConstantOp.dense(flat, t)
    try:
        op.verify()
    except VerifyException as e:
        raise CocoError(f"{_user_location()}: `{expr}`: {e}") from None
    b.insert(op, expr, [])
    return _finish(op, b)


def Dropout(x: Value, p: float, seed: int = 0) -> Value:
    """Zero each element with probability `p` and scale the rest by 1/(1-p).

    The mask is a pure function of (seed, global element index, rank on `local` axes), so
    every schedule of the program draws the same one."""
    expr = f"Dropout({_token(x)}, {p!r}, seed={seed!r})"
    if not isinstance(x, Value):
        raise CocoError(f"{_user_location()}: `{expr}` needs a tensor, got {x!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CocoError(f"{_user_location()}: `{expr}`: the seed must be an int")
    if not isinstance(p, int | float) or isinstance(p, bool):
        raise CocoError(f"{_user_location()}: `{expr}`: the probability must be a number")
    (a,) = _lift([x], expr, expr)

    def make() -> Operation:
        t = layout_rules.infer_unary(a.type, True, "coco.dropout")
        return coco.DropoutOp(a.ssa, float(p), seed, t)

    return _emit(expr, [a], make)


def MatMul(a: Value, b: Value) -> Value:
    """[..., M, K] x [K, N] -> [..., M, N] (batched over A's leading dims); also `a @ b`.
    Sliced(K) x Sliced(K) gives `local` partial sums, which an AllReduce combines."""
    expr = f"MatMul({_token(a)}, {_token(b)})"
    if not isinstance(a, Value) or not isinstance(b, Value):
        raise CocoError(f"{_user_location()}: `{expr}` multiplies two tensors")
    x, y = _lift([a, b], expr, expr)
    return _emit(expr, [x, y], lambda: coco.MatmulOp(x.ssa, y.ssa))


def _reduction(kind: str, fname: str, x: Value) -> Value:
    expr = f"{fname}({_token(x)})"
    if not isinstance(x, Value):
        raise CocoError(f"{_user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)
    return _emit(expr, [a], lambda: coco.ReduceOp(kind, a.ssa))


def Norm(x: Value) -> Value:
    """The L2 norm of a whole tensor, a scalar (of a replicated or local tensor)."""
    return _reduction("norm", "Norm", x)


def ReduceSum(x: Value) -> Value:
    """The sum of all elements; of a sliced tensor, this rank's partial sum (local)."""
    return _reduction("sum", "ReduceSum", x)


def ReduceMax(x: Value) -> Value:
    return _reduction("max", "ReduceMax", x)


def ReduceMin(x: Value) -> Value:
    return _reduction("min", "ReduceMin", x)


def _dims(x: Value, dims: int | Sequence[int], expr: str) -> list[int]:
    """`dims` as non-negative tensor dims of `x` (negative ones count from the end)."""
    items = [dims] if isinstance(dims, int) else list(dims)
    out = []
    for d in items:
        if isinstance(d, bool) or not isinstance(d, int) or not -x.type.rank <= d < x.type.rank:
            raise CocoError(
                f"{_user_location()}: `{expr}`: {d!r} is not a dim of a rank-{x.type.rank} tensor"
            )
        out.append(d % x.type.rank)
    return out


def _reduce_dims(
    kind: str, fname: str, x: Value, dims: int | Sequence[int], keepdims: bool
) -> Value:
    expr = f"{fname}({_token(x)}, {dims!r}" + (", keepdims=True)" if keepdims else ")")
    if not isinstance(x, Value):
        raise CocoError(f"{_user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)
    ds = _dims(a, dims, expr)

    def make() -> Operation:
        t = layout_rules.infer_dim_reduction(kind, a.type, ds, keepdims, name=_short(a))
        return coco.ReduceDimsOp(kind, a.ssa, ds, keepdims, t)

    return _emit(expr, [a], make)


def Sum(x: Value, dims: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
    """The sum over `dims` (a run of consecutive dims; the last by default). With
    `keepdims` the reduced dims stay as size 1, so the result broadcasts back against `x`.
    Over a dim `x` is sliced on, this rank's partial sums (local), for an AllReduce."""
    return _reduce_dims("sum", "Sum", x, dims, keepdims)


def Mean(x: Value, dims: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
    """The mean over `dims` (not over a dim `x` is sliced on: a partial mean does not
    combine; use Sum, AllReduce and divide)."""
    return _reduce_dims("mean", "Mean", x, dims, keepdims)


def AMax(x: Value, dims: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
    """The maximum over `dims` (NumPy's amax; `Max(a, b)` is the elementwise maximum)."""
    return _reduce_dims("max", "AMax", x, dims, keepdims)


def AMin(x: Value, dims: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
    return _reduce_dims("min", "AMin", x, dims, keepdims)


def Reshape(x: Value, shape: Sequence[int]) -> Value:
    """The same elements under another shape, keeping the layouts (a sliced tensor keeps
    its dims up to the sliced one)."""
    expr = f"Reshape({_token(x)}, {list(shape)!r})"
    if not isinstance(x, Value):
        raise CocoError(f"{_user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)
    new_shape = _as_shape(shape)
    return _emit(expr, [a], lambda: coco.ReshapeOp(a.ssa, a.type.with_shape(new_shape)))


def RMSNorm(x: Value, weight: Value, eps: float = 1e-6) -> Value:
    """x * rsqrt(mean(x^2 over the last dim) + eps) * weight (LLaMA's RMSNorm)."""
    mean_square = Mean(x * x, -1, keepdims=True)
    return x * Rsqrt(mean_square + eps) * weight


def LayerNorm(x: Value, gamma: Value, beta: Value, eps: float = 1e-5) -> Value:
    """(x - mean) * rsqrt(var + eps) * gamma + beta over the last dim (biased variance)."""
    centered = x - Mean(x, -1, keepdims=True)
    variance = Mean(centered * centered, -1, keepdims=True)
    return centered * Rsqrt(variance + eps) * gamma + beta


def Softmax(x: Value, dim: int = -1) -> Value:
    """exp(x - max) / sum(exp(x - max)) over `dim`."""
    shifted = Exp(x - AMax(x, dim, keepdims=True))
    return shifted / Sum(shifted, dim, keepdims=True)


def _axes(over: object) -> list[int] | None:
    """`over=` as a list of grid axes: an int, a sequence of ints, or None (default)."""
    if over is None:
        return None
    if isinstance(over, int):
        return [over]
    if not isinstance(over, Sequence) or isinstance(over, str):
        raise CocoError(f"{_user_location()}: over= names grid axes (ints), got {over!r}")
    return [int(a) for a in over]


def Slice(x: Value, dim: int = 0, over: int | Sequence[int] | None = None) -> Value:
    """This rank's part of a replicated tensor along `dim`, no communication (CoCoNet's
    Scatter). `over` names the grid axes that cut it (default: every axis where `x` is
    replicated)."""
    expr = f"Slice({_token(x)}, {dim!r})"
    if not isinstance(x, Value):
        raise CocoError(f"{_user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)
    b = _current(expr)
    layouts = a.type.layout_list(b.grid.rank)
    axes = _axes(over)
    if axes is None:
        axes = [i for i, lay in enumerate(layouts) if isinstance(lay, ReplicatedAttr)]
    for i in axes:
        if not 0 <= i < b.grid.rank:
            raise CocoError(
                f"{_user_location()}: `{expr}`: grid axis {i} does not exist on the grid {b.grid}"
            )
        if not isinstance(layouts[i], ReplicatedAttr):
            raise _build_error(
                expr,
                [a],
                f"[slice-layouts] grid axis {i} is already {layout_str(layouts[i])}: Slice cuts "
                "a replicated axis",
            )
        layouts[i] = Sliced(dim)
    if not axes:
        raise _build_error(expr, [a], "[slice-layouts] no grid axis is replicated: nothing to cut")

    def make() -> Operation:
        return coco.SliceOp(a.ssa, a.type.with_layouts(layouts))

    return _emit(expr, [a], make)


Scatter = Slice  # CoCoNet's name for it


def Update(target: Value, value: Value) -> Value:
    """Store `value` into the argument `target` (the program's side effect); returns `value`,
    which later code reads instead of `target`."""
    expr = f"Update({_token(target)}, {_token(value)})"
    if not isinstance(target, Value) or not isinstance(value, Value):
        raise CocoError(f"{_user_location()}: `{expr}` stores a tensor into a declared tensor")
    t, v = _lift([target, value], expr, expr)
    b = _current(expr)
    if not isinstance(t.ssa, BlockArgument) or t.ssa.block is not b.block:
        raise CocoError(
            f"{_user_location()}: `{expr}`: {_describe(t)} is not a declared tensor; only the "
            "program's arguments (the caller's buffers) can be updated"
        )
    if t.type != v.type:
        if t.type.element_type != v.type.element_type:
            hint = "Cast the value to the target's element type"
        else:
            hint = (
                "bring the value to the target's layout (AllGather a slice, Slice a "
                "replicated value, AllReduce a local one)"
            )
        raise _build_error(
            expr,
            [t, v],
            f"[update-type] the target is {t.type} but the value is {v.type}: {hint}",
        )
    op = coco.UpdateOp(t.ssa, v.ssa)
    b.insert(op, expr, [t, v])
    b.updated[t.ssa] = _user_location()
    b.name_from_frames()
    return v


# --------------------------------------------------------------------------------------------
# Communication
# --------------------------------------------------------------------------------------------

_REDUCTIONS = {
    "+": "sum", "sum": "sum", "summation": "sum", "add": "sum",
    "*": "prod", "prod": "prod", "multiplication": "prod", "mul": "prod",
    "max": "max", "maximum": "max",
    "min": "min", "minimum": "min",
}  # fmt: skip


def _reduction_kind(op: object) -> str:
    key = op.lower() if isinstance(op, str) else op
    if not isinstance(key, str) or key not in _REDUCTIONS:
        raise CocoError(
            f"{_user_location()}: unknown reduction {op!r}: use '+' (sum), '*' (prod), 'max' or "
            "'min'"
        )
    return _REDUCTIONS[key]


def _op_and_tensor(name: str, op: object, x: object) -> tuple[str, Value]:
    if isinstance(op, Value) and x is None:
        op, x = "+", op
    if not isinstance(x, Value):
        raise CocoError(f"{_user_location()}: {name}(op, x) takes a reduction and a tensor")
    return _reduction_kind(op), x


def _over(over: object) -> str:
    return "" if over is None else f", over={over!r}"


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
    except VerifyException as e:
        raise _build_error(expr, [a], str(e)) from None
    finally:
        b.block.detach_op(probe)
        probe.erase()
    op = make(result_type)
    b.insert(op, expr, [a])
    return _finish(op, b)


def _collective_props(
    kind: str | None = None, over: object = None, root: int | None = None
) -> dict[str, Attribute]:
    props: dict[str, Attribute] = {}
    if kind is not None:
        props["kind"] = comm.CollectiveKindAttr(comm.CollectiveKind(kind))
    if root is not None:
        if isinstance(root, bool) or not isinstance(root, int):
            raise CocoError(f"{_user_location()}: the root is a rank index (an int), got {root!r}")
        props["root"] = IntegerAttr(root, i64)
    axes = _axes(over)
    if axes is not None:
        props["axes"] = DenseArrayBase.from_list(i64, axes)
    return props


def AllReduce(op: str | Value = "+", x: Value | None = None, *, over=None) -> Value:
    """`AllReduce("+", g)`: the reduction over the ranks of every grid axis in `over` (all
    axes by default), replicated on them. Takes local or replicated tensors."""
    kind, x = _op_and_tensor("AllReduce", op, x)
    expr = f"AllReduce({kind}, {_token(x)}{_over(over)})"
    return _collective(expr, x, comm.AllReduceOp, _collective_props(kind, over))


def ReduceScatter(
    op: str | Value = "+", x: Value | None = None, *, dim: int = 0, over=None
) -> Value:
    """Reduce, and keep this rank's part along `dim` (the result is sliced<dim>)."""
    kind, x = _op_and_tensor("ReduceScatter", op, x)
    expr = f"ReduceScatter({kind}, {_token(x)}, dim={dim}{_over(over)})"
    return _collective(expr, x, comm.ReduceScatterOp, _collective_props(kind, over), dim=dim)


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


def Reduce(op: str | Value = "+", x: Value | None = None, root: int = 0, *, over=None) -> Value:
    """The reduction lands on rank `root`; the other ranks keep their input (local)."""
    kind, x = _op_and_tensor("Reduce", op, x)
    expr = f"Reduce({kind}, {_token(x)}, root={root}{_over(over)})"
    return _collective(expr, x, comm.ReduceOp, _collective_props(kind, over, root))


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
            raise CocoError(f"{_user_location()}: Send(x, to): `to` is a GroupRank, got {to!r}")
        along, shift = 0, to.group.shift
    expr = f"Send({_token(x)}, along={along}, shift={shift})"
    for what, n in (("along", along), ("shift", shift)):
        if isinstance(n, bool) or not isinstance(n, int):
            raise CocoError(f"{_user_location()}: `{expr}`: `{what}` is an int, got {n!r}")
    props: dict[str, Attribute] = {
        "along": IntegerAttr(along, i64),
        "shift": IntegerAttr(shift, i64),
    }
    return _collective(expr, x, comm.SendOp, props)


# --------------------------------------------------------------------------------------------
# Programs
# --------------------------------------------------------------------------------------------


def _as_grid(grid: object) -> GridAttr:
    if isinstance(grid, GridAttr):
        return grid
    if isinstance(grid, int | str) or grid is None:
        grid = [grid]
    sizes = []
    for s in grid:  # type: ignore[union-attr]
        if s is None or s == "?":
            sizes.append(DYNAMIC)
        elif isinstance(s, int) and not isinstance(s, bool) and s > 0:
            sizes.append(s)
        else:
            raise CocoError(
                f"grid sizes are positive ints or None (sized at launch), got {s!r} in {grid!r}"
            )
    try:
        return GridAttr(sizes)
    except VerifyException as e:
        raise CocoError(f"grid {grid!r}: {e}") from None


def _declaration_of(
    fn: Callable[..., Any], param: inspect.Parameter, scope: dict[str, Any]
) -> Value | None:
    for candidate in (param.default, param.annotation):
        if isinstance(candidate, str) and candidate:
            # `from __future__ import annotations` leaves annotations as text: evaluate it
            # where the function was defined
            try:
                candidate = eval(candidate, fn.__globals__, scope)
            except Exception as e:
                raise CocoError(
                    f"parameter '{param.name}' of {fn.__name__}: cannot evaluate its annotation "
                    f"{candidate!r}: {type(e).__name__}: {e}"
                ) from None
        if isinstance(candidate, Value):
            if candidate._spec is None:
                raise CocoError(
                    f"parameter '{param.name}' of {fn.__name__} is declared with a value of "
                    "another program; declare it with Tensor(...) or Scalar(...)"
                )
            return candidate
    return None


def _capture_locals(fn: Callable[..., Any], args: Sequence[Value]) -> tuple[Any, dict[str, Any]]:
    """Call `fn` and return its result and its locals as they were when it returned.

    A one-shot hook catches the call's frame at its first event and removes itself there: the
    frame object keeps its locals after the call returns. (A hook left in place for the whole
    call ran on every call the program's construction made, which tripled the time to build a
    2,401-op program.) The hook is a trace function, or a profile function where a debugger or
    coverage already traces; with both taken (a debugger under a profiler), values keep no
    Python names."""
    code = fn.__code__
    frames: list[FrameType] = []
    if sys.gettrace() is None:
        install: Callable[[Any], None] = sys.settrace
    elif sys.getprofile() is None:
        install = sys.setprofile
    else:
        return fn(*args), {}

    def catch(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is code and not frames:
            frames.append(frame)
            install(None)

    install(catch)
    try:
        result = fn(*args)
    finally:
        install(None)
    return result, dict(frames[0].f_locals) if frames else {}


def _parameter_specs(fn: Callable[..., Any], fname: str, where: str) -> list[_Spec]:
    """The declarations of `fn`'s parameters, each named (by default) after its parameter."""
    specs = []
    # Text annotations may name variables of the scope that defines `fn` (a builder's
    # arguments): the decorator runs there, so that is the first frame outside this module.
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == _FRONTEND_FILE:
        frame = frame.f_back
    scope = dict(frame.f_locals) if frame is not None else {}
    scope.update(inspect.getclosurevars(fn).nonlocals)
    stack = _stack()
    saved = stack[:]
    stack.clear()  # text annotations evaluate to declarations, not to an outer program's args
    try:
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.KEYWORD_ONLY):
                raise CocoError(
                    f"{where}: parameter '{param.name}' of {fname}: program parameters are "
                    "plain positional names, each declared as a tensor"
                )
            decl = _declaration_of(fn, param, scope)
            if decl is None:
                raise CocoError(
                    f"{where}: parameter '{param.name}' of {fname} is not a declared tensor: "
                    f"write `{param.name}: Tensor(F32, [N], Local)` (or Scalar(F32)) or "
                    "declare it inside the body"
                )
            spec = decl._spec
            assert spec is not None
            specs.append(_Spec(spec.dtype, spec.shape, spec.layouts, spec.name or param.name))
    finally:
        stack[:] = saved
    return specs


def build_program(
    fn: Callable[..., Any], grid: object = (None,), name: str | None = None
) -> Program:
    """Build the Program that `fn` describes (see `program`)."""
    grid_attr = _as_grid(grid)
    fname = name or fn.__name__
    where = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"
    specs = _parameter_specs(fn, fname, where)
    # (the collector paused as in every phase: core/gc_pause.py; not as a decorator, whose
    # frame would stand between the annotations and the caller's scope they are read in)
    with gc_paused():
        builder = _Builder(fname, grid_attr, fn.__code__)
        stack = _stack()
        stack.append(builder)
        try:
            args = [builder.declare(spec, where) for spec in specs]
            result, local_vars = _capture_locals(fn, args)
            builder.name_from_locals(local_vars)
            returned = _returned_values(result, fname)
            values = [_operand(v, f"returning {_token(v)}").ssa for v in returned]
            returned_op = func.ReturnOp(*values)
            builder.block.insert_op_before(returned_op, builder.terminator)
            builder.block.erase_op(builder.terminator)
        finally:
            stack.pop()
        builder.func.update_function_type()
        try:
            # Every op verified as it was inserted (`_Builder.insert`; nothing changes an op
            # after): what is left is the module, the function against its return, and the
            # return, not every op again (a quarter of building a deep model).
            builder.module.verify(verify_nested_ops=False)
            builder.func.verify(verify_nested_ops=False)
            returned_op.verify()
        except (VerifyException, DiagnosticException) as e:
            raise CocoError(f"{where}: program @{fname} is invalid: {e}") from None
    return Program(builder.module)


def _returned_values(result: object, fname: str) -> list[Value]:
    if result is None:
        return []
    items: list[object] = list(result) if isinstance(result, tuple | list) else [result]
    values: list[Value] = []
    for item in items:
        if not isinstance(item, Value):
            raise CocoError(
                f"@{fname} returns {item!r}: a program returns tensors (or nothing, when its "
                "outputs are Updates)"
            )
        values.append(item)
    return values


def program(
    fn: Callable[..., Any] | None = None, *, grid: object = (None,), name: str | None = None
) -> Any:
    """Decorator: `@program(grid=[None])` turns a function into a `coconet.core.program.Program`.

    `grid` lists the process grid's axis sizes, None for the one sized at launch: `[None]` is
    a 1-D world, `[2, None]` two pipeline stages of launch-sized tensor-parallel groups.
    `name` names the func (default: the function's name). Bare `@program` means grid [None]."""
    if fn is not None:
        if not callable(fn):
            raise CocoError("use @program or @program(grid=[...], name=...)")
        return build_program(fn, grid, name)

    def decorate(f: Callable[..., Any]) -> Program:
        return build_program(f, grid, name)

    return decorate
