"""How a schedule finds the values it targets: passes and pipelines name the ops they act on,
so values are looked up by SSA name, and the ops a schedule can target are named first."""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.dialects import func
from xdsl.ir import SSAValue

from coconet.core.target_names import TARGET_NAMES, name_module_targets, name_schedule_targets


def top_level_named(fn: func.FuncOp, name: str) -> SSAValue | None:
    return values_named(fn, (name,)).get(name)


def values_named(fn: func.FuncOp, names: Iterable[str]) -> dict[str, SSAValue]:
    """The value each of `names` names in `fn`, found in one scan: an argument first, else
    the last result of the body's ops with that name, else the first nested one."""
    wanted = set(names)
    found: dict[str, SSAValue] = {}
    block = fn.body.block
    for op in block.ops:
        for r in op.results:
            if r.name_hint in wanted:
                found[r.name_hint] = r
    for a in reversed(block.args):
        if a.name_hint in wanted:
            found[a.name_hint] = a
    if len(found) < len(wanted):
        for op in fn.walk():
            for r in op.results:
                if r.name_hint in wanted and r.name_hint not in found:
                    found[r.name_hint] = r
    return found


__all__ = [
    "TARGET_NAMES",
    "name_module_targets",
    "name_schedule_targets",
    "top_level_named",
    "values_named",
]
