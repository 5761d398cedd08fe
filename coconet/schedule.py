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
`apply_schedule`, and the `coco-schedule{name=...}` pass (passes/schedule.py). The autotuner's
space: `enumerate_schedules`.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, overload

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import BlockArgument, Operation, OpResult, SSAValue
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException

from coconet.core.gc_pause import without_gc
from coconet.core.program import CocoError, Program, make_context
from coconet.dialects import coco, comm
from coconet.dialects.coco import ReplicatedAttr, SlicedAttr, TensorType

__all__ = [
    "NAMED_SCHEDULES",
    "Handle",
    "Reordered",
    "Schedule",
    "ScheduleError",
    "ScheduleOffers",
    "apply_pipeline",
    "apply_schedule",
    "enumerate_scheduled_programs",
    "enumerate_schedules",
    "named_schedules",
    "resolve_schedule_name",
    "schedule",
    "why_not_offered",
]

# A dynamic (`?`) process-grid axis is sized at launch: a split then slices the lowest tensor
# dim that divides by this many ranks (a node of 8 GPUs), so the schedule runs on 1, 2, 4 and 8
# ranks; failing that, the dim with the largest power-of-two factor.
PREFERRED_GROUP = 8


VERIFY_RULE = "schedule-verify"  # a pass left IR that does not verify: a pass bug


class ScheduleError(CocoError):
    """An illegal schedule request. `rule` is the refusing pass's rule (`split-allreduce-op`,
    `reorder-local`, ...; `schedule-*` for the API's own checks), `step` the pass spec that was
    refused (None for the API's own checks)."""

    def __init__(self, message: str, rule: str | None = None, step: str | None = None):
        super().__init__(message)
        self.rule = rule
        self.step = step


_RULE = re.compile(r"^\[([A-Za-z0-9_.-]+)\]")


def _error(rule: str, message: str) -> ScheduleError:
    return ScheduleError(f"[{rule}] {message}", rule)


