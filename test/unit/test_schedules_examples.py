"""Every example x every schedule of the autotuner's space (coconet.schedule.
enumerate_scheduled_programs) means what the unscheduled example means: translation validation
in the sim oracle (coconet.equivalence.check_equivalence) at 1, 2, 4 and 8 ranks (rank counts
a program's grid cannot take are left out: the pipeline boundary's [2, ?] grid runs on 2, 4, 8).

Exactness. The sim's collectives accumulate in f64 in rank order and round once, so a schedule
is bit-identical to the program as written, with one exception: reordering a reduction
(LAMB's norms) onto slices sums each slice, rounds the partial sum, then all-reduces the
partials, which is a different summation order. Schedules that move a reduction are compared
within the per-dtype tolerances of coconet.core.tolerances.TOLERANCES; every other schedule must
match bit for bit.

Narrowing. A split may slice a tensor dim that does not divide on every rank count (the model-
parallel activations are [2, 16, 64]: `split(total,dim=0)` runs on 1 and 2 ranks only). The
enumeration keeps such schedules (they are legal where they run); named schedules pick a dim
that divides (coconet.schedule.auto_split_dim) and must never narrow.

Each pipeline string is also re-applied to the program as written and must give the scheduled
program's IR (the `(name, pipeline)` pairs are what an autotuner or coco-opt consumes).

`COCONET_FULL=1` runs a bigger sweep: three input seeds, 16 ranks too, and the Python forms of
the examples (including their fp32 builds).
"""

from __future__ import annotations

import functools
import os
import runpy
from pathlib import Path

import pytest
from conftest import example_params

import coconet
from coconet.core.program import Program
from coconet.dialects import comm
from coconet.equivalence import check_equivalence
from coconet.schedule import (
    apply_pipeline,
    apply_schedule,
    auto_split_dim,
    enumerate_scheduled_programs,
    named_schedules,
)

FULL = os.environ.get("COCONET_FULL") == "1"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.mlir"))
RANKS = (1, 2, 4, 8)


@functools.cache
def program(name: str) -> Program:
    return coconet.load(EXAMPLES / f"{name}.mlir")


@functools.cache
def space(name: str) -> list[tuple[str, str, Program]]:
    return enumerate_scheduled_programs(program(name))


def rank_counts(p: Program, counts=RANKS) -> tuple[int, ...]:
    """The counts of `counts` the program's grid can take (its static axes must divide)."""
    static = 1
    for s in p.grid.shape:
        if s > 0:
            static *= s
    return tuple(n for n in counts if n % static == 0)


def scalar_all_reduces(p: Program) -> int:
    return sum(
        1 for op in p.func.walk() if isinstance(op, comm.AllReduceOp) and op.input.type.rank == 0
    )


def moves_reductions(before: Program, after: Program) -> bool:
    """Whether the schedule turned a reduction into partial reductions + an all_reduce."""
    return scalar_all_reduces(after) > scalar_all_reduces(before)


def auto_dims(p: Program) -> dict[str, int]:
    return {
        op.result.name_hint: auto_split_dim(op)
        for op in p.func.walk()
        if isinstance(op, comm.AllReduceOp) and op.input.type.rank > 0 and op.result.name_hint
    }


def check_space(
    p: Program,
    schedules: list[tuple[str, str, Program]],
    ranks: tuple[int, ...],
    seeds: tuple[int, ...],
) -> tuple[list[str], dict[str, list[str]]]:
    """Check every schedule; returns (failures, notes) where notes lists the tolerant and the
    narrowed schedules."""
    failures: list[str] = []
    notes: dict[str, list[str]] = {"tolerant": [], "narrowed": []}
    dims = auto_dims(p)
    as_written = p.print()
    for name, pipeline, scheduled in schedules:
        again = apply_pipeline(p, pipeline).print()
        if again != scheduled.print():
            failures.append(f"{name}: its pipeline '{pipeline}' gives different IR")
            continue
        if pipeline and again == as_written:
            failures.append(f"{name}: the pipeline '{pipeline}' changes nothing")
        exact = not moves_reductions(p, scheduled)
        if not exact:
            notes["tolerant"].append(name)
        report = check_equivalence(p, scheduled, ranks=ranks, seeds=seeds, exact=exact)
        if not report.ok:
            failures.append(f"{name} ({pipeline}):\n{report}")
            continue
        if not report.checked:
            failures.append(f"{name}: compared at no rank count:\n{report}")
            continue
        if report.narrowed:
            notes["narrowed"].append(name)
            # only a split on another dim than the one named schedules pick may narrow
            if all(f"split({ar},dim={d})" in name for ar, d in dims.items()):
                failures.append(f"{name}: narrowed although it splits on the auto dim:\n{report}")
    return failures, notes


