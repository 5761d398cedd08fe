"""One rank of a `coco-run --backend cpu|cuda` job: `python -m coconet.tools.rank_job JOB`.

The launcher (runtime/launcher.py) starts N of these under `mpiexec` with a JSON job file
(program, schedules, inputs, what to do). For each schedule every rank loads and schedules the
program, lowers it for the job's N ranks, sets up its backend; rank 0 prepares the logical
inputs (the given .npz, or seeded ones) and sends every rank its piece; all ranks run the plan;
rank 0 gathers every rank's outputs, prints the per-rank summary, and with `check` compares
them with the sim oracle (per rank, against the scheduled program; and logically, against the
program as written). With `bench` the ranks time warm steps (barrier-synchronized; the step
time is the slowest rank's) and rank 0 prints a table.

Any failure on any rank ends the job through runtime/failures.py (one line naming the rank,
MPI_Abort). A failed check is not a crash: every rank finishes, and the job exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coconet.core import env, values as V
from coconet.core.program import CocoError, Program
from coconet.dialects import coco

# The module the launcher runs on every rank (`python -m RANK_WORKER JOB.json`).
RANK_WORKER = "coconet.tools.rank_job"


def seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds (--timeout)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got '{text}'")
    return value


def seconds_or_off(text: str) -> float:
    """An argparse type: a number of seconds >= 0, where 0 turns the limit off."""
    if text.strip() in ("0", "0.0"):
        return 0.0
    try:
        return seconds(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds > 0, or 0 for no limit, got '{text}'"
        ) from None


def add_timeout_options(p: argparse.ArgumentParser, job: str = "the whole job") -> None:
    """--timeout and --step-timeout, as every tool that launches rank jobs takes them."""
    p.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=f"cpu/cuda: stop {job} after this many seconds",
    )
    p.add_argument(
        "--step-timeout",
        type=seconds_or_off,
        default=None,
        metavar="SECONDS",
        help="cpu/cuda: end the job, naming the rank, when a rank makes no progress in one plan "
        "step or never arrives where its peers wait for this many seconds (default: "
        f"$COCONET_STEP_TIMEOUT, else {env.DEFAULT_STEP_TIMEOUT:g}; 0 disables)",
    )


def tool_main(prog: str, parser: argparse.ArgumentParser, run: Callable[[Any], int], argv) -> None:
    """The entry point of a tool that launches rank jobs (coco-run, coco-bench, coco-tune):
    `run`'s status, or one `PROG: error: ...` line and status 1 for a CocoError; Ctrl-C, or
    SIGTERM/SIGHUP while a job runs (runtime/launcher.py `Terminated`), says which signal
    ended the job's ranks and exits 128 + its number."""
    args = parser.parse_args(argv)
    try:
        sys.exit(run(args))
    except CocoError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(
            f"{prog}: {'interrupted' if signum == signal.SIGINT else 'terminated'} "
            f"({signal.Signals(signum).name}); the job's ranks were ended",
            file=sys.stderr,
        )
        sys.exit(128 + int(signum))


def job_description(
    backend: str,
    schedules: Sequence[tuple[str, str | None]],
    *,
    program: str | None = None,
    entry: str | None = None,
    programs: Sequence[dict[str, Any]] | None = None,
    inputs: str | None = None,
    output: str | None = None,
    seed: int = 0,
    check: bool = False,
    bench: bool = False,
    json_path: str | None = None,
    trace: str | None = None,
    warmup: int = 3,
    iters: int = 10,
    verbose: bool = False,
    quiet: bool = False,
    exact_collectives: bool = False,
    step_timeout: float | None = None,
    rounds: int = 1,
    numerics: str | None = None,
    **report: Any,
) -> dict[str, Any]:
    """The job every rank of coco-run, coco-bench and coco-tune runs (JSON through the
    launcher): one program (`program`, `entry`) or a sweep of them (`programs`: path, entry,
    meta), each under the (label, spec) `schedules`; `report` adds the sweep's keys (report,
    title, progress). With `bench` and `rounds` > 1 every schedule times `iters` steps per
    round, the schedules taking turns, once all are set up (coco-tune: comparable figures on a
    host that is busy with something else)."""
    job: dict[str, Any] = {
        "backend": backend,
        "schedules": [{"label": label, "spec": spec} for label, spec in schedules],
        "inputs": inputs,
        "output": output,
        "seed": seed,
        "check": check,
        "bench": bench,
        "json": json_path,
        "trace": trace,
        "warmup": warmup,
        "iters": iters,
        "verbose": verbose,
        "quiet": quiet,
        "exact_collectives": exact_collectives,
        "step_timeout": step_timeout,
        "rounds": rounds,
        **report,
    }
    if programs is not None:
        job["programs"] = list(programs)
    else:
        job["program"], job["entry"] = program, entry
        job["numerics"] = numerics
    return job


