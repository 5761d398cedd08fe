"""Stable names for the ops a schedule targets. Passes and pipelines name the ops they act on
(`coco-split-allreduce{ops=ar0}`), so a program's unnamed matmuls, all_reduces and sends are
given deterministic names, in the IR itself, when the program is built or loaded (the front
end, `load`) and when it is scheduled: every name a printed pipeline uses is one the printed
program carries, so `coco-opt -p PIPELINE` replays it on that text (docs/architecture.md §4)."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from coconet.dialects import coco, comm

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
    the enumeration and pipelines can target them. Deterministic and idempotent: a program
    and its printed text, read back, name the same ops alike. Values the function returns
    keep their (output) names."""
    block = fn.body.block
    last = block.last_op
    returned: set[SSAValue] = set(last.operands) if isinstance(last, func.ReturnOp) else set()
    unnamed = [
        op
        for op in block.ops
        if type(op) in TARGET_NAMES
        and len(op.results) == 1
        and not op.results[0].name_hint
        and op.results[0] not in returned
    ]
    if not unnamed:
        return
    taken = {a.name_hint for a in block.args if a.name_hint}
    taken |= {r.name_hint for op in fn.walk() for r in op.results if r.name_hint}
    counters: dict[str, int] = {}
    for op in unnamed:
        base = TARGET_NAMES[type(op)]
        k = counters.get(base, 0)
        while f"{base}{k}" in taken:
            k += 1
        counters[base] = k + 1
        op.results[0].name_hint = f"{base}{k}"
        taken.add(f"{base}{k}")


def name_module_targets(module: ModuleOp) -> None:
    """`name_schedule_targets` on every function of `module` that has a body."""
    for op in module.ops:
        if isinstance(op, func.FuncOp) and not op.is_declaration:
            name_schedule_targets(op)
