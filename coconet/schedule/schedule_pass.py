"""`coco-schedule`: apply one of CoCoNet's named schedules (named.py NAMED_SCHEDULES), that is
its recipe's pass pipeline, or, given no name, the module's own schedule (its `coco.schedule`
attribute). A pass of the schedule API, not of coconet.passes: it expands to their passes, so
they never reach the API."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.utils.arg_spec import ArgSpec
from xdsl.utils.exceptions import PassFailedException

from coconet.core.program import CocoError, Program
from coconet.dialects.coco import SCHEDULE_ATTR_NAME
from coconet.passes import get_all_passes
from coconet.passes.common import Refusal, fail
from coconet.schedule.named import NAMED_SCHEDULES, apply_schedule, resolve_schedule_name
from coconet.schedule.pipeline import parse_passes

RULE = "schedule"


@dataclass(frozen=True)
class SchedulePass(ModulePass):
    """Apply the named schedule `name` to every function of the module: the schedule's pass
    pipeline, built for each function from its structure (coconet.schedule.named_schedules
    lists it per program; `s.pipeline` of the same recipe is the equivalent pipeline of
    coconet's other passes).

    Names (any spelling `resolve_schedule_name` accepts):
    * `ar-c`                 (AR_C, MM_AR_C, AR_P2P_C): computation after the all_reduce fused
                             into one kernel.
    * `rs-c-ag`              (RS_C_AG, MM_RS_C_AG): split, reorder onto slices, as-slice the
                             optimizer state, fuse the sliced computation.
    * `fuse(rs-c-ag)`        (fuse_RS_C_AG): the same as one FusedAllReduce.
    * `fuse(rs-c)`           (ZeRO-3 / FSDP): a reduce_scatter and the update of sliced
                             parameters and state it feeds as one fused kernel.
    * `ol(mm,fuse(rs-c-ag))` (ol_MM_fuse_RS_C_AG): that, overlapped with the producing matmul.
    * `sliced-send`          (RS_P2P_C_AG): rs-c-ag, then send only this rank's slice.
    * `fuse(sliced-send)`:   the sliced computation fused into the send.
    * `ol(mm,rs)+fuse(sliced-send)`: plus the matmul overlapped with its reduce_scatter.
    * `ol(mm,rs,fuse(sliced-send),ag)` (ol_RS_fuse_P2P_C_AG): the matmul, its
                             reduce_scatter, the fused send and the next stage's all_gather
                             pipelined chunk by chunk (RS/send/AG overlapped).
    Names with parentheses or commas must be quoted in a pipeline
    (`coco-schedule{name="fuse(rs-c-ag)"}`), or written without them (`name=fuse-rs-c-ag`,
    `name=ol-mm-fuse-rs-c-ag`); CoCoNet's names work too (`name=fuse_RS_C_AG`).

    The option may also be spelled `schedule=`. Given no name, the pass applies the
    module's own schedule, its `coco.schedule` attribute, which it consumes: a pass pipeline
    (coco-opt's `-p` text: `module attributes {coco.schedule = "coco-reorder{ops=x}"}`) or a
    schedule name, told apart as `coconet.compile` tells them (the first element names a
    pass, coconet's or xDSL's). This is how MLIR's transform interpreter takes its script
    from the payload module when none is given: a test file's chunks (`--split-input-file`)
    each carry the passes and options they are tested with, so one coco-opt process checks
    them all; refusals come out as the command line would give them (the pass's own
    `[rule] message`, at its op).

    Legality (refusals name the rule):
    * [schedule-unknown] the name is a named schedule, and the function has the structure it
                         needs (an all_reduce; a matmul feeding it; a send of its result);
                         without a name, the module has a `coco.schedule`.
    * [schedule-pipeline] a module's schedule is a pipeline coco-opt would read.
    * the rules of the passes the schedule runs (e.g. [split-allreduce-empty]).
    """

    name = "coco-schedule"

    schedule: str = ""

    @classmethod
    def from_spec(cls, spec: ArgSpec) -> SchedulePass:
        # `name` is the pass's own class attribute, so the option lives in `schedule`
        params = dict(spec.normalize_parameter_names().parameters)
        if "name" in params:
            if "schedule" in params:
                raise ValueError(f"{cls.name}: give the schedule once (name= or schedule=)")
            params["schedule"] = params.pop("name")
        return super().from_spec(ArgSpec(spec.name, params))

    def spec(self, *, include_default: bool = False) -> ArgSpec:
        base = super().spec(include_default=include_default)
        params = dict(base.parameters)
        if "schedule" in params:
            params = {"name": params.pop("schedule"), **params}
        return ArgSpec(base.name, params)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if not self.schedule:
            script = op.attributes.get(SCHEDULE_ATTR_NAME)
            if script is None:
                raise fail(
                    f"{RULE}-unknown",
                    "coco-schedule needs a schedule name (name=...), one of "
                    + ", ".join(NAMED_SCHEDULES)
                    + f', or a module holding its own ({SCHEDULE_ATTR_NAME} = "PIPELINE")',
                )
            self._apply_module_schedule(ctx, op, script)
            return
        try:
            resolve_schedule_name(self.schedule)
            fns = [f for f in op.ops if isinstance(f, func.FuncOp) and not f.is_declaration]
            scheduled: list[func.FuncOp] = []
            for fn in fns:
                scheduled.append(apply_schedule(Program(op, fn.sym_name.data), self.schedule).func)
        except CocoError as e:
            raise self._refusal(e) from None
        for fn, new in zip(fns, scheduled, strict=True):
            new.detach()  # from the scheduled copy of the module
            PatternRewriter(fn).replace(fn, new)

    def _apply_module_schedule(self, ctx: Context, op: ModuleOp, script: object) -> None:
        if not isinstance(script, StringAttr):  # the program rules refuse it when parsing
            raise fail(f"{RULE}-pipeline", f"{SCHEDULE_ATTR_NAME} is not a string: {script}")
        from xdsl.transforms import get_all_passes as xdsl_passes

        registry = {**get_all_passes(), self.name: lambda: SchedulePass}
        head = script.data.split(",", 1)[0].split("{", 1)[0].strip()
        try:
            if head in registry or head in xdsl_passes():
                passes = parse_passes(script.data, registry)
            else:
                passes = [SchedulePass(schedule=script.data)]
        except CocoError as e:
            raise PassFailedException(str(e)) from None
        # consumed: the result holds no pending schedule (and a coco-schedule in it reads none)
        del op.attributes[SCHEDULE_ATTR_NAME]
        try:
            for p in passes:
                p.apply(ctx, op)
        except BaseException:
            op.attributes[SCHEDULE_ATTR_NAME] = script
            raise

    def _refusal(self, e: Exception) -> Exception:
        """The failing pass's `[rule] message`, saying which step of which schedule it was."""
        msg = str(e)
        rule = getattr(e, "rule", None)
        step = getattr(e, "step", None)
        if step and msg.startswith(step + ": "):
            msg = msg[len(step) + 2 :]
        if rule and msg.startswith(f"[{rule}] "):
            msg = msg[len(rule) + 3 :]
        where = f" ({step}, in schedule '{self.schedule}')" if step else ""
        op = getattr(e, "op", None)
        return Refusal(
            f"[{rule or RULE + '-unknown'}]{where} {msg}", op if isinstance(op, Operation) else None
        )
