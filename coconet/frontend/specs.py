"""A tensor declared outside a program (a parameter's annotation or default): its element type,
shape, layouts and name, each checked where it is written."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Attribute
from xdsl.utils.exceptions import VerifyException

from coconet.core.program import CocoError
from coconet.dialects.coco import (
    LayoutAttr,
    TensorType,
)
from coconet.frontend.dtypes import Sliced


@dataclass(frozen=True)
class TensorSpec:
    """A tensor declared outside a program (a parameter's annotation or default)."""

    dtype: Attribute
    shape: tuple[int, ...]
    layouts: tuple[LayoutAttr, ...]
    name: str | None
    symmetric: bool = False  # `{coco.symmetric}`: the caller keeps it in symmetric memory


def as_layouts(layout: object) -> tuple[LayoutAttr, ...]:
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


def as_shape(shape: object) -> tuple[int, ...]:
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


def tensor_type(spec: TensorSpec) -> TensorType:
    try:
        return TensorType(spec.shape, spec.dtype, spec.layouts)
    except VerifyException as e:
        raise CocoError(f"tensor '{spec.name or '?'}': {e}") from None
