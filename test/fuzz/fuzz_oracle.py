"""Run one fuzz case through every stage a user's program goes through, and classify it.

Stages, in order (each is the library call the tools make, in this process):

1. `load`: `coconet.load(FILE.mlir)` -- decode, parse, program rules, op verifiers, signatures;
2. `coco-opt`: the `coco-opt FILE` driver on the same file (xDSL's parser and the program rules
   through the tool's own path): it must agree with `load` on accepting;
3. `roundtrip`: the accepted module printed, parsed and verified again, printing the same;
4. per function and rank count 1-4: `lower` (the plan, `-t plan`; its CUDA C, `-t cuda`) and
   the sim on seeded random inputs (programs of more than SIM_ELEMENTS elements are lowered
   only: the fuzzer's memory budget, not a refusal);
5. `schedules`: `enumerate_scheduled_programs` (at most `schedule_limit` of them), each one
   lowered at 1, 2, 4 ranks and checked against the as-written program by
   `check_equivalence` (bit-exact except reassociated reductions) at 1, 2, 4 ranks;
6. `cpu`: for a `cpu_fraction` of the distinct accepted programs (chosen by a hash of their
   IR, so a run is reproducible), the plan runs on the cpu backend (the generated kernels,
   compiled by the host compiler, on 1, 2 and 3 in-process ranks; unevenly cut programs
   are chosen at four times the fraction) and its outputs must equal the
   sim's (per-dtype tolerances: the backend's library collectives may reorder sums).
Stages 3-5 run once per distinct accepted IR (most mutations of one seed print the same).
A pipeline case runs `coco-opt FILE -p PIPELINE -t TARGET` on an example.

Outcomes:
* `accepted` -- every stage ran (a stage may refuse a rank count with a CocoError: the
  program cannot run there, which is a diagnostic, not a failure);
* `rejected` -- a clean diagnostic: a `CocoError`, xDSL's `ParseError` or `DiagnosticException`
  (`VerifyException`), argparse's usage exit, or a malformed pipeline (`ArgSpecParseError`, or
  a ValueError/KeyError raised by xDSL's pipeline parser for an unknown pass or option);
* `traceback` -- any other exception from any stage (what a user would see as a traceback or,
  through coco-opt's catch-alls, as a raw internal message);
* `silent` -- a silent acceptance, one of:
  - a mutation that broke a documented rule (`Case.must_reject`) was accepted;
  - `load` and `coco-opt` disagree on whether the program is valid;
  - an accepted program's printed IR does not parse, verify or print back the same;
  - a schedule the enumerator offers computes different results from the program as written
    (check_equivalence reports a mismatch or a crash of the scheduled program);
  - the cpu backend computes different results from the sim for an accepted program;
  - `-t plan{ranks=N}` with N < 0 printed a plan;
* `hang` -- (the driver) no answer within the hang limit, confirmed by a second run.
"""

from __future__ import annotations

import contextlib
import io
import time
import traceback
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from fuzz_inputs import Case
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError

from coconet.core.program import CocoError, Program

CLEAN = (CocoError, DiagnosticException, ParseError)
SIM_ELEMENTS = 1 << 20
RANKS = (1, 2, 3, 4)


class SilentAcceptance(Exception):
    """A finding of the `silent` kind (see the module docstring)."""


class InternalError(Exception):
    """A CocoError whose message says `internal`: the compiler's own fault, never a refusal of
    the program (a `traceback` finding)."""


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """Lets a stage's clean refusals pass, not its internal errors."""
    try:
        yield
    except CLEAN as e:
        if str(e).startswith("internal"):
            raise InternalError(str(e)) from None


