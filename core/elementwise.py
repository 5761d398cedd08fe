"""What each elementwise op computes, stated once for every implementation.

The sim oracle (runtime/sim.py) applies `numpy` to operands in the op's compute type (f32 for
f16/bf16/f32, f64, int64) and rounds the result to the element type; the kernel generator
(lowering/kernels/elements.py) emits `device` — a C operator, or a function of coco_device.h
overloaded for float, double and coco_i64 — on the same compute type. `transcendental` ops
compute in f64 on both sides and round once: NumPy, glibc and CUDA disagree on f32 libm results,
and agree after rounding an f64 result. That is the `exact` numerics policy; under `fast`
(coco.py `numerics_of`) an op with a `fast` function computes in its compute type instead: the
sim applies `numpy` to f32 operands (NumPy's f32 loops), the kernels call `fast`, whose f32
overload is the target's f32 function (coco_device.h) and whose double one is the exact
function (f64 computes alike under both). A new elementwise op is its class in dialects/coco.py, a
row here, and its device function in toolchain/coco_device.h.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from coconet.dialects import coco


@dataclass(frozen=True)
class Elementwise:
    numpy: Callable[..., np.ndarray]
    device: str
    # `device` is a C operator (infix for two operands, prefix for one) rather than a function
    operator: bool = False
    # the function integers use where their C semantics differ from `device`'s
    integer_device: str | None = None
    transcendental: bool = False
    # the coco_device.h function the `fast` numerics policy calls (None: the policy does not apply)
    fast: str | None = None

    def device_for(self, is_float: bool) -> tuple[str, bool]:
        """(what the generator emits, whether it is an operator) for a float or integer op."""
        if not is_float and self.integer_device is not None:
            return self.integer_device, False
        return self.device, self.operator


def _c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return a / b
    # C semantics: truncate toward zero; x / 0 is defined here as 0 (C leaves it undefined).
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe)
    return np.where(b == 0, 0, q)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return np.power(a, b)
    return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return x.dtype.type(1) / np.sqrt(x)


def _log(x: np.ndarray) -> np.ndarray:
    # A negative number's log is the positive quiet NaN on every target: implementations
    # differ in that NaN's sign (NumPy's own loops by machine, glibc's logf gives -NaN).
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.log(x)
    return np.where(x < 0, x.dtype.type(np.nan), out)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, x.dtype.type(0))


def _gelu(x: np.ndarray) -> np.ndarray:
    """tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Below
    x = -3, 1 + tanh(u) cancels (at x = -10 the result was mostly tanh's last bits, which
    libm and NumPy round differently): there it is computed as x / (1 + exp(-2u)), the same
    function without the cancellation; coco_device.h computes it alike."""
    c = x.dtype.type(0.7978845608028654)
    k = x.dtype.type(0.044715)
    half = x.dtype.type(0.5)
    one = x.dtype.type(1.0)
    u = c * (x + k * x * x * x)
    with np.errstate(over="ignore", invalid="ignore"):  # each form where the other is taken
        far = x / (one + np.exp(x.dtype.type(-2.0) * u))
        near = half * x * (one + np.tanh(u))
    return cast(np.ndarray, np.where(x >= x.dtype.type(-3.0), near, far))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x))


ELEMENTWISE: dict[type, Elementwise] = {
    coco.AddOp: Elementwise(np.add, "+", operator=True),
    coco.SubOp: Elementwise(np.subtract, "-", operator=True),
    coco.MulOp: Elementwise(np.multiply, "*", operator=True),
    coco.DivOp: Elementwise(_c_div, "/", operator=True, integer_device="coco_div"),
    # NumPy's maximum/minimum: a NaN operand wins
    coco.MaxOp: Elementwise(np.maximum, "coco_max"),
    coco.MinOp: Elementwise(np.minimum, "coco_min"),
    coco.PowOp: Elementwise(_pow, "coco_pow", transcendental=True, fast="coco_fast_pow"),
    coco.NegOp: Elementwise(np.negative, "-", operator=True),
    coco.AbsOp: Elementwise(np.abs, "coco_abs"),
    coco.SqrtOp: Elementwise(np.sqrt, "coco_sqrt"),
    # 1/sqrt, not an approximate rsqrt: the same on every target (`fast`: CUDA's rsqrtf)
    coco.RsqrtOp: Elementwise(_rsqrt, "coco_rsqrt", fast="coco_fast_rsqrt"),
    coco.ExpOp: Elementwise(np.exp, "coco_exp", transcendental=True, fast="coco_fast_exp"),
    coco.LogOp: Elementwise(_log, "coco_log", transcendental=True, fast="coco_fast_log"),
    coco.TanhOp: Elementwise(np.tanh, "coco_tanh", transcendental=True, fast="coco_fast_tanh"),
    coco.ReluOp: Elementwise(_relu, "coco_relu"),
    coco.GeluOp: Elementwise(_gelu, "coco_gelu", transcendental=True, fast="coco_fast_gelu"),
    coco.SigmoidOp: Elementwise(
        _sigmoid, "coco_sigmoid", transcendental=True, fast="coco_fast_sigmoid"
    ),
}

# `coco.cmp`'s predicates: NumPy's comparison and the C operator.
COMPARISONS: dict[str, tuple[Callable[..., np.ndarray], str]] = {
    "eq": (np.equal, "=="),
    "ne": (np.not_equal, "!="),
    "lt": (np.less, "<"),
    "le": (np.less_equal, "<="),
    "gt": (np.greater, ">"),
    "ge": (np.greater_equal, ">="),
}