# Bandwidth conventions of the bench rows (coco-run --bench, coco-bench), as nccl-tests defines
# them for one collective, extended to whole programs through the plan's traffic.
ALGBW_CONVENTION = (
    "algbw = size / time; size = the bytes of the program's collectives as written, the same "
    "for every schedule (nccl-tests' size: an all_reduce's buffer, a reduce_scatter's input, "
    "an all_gather's output, an all_to_all's input)"
)
BUSBW_CONVENTION = (
    "busbw = bytes/rank / time; bytes/rank = what each rank sends per step in the scheduled plan "
    "(lowering/traffic.py plan_traffic): nccl-tests' busbw for one collective, algbw x 2(n-1)/n "
    "for all_reduce, x (n-1)/n for reduce_scatter, all_gather and all_to_all, x 1 for broadcast "
    "and reduce"
)


def conventions(prefix: str) -> str:
    """The two conventions, wrapped to 100 columns, each line starting with `prefix`."""
    import textwrap

    return "\n".join(
        textwrap.fill(text, 100, initial_indent=prefix, subsequent_indent=prefix + "  ")
        for text in (ALGBW_CONVENTION, BUSBW_CONVENTION)
    )


# GB/s as nccl-tests prints them: 1e9 bytes per second.
GB = 1e9


def nccl_bus_factor(op: str, ranks: int) -> float:
    """busbw / algbw of one collective on `ranks` ranks (nccl-tests' convention)."""
    n = ranks
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_gather": (n - 1) / n,
        # nccl-tests' alltoall: each rank keeps 1/n of its buffer and sends the rest
        "all_to_all": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
        "send": 1.0,
    }
    if op not in factors:
        raise ValueError(f"no bus bandwidth factor for {op!r}: one of {', '.join(factors)}")
    return factors[op] if n > 1 else 0.0


@dataclass
class BenchRow:
    """One schedule's timing: median and min over the timed steps (slowest rank per step),
    what each rank sends per step, and the program's collective size (None: not known)."""

    label: str
    median_s: float
    min_s: float
    bytes_per_rank: int
    steps: int
    launches: int
    size_bytes: int | None = None
    times_s: list[float] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def algbw(self) -> float | None:
        """GB/s: size / median time (ALGBW_CONVENTION)."""
        if self.size_bytes is None or self.median_s <= 0:
            return None
        return self.size_bytes / self.median_s / GB

    @property
    def busbw(self) -> float | None:
        """GB/s: bytes/rank / median time (BUSBW_CONVENTION)."""
        if self.median_s <= 0:
            return None
        return self.bytes_per_rank / self.median_s / GB

    def as_json(self) -> dict[str, Any]:
        factor = self.bytes_per_rank / self.size_bytes if self.size_bytes else None
        return {
            **self.meta,
            "schedule": self.label,
            "size_bytes": self.size_bytes,
            "time_s": self.median_s,
            "min_time_s": self.min_s,
            "algbw_GBps": self.algbw,
            "busbw_GBps": self.busbw,
            "bytes_per_rank": self.bytes_per_rank,
            "busbw_factor": factor,
            "steps": self.steps,
            "launches": self.launches,
            "times_s": list(self.times_s),
        }