def where(exc: BaseException) -> str:
    """The innermost frame of coconet's own code (else the innermost frame) that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    root = str(Path(__file__).resolve().parents[2])
    ours = [f for f in frames if f.filename.startswith(root) and "/fuzz/" not in f.filename]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return "?"
    parts = Path(frame.filename).parts
    short = "/".join(parts[-2:])
    return f"{short}:{frame.lineno} in {frame.name}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def _clean_tool_error(exc: BaseException) -> bool:
    """An error coco-opt reports as a diagnostic by design (see the module docstring)."""
    if isinstance(exc, (*CLEAN, ArgSpecParseError)):
        return True
    if isinstance(exc, SystemExit):
        return exc.code not in (0, None)
    if isinstance(exc, (ValueError, KeyError)):
        frames = traceback.extract_tb(exc.__traceback__)
        return bool(frames) and "/xdsl/" in frames[-1].filename
    return False


@cache
def _memoize_multiverse() -> None:
    """xDSL's `Universe.get_multiverse` reads every installed package's entry points on each
    call, three times per coco-opt run: a quarter of a case's time in a worker that runs
    coco-opt thousands of times. The packages do not change while a worker runs, so one
    reading serves all of them (the tool itself runs once per process and is left as is)."""
    from xdsl.universe import Universe

    Universe.get_multiverse = staticmethod(cache(Universe.get_multiverse))


def run_tool(args: list[str]) -> str:
    """`coco-opt ARGS` in this process, its output returned; exceptions propagate raw (the
    tool's main() would turn some internal errors into messages: the fuzzer must see them)."""
    from coconet.tools.coco_opt import CocoOptMain

    _memoize_multiverse()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        CocoOptMain(args).run()
    return out.getvalue()


class StageClock:
    """The stage a case is in (named in its result when it fails) and the seconds spent in
    each kind of stage (`lower@2` and `lower@4` are both `lower`): the fuzzer's profile."""

    def __init__(self) -> None:
        self.name = "load"
        self.kind = "load"
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()

    def enter(self, name: str, kind: str | None = None) -> None:
        self._charge()
        self.name = name
        self.kind = kind or name.split("@")[0].split(" ")[0]

    def stop(self) -> dict[str, float]:
        self._charge()
        return {k: round(v, 4) for k, v in self.seconds.items()}

    def _charge(self) -> None:
        now = time.perf_counter()
        self.seconds[self.kind] = self.seconds.get(self.kind, 0.0) + now - self._since
        self._since = now


class Oracle:
    def __init__(
        self,
        workdir: Path,
        schedule_limit: int | None = 4,
        tool: bool = True,
        cpu_fraction: float = 0.0,
        checked_schedules: int | None = None,
    ):
        """`schedule_limit`: how many schedules the enumerator makes per program (None: all it
        offers, each pipeline applied and its IR verified); `checked_schedules`: how many of
        them, spread evenly over the enumeration, are also lowered and checked against the
        sim (None: all)."""
        self.workdir = workdir
        self.cpu_fraction = cpu_fraction
        self.schedule_limit = schedule_limit
        self.checked_schedules = checked_schedules
        self.tool = tool
        self.seen: set[str] = set()

    def run(self, case: Case) -> dict[str, Any]:
        result: dict[str, Any] = {"index": case.index, "outcome": "accepted", "stage": ""}
        stage = StageClock()
        try:
            if case.kind == "pipeline":
                self._pipeline(case, stage)
            else:
                self._program(case, stage, result)
        except SilentAcceptance as e:
            result.update(outcome="silent", stage=stage.name, error="", message=str(e))
        except CLEAN as e:
            result.update(
                outcome="rejected", stage=stage.name, error=type(e).__name__, message=first_line(e)
            )
        except BaseException as e:
            if case.kind == "pipeline" and stage.name == "coco-opt" and _clean_tool_error(e):
                result.update(
                    outcome="rejected",
                    stage=stage.name,
                    error=type(e).__name__,
                    message=first_line(e),
                )
            elif isinstance(e, KeyboardInterrupt):
                raise
            else:
                result.update(
                    outcome="traceback",
                    stage=stage.name,
                    error=type(e).__name__,
                    where=where(e),
                    message=first_line(e),
                    traceback="".join(traceback.format_exception(e))[-3000:],
                )
        result["stage_seconds"] = stage.stop()
        return result

    # -- a mutated program ---------------------------------------------------------------------

    def _program(self, case: Case, stage: StageClock, result: dict[str, Any]) -> None:
        import coconet

        path = self.workdir / "case.mlir"
        path.write_bytes(case.data)
        stage.enter("load")
        try:
            program = coconet.load(path)
            load_error = None
        except CLEAN as e:
            load_error = e
        if self.tool:
            stage.enter("coco-opt")
            try:
                run_tool([str(path)])
                tool_error = None
            except BaseException as e:
                if not _clean_tool_error(e):
                    raise
                tool_error = e
            # coco-opt knows every xDSL dialect (rewrite patterns may sit beside the
            # functions), `load` only coconet's: an op unknown to `load` is no disagreement.
            unregistered = load_error is not None and "is not registered" in str(load_error)
            if (load_error is None) != (tool_error is None) and not unregistered:
                raise SilentAcceptance(
                    "coconet.load and coco-opt disagree: "
                    + (
                        f"coco-opt refuses ({first_line(tool_error)}) what load accepts"
                        if tool_error is not None
                        else f"coco-opt accepts what load refuses ({first_line(load_error)})"
                    )
                )
        if load_error is not None:
            stage.enter("load")
            raise load_error
        stage.enter("verify")
        if case.must_reject:
            raise SilentAcceptance(
                f"a program breaking rule [{case.must_reject}] ({case.mutations[-1]}) was accepted"
            )
        text = program.print()
        if text in self.seen:
            result["stage"] = "duplicate"
            return
        self.seen.add(text)
        self._deep(program, text, stage)

    def _deep(self, program: Program, text: str, stage: StageClock) -> None:
        from xdsl.dialects import func

        from coconet.core.program import parse_module
        from coconet.equivalence import check_equivalence
        from coconet.lowering.lower_to_plan import lower
        from coconet.runtime import sim
        from coconet.schedule import enumerate_scheduled_programs

        stage.enter("roundtrip")
        try:
            again = Program(parse_module(text, "<printed>"))
        except CLEAN as e:
            raise SilentAcceptance(
                f"the printed IR of an accepted program is refused: {e}"
            ) from None
        if again.print() != text:
            raise SilentAcceptance("the printed IR of an accepted program prints differently")
        module = program.module
        for fn in [op for op in module.ops if isinstance(op, func.FuncOp)]:
            p = Program(module, fn.sym_name.data)
            stage.enter("signature")
            p.arguments
            p.outputs
            simulate = _elements(p) <= SIM_ELEMENTS
            for ranks in RANKS:
                stage.enter(f"lower@{ranks}")
                with _refusals():
                    plan = lower(p, ranks)
                    plan.format()
                    plan.cuda_source
                if simulate:
                    stage.enter(f"sim@{ranks}")
                    with contextlib.suppress(*CLEAN):
                        sim.run(p, ranks=ranks, seed=ranks)
            # an unevenly cut program is where per-rank extents can go wrong: sampled 4x
            fraction = self.cpu_fraction * (4 if _cut_unevenly(p) else 1)
            if simulate and _chosen(text + p.name, fraction):
                self._cpu(p, stage)
            stage.enter("schedules")
            try:
                scheduled = enumerate_scheduled_programs(p, limit=self.schedule_limit)
            except CLEAN:
                continue
            for name, pipeline, sp in _spread(scheduled, self.checked_schedules):
                if not pipeline:
                    continue
                stage.enter(f"schedule {name}", kind="schedule-lower")
                for ranks in (1, 2, 4):
                    with _refusals():
                        lower(sp, ranks).format()
                if simulate:
                    stage.enter(f"schedule {name}", kind="schedule-check")
                    report = check_equivalence(p, sp, ranks=(1, 2, 4), seeds=(0,))
                    if not report.ok:
                        detail = str(report).replace("\n", " | ")[:400]
                        raise SilentAcceptance(
                            f"schedule {name} ({pipeline}) changes what @{p.name} computes: "
                            f"{detail}"
                        )

    def _cpu(self, p: Program, stage: StageClock) -> None:
        from coconet.equivalence import TOLERANCES, _close
        from coconet.lowering.lower_to_plan import lower
        from coconet.runtime import sim
        from coconet.runtime.threaded import ThreadedExecutor

        for ranks in (1, 2, 3):  # 3: most sizes cut unevenly, pieces of other extents
            stage.enter(f"cpu@{ranks}")
            try:
                plan = lower(p, ranks)
                want = sim.run(p, ranks=ranks, seed=7)
            except CLEAN:
                continue
            got = ThreadedExecutor(plan).run(want.inputs)
            for name, value in want.outputs.items():
                if name not in got:
                    raise SilentAcceptance(f"cpu backend at {ranks} rank(s) lacks output {name}")
                g = np.asarray(got[name])
                tol = TOLERANCES.get(_dtype_name(value), TOLERANCES["i32"])
                same = g.shape == value.shape and bool(np.all(_close(g, value, tol)))
                if not same:
                    raise SilentAcceptance(
                        f"cpu backend and sim differ at {ranks} rank(s) "
                        f"in output {name} of @{p.name}"
                    )

    # -- a mutated pipeline on a valid program ---------------------------------------------

    def _pipeline(self, case: Case, stage: StageClock) -> None:
        path = self.workdir / "case.mlir"
        path.write_bytes(case.data)
        stage.enter("coco-opt", kind="pipeline")
        args = [str(path), "-t", case.target or "mlir"]
        if case.pipeline:
            args += ["-p", case.pipeline]
        run_tool(args)
        if case.must_reject:
            raise SilentAcceptance(f"coco-opt -t '{case.target}' succeeded ({case.must_reject})")


def _elements(p: Program) -> int:
    from coconet.dialects.coco import TensorType

    total = 0
    for op in p.func.walk():
        for v in [*op.results, *(a for b in op.regions for blk in b.blocks for a in blk.args)]:
            if isinstance(v.type, TensorType):
                total += int(np.prod([max(d, 1) for d in v.type.get_shape()], dtype=object))
    for a in p.func.body.block.args:
        if isinstance(a.type, TensorType):
            total += int(np.prod([max(d, 1) for d in a.type.get_shape()], dtype=object)) * 4
    return total


def _spread(items: list[Any], count: int | None) -> list[Any]:
    """At most `count` of `items`, evenly spaced from the first to the last (the enumeration
    goes depth first: its first entries differ only in the last choices, its last ones compose
    the most passes)."""
    if count is None or len(items) <= count:
        return items
    if count <= 1:
        return items[-count:] if count == 1 else []
    step = (len(items) - 1) / (count - 1)
    return [items[round(i * step)] for i in range(count)]


def _dtype_name(a: np.ndarray) -> str:
    names = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}
    return names.get(a.dtype.name, "i32")


def _cut_unevenly(p: Program) -> bool:
    """Whether a sliced dim of one of the program's tensors does not divide by 2 or 3 (the
    cpu stage's rank counts): its ranks then hold pieces of different extents."""
    from coconet.dialects.coco import SlicedAttr, TensorType

    for op in p.func.walk():
        for v in (*op.operands, *op.results):
            t = v.type
            if isinstance(t, TensorType):
                shape = t.get_shape()
                for lay in t.layouts:
                    if isinstance(lay, SlicedAttr) and (shape[lay.dim.data] % 6):
                        return True
    return False


def _chosen(key: str, fraction: float) -> bool:
    import zlib

    return fraction > 0 and (zlib.crc32(key.encode()) % 10000) < fraction * 10000