# --------------------------------------------------------------------------------------------
# Pass pipelines as text
# --------------------------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    text = str(v)
    if _IDENT.fullmatch(text) and text not in ("true", "false"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def format_pass(p: ModulePass) -> str:
    """`p` as coco-opt pipeline text, options at their defaults left out: names print bare
    where xDSL's pipeline lexer reads them back as identifiers, quoted otherwise."""
    spec = p.spec()
    if not spec.parameters:
        return spec.name
    opts = []
    for key, values in spec.parameters.items():
        if not values:
            opts.append(key)
        else:
            opts.append(f"{key}=" + ",".join(_format_value(v) for v in values))
    return f"{spec.name}{{{' '.join(opts)}}}"


def format_pipeline(passes: Iterable[ModulePass]) -> str:
    return ",".join(format_pass(p) for p in passes)


def parse_pipeline(text: str) -> list[ModulePass]:
    """The passes of a coco-opt pipeline string (coconet's passes and xDSL's)."""
    from xdsl.transforms import get_all_passes as xdsl_passes

    from coconet.passes import get_all_passes

    available = dict(xdsl_passes()) | dict(get_all_passes())
    try:
        return list(PassPipeline.parse_spec(available, text).passes)
    except (ValueError, DiagnosticException, ArgSpecParseError) as e:
        # ArgSpecParseError is a BaseException in xDSL 0.74
        hint = ""
        if "coco-schedule" in text and "(" in text:
            hint = ' (quote a schedule name with parentheses: name="fuse(rs-c-ag)")'
        raise _error(
            "schedule-pipeline", f"cannot parse the pipeline '{text}'{hint}: {e}"
        ) from None


def _pass(name: str, **options: Any) -> ModulePass:
    from coconet.passes import get_all_passes

    cls = get_all_passes()[name]()
    return cls(**{k: v for k, v in options.items() if v is not None})


# --------------------------------------------------------------------------------------------
# Running passes on one function
# --------------------------------------------------------------------------------------------

_CTX: Context | None = None


def _context() -> Context:
    global _CTX
    if _CTX is None:
        _CTX = make_context()
    return _CTX


def _run_on_function(program: Program, p: ModulePass) -> None:
    """Apply `p` to `program.func` alone (targeted passes find values by name module-wide, so
    a module's other functions are set aside meanwhile)."""
    module, fn = program.module, program.func
    if all(op is fn for op in module.ops):
        p.apply(_context(), module)
        return
    block = module.body.block
    after = fn.next_op
    fn.detach()
    alone = ModuleOp([fn])
    try:
        p.apply(_context(), alone)
    finally:
        fn.detach()
        if after is not None:
            block.insert_op_before(fn, after)
        else:
            block.add_op(fn)


def _as_program(program: Any) -> Program:
    if isinstance(program, Program):
        return program
    if isinstance(program, ModuleOp):
        return Program(program)
    if isinstance(program, str | Path):
        from coconet.core.program import load

        return load(program)
    inner = getattr(program, "program", None)
    if isinstance(inner, Program):
        return inner
    raise CocoError(f"cannot schedule a {type(program).__name__}: expected a coconet Program")


# --------------------------------------------------------------------------------------------
# Handles
# --------------------------------------------------------------------------------------------


def _top_level_named(fn: func.FuncOp, name: str) -> SSAValue | None:
    return _values_named(fn, (name,)).get(name)


def _values_named(fn: func.FuncOp, names: Iterable[str]) -> dict[str, SSAValue]:
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


def _auto_dim(v: SSAValue | None) -> int:
    if v is None or not isinstance(v.owner, comm.AllReduceOp):
        return 0  # the pass refuses with its own rule
    return auto_split_dim(v.owner)


@dataclass(frozen=True, eq=False)
class Handle:
    """A name-based reference to a value (or the op producing it) of a Schedule's program.

    It stays valid across later steps as long as some op still produces a value of that name
    (a value moved into a fused region is found inside it). `str(handle)` is `%name`. A region
    with no results has no name: such a handle holds the op itself and cannot be targeted."""

    schedule: Schedule = field(repr=False)
    name: str | None
    kind: str  # the producing op's name (`comm.reduce_scatter`, ...) or `argument`
    _op: Operation | None = field(default=None, repr=False)

    @property
    def value(self) -> SSAValue | None:
        if self.name is None:
            return None
        return _top_level_named(self.schedule.program.func, self.name)

    @property
    def op(self) -> Operation | None:
        """The op producing the value now (None for an argument)."""
        if self.name is None:
            return self._op if self._op is not None and self._op.parent is not None else None
        v = self.value
        return v.owner if isinstance(v, OpResult) else None

    @property
    def type(self) -> Any:
        v = self.value
        return None if v is None else v.type

    def __str__(self) -> str:
        return f"%{self.name}" if self.name else f"<unnamed {self.kind}>"


class Reordered:
    """What `Schedule.reorder` returns: unpacks as CoCoNet's `(newComps, newAGs)`: the moved
    computations (their sliced values) and the all_gathers re-inserted for values that leave
    the moved set; `slices` holds the slices of replicated operands it made."""

    def __init__(self, computations: list[Handle], gathers: list[Handle], slices: list[Handle]):
        self.computations = computations
        self.gathers = gathers
        self.slices = slices

    def __iter__(self) -> Iterator[list[Handle]]:
        return iter((self.computations, self.gathers))

    def __repr__(self) -> str:
        show = lambda hs: "[" + ", ".join(map(str, hs)) + "]"  # noqa: E731
        return (
            f"Reordered(computations={show(self.computations)}, gathers={show(self.gathers)}, "
            f"slices={show(self.slices)})"
        )


Target = str | Handle | SSAValue | Operation


def _target_name(t: Target, method: str) -> str:
    if isinstance(t, Handle):
        if t.name is None:
            raise _error(
                "schedule-target",
                f"{method}: {t} has no SSA name, so no pass can target it; target a named op "
                "it holds, or call without targets (greedy mode)",
            )
        return t.name
    if isinstance(t, str):
        name = t[1:] if t.startswith("%") else t
        if not name:
            raise _error("schedule-target", f"{method}: empty target name")
        return name
    if isinstance(t, SSAValue):
        if not t.name_hint:
            raise _error(
                "schedule-target",
                f"{method}: the value has no SSA name; name it in the program (passes find "
                "ops by name) or call without targets (greedy mode)",
            )
        return t.name_hint
    if isinstance(t, Operation):
        named = [r.name_hint for r in t.results if r.name_hint]
        if not named:
            raise _error("schedule-target", f"{method}: {t.name} has no named result to target")
        return named[0]
    raise _error("schedule-target", f"{method}: cannot target a {type(t).__name__}")


def _flatten(targets: Iterable[Any]) -> list[Target]:
    out: list[Target] = []
    for t in targets:
        if isinstance(t, list | tuple | set | frozenset | Reordered):
            out.extend(_flatten(t))
        elif t is not None:
            out.append(t)
    return out


# --------------------------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------------------------


class Schedule:
    """A schedule of one program (its first function, or `entry`): see the module docstring."""

    def __init__(self, program: Any, entry: str | None = None):
        p = _as_program(program)
        if entry is not None and entry != p.name:
            p = Program(p.module, entry)
        self._start(p.clone())

    def _start(self, program: Program) -> None:
        self._program = program
        name_schedule_targets(self._program.func)
        self._steps: list[ModulePass] = []
        self._new_values: list[SSAValue] = []
        # clones taken to undo a refused step: _run takes one per pass unless an enclosing
        # _all_or_nothing holds one, or the schedule is disposable (its maker drops it on
        # any refusal, so nothing needs undoing)
        self._checkpoints = 0
        self._disposable = False
        # a disposable schedule's steps not verified yet (_verify_deferred)
        self._unverified: list[str] = []

    @classmethod
    def _working_on(cls, program: Program, disposable: bool) -> Schedule:
        """A schedule working on `program` itself, not a clone (a deep program's clone takes
        a tenth of a second): for a caller that made `program` for this and uses only the
        result. `disposable`: the caller drops the schedule when a step is refused, so steps
        keep no undo clones (except inside `_attempt`) and are verified together at the end
        (`_verify_deferred`, which the caller calls)."""
        s = object.__new__(cls)
        s._start(program)
        s._disposable = disposable
        return s

    @contextlib.contextmanager
    def _attempt(self) -> Iterator[None]:
        """A step its caller goes on without when refused: undone then, even in a disposable
        schedule."""
        disposable, self._disposable = self._disposable, False
        try:
            yield
        finally:
            self._disposable = disposable

    # -- state -------------------------------------------------------------------------

    @property
    def program(self) -> Program:
        """The scheduled program (a clone of the one given)."""
        return self._program

    @property
    def steps(self) -> list[str]:
        """The pass specs applied so far, in order."""
        return [format_pass(p) for p in self._steps]

    @property
    def pipeline(self) -> str:
        """The coco-opt pipeline reproducing this schedule (`""` for no steps)."""
        return format_pipeline(self._steps)

    def ir(self, generic: bool = False) -> str:
        """The scheduled module as text."""
        return self._program.print(generic=generic)

    def copy(self) -> Schedule:
        """An independent schedule with the same steps so far (for exploring alternatives)."""
        other = object.__new__(Schedule)
        other._program = self._program.clone()
        other._steps = list(self._steps)
        other._new_values = []
        other._checkpoints = 0
        other._disposable = False
        other._unverified = []
        return other

    def __repr__(self) -> str:
        return f"Schedule(@{self._program.name}, pipeline={self.pipeline!r})"

    # -- applying passes -----------------------------------------------------------------

    def _snapshot(self) -> tuple[set[int], list[Any]]:
        keep: list[Any] = list(self._program.func.walk())
        for op in list(keep):
            keep.extend(op.results)
        keep.extend(self._program.func.body.block.args)
        return {id(x) for x in keep}, keep

    @without_gc
    def _run(self, p: ModulePass) -> list[Operation]:
        """Apply `p`, verify, record it; returns the ops it created (program order). On a
        refusal the program is left as it was and ScheduleError carries the rule."""
        spec = format_pass(p)
        seen, keep = self._snapshot()
        backup = self._program.clone() if not (self._checkpoints or self._disposable) else None
        try:
            _run_on_function(self._program, p)
        except DiagnosticException as e:
            self._restore(backup)
            msg = str(e).strip()
            m = _RULE.match(msg)
            raise ScheduleError(f"{spec}: {msg}", m.group(1) if m else None, spec) from None
        except CocoError as e:
            self._restore(backup)
            rule = getattr(e, "rule", None)
            raise ScheduleError(f"{spec}: {e}", rule, spec) from None
        except BaseException:
            self._restore(backup)  # a pass crashed: keep the schedule as it was, and say so
            raise
        if self._disposable:
            self._unverified.append(spec)
        else:
            try:
                self._program.verify()
            except CocoError as e:
                self._restore(backup)
                raise ScheduleError(
                    f"{spec}: the pass produced invalid IR (a pass bug): {e}", VERIFY_RULE, spec
                ) from None
        self._steps.append(p)
        new_ops = [op for op in self._program.func.walk() if id(op) not in seen]
        self._new_values = [
            r for op in self._program.func.walk() for r in op.results if id(r) not in seen
        ]
        del keep
        return new_ops

    def _verify_deferred(self) -> None:
        """Verify the steps a disposable schedule ran unverified: once, after its last step
        (a whole-program verification of a deep program costs as much as a pass)."""
        if not self._unverified:
            return
        steps, self._unverified = ",".join(self._unverified), []
        try:
            self._program.verify()
        except CocoError as e:
            raise ScheduleError(
                f"{steps}: the passes produced invalid IR (a bug in one of them): {e}",
                VERIFY_RULE,
                steps,
            ) from None

    def _restore(self, backup: Program | None) -> None:
        if backup is not None:
            self._program = backup

    def _handle(self, v: SSAValue) -> Handle:
        kind = v.op.name if isinstance(v, OpResult) else "argument"
        return Handle(self, v.name_hint, kind)

    def _op_handle(self, op: Operation) -> Handle:
        named = [r for r in op.results if r.name_hint]
        if named:
            return Handle(self, named[0].name_hint, op.name)
        return Handle(self, None, op.name, op)

    def handle(self, target: Target) -> Handle:
        """A handle to a named value of the program (checks that it exists)."""
        name = _target_name(target, "handle")
        v = _top_level_named(self._program.func, name)
        if v is None:
            raise _error("schedule-target", f"no value named %{name} in @{self._program.name}")
        return self._handle(v)

    def _names(self, targets: Sequence[Any], method: str) -> tuple[str, ...]:
        return tuple(_target_name(t, method) for t in _flatten(targets))

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

    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """Several passes as one step: if one is refused, none of them stays applied."""
        if self._disposable:
            yield
            return
        program, steps = self._program.clone(), list(self._steps)
        self._checkpoints += 1
        try:
            yield
        except BaseException:
            self._program, self._steps = program, steps
            raise
        finally:
            self._checkpoints -= 1

    # -- CoCoNet's transformations -------------------------------------------------------

    def split(self, *targets: Target, dim: int | str | None = None) -> Any:
        """`rs, ag = s.split(ar)`: all_reduce -> reduce_scatter + all_gather (the gather
        keeps the all_reduce's name; the reduce_scatter is `%<name>_rs`). Several targets
        give a list of pairs; none splits every all_reduce (greedy). `dim`: the tensor dim
        the reduce_scatter slices (default 0, the pass's default); `"auto"` picks per target
        the dim that divides on the group (see PREFERRED_GROUP)."""
        names = self._names(targets, "split")
        if dim == "auto":
            values = _values_named(self._program.func, names)
            dims = {n: _auto_dim(values.get(n)) for n in names}
            groups: dict[int, list[str]] = {}
            for n in names:
                groups.setdefault(dims[n], []).append(n)
            if not names:
                block = self._program.func.body.block
                ars = [o for o in block.ops if isinstance(o, comm.AllReduceOp)]
                groups = {auto_split_dim(ars[0]) if ars else 0: []}
            new: list[Operation] = []
            with self._all_or_nothing():
                for d, ns in groups.items():
                    new = [o for o in new if o.parent is not None] + self._run(
                        _pass("coco-split-allreduce", ops=tuple(ns), dim=d or None)
                    )
        else:
            if dim is not None and not isinstance(dim, int):
                raise _error("schedule-option", f"split: dim must be an int or 'auto', got {dim!r}")
            new = self._run(_pass("coco-split-allreduce", ops=names, dim=dim or None))
        pairs = [
            (self._handle(op.input), self._handle(op.result))
            for op in new
            if isinstance(op, comm.AllGatherOp) and isinstance(op.input.owner, comm.ReduceScatterOp)
        ]
        return pairs[0] if len(names) == 1 and len(pairs) == 1 else pairs

    def reorder(self, computations: Any = None, ag: Target | None = None) -> Reordered:
        """CoCoNet's `reorder(comps, ag)`: move elementwise computation consuming the
        all_gather `ag` before it, onto slices. `s.reorder(ag)` moves the maximal legal set;
        `s.reorder([c1, c2], ag)` (or without `ag`) exactly the named computations; with no
        arguments, every all_gather (greedy). Returns `Reordered` (`comps, ags = ...`)."""
        if (
            ag is None
            and computations is not None
            and not isinstance(computations, list | tuple | set | frozenset)
        ):
            computations, ag = None, computations
        names = self._names([computations, ag], "reorder")
        self._run(_pass("coco-reorder", ops=names))
        comps: list[Handle] = []
        gathers: list[Handle] = []
        slices: list[Handle] = []
        # moved ops keep their op but get a new (sliced) result value; moved reductions
        # become new ops (partial reduction, all_reduce, ...)
        for v in self._new_values:
            op = v.owner
            if isinstance(op, comm.AllGatherOp):
                gathers.append(self._handle(v))
            elif isinstance(op, coco.SliceOp):
                slices.append(self._handle(v))
            elif v.name_hint and not isinstance(op, comm.CollectiveOp):
                comps.append(self._handle(v))
        return Reordered(comps, gathers, slices)

    def as_slice(self, *args: Target) -> list[Handle]:
        """CoCoNet's `asSlice(tensors)`: keep replicated arguments (optimizer state) sliced.
        Returns handles to the (now sliced) arguments; none given: every legal updated
        argument (greedy)."""
        names = self._names(args, "as_slice")
        self._run(_pass("coco-as-slice", ops=names))
        fn = self._program.func
        if names:
            return [self.handle(n) for n in names]
        return [
            self._handle(a) for a in fn.body.block.args if a.name_hint and _sliced_somewhere(a.type)
        ]

    def fuse(self, *targets: Target, mode: str = "auto") -> Any:
        """CoCoNet's `fuse`: `mode="elementwise"` fuses the named elementwise ops into one
        kernel; `mode="all_reduce"` fuses a reduce_scatter's chain (name the reduce_scatter,
        or the exact set) into one FusedAllReduce; `mode="send"` fuses computation into a
        send; `auto` picks by the targets. No targets: greedy. Returns the new region's
        handle (a list when several regions were made)."""
        names = self._names(targets, "fuse")
        new = self._run(_pass("coco-fuse", ops=names, mode=None if mode == "auto" else mode))
        regions = [self._op_handle(op) for op in new if isinstance(op, comm.FusedOp)]
        return regions[0] if len(regions) == 1 else regions

    def overlap(
        self,
        producer: Target | None = None,
        consumer: Target | None = None,
        chunks: int = 4,
        send: bool = False,
    ) -> Any:
        """CoCoNet's `overlap(mm, fusedAR)`: pipeline a matmul with the collective (or fused
        collective) consuming it, in `chunks` pieces. Name the matmul, the consumer, or both
        (then the consumer must be the one reading the matmul). Neither: greedy. `send=True`:
        the pipeline-boundary form, CoCoNet's overlap of reduce_scatter, send and all_gather:
        the matmul's reduce_scatter, the fused send of its slice and the next stage's
        all_gather, chunk by chunk. Returns the overlap region's handle."""
        names: tuple[str, ...]
        if producer is not None:
            names = (_target_name(producer, "overlap"),)
            if consumer is not None:
                self._check_consumer(names[0], consumer)
        elif consumer is not None:
            names = (_target_name(consumer, "overlap"),)
        else:
            names = ()
        new = self._run(
            _pass(
                "coco-overlap",
                ops=names,
                chunks=None if chunks == 4 else chunks,
                send=True if send else None,
            )
        )
        regions = [self._op_handle(op) for op in new if isinstance(op, comm.OverlapOp)]
        return regions[0] if len(regions) == 1 else regions

    def _check_consumer(self, producer: str, consumer: Target) -> None:
        mm = _top_level_named(self._program.func, producer)
        if isinstance(consumer, Handle) and consumer.name is None:
            want = consumer.op
        else:
            cv = _top_level_named(self._program.func, _target_name(consumer, "overlap"))
            want = cv.owner if isinstance(cv, OpResult) else None
        if mm is None or want is None:
            return  # the pass reports missing names
        block = self._program.func.body.block
        users = {block.find_ancestor_op_in_block(u.operation) for u in mm.uses}
        if users != {want}:
            raise _error(
                "overlap-consumer",
                f"overlap: %{producer} is not read (only) by {consumer}: the consumer to overlap "
                "must be the collective reading the matmul",
            )

    def sliced_send(self, *sends: Target) -> Any:
        """CoCoNet's reorder of an AllGather with a Send: each rank sends only its slice and
        the receiving stage all_gathers. Returns `(send, gather)` handles (a list of pairs for
        several sends); none named: every legal send (greedy)."""
        names = self._names(sends, "sliced_send")
        new = self._run(_pass("coco-sliced-send", ops=names))
        pairs = [
            (self._handle(op.input), self._handle(op.result))
            for op in new
            if isinstance(op, comm.AllGatherOp) and isinstance(op.input.owner, comm.SendOp)
        ]
        return pairs[0] if len(names) == 1 and len(pairs) == 1 else pairs

    def dce(self, *ops: Target) -> None:
        """Dead-code elimination: the named (dead) ops, or every dead op."""
        self._run(_pass("coco-dce", ops=self._names(ops, "dce")))

    def canonicalize(self, *ops: Target) -> None:
        """Fold slice/all_gather round trips: the named ops, or all of them."""
        self._run(_pass("coco-canonicalize", ops=self._names(ops, "canonicalize")))

    def named(self, name: str) -> Schedule:
        """Apply the named schedule `name` (see NAMED_SCHEDULES) on top of this one."""
        canonical = resolve_schedule_name(name)
        info = _Structure(self._program)
        if not NAMED_SCHEDULES[canonical].applies(info):
            raise _error(
                "schedule-unknown",
                f"the schedule '{canonical}' does not fit @{self._program.name}'s structure "
                f"({NAMED_SCHEDULES[canonical].requires})",
            )
        NAMED_SCHEDULES[canonical].recipe(self, info)
        return self


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


def schedule(program: Any, entry: str | None = None) -> Schedule:
    """`s = schedule(program)`: a Schedule of (a clone of) `program`."""
    return Schedule(program, entry)


def _sliced_somewhere(t: Any) -> bool:
    return isinstance(t, TensorType) and any(isinstance(lay, SlicedAttr) for lay in t.layouts.data)


# --------------------------------------------------------------------------------------------
# Structure of a program (what named schedules and the enumeration look at)
# --------------------------------------------------------------------------------------------


def _v2(n: int) -> int:
    return (n & -n).bit_length() - 1 if n > 0 else 0


def auto_split_dim(ar: comm.AllReduceOp) -> int:
    """The tensor dim a split of `ar` slices, among the dims no grid axis slices yet (on a
    multi-axis grid, a dim another axis cuts is taken; failing such a dim, any dim the split
    accepts): on a static group, the lowest dim that divides by it; on a group sized at
    launch, the lowest dim divisible by PREFERRED_GROUP, else the dim with the largest
    power-of-two factor (lowest first). A dim that does not divide is cut unevenly."""
    from coconet.dialects.layout_rules import grid_of
    from coconet.passes.split_allreduce import split_refusal

    t: TensorType = ar.input.type
    shape = t.get_shape()
    if not shape:
        return 0
    dims = [d for d in range(len(shape)) if not t.slicing_axes(d)]
    if not dims:
        dims = [d for d in range(len(shape)) if split_refusal(ar, d) is None] or [0]
    grid = grid_of(ar)
    sizes = [grid.shape[a] for a in ar.span()]
    if all(s > 0 for s in sizes):
        group = 1
        for s in sizes:
            group *= s
        for d in dims:
            if shape[d] > 0 and shape[d] % group == 0:
                return d
        return dims[0]
    for d in dims:
        if shape[d] > 0 and shape[d] % PREFERRED_GROUP == 0:
            return d
    return max(dims, key=lambda d: (_v2(shape[d]), -d))


class _Structure:
    """The shape of a program that decides which schedules fit it."""

    def __init__(self, program: Program):
        fn = program.func
        block = fn.body.block
        ops = list(block.ops)
        self.all_reduces = [
            op
            for op in ops
            if isinstance(op, comm.AllReduceOp)
            and isinstance(op.input.type, TensorType)
            and op.input.type.rank > 0
        ]
        # matmuls whose only reader is an all_reduce (Megatron's row-parallel layer)
        self.matmuls = []
        for op in ops:
            if isinstance(op, coco.MatmulOp):
                users = {u.operation for u in op.result.uses}
                if len(users) == 1 and next(iter(users)) in self.all_reduces:
                    self.matmuls.append(op)
        # async tensor parallelism (sequence parallelism): matmuls reading an all_gather that
        # nothing else reads (column-parallel GEMM), matmuls whose only reader is a
        # reduce_scatter (row-parallel GEMM)
        self.gathered_matmuls = []
        self.scattered_matmuls = []
        for op in ops:
            if not isinstance(op, coco.MatmulOp):
                continue
            g = op.lhs.owner
            if isinstance(g, comm.AllGatherOp) and {u.operation for u in g.result.uses} == {op}:
                self.gathered_matmuls.append(op)
            users = {u.operation for u in op.result.uses}
            if len(users) == 1 and isinstance(next(iter(users)), comm.ReduceScatterOp):
                self.scattered_matmuls.append(op)
        # sends of a value computed (elementwise) from an all_reduce
        derived: set[SSAValue] = {ar.result for ar in self.all_reduces}
        self.sends = []
        for op in ops:
            if isinstance(op, comm.SendOp):
                if op.input in derived:
                    self.sends.append(op)
            elif isinstance(op, coco.ElementwiseOp) and any(v in derived for v in op.operands):
                derived.update(op.results)
        # optimizer state: replicated arguments whose new value (the one their update stores)
        # the program also reads (m, v of Adam feed the weight update; the weights do not)
        self.state: list[BlockArgument] = []
        for a in block.args:
            t = a.type
            if not isinstance(t, TensorType) or t.rank == 0:
                continue
            if not all(isinstance(lay, ReplicatedAttr) for lay in t.layouts.data):
                continue
            for use in a.uses:
                up = use.operation
                if isinstance(up, coco.UpdateOp) and use.index == 0:
                    if any(u.operation is not up for u in up.value.uses):
                        self.state.append(a)
                        break

    @staticmethod
    def names(ops: Iterable[Any]) -> tuple[str, ...] | None:
        """The ops' (or values') names, each once, in order; None if one is unnamed (then use
        greedy mode). Ops may share a name (`%gsum_1` reads back as `gsum`): a targeted pass
        acts on all of them at once."""
        out: list[str] = []
        for op in ops:
            v = op if isinstance(op, SSAValue) else op.results[0]
            if not v.name_hint:
                return None
            if v.name_hint not in out:
                out.append(v.name_hint)
        return tuple(out)

    @staticmethod
    def unique_names(ops: Iterable[Any]) -> list[str]:
        """The names of the named ones of `ops` (or values), each once, in order."""
        out: list[str] = []
        for op in ops:
            v = op if isinstance(op, SSAValue) else op.results[0]
            if v.name_hint and v.name_hint not in out:
                out.append(v.name_hint)
        return out


# --------------------------------------------------------------------------------------------
# Named schedules (CoCoNet's variants)
# --------------------------------------------------------------------------------------------


def _split_reorder(s: Schedule, info: _Structure) -> None:
    names = info.names(info.all_reduces)
    if names is None:
        s.split(dim="auto")
        s.reorder()
        return
    # One split per dim (not one per all_reduce: each schedule step verifies the program).
    s.split(*names, dim="auto")
    # One reorder of every gather: reordering one gather can carry its slices through the
    # next all_reduce's consumers (a residual stack's `x + 1 = dropout(...) + x`), taking that
    # gather with it; a reorder per name would then find it gone.
    s.reorder(list(names))


def _slice_state(s: Schedule, info: _Structure) -> None:
    """as-slice the optimizer state where it can be sliced (all together if legal, else each
    one that is)."""
    names = info.names(info.state)
    if not names:
        return
    try:
        with s._attempt():
            s.as_slice(*names)
        return
    except ScheduleError as e:
        if e.rule == VERIFY_RULE:
            raise
    for n in names:
        try:
            with s._attempt():
                s.as_slice(n)
        except ScheduleError as e:
            if e.rule == VERIFY_RULE:
                raise


def _rs_names(s: Schedule) -> tuple[str, ...] | None:
    rss = [op for op in s.program.func.body.block.ops if isinstance(op, comm.ReduceScatterOp)]
    return _Structure.names(rss)


def _fuse_all_reduce(s: Schedule) -> None:
    names = _rs_names(s)
    s.fuse(*(names or ()), mode="all_reduce")


def _overlap(s: Schedule, info: _Structure, chunks: int = 4) -> None:
    names = info.names(info.matmuls)
    if names is None:
        s.overlap(chunks=chunks)
        return
    _overlap_named(s, names, chunks)


def _overlap_named(s: Schedule, names: tuple[str, ...], chunks: int) -> None:
    """Overlap each named matmul with the collective consuming it: one coco-overlap step
    naming them all. That is what a step per matmul does (the pass checks every pair, and that
    the pairs form no cycle together, before it rewrites them one by one in program order),
    without a step's walks of the whole program per matmul (its snapshot, the search for the
    name): a deep stack's ol(...) schedules were quadratic in the layers. A step per matmul
    where the matmuls no longer stand in the order named, which the pass would not keep."""
    wanted = set(names)
    current = [
        r.name_hint
        for op in s.program.func.body.block.ops
        for r in op.results[:1]
        if r.name_hint in wanted
    ]
    if list(dict.fromkeys(current)) != list(names):
        for n in names:
            s.overlap(n, chunks=chunks)
        return
    s._run(_pass("coco-overlap", ops=names, chunks=None if chunks == 4 else chunks))


def _sliced_send(s: Schedule, info: _Structure) -> None:
    names = info.names(info.sends)
    s.sliced_send(*(names or ()))


def _sent_slices(s: Schedule) -> tuple[str, ...] | None:
    sends = [op for op in s.program.func.body.block.ops if isinstance(op, comm.SendOp)]
    return _Structure.names(sends)


def recipe_ar_c(s: Schedule, info: _Structure) -> None:
    s.fuse(mode="elementwise")


def recipe_rs_c_ag(s: Schedule, info: _Structure) -> None:
    _split_reorder(s, info)
    _slice_state(s, info)
    s.fuse(mode="elementwise")


def recipe_fuse_rs_c_ag(s: Schedule, info: _Structure) -> None:
    _split_reorder(s, info)
    _slice_state(s, info)
    _fuse_all_reduce(s)


def recipe_ol_mm_fuse_rs_c_ag(s: Schedule, info: _Structure) -> None:
    recipe_fuse_rs_c_ag(s, info)
    _overlap(s, info)


def _overlap_each(s: Schedule, matmuls: list, chunks: int = 4) -> None:
    names = _Structure.names(matmuls)
    if names is None:
        raise _error("schedule-target", "overlap: the matmuls to overlap have no SSA names")
    _overlap_named(s, names, chunks)


def recipe_ol_ag_mm(s: Schedule, info: _Structure) -> None:
    _overlap_each(s, info.gathered_matmuls)


def recipe_ol_mm_rs(s: Schedule, info: _Structure) -> None:
    _overlap_each(s, info.scattered_matmuls)


def recipe_ol_ag_mm_ol_mm_rs(s: Schedule, info: _Structure) -> None:
    recipe_ol_ag_mm(s, info)
    recipe_ol_mm_rs(s, info)


def recipe_sliced_send(s: Schedule, info: _Structure) -> None:
    _split_reorder(s, info)
    _slice_state(s, info)
    _sliced_send(s, info)
    s.fuse(mode="elementwise")


def recipe_fuse_sliced_send(s: Schedule, info: _Structure) -> None:
    _split_reorder(s, info)
    _slice_state(s, info)
    _sliced_send(s, info)
    s.fuse(*(_sent_slices(s) or ()), mode="send")


def recipe_ol_rs_fuse_sliced_send(s: Schedule, info: _Structure) -> None:
    recipe_fuse_sliced_send(s, info)
    _overlap(s, info)


def recipe_ol_rs_send_ag(s: Schedule, info: _Structure) -> None:
    recipe_fuse_sliced_send(s, info)
    names = info.names(info.matmuls)
    for n in names or (None,):
        s.overlap(n, send=True)


@dataclass(frozen=True)
class NamedSchedule:
    name: str
    coconet: str  # CoCoNet's name for the variant
    description: str
    requires: str  # the structure it needs, in words
    applies: Callable[[_Structure], bool]
    recipe: Callable[[Schedule, _Structure], None]
    aliases: tuple[str, ...] = ()


NAMED_SCHEDULES: dict[str, NamedSchedule] = {
    s.name: s
    for s in [
        NamedSchedule(
            "ar-c",
            "AR_C / MM_AR_C / AR_P2P_C",
            "the all_reduce as written, the computation after it fused into one kernel",
            "an all_reduce",
            lambda i: bool(i.all_reduces),
            recipe_ar_c,
            ("mm-ar-c", "ar-p2p-c"),
        ),
        NamedSchedule(
            "rs-c-ag",
            "RS_C_AG / MM_RS_C_AG",
            "split the all_reduce, reorder the computation onto slices, as-slice the optimizer "
            "state, fuse the sliced computation into one kernel",
            "an all_reduce",
            lambda i: bool(i.all_reduces),
            recipe_rs_c_ag,
            ("mm-rs-c-ag",),
        ),
        NamedSchedule(
            "fuse(rs-c-ag)",
            "fuse_RS_C_AG",
            "rs-c-ag with reduce_scatter + sliced computation + all_gather as one FusedAllReduce",
            "an all_reduce",
            lambda i: bool(i.all_reduces),
            recipe_fuse_rs_c_ag,
            ("mm-fuse-rs-c-ag",),
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
    (`fuse_RS_C_AG`, `MM_AR_C`, `ol_MM_fuse_RS_C_AG`, `RS_P2P_C_AG`, `ol_RS_fuse_P2P_C_AG`)."""
    canonical = _ALIASES.get(_alias_key(name))
    if canonical is None:
        raise _error(
            "schedule-unknown",
            f"no schedule named '{name}'; named schedules: " + ", ".join(NAMED_SCHEDULES),
        )
    return canonical


def _structure_refusal(p: Program, info: _Structure, name: str) -> ScheduleError | None:
    """Why the named schedule `name` does not fit `p`'s structure (None if it does)."""
    ns = NAMED_SCHEDULES[name]
    if ns.applies(info):
        return None
    fits = [n for n, x in NAMED_SCHEDULES.items() if x.applies(info)]
    return _error(
        "schedule-unknown",
        f"the schedule '{name}' needs {ns.requires}, which @{p.name} lacks; schedules "
        f"that fit it: {', '.join(fits) or 'none'}",
    )


def _try_named(program: Program, info: _Structure, name: str) -> Schedule | ScheduleError:
    """The named schedule `name` applied to a clone of `program`, or the refusal of the
    step that stopped it (a pass bug -- IR that does not verify -- is raised)."""
    s = Schedule._working_on(program.clone(), disposable=True)
    try:
        NAMED_SCHEDULES[name].recipe(s, info)
        s._verify_deferred()
    except ScheduleError as e:
        if e.rule == VERIFY_RULE:
            raise  # a pass bug, not a schedule that does not fit
        return e
    return s


class ScheduleOffers(NamedTuple):
    """`named_schedules(program, explain=True)`: the named schedules offered for a program
    (name -> coco-opt pipeline) and those dropped (name -> why: the structure the schedule
    needs and the program lacks, or the refused step with its `[rule] message`)."""

    offered: dict[str, str]
    dropped: dict[str, str]


@overload
def named_schedules(program: Any, *, explain: Literal[False] = False) -> dict[str, str]: ...


@overload
def named_schedules(program: Any, *, explain: Literal[True]) -> ScheduleOffers: ...


def named_schedules(program: Any, *, explain: bool = False) -> dict[str, str] | ScheduleOffers:
    """The named schedules that fit `program` (by its structure: an all_reduce; a matmul
    feeding one; a send of a value computed from one), each with its coco-opt pipeline, in a
    fixed order. A schedule is listed only if its passes all apply. `explain=True`: a
    ScheduleOffers, which also holds every schedule dropped, with the reason (nothing is
    dropped silently)."""
    p = _as_program(program)
    info = _Structure(p)
    out: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for name in NAMED_SCHEDULES:
        refusal = _structure_refusal(p, info, name)
        if refusal is None:
            s = _try_named(p, info, name)
            if isinstance(s, Schedule):
                out[name] = s.pipeline
                continue
            refusal = s
        dropped[name] = str(refusal)
    return ScheduleOffers(out, dropped) if explain else out


def why_not_offered(program: Any, name: str) -> str | None:
    """Why `named_schedules(program)` does not offer the named schedule `name` (any accepted
    spelling): its refusal's `[rule] message`; None if it is offered."""
    p = _as_program(program)
    canonical = resolve_schedule_name(name)
    info = _Structure(p)
    refusal = _structure_refusal(p, info, canonical)
    if refusal is None:
        s = _try_named(p, info, canonical)
        if isinstance(s, Schedule):
            return None
        refusal = s
    return str(refusal)


@without_gc  # as every compiler phase (core/gc_pause.py): 0.1-0.3 s of a 2,400-op schedule
def apply_schedule(program: Any, name: str, *, in_place: bool = False) -> Program:
    """`program` (cloned) scheduled by the named schedule `name` (any accepted spelling).
    `in_place`: schedule `program` itself, a Program its caller made for this and uses only
    through the result (it may be left half-scheduled when a step is refused)."""
    p = _as_program(program)
    canonical = resolve_schedule_name(name)
    info = _Structure(p)
    ns = NAMED_SCHEDULES[canonical]
    refusal = _structure_refusal(p, info, canonical)
    if refusal is not None:
        raise refusal
    # private: dropped on a refusal (recipes undo what they try and go on without: _attempt)
    s = Schedule._working_on(p if in_place else p.clone(), disposable=True)
    ns.recipe(s, info)
    s._verify_deferred()
    return s.program


@without_gc
def apply_pipeline(program: Any, pipeline: str, *, in_place: bool = False) -> Program:
    """`program` (cloned; `in_place` as for apply_schedule) with the coco-opt `pipeline`
    applied to its function."""
    p = _as_program(program)
    # a refused pass ends the pipeline and its schedule: nothing to undo
    s = Schedule._working_on(p if in_place else p.clone(), disposable=True)
    s.apply(pipeline)
    s._verify_deferred()
    return s.program


# --------------------------------------------------------------------------------------------
# Enumeration: the autotuner's space
# --------------------------------------------------------------------------------------------

FUSE_CHOICES: tuple[tuple[str, ...], ...] = (
    ("all_reduce",),
    ("send",),
    ("elementwise",),
    ("all_reduce", "elementwise"),
    ("send", "elementwise"),
    ("all_reduce", "send"),
    ("all_reduce", "send", "elementwise"),
)


@dataclass
class _Node:
    s: Schedule
    parts: list[str]
    ir: str


def _step(node: _Node, label: str, action: Callable[[Schedule], Any]) -> _Node | None:
    """`node` with one more step, or None if the step is refused or changes nothing."""
    s = node.s.copy()
    try:
        action(s)
    except ScheduleError as e:
        if e.rule == VERIFY_RULE:
            raise  # a pass bug, not an illegal schedule: do not hide it
        return None
    ir = s.ir()
    if ir == node.ir:
        return None
    return _Node(s, [*node.parts, label], ir)


def _reorder_each(names: Sequence[str]) -> Callable[[Schedule], None]:
    def run(s: Schedule) -> None:
        s.reorder(list(names))  # one pass: see _split_reorder

    return run


def enumerate_schedules(
    program: Any,
    *,
    chunks: Sequence[int] = (2, 4),
    split_dims: str = "all",
    limit: int | None = None,
    max_independent: int = 2,
    max_as_slice_subsets: int = 3,
) -> list[tuple[str, str]]:
    """Every legal schedule of `program` as `(name, pipeline)`: see
    `enumerate_scheduled_programs` (same options), which also returns the scheduled
    programs."""
    return [
        (n, pipe)
        for n, pipe, _ in enumerate_scheduled_programs(
            program,
            chunks=chunks,
            split_dims=split_dims,
            limit=limit,
            max_independent=max_independent,
            max_as_slice_subsets=max_as_slice_subsets,
        )
    ]


def enumerate_scheduled_programs(
    program: Any,
    *,
    chunks: Sequence[int] = (2, 4),
    split_dims: str = "all",
    limit: int | None = None,
    max_independent: int = 2,
    max_as_slice_subsets: int = 3,
) -> list[tuple[str, str, Program]]:
    """Every legal schedule of `program` in the autotuner's space, as `(name, pipeline,
    scheduled program)`.

    The space, step by step (each choice tried by applying the pass; refused or no-op choices
    are dropped):
    1. split: for each all_reduce (by SSA name: all_reduces sharing a name are one choice, as
       a targeted pass acts on all of them), no split or a split on each tensor dim
       (`split_dims="auto"`: only the dim `auto_split_dim` picks);
    2. reorder: for each split, no reorder or the maximal reorder across its all_gather;
    3. as-slice: every subset of the arguments that can be sliced (with more than
       `max_as_slice_subsets` candidates: none, the optimizer state (see named schedules), or
       all of them);
    4. sliced-send: for each send of an all_gather, the sliced send or not;
    5. fusion: none, or greedy `all_reduce`, `send` and `elementwise` fusion in each
       combination (in that order);
    6. overlap: for each matmul feeding a collective, none or an overlap with each of `chunks`
       (and, where a fused send exists, the pipeline-boundary form through the send and the
       next stage's all_gather, `overlap(mm,chunks=N,send)`).
    With more than `max_independent` all_reduce names, steps 1-2 choose for all of them at
    once (no split; split all on their auto dims; split and reorder all), as CoCoNet's
    autotuner does: the per-collective product would grow as 3^n.

    Names are the choices made, e.g. `split(g1,dim=0)+reorder(g1)+as-slice(m,v)+
    fuse(all_reduce)`; the unscheduled program is `as-written` (pipeline `""`). The order is
    deterministic (depth first, "no" before "yes", choices in program order), and schedules
    whose IR equals an earlier one's are left out (the simpler pipeline is kept). `limit`
    stops after that many schedules.

    A pass that leaves IR that does not verify is a pass bug, not an illegal schedule: its
    ScheduleError (rule `schedule-verify`) propagates instead of pruning the branch.
    """
    p = _as_program(program)
    root = Schedule(p)
    root_node = _Node(root, [], root.ir())
    out: list[tuple[str, str, Program]] = []
    seen: set[str] = set()

    class _Full(Exception):
        pass

    def emit(node: _Node) -> None:
        if node.ir in seen:
            return
        seen.add(node.ir)
        out.append(("+".join(node.parts) or "as-written", node.s.pipeline, node.s.program))
        if limit is not None and len(out) >= limit:
            raise _Full

    info = _Structure(root.program)  # the program with its schedule targets named
    ar_names = list(info.unique_names(info.all_reduces))
    state = list(info.unique_names(info.state))

    def split_dims_of(node: _Node, name: str) -> list[int]:
        v = _top_level_named(node.s.program.func, name)
        if v is None or not isinstance(v.owner, comm.AllReduceOp):
            return []
        if split_dims == "auto":
            return [auto_split_dim(v.owner)]
        return list(range(v.owner.input.type.rank))

    def splits(node: _Node, i: int, done: list[str]) -> Iterator[tuple[_Node, list[str]]]:
        if i == len(ar_names):
            yield node, done
            return
        name = ar_names[i]
        yield from splits(node, i + 1, done)
        for d in split_dims_of(node, name):
            nxt = _step(node, f"split({name},dim={d})", lambda s, n=name, d=d: s.split(n, dim=d))
            if nxt is not None:
                yield from splits(nxt, i + 1, [*done, name])

    def reorders(node: _Node, names: list[str], i: int) -> Iterator[_Node]:
        if i == len(names):
            yield node
            return
        yield from reorders(node, names, i + 1)
        nxt = _step(node, f"reorder({names[i]})", lambda s, n=names[i]: s.reorder(n))
        if nxt is not None:
            yield from reorders(nxt, names, i + 1)

    def joint(node: _Node) -> Iterator[_Node]:
        yield node
        split = _step(node, "split(all)", lambda s: s.split(*ar_names, dim="auto"))
        if split is None:
            return
        yield split
        both = _step(split, "reorder(all)", _reorder_each(ar_names))
        if both is not None:
            yield both

    def split_and_reorder() -> Iterator[_Node]:
        if len(ar_names) > max_independent:
            yield from joint(root_node)
            return
        for n1, split_names in splits(root_node, 0, []):
            yield from reorders(n1, split_names, 0)

    def as_slices(node: _Node) -> Iterator[_Node]:
        yield node
        fn = node.s.program.func
        cands = []
        for a in fn.body.block.args:
            if not a.name_hint or not isinstance(a.type, TensorType) or a.name_hint in cands:
                continue
            if any(isinstance(u.operation, coco.SliceOp) for u in a.uses):
                if _step(node, "", lambda s, n=a.name_hint: s.as_slice(n)) is not None:
                    cands.append(a.name_hint)
        if len(cands) <= max_as_slice_subsets:
            subsets = [
                c for k in range(1, len(cands) + 1) for c in itertools.combinations(cands, k)
            ]
        else:
            subsets = []
            legal_state = tuple(n for n in state if n in cands)
            if legal_state and len(legal_state) < len(cands):
                subsets.append(legal_state)
            subsets.append(tuple(cands))
        for subset in subsets:
            nxt = _step(node, f"as-slice({','.join(subset)})", lambda s, ns=subset: s.as_slice(*ns))
            if nxt is not None:
                yield nxt

    def sliced_sends(node: _Node) -> Iterator[_Node]:
        sends = _Structure.unique_names(
            op
            for op in node.s.program.func.body.block.ops
            if isinstance(op, comm.SendOp)
            and isinstance(op.input.owner, comm.AllGatherOp)
            and op.result.name_hint
        )

        def rec(n: _Node, i: int) -> Iterator[_Node]:
            if i == len(sends):
                yield n
                return
            yield from rec(n, i + 1)
            nxt = _step(n, f"sliced-send({sends[i]})", lambda s, x=sends[i]: s.sliced_send(x))
            if nxt is not None:
                yield from rec(nxt, i + 1)

        yield from rec(node, 0)

    def fusions(node: _Node) -> Iterator[_Node]:
        yield node
        for choice in FUSE_CHOICES:
            cur: _Node | None = node
            for kind in choice:
                assert cur is not None
                cur = _step(cur, f"fuse({kind})", lambda s, k=kind: s.fuse(mode=k))
                if cur is None:
                    break
            if cur is not None:
                yield cur

    def overlaps(node: _Node) -> Iterator[_Node]:
        block = node.s.program.func.body.block
        # matmuls next to a collective: feeding one, or reading an all_gather (the pass
        # refuses the pairs it cannot pipeline, and refused steps are dropped)
        feeding = []
        for op in block.ops:
            if isinstance(op, coco.MatmulOp) and op.result.name_hint:
                users = {block.find_ancestor_op_in_block(u.operation) for u in op.result.uses}
                if len(users) == 1:
                    (u,) = users
                    if isinstance(u, comm.CollectiveOp) or (
                        isinstance(u, comm.FusedOp) and u.kind.data != "elementwise"
                    ):
                        feeding.append(op)
                        continue
                if isinstance(op.lhs.owner, comm.AllGatherOp):
                    feeding.append(op)
        mms = _Structure.unique_names(feeding)
        # the pipeline-boundary form (through a fused send and the next stage's all_gather)
        # is tried only where a fused send exists
        forms = [False]
        if any(isinstance(o, comm.FusedOp) and o.kind.data == "send" for o in block.ops):
            forms.append(True)

        def rec(n: _Node, i: int) -> Iterator[_Node]:
            if i == len(mms):
                yield n
                return
            yield from rec(n, i + 1)
            for c in chunks:
                for send in forms:
                    nxt = _step(
                        n,
                        f"overlap({mms[i]},chunks={c}{',send' if send else ''})",
                        lambda s, m=mms[i], c=c, send=send: s.overlap(m, chunks=c, send=send),
                    )
                    if nxt is not None:
                        yield from rec(nxt, i + 1)

        yield from rec(node, 0)

    if limit is not None and limit <= 0:
        return out
    try:
        for n2 in split_and_reorder():
            for n3 in as_slices(n2):
                for n4 in sliced_sends(n3):
                    for n5 in fusions(n4):
                        for n6 in overlaps(n5):
                            emit(n6)
    except _Full:
        pass
    return out
