"""Element types (`F32`, `BF16`, CoCoNet's `Float32`, ...) and layouts (`Replicated`, `Local`,
`Sliced(d)`) as the front end spells them."""

from __future__ import annotations

from xdsl.dialects.builtin import (
    Float8E4M3FNType,
    Float8E5M2Type,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i32,
    i64,
)
from xdsl.ir import Attribute

from coconet.core.program import CocoError
from coconet.dialects.coco import (
    LOCAL,
    REPLICATED,
    LayoutAttr,
    SlicedAttr,
    element_type_name,
)

F16: Attribute = f16
BF16: Attribute = bf16
F32: Attribute = f32
F64: Attribute = f64
I32: Attribute = i32
I64: Attribute = i64
I1: Attribute = i1
# fp8 (MLIR's names; ml_dtypes' float8_e4m3fn and float8_e5m2)
F8E4M3FN: Attribute = Float8E4M3FNType()
F8E5M2: Attribute = Float8E5M2Type()
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


def elt_name(dtype: object) -> str:
    try:
        return element_type_name(dtype)  # type: ignore[arg-type]
    except Exception:
        raise CocoError(
            f"{dtype!r} is not an element type: use F16, BF16, F32, F64, F8E4M3FN, F8E5M2, "
            "I32, I64 or I1"
        ) from None


def element_type_of(dtype: object) -> Attribute:
    """`dtype` if it is an element type (F32, BF16, ...); a CocoError otherwise."""
    elt_name(dtype)
    assert isinstance(dtype, Attribute)
    return dtype
