"""The calling conventions of a compiled program (coconet/compile.py states the contract).

The default: each rank passes, for every argument, its value under the type the program AS
WRITTEN declares (core/values.py `piece_of` of the logical value under that type), whatever
the schedule. A schedule that keeps replicated state sliced (`coco-as-slice`: ZeRO's m and v
under `rs-c-ag`, `fuse(rs-c-ag)`) changes what the plan's buffers hold, not what the caller
passes: such an argument is *resliced*. The runtime hands the plan this rank's piece of the
caller's array (a view: zero copy where it is contiguous, as a dim-0 cut of a C-contiguous
array is) and, where the program updates it, gathers every rank's updated piece back into
the caller's array after the step (an all_gather over the grid axes the schedule slices it
on, through the backend's own collectives: on the device on a GPU), so a loop written
against `ar-c` runs unchanged under every schedule.

`compile(..., pieces=True)`: each rank passes the pieces the plan's buffers hold (the
scheduled program's types), bound as they are with nothing gathered: the zero-copy
convention of coconet.torch and the benchmarks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from coconet.core import values as V
from coconet.core.program import CocoError
from coconet.dialects.coco import ReplicatedAttr, SlicedAttr, TensorType
from coconet.dialects.coco_types import same_cut
from coconet.lowering.plan import Buffer, Collective, Plan


@dataclass(frozen=True)
class Resliced:
    """An argument the schedule stores sliced where the program as written replicates it."""

    name: str
    written: TensorType  # the caller's type
    shape: tuple[int, ...]  # this rank's value under `written`: what the caller passes
    region: tuple[slice, ...]  # where this rank's piece (its buffer) lies in that value
    # the updated pieces back into the caller's array; None where the program only reads it
    gather: Collective | None

    def piece(self, rank: int, whole: Any, shape_of: Any, dtype_of: Any) -> Any:
        """This rank's piece of the caller's value (`whole`, as the backend took it): a view.
        Refuses a value of another shape or dtype than the program as written gives it."""
        got = tuple(shape_of(whole))
        if got != self.shape:
            raise CocoError(
                f"input '{self.name}' of type {self.written}: rank {rank} must pass its value "
                f"of shape {list(self.shape)} (the type the program as written declares; "
                f"compile(..., pieces=True) takes the schedule's pieces), got {list(got)}"
            )
        want = V.numpy_dtype(self.written)
        if np.dtype(dtype_of(whole)) != want:
            raise CocoError(
                f"input '{self.name}' of type {self.written}: expected dtype "
                f"{self.written.elt} ({want.name}), got {np.dtype(dtype_of(whole)).name}"
            )
        return whole[self.region]

    def returned(self, value: Any, whole: Any) -> Any:
        """What the call returns for the updated argument: the caller's own array, which
        `whole` views (NumPy arrays, DLPack tensors), else `whole` (a value the backend had
        to copy, which the update could not reach)."""
        return value if whole is value or hasattr(value, "__dlpack__") else whole


def resliced_arguments(plan: Plan, rank: int) -> dict[str, Resliced]:
    """The arguments whose as-written type (`plan.written_types`) the schedule changed, with
    how rank `rank` converts them. A change other than slicing a replicated axis has no
    conversion here: refused, naming the argument."""
    grid = plan.grid_shape
    coords = V.coords_of(rank, grid)
    out: dict[str, Resliced] = {}
    for name, written in plan.written_types.items():
        buf = plan.arguments[name]
        axes = _sliced_axes(name, written, buf.type, len(grid))
        if all(grid[a] == 1 for a in axes):
            continue  # one rank along them: its piece is the whole value
        shape = V.piece_shape(written, coords, grid)
        region, _ = V.shared_region(written, coords, buf.type, coords, grid)
        gather = None
        if plan.outputs.get(name) is buf:
            # a destination standing for the caller's array: only its type and shape are read
            caller = Buffer(name, written, shape, kind="arg", elt=buf.elt)
            gather = Collective("all_gather", buf, caller, axes=axes)
        out[name] = Resliced(name, written, shape, region, gather)
    return out


def _sliced_axes(
    name: str, written: TensorType, stored: TensorType, grid_rank: int
) -> tuple[int, ...]:
    """The grid axes on which `stored` slices what `written` replicates; refused where the
    two differ otherwise."""
    axes: list[int] = []
    ok = written.get_shape() == stored.get_shape() and written.elt == stored.elt
    for a, (w, s) in enumerate(
        zip(written.layout_list(grid_rank), stored.layout_list(grid_rank), strict=True)
    ):
        if same_cut(w, s):
            continue  # (a cut the schedule nests another inside: the same on this axis)
        if isinstance(w, ReplicatedAttr) and isinstance(s, SlicedAttr):
            axes.append(a)
        else:
            ok = False
    if not ok:
        raise CocoError(
            f"the schedule stores argument '{name}' as {stored} where the program as written "
            f"declares {written}: the default calling convention converts only replicated "
            "state a schedule slices; compile(..., pieces=True) and pass each rank's piece"
        )
    return tuple(axes)


def caller_types(plan: Plan, resliced: Mapping[str, Resliced]) -> dict[str, TensorType]:
    """The type of each argument's value as the caller passes it."""
    return {
        name: resliced[name].written if name in resliced else buf.type
        for name, buf in plan.arguments.items()
    }


def written_changes(
    plan: Plan, arguments: Mapping[str, TensorType], results: Mapping[str, TensorType]
) -> dict[str, TensorType]:
    """The as-written types of `plan`'s arguments that the schedule changed (what
    `Plan.written_types` records), from the program as written's `arguments` and returned
    `results` by name. A returned value's changed type is refused: the default convention
    converts arguments only (no pass changes a function's result types)."""
    grid_rank = len(plan.grid_shape)

    def same(a: TensorType, b: TensorType) -> bool:
        return a.get_shape() == b.get_shape() and a.layout_list(grid_rank) == b.layout_list(
            grid_rank
        )

    for name, t in results.items():
        buf = plan.outputs.get(name)
        if buf is not None and not same(buf.type, t):
            raise CocoError(
                f"@{plan.program}: the schedule returns '{name}' as {buf.type} where the "
                f"program as written returns {t}: compile(..., pieces=True) returns the "
                "schedule's pieces"
            )
    return {
        name: t
        for name, t in arguments.items()
        if name in plan.arguments and not same(plan.arguments[name].type, t)
    }
