"""Optimizer state updated after a global norm, fused (test/unit/programs/late_updates.mlir).

The norm's all_reduce cuts a fused kernel in two; `m` and `v`, computed in the first part and
updated at the end (the natural order to write LAMB or Adam with clipping in), were offered
by the enumerator under `fuse(rs-c-ag)` and then refused by the lowering with "internal: no
buffer holds m1_s". Every offered schedule of each program runs on the cpu backend's kernels
at 2, 3 and 7 ranks (45 elements: uneven at 2 and 7) in f32 (LAMB in bf16 too) against the sim;
where no op reads the state between its new value and its update, the fused plan is the one
of the same program with the updates written early (the part computing the value stores it
in the state), and where one does, the value is kept and copied into the state at the end."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from coconet.core.program import Program, parse_module
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Copy, Launch
from coconet.runtime import sim
from coconet.runtime.check import compare_piece
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules

PROGRAMS = Path(__file__).parent / "programs" / "late_updates.mlir"
FUNCTIONS = ("lamb_late", "clip_late", "read_after_norm")


@functools.cache
def program(fn: str, elt: str = "f32") -> Program:
    text = PROGRAMS.read_text()
    if elt != "f32":
        text = text.replace("f32", elt)
    return Program(parse_module(text, str(PROGRAMS)), fn)


def early(fn: str) -> Program:
    """The same function with every update moved up to just after its value's op."""
    text = PROGRAMS.read_text()
    start = text.index(f"func.func @{fn}(")
    lines = text[start : text.index("\n}", start) + 2].splitlines()
    updates = [line for line in lines if "coco.update" in line]
    rest = [line for line in lines if "coco.update" not in line]
    for u in updates:
        value = u.split(",")[1].split(":")[0].strip()
        at = next(i for i, line in enumerate(rest) if line.strip().startswith(f"{value} ="))
        rest.insert(at + 1, u)
    return Program(parse_module("\n".join(rest), "<early>"), fn)


@pytest.mark.parametrize(("fn", "elt"), [*((fn, "f32") for fn in FUNCTIONS), ("lamb_late", "bf16")])
def test_every_offered_schedule_runs_as_the_sim_computes(fn: str, elt: str) -> None:
    p = program(fn, elt)
    names = [n for n in named_schedules(p) if n != "as-written"]
    assert "fuse(rs-c-ag)" in names, names
    for name in names:
        scheduled = apply_schedule(p, name)
        for ranks in (2, 3, 7):
            want = sim.run(p, ranks=ranks, seed=ranks)
            got = ThreadedExecutor(lower(scheduled, ranks)).run(want.inputs)
            for out, value in want.outputs.items():
                diff, _, _ = compare_piece(out, 0, np.asarray(got[out]), value)
                assert diff is None, f"{fn} {elt} {name} at {ranks} ranks: {diff}"


@pytest.mark.parametrize("fn", ["lamb_late", "clip_late"])
def test_a_late_update_is_stored_by_the_part_computing_its_value(fn: str) -> None:
    late = lower(apply_schedule(program(fn), "fuse(rs-c-ag)"), 3)
    written_early = lower(apply_schedule(early(fn), "fuse(rs-c-ag)"), 3)
    assert [type(s) for s in late.steps] == [type(s) for s in written_early.steps]
    assert not any(isinstance(s, Copy) for s in late.steps), late.format()
    assert all(isinstance(s, Launch) for s in late.steps), late.format()


def test_state_read_again_after_the_norm_is_copied_at_the_end() -> None:
    """`m` is read after the norm (the old value): its new value cannot go into it before."""
    plan = lower(apply_schedule(program("read_after_norm"), "fuse(rs-c-ag)"), 3)
    copies = [s for s in plan.steps if isinstance(s, Copy)]
    assert [c.dst.name for c in copies] == ["m"], plan.format()