@pytest.mark.parametrize("example", example_params(NAMES))
def test_every_enumerated_schedule_is_equivalent(example):
    p = program(example)
    schedules = space(example)
    assert schedules[0][:2] == ("as-written", "")
    assert len(schedules) > 1
    names = [n for n, _, _ in schedules]
    assert len(set(names)) == len(names), "schedule names must be unique"
    failures, notes = check_space(p, schedules, rank_counts(p), (0,))
    assert not failures, f"{len(failures)} of {len(schedules)} schedules of {example} fail:\n" + (
        "\n".join(failures)
    )
    # bit-exact unless a reduction was reordered
    for name in notes["tolerant"]:
        assert "reorder(" in name, name


@pytest.mark.parametrize("example", example_params(NAMES))
def test_named_schedules_are_in_the_space_and_never_narrow(example):
    p = program(example)
    irs = {scheduled.print(): name for name, _, scheduled in space(example)}
    named = named_schedules(p)
    assert named, "every example is offered a named schedule"
    if example == "fp8_allgather_matmul":  # its one all_reduce is a scalar's: the gather's
        assert set(named) == {"fuse(ag)", "ol(fuse(ag),mm)"}, named
    for name, pipeline in named.items():
        scheduled = apply_schedule(p, name)
        assert scheduled.print() in irs, f"{name} ({pipeline}) is not in the enumerated space"
        exact = not moves_reductions(p, scheduled)
        report = check_equivalence(p, scheduled, ranks=rank_counts(p), seeds=(0,), exact=exact)
        assert report.ok, f"{name}:\n{report}"
        assert not report.narrowed, f"{name} narrows:\n{report}"
        assert not report.skipped, f"{name}:\n{report}"


def test_reduction_reordering_is_the_only_inexact_case():
    """LAMB's rs-c-ag is exact except where its norms are summed by slice."""
    if "lamb" not in NAMES:
        pytest.skip("no lamb example")
    p = program("lamb")
    scheduled = apply_schedule(p, "rs-c-ag")
    assert moves_reductions(p, scheduled)
    report = check_equivalence(p, scheduled, ranks=(1, 2), seeds=(0,), exact=True)
    assert report.ok  # 1 and 2 ranks happen to round alike; more ranks may not
    tolerant = check_equivalence(p, scheduled, ranks=RANKS, seeds=(0, 1), exact=False)
    assert tolerant.ok, str(tolerant)


# --------------------------------------------------------------------------------------------
# COCONET_FULL=1: more seeds and ranks, and the Python forms of the examples
# --------------------------------------------------------------------------------------------


def python_forms() -> list[tuple[str, str]]:
    forms = []
    for path in sorted(EXAMPLES.glob("*.py")):
        if path.name.startswith("torch_"):  # training scripts (torch_lm, torch_gpt), no program
            continue
        forms.append((path.stem, "program"))
        text = path.read_text()
        if "def build(dtype" in text:
            forms.append((path.stem, "f32"))
    return forms


def load_python_form(stem: str, form: str) -> Program:
    if form == "program":
        return coconet.load(EXAMPLES / f"{stem}.py")
    ns = runpy.run_path(str(EXAMPLES / f"{stem}.py"), run_name="coconet_program")
    from coconet.frontend import F32

    built = ns["build"](F32)
    return built if isinstance(built, Program) else built.program


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="bigger sweep: set COCONET_FULL=1")
@pytest.mark.parametrize("example", NAMES)
def test_every_schedule_full_sweep(example):
    p = program(example)
    failures, _ = check_space(p, space(example), rank_counts(p, (1, 2, 4, 8, 16)), (0, 1, 2))
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="bigger sweep: set COCONET_FULL=1")
@pytest.mark.parametrize(("stem", "form"), python_forms())
def test_python_forms_full_sweep(stem, form):
    p = load_python_form(stem, form)
    schedules = enumerate_scheduled_programs(p)
    failures, _ = check_space(p, schedules, rank_counts(p), (0, 1))
    assert not failures, "\n".join(failures)
