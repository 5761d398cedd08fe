"""The computation ops: elementwise functions, casts and constants, dropout, reductions (whole
tensor and over dims), reshape, the norms and softmax, slicing and updates."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.ir import Attribute, BlockArgument, Operation
from xdsl.utils.exceptions import VerifyException

from coconet.core.program import CocoError
from coconet.core.values import NUMPY_DTYPES
from coconet.dialects import coco, layout_rules
from coconet.dialects.coco import (
    ReplicatedAttr,
    TensorType,
    is_float_type,
    layout_str,
)
from coconet.dialects.coco_types import nest_layouts
from coconet.dialects.reduction import Reduction
from coconet.frontend.dtypes import (
    BF16,
    F8E4M3FN,
    F8E5M2,
    F16,
    F32,
    F64,
    I1,
    I32,
    I64,
    Sliced,
    elt_name,
)
from coconet.frontend.naming import user_location
from coconet.frontend.specs import as_shape
from coconet.frontend.values import (
    Value,
    _binary,
    _build_error,
    _compare,
    _current,
    _describe,
    _emit,
    _finish,
    _is_literal,
    _lift,
    _literal_value,
    _short,
    _token,
    _unary,
)


def Max(a: object, b: object) -> Value:
    """Elementwise maximum (coco.max)."""
    return _binary(coco.MaxOp, "Max", a, b)


def Min(a: object, b: object) -> Value:
    """Elementwise minimum (coco.min)."""
    return _binary(coco.MinOp, "Min", a, b)


def Pow(a: object, b: object, numerics: str | None = None) -> Value:
    """Elementwise power (coco.pow), also `a ** b`. `numerics`: "exact" or "fast", this op's
    own numerics policy (default: the program's; docs/usage.md)."""
    return _binary(coco.PowOp, "Pow" if numerics else "**", a, b, numerics)


def Eq(a: object, b: object) -> Value:
    """Elementwise `a == b` as an i1 tensor (Python's `==` keeps its identity meaning)."""
    return _compare("eq", "==", a, b)


def Ne(a: object, b: object) -> Value:
    """Elementwise `a != b` as an i1 tensor."""
    return _compare("ne", "!=", a, b)


def Sqrt(x: Value) -> Value:
    return _unary(coco.SqrtOp, "Sqrt", x)


def Rsqrt(x: Value, numerics: str | None = None) -> Value:
    return _unary(coco.RsqrtOp, "Rsqrt", x, numerics)


def Exp(x: Value, numerics: str | None = None) -> Value:
    """exp(x) (coco.exp). `numerics`: "exact" or "fast", this op's own numerics policy
    (default: the program's); so for Log, Tanh, Gelu, Sigmoid, Rsqrt, Pow and Softmax."""
    return _unary(coco.ExpOp, "Exp", x, numerics)


def Log(x: Value, numerics: str | None = None) -> Value:
    return _unary(coco.LogOp, "Log", x, numerics)


def Tanh(x: Value, numerics: str | None = None) -> Value:
    return _unary(coco.TanhOp, "Tanh", x, numerics)


def Relu(x: Value) -> Value:
    return _unary(coco.ReluOp, "Relu", x)


def Gelu(x: Value, numerics: str | None = None) -> Value:
    """tanh-approximated GELU."""
    return _unary(coco.GeluOp, "Gelu", x, numerics)


def Sigmoid(x: Value, numerics: str | None = None) -> Value:
    return _unary(coco.SigmoidOp, "Sigmoid", x, numerics)


def Abs(x: Value) -> Value:
    return _unary(coco.AbsOp, "Abs", x)


def Neg(x: Value) -> Value:
    return _unary(coco.NegOp, "Neg", x)


def Ite(cond: Value, a: object, b: object) -> Value:
    """Elementwise `cond ? a : b` (coco.select); `cond` is an i1 tensor, e.g. `x > 0`."""
    expr = f"Ite({_token(cond)}, {_token(a)}, {_token(b)})"
    if not isinstance(cond, Value):
        raise CocoError(f"{user_location()}: `{expr}`: the condition must be an i1 tensor")
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
    elt_name(dtype)
    expr = f"Cast({elt_name(dtype)}, {_token(x)})"
    if not isinstance(x, Value):
        raise CocoError(f"{user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)
    assert isinstance(dtype, Attribute)  # _elt_name took it as an element type
    return _emit(expr, [a], lambda: coco.CastOp(a.ssa, a.type.with_element_type(dtype)))


def Quantize(x: Value, scale: object, dtype: Attribute) -> Value:
    """`x / scale` rounded to the fp8 type `dtype`, saturating (coco.quantize). `scale` is a
    tensor (a scalar per tensor, `[R, 1]` per row, `[R / bR, C / bC]` per bR x bC block:
    element (i, j) takes scale (i // bR, j // bC)) or a number; it is the value a code of 1
    stands for: `Quantize(w, amax / 448, F8E4M3FN)`, or per 1 x 128 block of the rows
    `Quantize(x, AMax(Abs(Reshape(x, [R, C // 128, 128])), dims=2) / 448, F8E4M3FN)`."""
    expr = f"Quantize({_token(x)}, {_token(scale)}, {elt_name(dtype)})"
    if not isinstance(x, Value):
        raise CocoError(f"{user_location()}: `{expr}` needs a tensor, got {x!r}")
    a, s = _lift([x, scale], expr, expr)
    return _emit(expr, [a, s], lambda: coco.QuantizeOp(a.ssa, s.ssa, dtype))


def Dequantize(q: Value, scale: object, dtype: Attribute = F32) -> Value:
    """The fp8 values of `q` times `scale` (of any shape Quantize takes, blocks included), in
    float type `dtype` (coco.dequantize)."""
    expr = f"Dequantize({_token(q)}, {_token(scale)}, {elt_name(dtype)})"
    if not isinstance(q, Value):
        raise CocoError(f"{user_location()}: `{expr}` needs a tensor, got {q!r}")
    if not isinstance(scale, Value):  # a number: a scalar of the result's type, not fp8's
        scale = Const(dtype, float(scale))  # pyright: ignore[reportArgumentType]
    a, s = _lift([q, scale], expr, expr)
    return _emit(expr, [a, s], lambda: coco.DequantizeOp(a.ssa, s.ssa, dtype))


def Const(dtype: Attribute, value: float | int | bool) -> Value:
    """A replicated scalar constant of an explicit element type (CoCoNet's `Const<T>`)."""
    elt_name(dtype)
    expr = f"Const({elt_name(dtype)}, {value!r})"
    if not _is_literal(value):
        raise CocoError(f"{user_location()}: `{expr}` takes a Python number")
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
    "f8E4M3FN": F8E4M3FN,
    "f8E5M2": F8E5M2,
    "i32": I32,
    "i64": I64,
    "i1": I1,
}


def Constant(values: object, dtype: Attribute | None = None) -> Value:
    """A replicated tensor constant holding a NumPy array's values, one per element (an
    attention mask, a position bias): `coco.constant dense<...>`. Its element type is
    `dtype`, else the array's; each value is rounded to it. A 0-d array is a splat."""
    expr = f"Constant({type(values).__name__}{'' if dtype is None else ', ' + elt_name(dtype)})"
    b = _current(expr)
    array = np.asarray(values)
    if dtype is None:
        by_dtype = {d: name for name, d in NUMPY_DTYPES.items()}
        name = by_dtype.get(array.dtype)
        if name is None:
            raise CocoError(
                f"{user_location()}: `{expr}`: no element type holds {array.dtype} values: "
                "pass dtype="
            )
        dtype = _ELEMENT_TYPES[name]
    elt_name(dtype)
    t = TensorType(array.shape, dtype)
    if array.size == 0:
        raise CocoError(f"{user_location()}: `{expr}` needs at least one value")
    if is_float_type(dtype):
        if array.dtype.kind not in "fiub":
            raise CocoError(f"{user_location()}: `{expr}` needs numbers, got {array.dtype}")
        flat: list[float | int] = [float(v) for v in array.astype(np.float64).ravel()]
    else:
        if array.dtype.kind not in "iub":
            raise CocoError(
                f"{user_location()}: `{expr}`: an integer tensor needs integer values, got "
                f"{array.dtype}"
            )
        flat = [int(v) for v in array.astype(np.int64).ravel()]
    op = coco.ConstantOp(flat[0], t) if array.ndim == 0 else coco.ConstantOp.dense(flat, t)
    try:
        op.verify()
    except VerifyException as e:
        raise CocoError(f"{user_location()}: `{expr}`: {e}") from None
    b.insert(op, expr, [])
    return _finish(op, b)


def Dropout(x: Value, p: float, seed: int = 0) -> Value:
    """Zero each element with probability `p` and scale the rest by 1/(1-p).

    The mask is a pure function of (seed, global element index, rank on `local` axes), so
    every schedule of the program draws the same one."""
    expr = f"Dropout({_token(x)}, {p!r}, seed={seed!r})"
    if not isinstance(x, Value):
        raise CocoError(f"{user_location()}: `{expr}` needs a tensor, got {x!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CocoError(f"{user_location()}: `{expr}`: the seed must be an int")
    if not isinstance(p, int | float) or isinstance(p, bool):
        raise CocoError(f"{user_location()}: `{expr}`: the probability must be a number")
    (a,) = _lift([x], expr, expr)

    def make() -> Operation:
        t = layout_rules.infer_unary(a.type, True, "coco.dropout")
        return coco.DropoutOp(a.ssa, float(p), seed, t)

    return _emit(expr, [a], make)


def _reduction(kind: Reduction, fname: str, x: Value) -> Value:
    expr = f"{fname}({_token(x)})"
    if not isinstance(x, Value):
        raise CocoError(f"{user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)
    return _emit(expr, [a], lambda: coco.ReduceOp(kind, a.ssa))


def Norm(x: Value) -> Value:
    """The L2 norm of a whole tensor, a scalar (of a replicated or local tensor)."""
    return _reduction(Reduction.NORM, "Norm", x)


def ReduceSum(x: Value) -> Value:
    """The sum of all elements; of a sliced tensor, this rank's partial sum (local)."""
    return _reduction(Reduction.SUM, "ReduceSum", x)


def ReduceMax(x: Value) -> Value:
    return _reduction(Reduction.MAX, "ReduceMax", x)


def ReduceMin(x: Value) -> Value:
    return _reduction(Reduction.MIN, "ReduceMin", x)


def _dims(x: Value, dims: int | Sequence[int], expr: str) -> list[int]:
    """`dims` as non-negative tensor dims of `x` (negative ones count from the end)."""
    items = [dims] if isinstance(dims, int) else list(dims)
    out = []
    for d in items:
        if isinstance(d, bool) or not isinstance(d, int) or not -x.type.rank <= d < x.type.rank:
            raise CocoError(
                f"{user_location()}: `{expr}`: {d!r} is not a dim of a rank-{x.type.rank} tensor"
            )
        out.append(d % x.type.rank)
    return out


def _reduce_dims(
    kind: Reduction, fname: str, x: Value, dims: int | Sequence[int], keepdims: bool
) -> Value:
    expr = f"{fname}({_token(x)}, {dims!r}" + (", keepdims=True)" if keepdims else ")")
    if not isinstance(x, Value):
        raise CocoError(f"{user_location()}: `{expr}` needs a tensor, got {x!r}")
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
    return _reduce_dims(Reduction.SUM, "Sum", x, dims, keepdims)


def Mean(x: Value, dims: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
    """The mean over `dims` (not over a dim `x` is sliced on: a partial mean does not
    combine; use Sum, AllReduce and divide)."""
    return _reduce_dims(Reduction.MEAN, "Mean", x, dims, keepdims)


def AMax(x: Value, dims: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
    """The maximum over `dims` (NumPy's amax; `Max(a, b)` is the elementwise maximum)."""
    return _reduce_dims(Reduction.MAX, "AMax", x, dims, keepdims)


def AMin(x: Value, dims: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
    return _reduce_dims(Reduction.MIN, "AMin", x, dims, keepdims)


def Reshape(x: Value, shape: Sequence[int]) -> Value:
    """The same elements under another shape, keeping the layouts (a sliced tensor keeps
    its dims up to the sliced one)."""
    expr = f"Reshape({_token(x)}, {list(shape)!r})"
    if not isinstance(x, Value):
        raise CocoError(f"{user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)
    new_shape = as_shape(shape)
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


def Softmax(x: Value, dim: int = -1, numerics: str | None = None) -> Value:
    """exp(x - max) / sum(exp(x - max)) over `dim` (`numerics`: the exp's policy)."""
    shifted = Exp(x - AMax(x, dim, keepdims=True), numerics)
    return shifted / Sum(shifted, dim, keepdims=True)


def _axes(over: object) -> list[int] | None:
    """`over=` as a list of grid axes: an int, a sequence of ints, or None (default)."""
    if over is None:
        return None
    if isinstance(over, int):
        return [over]
    if not isinstance(over, Sequence) or isinstance(over, str):
        raise CocoError(f"{user_location()}: over= names grid axes (ints), got {over!r}")
    return [int(a) for a in over]


def Slice(x: Value, dim: int = 0, over: int | Sequence[int] | None = None) -> Value:
    """This rank's part of a replicated tensor along `dim`, no communication (CoCoNet's
    Scatter). `over` names the grid axes that cut it (default: every axis where `x` is
    replicated)."""
    expr = f"Slice({_token(x)}, {dim!r})"
    if not isinstance(x, Value):
        raise CocoError(f"{user_location()}: `{expr}` needs a tensor, got {x!r}")
    (a,) = _lift([x], expr, expr)
    b = _current(expr)
    layouts = a.type.layout_list(b.grid.rank)
    axes = _axes(over)
    if axes is None:
        axes = [i for i, lay in enumerate(layouts) if isinstance(lay, ReplicatedAttr)]
    for i in axes:
        if not 0 <= i < b.grid.rank:
            raise CocoError(
                f"{user_location()}: `{expr}`: grid axis {i} does not exist on the grid {b.grid}"
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
        # A slice cuts each rank's piece: its cuts nest inside those `x` has.
        return coco.SliceOp(a.ssa, a.type.with_layouts(nest_layouts(a.type, layouts)))

    return _emit(expr, [a], make)


Scatter = Slice  # CoCoNet's name for it


def Update(target: Value, value: Value) -> Value:
    """Store `value` into the argument `target` (the program's side effect); returns `value`,
    which later code reads instead of `target`."""
    expr = f"Update({_token(target)}, {_token(value)})"
    if not isinstance(target, Value) or not isinstance(value, Value):
        raise CocoError(f"{user_location()}: `{expr}` stores a tensor into a declared tensor")
    t, v = _lift([target, value], expr, expr)
    b = _current(expr)
    if not isinstance(t.ssa, BlockArgument) or t.ssa.block is not b.block:
        raise CocoError(
            f"{user_location()}: `{expr}`: {_describe(t)} is not a declared tensor; only the "
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
    b.updated[t.ssa] = user_location()
    b.name_from_frames()
    return v
