"""Iteration spaces: the shape and layouts a value occupies in a kernel, and how the ops of
a fused set must agree on them (one kernel runs one space; a fused collective's rows are a
second space of its own)."""

from __future__ import annotations

import functools

from xdsl.ir import Attribute, Operation, SSAValue

from coconet.dialects import coco
from coconet.dialects.coco import SlicedAttr, TensorType

Space = tuple[tuple[int, ...], tuple[Attribute, ...]] | None


def space_of(v: SSAValue) -> Space:
    """The iteration space a value occupies in a kernel: its shape and layouts (element type
    aside); None for a scalar, which fits any space."""
    return _space_of_type(v.type)


@functools.lru_cache(maxsize=4096)
def _space_of_type(t: Attribute) -> Space:
    # by type (attributes are immutable): a chain scan asks it for every op it looks at
    if not isinstance(t, TensorType) or t.rank == 0:
        return None
    return (t.get_shape(), tuple(t.layouts.data))


def op_space(op: Operation) -> Space | str:
    spaces = {space_of(r) for r in op.results} - {None}
    if len(spaces) > 1:
        return "mixed"
    return spaces.pop() if spaces else None


def row_space(space: Space) -> Space:
    """The space of a keepdims reduction over the last dim of `space` (its rows), when no
    grid axis slices that dim (each rank then holds whole rows); None otherwise."""
    if space is None:
        return None
    shape, layouts = space
    last = len(shape) - 1
    if any(isinstance(lay, SlicedAttr) and lay.dim.data == last for lay in layouts):
        return None
    return ((*shape[:-1], 1), layouts)


def row_reduction_of(u: Operation, space: Space) -> bool:
    """Whether `u` reduces the rows of `space` (a coco.reduce_dims over its last dim, keeping
    it), which a fused collective kernel finishes inside one block per row."""
    return (
        isinstance(u, coco.ReduceDimsOp)
        and space is not None
        and u.reduced_dims == (len(space[0]) - 1,)
        and u.keeps_dims
        and space_of(u.input) == space
        and row_space(space) is not None
        and space_of(u.result) == row_space(space)
    )


def meet(a: Space, b: Space | str) -> Space | str:
    """The common iteration space of `a` and `b`, `b` itself when it is a mark (`"mixed"`),
    "mismatch" when they differ."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    return "mismatch"
