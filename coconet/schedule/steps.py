"""A schedule's steps: each CoCoNet transformation (split, reorder, as-slice, fuse, overlap,
sliced send, dce, canonicalize) applied as its pass to one function, verified, recorded, and
answered with name-based handles to what it made."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Self

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, OpResult, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import DiagnosticException

from coconet.core.gc_pause import without_gc
from coconet.core.program import CocoError, Program, make_context
from coconet.dialects import coco, comm
from coconet.dialects.coco import SlicedAttr, TensorType
from coconet.schedule.errors import RULE_PREFIX, VERIFY_RULE, ScheduleError, schedule_error
from coconet.schedule.handles import Handle, Reordered, Target, flatten_targets, target_name
from coconet.schedule.pipeline import format_pass, format_pipeline, make_pass
from coconet.schedule.structure import auto_split_dim
from coconet.schedule.targets import (
    name_module_targets,
    name_schedule_targets,
    top_level_named,
    values_named,
)

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


def as_program(program: Any) -> Program:
    """The Program a schedule works from, its unnamed schedule targets named in place
    (`name_schedule_targets`: names only, idempotent), so that the names the pipelines of its
    schedules use are names its printed text carries."""
    p = _as_program(program)
    name_module_targets(p.module)
    return p


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


def _auto_dim(v: SSAValue | None) -> int:
    if v is None or not isinstance(v.owner, comm.AllReduceOp):
        return 0  # the pass refuses with its own rule
    return auto_split_dim(v.owner)


class ScheduleSteps:
    """A schedule of one program (its first function, or `entry`): CoCoNet's transformations
    as steps, one verified pass each (see the package docstring). `Schedule` (api.py) adds
    pipelines as text and named schedules; the recipes of named schedules are written against
    this class, which is why it stands apart: a pipeline may hold `coco-schedule`, which runs a
    recipe."""

    def __init__(self, program: Any, entry: str | None = None):
        p = as_program(program)
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
        # steps verified one by one, but no undo clones: the maker drops the schedule on a
        # refusal (the enumerator's copies, made to try one step each)
        self._throwaway = False
        # a disposable schedule's steps not verified yet (_verify_deferred)
        self._unverified: list[str] = []
        # inside an _attempt of a disposable schedule: steps keep undo clones, and their
        # verification still waits for _verify_deferred (half the verifications of a named
        # schedule were of attempted steps)
        self._defer_verify = False

    @classmethod
    def _working_on(cls, program: Program, disposable: bool) -> Self:
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
        or throwaway schedule (a disposable one still verifies it with its other steps)."""
        kept = self._disposable, self._throwaway, self._defer_verify
        self._defer_verify = self._defer_verify or self._disposable
        self._disposable = self._throwaway = False
        try:
            yield
        finally:
            self._disposable, self._throwaway, self._defer_verify = kept

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

    def copy(self, *, throwaway: bool = False) -> Self:
        """An independent schedule with the same steps so far (for exploring alternatives).
        `throwaway`: the caller drops the copy when a step is refused, so its steps keep no
        undo clones (each is still verified)."""
        other = object.__new__(type(self))
        other._program = self._program.clone()
        other._steps = list(self._steps)
        other._new_values = []
        other._checkpoints = 0
        other._disposable = False
        other._throwaway = throwaway
        other._unverified = []
        other._defer_verify = False
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
        undo = not (self._checkpoints or self._disposable or self._throwaway)
        backup = self._program.clone() if undo else None
        try:
            _run_on_function(self._program, p)
        except DiagnosticException as e:
            self._restore(backup)
            msg = str(e).strip()
            m = RULE_PREFIX.match(msg)
            raise ScheduleError(
                f"{spec}: {msg}", m.group(1) if m else None, spec, getattr(e, "op", None)
            ) from None
        except CocoError as e:
            self._restore(backup)
            rule = getattr(e, "rule", None)
            raise ScheduleError(f"{spec}: {e}", rule, spec) from None
        except BaseException:
            self._restore(backup)  # a pass crashed: keep the schedule as it was, and say so
            raise
        if self._disposable or self._defer_verify:
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
        return self._handles((target_name(target, "handle"),))[0]

    def _handles(self, names: Sequence[str]) -> list[Handle]:
        """Handles to named values, found in one scan of the program (not one a name)."""
        found = values_named(self._program.func, names)
        for name in names:
            if name not in found:
                raise schedule_error(
                    "schedule-target", f"no value named %{name} in @{self._program.name}"
                )
        return [self._handle(found[name]) for name in names]

    def _names(self, targets: Sequence[Any], method: str) -> tuple[str, ...]:
        return tuple(target_name(t, method) for t in flatten_targets(targets))

    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """Several passes as one step: if one is refused, none of them stays applied."""
        if self._disposable or self._throwaway:
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
            values = values_named(self._program.func, names)
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
                        make_pass("coco-split-allreduce", ops=tuple(ns), dim=d or None)
                    )
        else:
            if dim is not None and not isinstance(dim, int):
                raise schedule_error(
                    "schedule-option", f"split: dim must be an int or 'auto', got {dim!r}"
                )
            new = self._run(make_pass("coco-split-allreduce", ops=names, dim=dim or None))
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
        self._run(make_pass("coco-reorder", ops=names))
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
        self._run(make_pass("coco-as-slice", ops=names))
        fn = self._program.func
        if names:
            return self._handles(names)
        return [
            self._handle(a) for a in fn.body.block.args if a.name_hint and _sliced_somewhere(a.type)
        ]

    def fuse(self, *targets: Target, mode: str = "auto", form: str = "two_shot") -> Any:
        """CoCoNet's `fuse`: `mode="elementwise"` fuses the named elementwise ops into one
        kernel; `mode="all_reduce"` fuses a reduce_scatter's chain (name the reduce_scatter,
        or the exact set) into one FusedAllReduce; `mode="send"` fuses computation into a
        send; `mode="all_to_all"` an all_to_all with the computation of its input and of
        its result (name the all_to_all, or the exact set), `mode="all_gather"` an
        all_gather so (FSDP's cast of the master shard fused into the parameter gather);
        `mode="reduction"` a full reduction with its input's computation and the all_reduce
        of its partial (an fp8 scale's amax; name the reduction or that all_reduce);
        `auto` picks by the targets. No
        targets: greedy. `form="one_shot"` (with `mode="all_reduce"`): an all_reduce as
        written and the computation on its whole result, one kernel in which each rank
        reduces every peer's whole input (name the all_reduce, or the exact set). Returns the
        new region's handle (a list when several regions were made)."""
        names = self._names(targets, "fuse")
        new = self._run(
            make_pass(
                "coco-fuse",
                ops=names,
                mode=None if mode == "auto" else mode,
                form=None if form == "two_shot" else form,
            )
        )
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
            names = (target_name(producer, "overlap"),)
            if consumer is not None:
                self._check_consumer(names[0], consumer)
        elif consumer is not None:
            names = (target_name(consumer, "overlap"),)
        else:
            names = ()
        new = self._run(
            make_pass(
                "coco-overlap",
                ops=names,
                chunks=None if chunks == 4 else chunks,
                send=True if send else None,
            )
        )
        regions = [self._op_handle(op) for op in new if isinstance(op, comm.OverlapOp)]
        return regions[0] if len(regions) == 1 else regions

    def _check_consumer(self, producer: str, consumer: Target) -> None:
        mm = top_level_named(self._program.func, producer)
        if isinstance(consumer, Handle) and consumer.name is None:
            want = consumer.op
        else:
            cv = top_level_named(self._program.func, target_name(consumer, "overlap"))
            want = cv.owner if isinstance(cv, OpResult) else None
        if mm is None or want is None:
            return  # the pass reports missing names
        block = self._program.func.body.block
        users = {block.find_ancestor_op_in_block(u.operation) for u in mm.uses}
        if users != {want}:
            raise schedule_error(
                "overlap-consumer",
                f"overlap: %{producer} is not read (only) by {consumer}: the consumer to overlap "
                "must be the collective reading the matmul",
            )

    def sliced_send(self, *sends: Target) -> Any:
        """CoCoNet's reorder of an AllGather with a Send: each rank sends only its slice and
        the receiving stage all_gathers. Returns `(send, gather)` handles (a list of pairs for
        several sends); none named: every legal send (greedy)."""
        names = self._names(sends, "sliced_send")
        new = self._run(make_pass("coco-sliced-send", ops=names))
        pairs = [
            (self._handle(op.input), self._handle(op.result))
            for op in new
            if isinstance(op, comm.AllGatherOp) and isinstance(op.input.owner, comm.SendOp)
        ]
        return pairs[0] if len(names) == 1 and len(pairs) == 1 else pairs

    def dce(self, *ops: Target) -> None:
        """Dead-code elimination: the named (dead) ops, or every dead op."""
        self._run(make_pass("coco-dce", ops=self._names(ops, "dce")))

    def canonicalize(self, *ops: Target) -> None:
        """Fold slice/all_gather round trips: the named ops, or all of them."""
        self._run(make_pass("coco-canonicalize", ops=self._names(ops, "canonicalize")))


def _sliced_somewhere(t: Any) -> bool:
    return isinstance(t, TensorType) and any(isinstance(lay, SlicedAttr) for lay in t.layouts.data)
