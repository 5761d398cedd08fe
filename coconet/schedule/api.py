"""`Schedule`, what users hold: a schedule's steps (steps.py) plus pass pipelines as text and
named schedules, either of which may run `coco-schedule`; `schedule()` and `apply_pipeline`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from xdsl.ir import Operation
from xdsl.passes import ModulePass

from coconet.core.gc_pause import without_gc
from coconet.core.program import Program
from coconet.schedule.errors import schedule_error
from coconet.schedule.handles import Handle
from coconet.schedule.named import NAMED_SCHEDULES, resolve_schedule_name
from coconet.schedule.registry import parse_pipeline
from coconet.schedule.steps import ScheduleSteps, as_program
from coconet.schedule.structure import Structure


class Schedule(ScheduleSteps):
    """A schedule of one program (its first function, or `entry`): see the package docstring."""

    def apply(self, pipeline: str | ModulePass | Sequence[ModulePass]) -> list[Handle]:
        """Apply any pass or pipeline (text or pass objects), step by step; returns handles
        to the named values the steps created."""
        passes = (
            parse_pipeline(pipeline)
            if isinstance(pipeline, str)
            else ([pipeline] if isinstance(pipeline, ModulePass) else list(pipeline))
        )
        new: list[Operation] = []
        with self._all_or_nothing():
            for p in passes:
                new = [op for op in new if op.parent is not None] + self._run(p)
        return [self._handle(r) for op in new for r in op.results if r.name_hint]

    def named(self, name: str) -> Self:
        """Apply the named schedule `name` (see NAMED_SCHEDULES) on top of this one."""
        canonical = resolve_schedule_name(name)
        info = Structure(self._program)
        if not NAMED_SCHEDULES[canonical].applies(info):
            raise schedule_error(
                "schedule-unknown",
                f"the schedule '{canonical}' does not fit @{self._program.name}'s structure "
                f"({NAMED_SCHEDULES[canonical].requires})",
            )
        NAMED_SCHEDULES[canonical].recipe(self, info)
        return self


def schedule(program: Any, entry: str | None = None) -> Schedule:
    """`s = schedule(program)`: a Schedule of (a clone of) `program`."""
    return Schedule(program, entry)


@without_gc
def apply_pipeline(program: Any, pipeline: str, *, in_place: bool = False) -> Program:
    """`program` (cloned; `in_place` as for apply_schedule) with the coco-opt `pipeline`
    applied to its function."""
    p = as_program(program)
    # a refused pass ends the pipeline and its schedule: nothing to undo
    s = Schedule._working_on(p if in_place else p.clone(), disposable=True)
    s.apply(pipeline)
    s._verify_deferred()
    return s.program
