"""The schedule API: CoCoNet's transformations as calls on a program, each one a verified IR pass.

    from coconet.schedule import Schedule
    s = Schedule(program)                      # works on a clone; `program` is untouched
    rs, ag = s.split("g1")                     # coco-split-allreduce{ops=g1}
    s.reorder(ag)                              # coco-reorder{ops=g1}: computation onto slices
    s.as_slice("m", "v")                       # coco-as-slice{ops=m,v}: ZeRO-style sharded state
    fused = s.fuse(rs, mode="all_reduce")      # coco-fuse{mode=all_reduce ops=g1_rs}
    s.program, s.ir(), s.pipeline              # the scheduled Program, its text, and the
                                               # coco-opt pipeline that reproduces it

Every method applies the corresponding pass in TARGETED mode (its `ops` option names the SSA
values to act on; a call without targets runs the pass greedily), verifies the result and
returns name-based handles (`Handle`) to what the pass created. An illegal request raises
`ScheduleError` (a `CocoError`) carrying the pass's `[rule] message`; the program is left as
it was. `s.pipeline` is the comma-separated pass pipeline of every step so far:
`coco-opt FILE -p "<s.pipeline>"` gives the same IR (for a module holding one function: a
Schedule schedules one function and runs each pass on it alone).

Targets are SSA names (`"g1"` or `"%g1"`), handles, or xDSL values/ops of `s.program`. Only
named values can be targeted (passes find ops by `name_hint`); to act on unnamed ops, call the
method without targets (greedy mode).

Named schedules (CoCoNet's variants, chosen by a program's structure): `named_schedules`
(`explain=True`: also every schedule dropped, with the reason; `why_not_offered` for one),
`apply_schedule`, and the `coco-schedule{name=...}` pass. The autotuner's space:
`enumerate_schedules`. Both offer only schedules that launch at the rank counts asked for
(`ranks=`; default: those of DEFAULT_RANKS the program as written launches at).

One concern a module, bottom to top: `errors` (ScheduleError), `pipeline` (pipelines as
text), `targets` (finding and naming the values passes target), `handles` (references to
what steps made, and targets as names), `structure` (what decides which schedules fit),
`steps` (the transformations, one pass each), `recipes` and `named` (the named schedules),
`schedule_pass` (`coco-schedule`), `registry` (every pass, coco-schedule included), `api`
(`Schedule`), `enumerator` (what is offered; the autotuner's space).
"""

from coconet.schedule.api import Schedule, apply_pipeline, schedule
from coconet.schedule.enumerator import (
    DEFAULT_RANKS,
    ScheduleOffers,
    enumerate_scheduled_programs,
    enumerate_schedules,
    launch_ranks,
    launch_refusal,
    named_schedules,
    why_not_offered,
)
from coconet.schedule.errors import VERIFY_RULE, ScheduleError
from coconet.schedule.handles import Handle, Reordered
from coconet.schedule.named import (
    NAMED_SCHEDULES,
    NamedSchedule,
    apply_schedule,
    resolve_schedule_name,
)
from coconet.schedule.pipeline import format_pass, format_pipeline
from coconet.schedule.registry import get_all_passes, parse_pipeline
from coconet.schedule.schedule_pass import SchedulePass
from coconet.schedule.steps import ScheduleSteps
from coconet.schedule.structure import PREFERRED_GROUP, auto_split_dim
from coconet.schedule.targets import TARGET_NAMES, name_schedule_targets

__all__ = [
    "DEFAULT_RANKS",
    "NAMED_SCHEDULES",
    "PREFERRED_GROUP",
    "TARGET_NAMES",
    "VERIFY_RULE",
    "Handle",
    "NamedSchedule",
    "Reordered",
    "Schedule",
    "ScheduleError",
    "ScheduleOffers",
    "SchedulePass",
    "ScheduleSteps",
    "apply_pipeline",
    "apply_schedule",
    "auto_split_dim",
    "enumerate_scheduled_programs",
    "enumerate_schedules",
    "format_pass",
    "format_pipeline",
    "get_all_passes",
    "launch_ranks",
    "launch_refusal",
    "name_schedule_targets",
    "named_schedules",
    "parse_pipeline",
    "resolve_schedule_name",
    "schedule",
    "why_not_offered",
]
