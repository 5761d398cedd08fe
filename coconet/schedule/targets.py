"""How a schedule finds the values it targets: passes and pipelines name the ops they act on,
so values are looked up by SSA name, and the ops a schedule can target are named first."""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from coconet.dialects import coco, comm


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


# What an unnamed op a schedule can target is called: passes and pipelines name the ops
# they act on, so a schedule of a program must not depend on whether its author named them.
TARGET_NAMES: dict[type[Operation], str] = {
    coco.MatmulOp: "mm",
    comm.AllReduceOp: "ar",
    comm.SendOp: "sent",
}


def name_schedule_targets(fn: func.FuncOp) -> None:
    """Give every unnamed matmul, all_reduce and send of `fn`'s body a name (`mm0`, `ar0`,
    `sent0`, ..., numbered in program order, skipping names in use), so that named schedules,
    the enumeration and pipelines can target them. Deterministic: a Schedule of the same
    program names the same ops alike. Values the function returns keep their (output) names."""
    block = fn.body.block
    last = block.last_op
    returned = set(last.operands) if isinstance(last, func.ReturnOp) else set()
    taken = {a.name_hint for a in block.args if a.name_hint}
    taken |= {r.name_hint for op in fn.walk() for r in op.results if r.name_hint}
    counters: dict[str, int] = {}
    for op in block.ops:
        base = TARGET_NAMES.get(type(op))
        if base is None or len(op.results) != 1:
            continue
        v = op.results[0]
        if v.name_hint or v in returned:
            continue
        k = counters.get(base, 0)
        while f"{base}{k}" in taken:
            k += 1
        counters[base] = k + 1
        v.name_hint = f"{base}{k}"
        taken.add(v.name_hint)
