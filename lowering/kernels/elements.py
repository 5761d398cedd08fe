"""Element types in the kernel IR: how each is stored and the type it computes in, exact
literals, loads and stores between the two, rounding (once, from double, where an op computes
in double: core/elementwise.py says which), casts, and the accumulators of reductions (double,
or long long for integers).

Numerics follow the dialects exactly: each op computes in float (double, long long) and rounds
its result to its element type, constants are rounded to their element type at compile time,
and reductions accumulate in double."""

from __future__ import annotations

import numpy as np
from xdsl.ir import Operation

from coconet.core.elementwise import ELEMENTWISE
from coconet.core.values import NUMPY_DTYPES
from coconet.dialects import coco
from coconet.dialects.coco import is_float_name, tensor_type_of
from coconet.dialects.reduction import Reduction
from coconet.lowering.kernel_ir import Binary, Cast, Expr, Lit, Unary, Var, binary
from coconet.lowering.kernels.statements import call
from coconet.lowering.signature import BOOL, F32, F64, I32, I64, CType

# The floats narrower than float: stored in coco_device.h's storage types (this suffix), loaded
# to float, and rounded from float by its coco_round_<suffix>.
NARROW_FLOATS = {"f16": "f16", "bf16": "bf16", "f8E4M3FN": "f8e4m3", "f8E5M2": "f8e5m2"}

# How an element type is stored, and the type it is computed in.
C_STORAGE = {
    **{elt: CType(f"coco_{sfx}") for elt, sfx in NARROW_FLOATS.items()},
    "f32": F32,
    "f64": F64,
    "i32": I32,
    "i64": I64,
    "i1": BOOL,
}
C_COMPUTE = {
    **dict.fromkeys(NARROW_FLOATS, F32),
    "f32": F32,
    "f64": F64,
    "i32": I64,
    "i64": I64,
    "i1": BOOL,
}


# Bytes of one stored element (vector widths are counted in the narrowest element).
STORAGE_BYTES = {
    "f16": 2,
    "bf16": 2,
    "f8E4M3FN": 1,
    "f8E5M2": 1,
    "f32": 4,
    "f64": 8,
    "i32": 4,
    "i64": 8,
    "i1": 1,
}


def is_float(elt: str) -> bool:
    return is_float_name(elt)


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


def int_literal(value: float | int, elt: str) -> Expr:
    """An integer constant wrapped to its element type, as a long long."""
    return Cast(I64, Lit(str(int(np.array(value).astype(NUMPY_DTYPES[elt])))))


def load_expr(elt: str, ref: Expr) -> Expr:
    """A stored element in its compute type."""
    if elt in NARROW_FLOATS:
        return call("coco_to_f32", ref)
    if elt == "i32":
        return Cast(I64, ref)
    return ref


def store_expr(elt: str, value: Expr) -> Expr:
    """A compute-type value (already rounded to `elt`) in its storage type."""
    if elt in NARROW_FLOATS:
        return call(f"coco_{NARROW_FLOATS[elt]}_from_f32", value)
    if elt == "i32":
        return Cast(I32, value)
    return value


def round_expr(elt: str, value: Expr) -> Expr:
    """Round a compute-type value to the element type, staying in the compute type."""
    if elt in NARROW_FLOATS:
        return call(f"coco_round_{NARROW_FLOATS[elt]}", value)
    if elt == "i32":
        return Cast(I64, Cast(I32, value))
    return value


def store_from_double(elt: str, value: Expr) -> Expr:
    """Round a double to the element type ONCE (as NumPy does), in storage form. Going through
    float would round twice for f16/bf16; rounding to odd first makes the second rounding
    exact (float has more than twice the bits of any of them)."""
    if elt in NARROW_FLOATS:
        return store_expr(elt, call("coco_f64_to_f32_odd", value))
    if elt == "i1":
        return binary("!=", value, 0)
    if elt == "i32":
        return store_expr(elt, Cast(I64, value))
    return Cast(C_STORAGE[elt], value)


def in_double(op: Operation) -> bool:
    """A transcendental op on a float narrower than double computes in double and rounds once
    (core/elementwise.py says which ops; the sim does the same), and so do coco.quantize and
    coco.dequantize where any of their types is f64."""
    if isinstance(op, coco.ScaleOp):
        return any(tensor_type_of(v).elt == "f64" for v in (*op.operands, op.result))
    semantics = ELEMENTWISE.get(type(op))
    return (
        semantics is not None
        and semantics.transcendental
        and tensor_type_of(op.results[0]).elt in (*NARROW_FLOATS, "f32")
        and not coco.is_fast(op)
    )


