"""The full pass registry: coconet's passes and `coco-schedule`, the names coco-opt, pipeline
text (`parse_pipeline`) and `compile(..., schedule=PIPELINE)` accept."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass

from coconet.passes import get_all_passes as coconet_passes
from coconet.schedule.pipeline import parse_passes
from coconet.schedule.schedule_pass import SchedulePass


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """coconet.passes' registry with `coco-schedule` last (coco-opt lists them in this order)."""
    return {**coconet_passes(), "coco-schedule": lambda: SchedulePass}


def parse_pipeline(text: str) -> list[ModulePass]:
    """The passes of a coco-opt pipeline string (coconet's passes, `coco-schedule` and
    xDSL's)."""
    return parse_passes(text, get_all_passes())