def plan_size(plan, rank: int = 0) -> int:
    """The bytes of the plan's library collectives in nccl-tests' size convention: an
    all_reduce's (or broadcast's, reduce's, send's) buffer, a reduce_scatter's (or
    all_to_all's) input, an all_gather's output; chunked steps count their rows. With
    lowering/traffic.py plan_traffic (the same steps times their bus factors), busbw / algbw
    is the collective's factor."""
    from coconet.lowering.plan import Collective
    from coconet.lowering.traffic import buffer_nbytes, rows_fraction
    from coconet.runtime.executor import group_of

    total = 0.0
    for step in plan.steps:
        if not isinstance(step, Collective):
            continue
        if step.op == "send":
            along, shift = step.along, step.shift
            # a send names its axis and its shift
            assert along is not None
            assert shift is not None
            c = list(V.coords_of(rank, plan.grid_shape))
            c[along] += shift
            if not 0 <= c[along] < plan.grid_shape[along]:
                continue
        elif len(group_of(plan.grid_shape, step.axes, rank)) <= 1:
            continue
        nbytes = buffer_nbytes(step.dst if step.op == "all_gather" else step.src)
        total += nbytes * rows_fraction(step)
    return round(total)


def program_size(program, ranks: int, comm=None) -> int | None:
    """The size (plan_size, largest over ranks) of the program as written on `ranks` ranks:
    what every schedule of it moves, so all its rows share one size. None when the program as
    written does not lower (or holds no library collective, e.g. written already fused)."""
    from coconet.core.program import CocoError
    from coconet.lowering.lower_to_plan import lower

    try:
        plan = lower(program, ranks)
    except CocoError:
        return None
    if comm is not None:
        size = comm.allreduce(plan_size(plan, comm.Get_rank()), op=_max_op(comm))
    else:
        size = max(plan_size(plan, r) for r in range(ranks))
    return size or None


