"""The named schedules: the table of CoCoNet's variants (name, what each needs, its recipe),
the spellings each name accepts, and applying one to a program."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coconet.core.gc_pause import without_gc
from coconet.core.program import Program
from coconet.dialects import comm
from coconet.passes.common import op_name
from coconet.schedule.errors import VERIFY_RULE, ScheduleError, schedule_error
from coconet.schedule.recipes import (
    recipe_ar_c,
    recipe_fuse_a2a,
    recipe_fuse_ag,
    recipe_fuse_ar_c,
    recipe_fuse_rs_c,
    recipe_fuse_rs_c_ag,
    recipe_fuse_sliced_send,
    recipe_ol_a2a_mm,
    recipe_ol_ag_mm,
    recipe_ol_ag_mm_ol_mm_rs,
    recipe_ol_fuse_ag_mm,
    recipe_ol_mm_a2a,
    recipe_ol_mm_fuse_rs_c_ag,
    recipe_ol_mm_rs,
    recipe_ol_rs_fuse_sliced_send,
    recipe_ol_rs_send_ag,
    recipe_rs_c_ag,
    recipe_sliced_send,
)
from coconet.schedule.steps import ScheduleSteps, as_program
from coconet.schedule.structure import Structure


@dataclass(frozen=True)
class NamedSchedule:
    name: str
    coconet: str  # CoCoNet's name for the variant
    description: str
    requires: str  # the structure it needs, in words
    applies: Callable[[Structure], bool]
    recipe: Callable[[ScheduleSteps, Structure], None]
    aliases: tuple[str, ...] = ()


NAMED_SCHEDULES: dict[str, NamedSchedule] = {
    s.name: s
    for s in [
        NamedSchedule(
            "ar-c",
            "AR_C / MM_AR_C / AR_P2P_C",
            "the all_reduce as written, the computation after it fused into one kernel",
            "an all_reduce of a tensor",
            lambda i: bool(i.all_reduces),
            recipe_ar_c,
            ("mm-ar-c", "ar-p2p-c"),
        ),
        NamedSchedule(
            "rs-c-ag",
            "RS_C_AG / MM_RS_C_AG",
            "split the all_reduce, reorder the computation onto slices, as-slice the optimizer "
            "state, fuse the sliced computation into one kernel",
            "an all_reduce of a tensor",
            lambda i: bool(i.all_reduces),
            recipe_rs_c_ag,
            ("mm-rs-c-ag",),
        ),
        NamedSchedule(
            "fuse(rs-c-ag)",
            "fuse_RS_C_AG",
            "rs-c-ag with reduce_scatter + sliced computation + all_gather as one FusedAllReduce",
            "an all_reduce of a tensor",
            lambda i: bool(i.all_reduces),
            recipe_fuse_rs_c_ag,
            ("mm-fuse-rs-c-ag",),
        ),
        NamedSchedule(
            "fuse(ar-c)",
            "one-shot fused AllReduce (not in CoCoNet; vLLM's / TensorRT-LLM's one-shot)",
            "the all_reduce as written and the computation on its result as one kernel: each "
            "rank reduces every peer's whole input from symmetric memory and computes the "
            "rest locally (one handshake, no all_gather: the form of small tensors)",
            "an all_reduce of a tensor",
            lambda i: bool(i.all_reduces),
            recipe_fuse_ar_c,
            ("mm-fuse-ar-c", "one-shot"),
        ),
        NamedSchedule(
            "fuse(rs-c)",
            "ZeRO-3 / FSDP (not in CoCoNet)",
            "reduce_scatter + the sliced update it feeds as one fused collective kernel; "
            "parameters and optimizer state stay sliced (no all_gather)",
            "a reduce_scatter and sliced arguments it updates",
            lambda i: bool(i.sliced_scatters),
            recipe_fuse_rs_c,
            ("zero3",),
        ),
        NamedSchedule(
            "ol(mm,fuse(rs-c-ag))",
            "ol_MM_fuse_RS_C_AG",
            "fuse(rs-c-ag), overlapped (4 chunks) with the matmul producing the partial sums",
            "a matmul whose only reader is an all_reduce",
            lambda i: bool(i.matmuls),
            recipe_ol_mm_fuse_rs_c_ag,
        ),
        NamedSchedule(
            "ol(ag,mm)",
            "async TP: AllGather + column-parallel GEMM",
            "each all_gather pipelined (4 chunks of rows) with the matmul reading it: chunk k "
            "multiplies while chunk k+1 is gathered",
            "a matmul reading an all_gather (sequence parallelism)",
            lambda i: bool(i.gathered_matmuls),
            recipe_ol_ag_mm,
        ),
        NamedSchedule(
            "ol(mm,rs)",
            "async TP: row-parallel GEMM + ReduceScatter",
            "each matmul pipelined (4 chunks of rows) with the reduce_scatter of its partial "
            "sums: chunk k is reduced while chunk k+1 multiplies",
            "a matmul whose only reader is a reduce_scatter (sequence parallelism)",
            lambda i: bool(i.scattered_matmuls),
            recipe_ol_mm_rs,
        ),
        NamedSchedule(
            "ol(ag,mm)+ol(mm,rs)",
            "async TP: both halves",
            "ol(ag,mm) and ol(mm,rs) together",
            "a matmul reading an all_gather and one feeding a reduce_scatter",
            lambda i: bool(i.gathered_matmuls) and bool(i.scattered_matmuls),
            recipe_ol_ag_mm_ol_mm_rs,
        ),
        NamedSchedule(
            "sliced-send",
            "RS_P2P_C_AG",
            "rs-c-ag, then each rank sends only its slice to the next stage, which all_gathers",
            "a send of a value computed from an all_reduce",
            lambda i: bool(i.sends),
            recipe_sliced_send,
            ("rs-p2p-c-ag",),
        ),
        NamedSchedule(
            "fuse(sliced-send)",
            "fuse(C, P2P)",
            "sliced-send with the sliced computation fused into the send",
            "a send of a value computed from an all_reduce",
            lambda i: bool(i.sends),
            recipe_fuse_sliced_send,
        ),
        NamedSchedule(
            "ol(mm,rs)+fuse(sliced-send)",
            "ol_MM_RS + fuse_P2P_C_AG",
            "fuse(sliced-send), with the matmul overlapped (4 chunks) with its reduce_scatter",
            "a send of a value computed from an all_reduce of a matmul",
            lambda i: bool(i.sends) and bool(i.matmuls),
            recipe_ol_rs_fuse_sliced_send,
        ),
        NamedSchedule(
            "ol(mm,rs,fuse(sliced-send),ag)",
            "ol_RS_fuse_P2P_C_AG",
            "fuse(sliced-send) with the matmul, its reduce_scatter, the fused send and the next "
            "stage's all_gather pipelined in 4 chunks: chunk k is sent while chunk k+1 is "
            "reduce-scattered, and gathered while chunk k+1 is sent",
            "a send of a value computed from an all_reduce of a matmul",
            lambda i: bool(i.sends) and bool(i.matmuls),
            recipe_ol_rs_send_ag,
            ("ol-rs-fuse-p2p-c-ag",),
        ),
        NamedSchedule(
            "fuse(a2a)",
            "DeepEP's fused dispatch / combine (not in CoCoNet)",
            "each all_to_all with the elementwise computation of its input (before the "
            "exchange, on the sender's piece) and of its result (after it, on the receiver's) "
            "as one kernel over symmetric memory",
            "an all_to_all",
            lambda i: bool(i.all_to_alls),
            recipe_fuse_a2a,
            ("fuse-all-to-all",),
        ),
        NamedSchedule(
            "fuse(ag)",
            "FSDP's cast fused into the parameter all_gather (not in CoCoNet)",
            "each all_gather with the elementwise computation of its input (on the sender's "
            "piece, staged once: a cast of the master shard to bf16) and of its result as one "
            "kernel over symmetric memory",
            "an all_gather of a value computed elementwise, or read by elementwise ops",
            lambda i: bool(i.computed_gathers),
            recipe_fuse_ag,
            ("fuse-all-gather",),
        ),
        NamedSchedule(
            "ol(fuse(ag),mm)",
            "FSDP: the fused parameter gather pipelined with its GEMM (not in CoCoNet)",
            "fuse(ag), and each matmul reading a fused all_gather's result pipelined with it "
            "(4 chunks of the matrix's rows): chunk k is cast (or quantized) and gathered "
            "while chunk k-1 multiplies",
            "an all_gather of a matrix computed elementwise whose result a matmul reads",
            lambda i: bool(i.computed_gathers) and i.has_matmul,
            recipe_ol_fuse_ag_mm,
            ("ol-fuse-all-gather-mm",),
        ),
        NamedSchedule(
            "ol(mm,a2a)",
            "expert parallelism: GEMM + AllToAll (not in CoCoNet; Tutel's pipelining)",
            "each matmul pipelined with the all_to_all of its result (through a reshape or "
            "not) in 4, 3 or 2 chunks of a dim the all_to_all neither splits nor gathers: "
            "chunk k is exchanged while chunk k+1 multiplies",
            "a matmul whose only reader is an all_to_all (MoE dispatch buffers, expert output)",
            lambda i: bool(i.exchanged_matmuls),
            recipe_ol_mm_a2a,
            ("ol-mm-all-to-all",),
        ),
        NamedSchedule(
            "ol(a2a,mm)",
            "expert parallelism: AllToAll + GEMM (not in CoCoNet; Tutel's pipelining)",
            "each all_to_all pipelined with the matmul reading it (through a reshape or not) "
            "in 4, 3 or 2 chunks of a dim the all_to_all neither splits nor gathers: chunk k "
            "multiplies while chunk k+1 is exchanged",
            "an all_to_all that only a matmul's left operand reads (the experts' input)",
            lambda i: bool(i.exchanges_into_matmuls),
            recipe_ol_a2a_mm,
            ("ol-all-to-all-mm",),
        ),
    ]
}


def _alias_key(name: str) -> str:
    """Spelling-insensitive form: lowercase, `_`, `(`, `)`, `,`, `+` as `-`, no doubles."""
    key = re.sub(r"[_(),+\s]+", "-", name.strip().lower())
    return key.strip("-")


_ALIASES: dict[str, str] = {}
for _s in NAMED_SCHEDULES.values():
    for _a in (_s.name, *_s.aliases):
        _ALIASES[_alias_key(_a)] = _s.name


def resolve_schedule_name(name: str) -> str:
    """The canonical name of a named schedule. Accepted spellings: the canonical name
    (`fuse(rs-c-ag)`), the same without parentheses and commas (`fuse-rs-c-ag`,
    `ol-mm-fuse-rs-c-ag`, `ol-mm-rs-fuse-sliced-send-ag`), CoCoNet's names in any case
    (`fuse_RS_C_AG`, `MM_AR_C`, `ol_MM_fuse_RS_C_AG`, `RS_P2P_C_AG`, `ol_RS_fuse_P2P_C_AG`);
    the one-shot fused all_reduce `fuse(ar-c)` also as `one-shot`."""
    canonical = _ALIASES.get(_alias_key(name))
    if canonical is None:
        raise schedule_error(
            "schedule-unknown",
            f"no schedule named '{name}'; named schedules: " + ", ".join(NAMED_SCHEDULES),
        )
    return canonical


def structure_refusal(
    p: Program, info: Structure, name: str, *, applying: Sequence[str] | None = None
) -> ScheduleError | None:
    """Why the named schedule `name` does not fit `p`'s structure (None if it does), naming
    the schedules that apply to it: `applying` when the caller knows them, else those whose
    steps all apply (not only those whose structure it has: a split can still be refused)."""
    ns = NAMED_SCHEDULES[name]
    if ns.applies(info):
        return None
    fits = applying
    if fits is None:
        fits = [
            n
            for n, x in NAMED_SCHEDULES.items()
            if x.applies(info) and not isinstance(try_named(p, info, n), ScheduleError)
        ]
    lacks = f"which @{p.name} lacks"
    if ns.requires.startswith("an all_reduce") and not info.all_reduces:
        # its all_reduces, if any, are of scalars: say so, not that it has none
        scalars = [op for op in p.func.body.block.ops if isinstance(op, comm.AllReduceOp)]
        if scalars:
            names = ", ".join(op_name(op) for op in scalars)
            several = len(scalars) > 1
            lacks = (
                f"and @{p.name}'s only all_reduce{'s' if several else ''} ({names}) "
                f"reduce{'' if several else 's'} a scalar "
                f"({', '.join(sorted({str(op.input.type) for op in scalars}))}), which no "
                "named schedule rewrites: it runs as written"
            )
    return schedule_error(
        "schedule-unknown",
        f"the schedule '{name}' needs {ns.requires}, {lacks}; schedules "
        f"that apply to it: {', '.join(fits) or 'none'}",
    )


def try_named(program: Program, info: Structure, name: str) -> ScheduleSteps | ScheduleError:
    """The named schedule `name` applied to a clone of `program`, or the refusal of the
    step that stopped it (a pass bug -- IR that does not verify -- is raised)."""
    s = ScheduleSteps._working_on(program.clone(), disposable=True)
    try:
        NAMED_SCHEDULES[name].recipe(s, info)
        s._verify_deferred()
    except ScheduleError as e:
        if e.rule == VERIFY_RULE:
            raise  # a pass bug, not a schedule that does not fit
        return e
    return s


@without_gc  # as every compiler phase (core/gc_pause.py): 0.1-0.3 s of a 2,400-op schedule
def apply_schedule(program: Any, name: str, *, in_place: bool = False) -> Program:
    """`program` (cloned) scheduled by the named schedule `name` (any accepted spelling).
    `in_place`: schedule `program` itself, a Program its caller made for this and uses only
    through the result (it may be left half-scheduled when a step is refused)."""
    p = as_program(program)
    canonical = resolve_schedule_name(name)
    info = Structure(p)
    ns = NAMED_SCHEDULES[canonical]
    refusal = structure_refusal(p, info, canonical)
    if refusal is not None:
        raise refusal
    # private: dropped on a refusal (recipes undo what they try and go on without: _attempt)
    s = ScheduleSteps._working_on(p if in_place else p.clone(), disposable=True)
    ns.recipe(s, info)
    s._verify_deferred()
    return s.program