def round_from_double(elt: str, value: Expr) -> Expr:
    """Round a double to `elt` once, staying in its compute type (float, or double for f64)."""
    if elt in NARROW_FLOATS:
        return call(f"coco_round_{NARROW_FLOATS[elt]}", call("coco_f64_to_f32_odd", value))
    if elt == "f64":
        return value
    return Cast(F32, value)


def arithmetic(op: coco.BinaryOp | coco.UnaryOp, operands: list[Var]) -> Expr:
    """The op as core/elementwise.py states it: a C operator or a coco_device.h function
    (overloaded for float, double and coco_i64), on double operands where it computes in
    double. Under the `fast` numerics policy an op on a float narrower than double calls its
    `fast` function on float operands (coco_device.h: the target's f32 function)."""
    semantics = ELEMENTWISE[type(op)]
    elt = tensor_type_of(op.results[0]).elt
    name, is_operator = semantics.device_for(is_float(elt))
    if semantics.fast is not None and C_COMPUTE[elt] == F32 and coco.is_fast(op):
        name, is_operator = semantics.fast, False
    args: list[Expr] = [Cast(F64, x) for x in operands] if in_double(op) else list(operands)
    if not is_operator:
        return call(name, *args)
    if len(args) == 1:
        return Unary(name, args[0])
    return Binary(name, args[0], args[1])


def scaled(op: coco.ScaleOp, operands: list[Var]) -> Expr:
    """coco.quantize (x / scale, saturated to the fp8 type's largest finite value) and
    coco.dequantize (q * scale), in double where `in_double` says so; the caller rounds."""
    x, s = [Cast(F64, v) for v in operands] if in_double(op) else operands
    if isinstance(op, coco.DequantizeOp):
        return Binary("*", x, s)
    limit = coco.FP8_MAX[tensor_type_of(op.result).elt]
    sfx = "" if in_double(op) else "f"
    return call("coco_saturate", Binary("/", x, s), Lit(f"{limit!r}{sfx}"))


def cast_to(dst_elt: str, x: Expr) -> Expr:
    if dst_elt == "i1":
        return binary("!=", x, 0)
    return Cast(C_COMPUTE[dst_elt], x)


def accumulator(elt: str, acc: str | None = None) -> CType:
    """Reductions accumulate floats in double, integers in long long; a collective's stated
    accumulation `acc` (comm.accumulation) in float, or double for f64."""
    if acc is not None:
        return F64 if acc == "f64" else F32
    return F64 if is_float(elt) else I64


def reduce_accumulator(elt: str, kind: Reduction) -> CType:
    """The accumulator of a reduction over elements: the max or min of floats narrower than
    double in float (the bits a double gives, at twice the vector width: the amax of fp8
    scaling, a softmax's row max), sums and the rest as `accumulator` says."""
    if kind in (Reduction.MAX, Reduction.MIN) and (elt in NARROW_FLOATS or elt == "f32"):
        return F32
    return accumulator(elt)


# A sum of e4m3 codes (multiples of 2^-9 of magnitude at most 448) is exact in float while
# every partial sum stays below 2^24 units of 2^-9: up to 73 terms.
EXACT_E4M3_TERMS = 64


def peer_accumulator(elt: str, acc: str | None, kind: Reduction, group: int) -> CType:
    """The accumulator of a reduction over a group's values: a float where it gives the bits
    the default double would (the oracle's exact sum rounded once): the max or min of floats,
    and sums of e4m3 codes over at most EXACT_E4M3_TERMS members. A float tile is half a
    double's and needs no widening: an fp8 gradient's fused step is compute-bound on the host
    otherwise."""
    if acc is None and group > 0:
        if kind == Reduction.SUM and elt == "f8E4M3FN" and group <= EXACT_E4M3_TERMS:
            return F32
        return reduce_accumulator(elt, kind)
    return accumulator(elt, acc)


def accumulate_step(acc: str | None, value: Expr) -> Expr:
    """One step of a reduction, rounded to the stated accumulation `acc`: float arithmetic
    rounds to f32 (and double to f64) itself; bf16 and f16 round from float, which is exact
    as a single rounding would be (float has more than twice their bits plus two)."""
    if acc in NARROW_FLOATS:
        return round_expr(acc, value)
    return value