def _raw(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def scatter_inputs(comm, plan, logical: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Rank 0 holds the logical inputs; every rank gets its piece (raw bytes: MPI has no bf16)."""
    from coconet.runtime.executor import buffer_dtype

    rank, size = comm.Get_rank(), comm.Get_size()
    pieces: dict[str, np.ndarray] = {}
    for name, buf in plan.arguments.items():
        if rank == 0:
            assert logical is not None
            for r in range(size):
                piece = V.piece_of(
                    logical[name], buf.type, V.coords_of(r, plan.grid_shape), plan.grid_shape
                )
                if r == 0:
                    pieces[name] = piece
                else:
                    comm.Send(_raw(piece), dest=r, tag=11)
        else:
            arr = np.empty(buf.shape_at(rank), dtype=buffer_dtype(buf))
            comm.Recv(_raw(arr), source=0, tag=11)
            pieces[name] = arr
    return pieces


def gather_outputs(comm, plan, mine: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]] | None:
    """Every rank's outputs at rank 0 (None elsewhere)."""
    from coconet.runtime.executor import buffer_dtype

    rank, size = comm.Get_rank(), comm.Get_size()
    if rank != 0:
        for name in plan.outputs:
            comm.Send(_raw(mine[name]), dest=0, tag=12)
        return None
    per_rank = [mine]
    for r in range(1, size):
        got = {}
        for name, buf in plan.outputs.items():
            arr = np.empty(buf.shape_at(r), dtype=buffer_dtype(buf))
            comm.Recv(_raw(arr), source=r, tag=12)
            got[name] = arr
        per_rank.append(got)
    return per_rank


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _fmt_gbps(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_bench_table(
    rows: list[BenchRow],
    program: str,
    ranks: int,
    backend: str,
    warmup: int,
    iters: int,
    timing: str = "slowest rank per step",
) -> None:
    """coco-run --bench's table: one row per schedule (the schedule, then its median and min
    step time in ms: benchmarks/gpu_check.py parses that much), then nccl-tests' size, algbw
    and busbw, and the plan's bytes per rank, steps and kernel launches."""
    print(
        f"\nbench @{program} on {ranks} rank(s), backend {backend}: median of {iters} step(s) "
        f"after {warmup} warm-up, {timing}"
    )
    width = max([len("schedule")] + [len(r.label) for r in rows])
    print(
        f"  {'schedule':<{width}}  {'median':>10}  {'min':>10}  {'size':>11}  "
        f"{'algbw GB/s':>10}  {'busbw GB/s':>10}  {'bytes/rank':>11}  {'steps':>5}  "
        f"{'launches':>8}"
    )
    for r in rows:
        size = "-" if r.size_bytes is None else _fmt_bytes(r.size_bytes)
        print(
            f"  {r.label:<{width}}  {r.median_s * 1e3:>8.3f}ms  {r.min_s * 1e3:>8.3f}ms  "
            f"{size:>11}  {_fmt_gbps(r.algbw):>10}  {_fmt_gbps(r.busbw):>10}  "
            f"{_fmt_bytes(r.bytes_per_rank):>11}  {r.steps:>5}  {r.launches:>8}"
        )
    print("\n" + conventions("  "))
    sys.stdout.flush()


# coco-bench's rows, nccl-tests' layout: one line per size and schedule, printed as measured.
SWEEP_COLUMNS = (
    ("size", 12),
    ("count", 12),
    ("type", 5),
    ("schedule", 0),  # as wide as the longest schedule label
    ("time(us)", 11),
    ("min(us)", 11),
    ("algbw(GB/s)", 11),
    ("busbw(GB/s)", 11),
    ("bytes/rank", 12),
)


def sweep_header(title: str, labels: list[str]) -> str:
    width = max([len("schedule")] + [len(x) for x in labels])
    cells = [f"{name:>{w}}" if w else f"{name:<{width}}" for name, w in SWEEP_COLUMNS]
    return "\n".join(
        [
            f"# {title}",
            conventions("# "),
            "#",
            "#" + " ".join(cells)[1:],
        ]
    )


def sweep_row(row: BenchRow, labels: list[str]) -> str:
    width = max([len("schedule")] + [len(x) for x in labels])
    count = row.meta.get("count")
    values = [
        "-" if row.size_bytes is None else str(row.size_bytes),
        "-" if count is None else str(count),
        str(row.meta.get("dtype") or "-"),
        row.label,
        f"{row.median_s * 1e6:.1f}",
        f"{row.min_s * 1e6:.1f}",
        _fmt_gbps(row.algbw),
        _fmt_gbps(row.busbw),
        str(row.bytes_per_rank),
    ]
    cells = [f"{v:>{w}}" if w else f"{v:<{width}}" for v, (_, w) in zip(values, SWEEP_COLUMNS)]
    return " ".join(cells)


# A line rank 0 prints after every measured schedule when the job asks for progress: coco-bench
# turns these into its progress bar and shows none of them.
PROGRESS_MARKER = "#coco-bench-progress"


def bench_document(job: dict[str, Any], rows: list[BenchRow], ranks: int) -> dict[str, Any]:
    """The machine-readable form of the bench rows (`--json FILE`)."""
    return {
        "ranks": ranks,
        "backend": job["backend"],
        "warmup": job.get("warmup", 3),
        "iters": job.get("iters", 10),
        "time": "median over the timed steps of the slowest rank's step time, seconds",
        "units": {"size_bytes": "bytes", "algbw_GBps": "1e9 bytes/s", "busbw_GBps": "1e9 bytes/s"},
        "conventions": {"algbw": ALGBW_CONVENTION, "busbw": BUSBW_CONVENTION},
        "rows": [r.as_json() for r in rows],
    }


def write_json(path: str, document: dict[str, Any]) -> None:
    from coconet.core.program import CocoError

    try:
        Path(path).write_text(json.dumps(document, indent=1) + "\n")
    except OSError as e:
        raise CocoError(f"cannot write {path}: {e.strerror or e}") from None


def summarize(name: str, piece: np.ndarray) -> str:
    if piece.size == 0:
        return f"{name:>12}  {list(piece.shape)!s:>16}  {piece.dtype.name:>8}  (empty)"
    x = piece.astype(np.float64)
    return (
        f"{name:>12}  {list(piece.shape)!s:>16}  {piece.dtype.name:>8}  "
        f"min {x.min():>11.4g}  max {x.max():>11.4g}  mean {x.mean():>11.4g}  sum {x.sum():>13.6g}"
    )


def print_summary(
    program: Program, per_rank: Sequence[dict[str, np.ndarray]], backend: str
) -> None:
    print(f"@{program.name} on {len(per_rank)} rank(s), backend {backend}")
    for rank, outputs in enumerate(per_rank):
        print(f"rank {rank}:")
        for name, piece in outputs.items():
            print("  " + summarize(name, piece))


def job_programs(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The programs a job runs, in order: coco-bench's sweep lists one per size (`programs`:
    path, entry, meta for its rows); coco-run's job names one (`program`)."""
    if job.get("programs"):
        return list(job["programs"])
    return [
        {
            "path": job["program"],
            "entry": job.get("entry"),
            "numerics": job.get("numerics"),
            "meta": {},
        }
    ]


def run_job(job: dict[str, Any], comm, guard) -> int:
    from coconet.runtime.trace import (
        StepTracer,
        common_origin,
        load_nvtx,
        trace_document,
        write_trace,
    )

    rank, size = comm.Get_rank(), comm.Get_size()
    labels = [s["label"] for s in job["schedules"]]
    sweep = job.get("report") == "sweep"
    if sweep and rank == 0:
        print(sweep_header(job.get("title", "coco-bench"), labels), flush=True)
    tracer = None
    if job.get("trace"):
        nvtx = load_nvtx() if job["backend"] == "cuda" else None
        tracer = StepTracer(rank, origin_ns=common_origin(comm), nvtx=nvtx)
    rows: list[BenchRow] = []
    failures: list[str] = []
    title = "coconet"
    for entry in job_programs(job):
        title, problems = run_program(job, entry, comm, guard, tracer, rows, labels)
        failures += problems

    if rank == 0 and rows and not sweep:
        print_bench_table(
            rows, title, size, job["backend"], job.get("warmup", 3), job.get("iters", 10)
        )
    if rank == 0 and job.get("json"):
        write_json(job["json"], bench_document(job, rows, size))
    if tracer is not None:
        per_rank = comm.gather(tracer.events, root=0)
        if rank == 0:
            meta = {"program": title, "backend": job["backend"], "ranks": size}
            write_trace(job["trace"], trace_document(per_rank, meta))
            if not job.get("quiet_trace"):
                events = sum(len(e) for e in per_rank)
                print(f"trace: {events} step event(s) of {size} rank(s) in {job['trace']}")
    failed = comm.bcast(failures if rank == 0 else None, root=0)
    if failed:
        if rank == 0:
            guard.record("check", "; ".join(failed))
            for f in failed:
                print(f"coco-run: error: check failed: {f}", file=sys.stderr, flush=True)
        return 1
    return 0


def job_plan(
    program: Program,
    entry: str | None,
    spec: str | None,
    ranks: int,
    config: Any,
    nodes: Sequence[int],
    backend: str,
    scheduled: Program | None = None,
) -> Any:
    """`program` under schedule `spec`, lowered for the job: from the plan cache, where the
    launcher put it before launch (coco-run's `prepared_job`), so no rank schedules and lowers
    it again (a job's ranks started 0.2 s a schedule apart each). The key is the program's
    printed text (numerics default included) under a target of coco-run's own: `compile()`'s
    plans carry more (the written types) and never mix with these. `scheduled`: the caller's
    `apply_schedule(program, spec)`, lowered on a miss instead of scheduling again."""
    from coconet.compile import apply_schedule
    from coconet.lowering.lower_to_plan import lower
    from coconet.lowering.plan_cache import cached_plan, plan_key

    key = plan_key(
        program.print(), entry, spec or "", ranks, nodes, repr(config), f"coco-run:{backend}"
    )
    return cached_plan(
        key, lambda: lower(scheduled or apply_schedule(program, spec), ranks, config, nodes)
    ).value


def run_program(
    job: dict[str, Any],
    entry: dict[str, Any],
    comm,
    guard,
    tracer,
    rows: list[BenchRow],
    labels: list[str],
) -> tuple[str, list[str]]:
    """Every schedule of one program: lower, set up, run once (summary, check, output), and
    with `bench` time warm steps into `rows`. Returns the program's name and failed checks."""
    from coconet.compile import apply_schedule, make_backend
    from coconet.core.program import load
    from coconet.lowering.lower_to_plan import LaunchConfig
    from coconet.runtime import sim
    from coconet.runtime.executor import PlanRunner
    from coconet.runtime.symmetric import job_nodes
    from coconet.runtime.torch_comm import mpi_module_for

    rank, size = comm.Get_rank(), comm.Get_size()
    backend_name = job["backend"]
    verbose = job.get("verbose", False)
    program = load(entry["path"], entry.get("entry"))
    if entry.get("numerics"):  # coco-run --numerics: the module's default policy
        coco.set_numerics_default(program.module, entry["numerics"])
    given = V.load_arrays(job["inputs"]) if job.get("inputs") and rank == 0 else None
    config = LaunchConfig(**job["launch_config"]) if job.get("launch_config") else None
    bench = job.get("bench")
    # The collective size every schedule of this program shares (the bench rows' algbw).
    collective_size = program_size(program, size, comm) if bench else None
    # Gathering every rank's outputs costs a full copy to rank 0: only when something reads them.
    gather = not job.get("quiet") or job.get("check") or job.get("output")
    failures: list[str] = []
    saved = False
    # Where the ranks live: fused collectives spanning nodes lower hierarchically.
    nodes = job_nodes(comm, mpi_module_for(comm))
    # rounds > 1: the schedules' steps are timed in rounds, after every schedule is set up
    rounds = int(job.get("rounds", 1)) if bench else 1
    interleaved: list[_Timed] = []
    for sched in job["schedules"]:
        label, spec = sched["label"], sched.get("spec")
        t0 = time.perf_counter()
        # the program the oracle runs, which only rank 0 does (the others never read it)
        oracle = apply_schedule(program, spec) if rank == 0 else None
        plan = job_plan(
            program, entry.get("entry"), spec, size, config, nodes, backend_name, oracle
        )
        scheduled = oracle or program
        plan.cuda_source = guard.corrupt_source(plan.cuda_source)
        t_lower = time.perf_counter() - t0
        backend = make_backend(
            backend_name, comm, exact_collectives=job.get("exact_collectives", False)
        )
        runner = PlanRunner(plan, rank, backend, fault=guard.fault_hook)
        guard.watch(runner)
        t0 = time.perf_counter()
        runner.setup()
        t_setup = time.perf_counter() - t0
        with guard.waiting(f"the set-up of schedule {label}"):
            stats = comm.gather(
                (getattr(backend, "compiled", 0), getattr(backend, "cached", 0)), root=0
            )
        if rank == 0 and verbose:
            compiled = sum(s[0] for s in stats)
            cached = sum(s[1] for s in stats)
            print(
                f"[{label}] lowered in {t_lower:.2f} s, set up in {t_setup:.2f} s; kernel cache: "
                f"{compiled} compiled, {cached} loaded from cache ({size} rank(s))",
                flush=True,
            )

        logical = None
        reference_inputs: dict[str, np.ndarray] = {}  # rank 0's, which checks the outputs
        if rank == 0:
            logical = sim.prepare_inputs(scheduled, given, plan.grid_shape, job.get("seed", 0))
            reference_inputs = {k: v.copy() for k, v in logical.items()}
        with guard.waiting(f"the inputs of schedule {label}"):
            pieces = scatter_inputs(comm, plan, logical)
        runner.check_inputs(pieces, lambda a: a.shape, lambda a: a.dtype)
        runner.set_inputs(pieces)
        guard.before_run()
        if tracer is not None and not bench:  # without --bench, trace this one run
            tracer.context = {"program": program.name, "schedule": label}
            runner.trace(tracer)
        runner.run()
        runner.trace(None)
        per_rank = None
        if gather:
            mine = {name: backend.read(buf) for name, buf in plan.outputs.items()}
            if guard.corrupts_outputs() and mine:  # tests of --check (COCONET_FAULT=R:corrupt)
                first = next(iter(mine))
                mine[first] = (mine[first].astype(np.float64) + 0.5).astype(mine[first].dtype)
            with guard.waiting(f"the outputs of schedule {label}"):
                per_rank = gather_outputs(comm, plan, mine)

        if rank == 0 and per_rank is not None:
            title = "" if len(job["schedules"]) == 1 and not spec else f" [{label}]"
            if not job.get("quiet"):
                print_summary(scheduled, per_rank, backend_name + title)
            checking = job.get("check")
            problems: list[str] = []
            if checking:
                problems = check_per_rank(label, scheduled, reference_inputs, per_rank, size)
                failures += problems
            if (job.get("output") and not saved) or (checking and spec and not problems):
                # Assembling verifies that ranks sharing a value agree (skipped when the
                # per-rank check already found where they do not).
                outputs = {
                    name: V.assemble(
                        [p[name] for p in per_rank], buf.type, plan.grid_shape, check=not problems
                    )
                    for name, buf in plan.outputs.items()
                }
                if job.get("output") and not saved:
                    written = V.save_arrays(job["output"], outputs)
                    print(f"saved {len(outputs)} output(s) to {written}")
                    saved = True
                if checking and spec and not problems:
                    failures += check_logical(label, program, reference_inputs, outputs, size)
        with guard.waiting(f"the end of the first run of schedule {label}"):
            comm.Barrier()

        if bench:
            timing = _Timed(label, spec, plan, runner)
            for _ in range(job.get("warmup", 3)):
                guard.before_run()
                runner.run()
            if rounds > 1:  # timed below, in rounds, beside the schedules still to come
                interleaved.append(timing)
            else:
                timing.time_steps(comm, guard, tracer, program.name, job.get("iters", 10))
                rows.append(
                    timing.row(comm, guard, program.name, entry, backend_name, collective_size)
                )
                if rank == 0 and job.get("report") == "sweep":
                    print(sweep_row(rows[-1], labels), flush=True)
        if not (bench and rounds > 1):
            runner.close()
        if rank == 0 and job.get("progress"):
            print(PROGRESS_MARKER, flush=True)
    if interleaved:
        # Every schedule times `iters` steps per round, in an order that rotates each round:
        # what the host does meanwhile (other jobs, frequency changes) falls on all of them
        # alike instead of on whichever schedule ran during it.
        iters = job.get("iters", 10)
        for r in range(rounds):
            for k in range(len(interleaved)):
                timing = interleaved[(r + k) % len(interleaved)]
                timing.time_steps(comm, guard, tracer, program.name, iters)
        for timing in interleaved:
            rows.append(timing.row(comm, guard, program.name, entry, backend_name, collective_size))
            timing.runner.close()
    return program.name, failures


@dataclass
class _Timed:
    """One schedule's timed steps (slowest rank per step) while it is benchmarked."""

    label: str
    spec: str | None
    plan: Any
    runner: Any
    times: list[float] = field(default_factory=list)

    def time_steps(self, comm, guard, tracer, program: str, iters: int) -> None:
        for _ in range(iters):
            i = len(self.times)
            guard.before_run()
            if tracer is not None:
                tracer.context = {"program": program, "schedule": self.label, "iteration": i}
                self.runner.trace(tracer)
            with guard.waiting(f"the start of bench iteration {i} of schedule {self.label}"):
                comm.Barrier()
            t0 = time.perf_counter()
            self.runner.run()
            dt = time.perf_counter() - t0
            self.runner.trace(None)
            with guard.waiting(f"the timing of bench iteration {i} of schedule {self.label}"):
                self.times.append(comm.allreduce(dt, op=_max_op(comm)))

    def row(self, comm, guard, program: str, entry, backend: str, size) -> BenchRow:
        """The schedule's bench row: median and min of its steps, and its plan's traffic."""
        from coconet.lowering.plan import Launch
        from coconet.runtime.executor import plan_traffic

        with guard.waiting(f"the bench summary of schedule {self.label}"):
            traffic = comm.allreduce(plan_traffic(self.plan, comm.Get_rank()), op=_max_op(comm))
        return BenchRow(
            self.label,
            statistics.median(self.times),
            min(self.times),
            traffic,
            len(self.plan.steps),
            sum(isinstance(s, Launch) for s in self.plan.steps),
            size_bytes=size,
            times_s=self.times,
            meta={
                "program": program,
                **entry.get("meta", {}),
                "pipeline": self.spec,
                "ranks": comm.Get_size(),
                "backend": backend,
            },
        )


def _max_op(comm):
    from coconet.runtime.torch_comm import mpi_module_for

    return mpi_module_for(comm).MAX


def check_per_rank(label, scheduled, inputs, per_rank, size) -> list[str]:
    """Rank 0: every rank's pieces against the sim running the scheduled program."""
    from coconet.core.path_tolerances import path_tolerances
    from coconet.core.tolerances import TOLERANCES
    from coconet.runtime import sim
    from coconet.runtime.check import compare_outputs

    ref = sim.run(scheduled, {k: v.copy() for k, v in inputs.items()}, ranks=size, inplace=False)
    paths = path_tolerances(sim.as_program(scheduled), TOLERANCES)
    result = compare_outputs(per_rank, ref.per_rank, paths)
    problems = [f"[{label}] {d}" for d in result.differences]
    if not problems:
        how = (
            "bit-exact"
            if result.bit_exact
            else f"within tolerance, max abs error {result.max_abs_error:.3g}"
        )
        print(f"check [{label}]: every rank's outputs match the sim oracle ({how})", flush=True)
    return problems


def check_logical(label, program, inputs, outputs, size) -> list[str]:
    """Rank 0: the logical outputs of a scheduled run against the program as written."""
    from coconet.runtime import sim
    from coconet.runtime.check import compare_piece

    original = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=size, inplace=False)
    problems = []
    for name, want in original.outputs.items():
        if name not in outputs:
            continue
        d, _bits, _err = compare_piece(name, -1, outputs[name], want)
        if d is not None:
            problems.append(
                f"[{label}] output '{name}' (logical value) differs from the program as written: "
                f"max abs error {d.max_abs_error:.6g}"
            )
    return problems


def run_job_guarded(job: dict[str, Any], comm, guard) -> int:
    """`run_job`, where every failure ends the whole job with its reason (guard.fail)."""
    code = 1
    try:
        guard.step_timeout = job.get("step_timeout") or None
        code = run_job(job, comm, guard)
    except BaseException as e:
        if isinstance(e, SystemExit) and not e.code:
            code = 0
        else:
            guard.fail(e)
    guard.close()
    sys.stdout.flush()
    return code


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    from coconet.runtime.cpu import apply_rank_env_defaults

    apply_rank_env_defaults()
    from mpi4py import MPI

    from coconet.runtime.failures import FailureGuard

    comm = MPI.COMM_WORLD
    guard = FailureGuard(comm, prefix="coco-run")
    job: dict[str, Any] = {}
    try:
        job = json.loads(Path(argv[0]).read_text())
    except BaseException as e:
        guard.fail(e)
    sys.exit(run_job_guarded(job, comm, guard))


if __name__ == "__main__":
    main()
