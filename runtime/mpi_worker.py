"""One rank of a `coco-run --backend cpu|cuda` job: `python -m coconet.runtime.mpi_worker JOB`.

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

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class BenchRow:
    label: str
    median_s: float
    min_s: float
    bytes_per_rank: int
    steps: int
    launches: int


def _raw(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def scatter_inputs(comm, plan, logical: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Rank 0 holds the logical inputs; every rank gets its piece (raw bytes: MPI has no bf16)."""
    from coconet.runtime import values as V
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
            arr = np.empty(buf.shape, dtype=buffer_dtype(buf))
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
            arr = np.empty(buf.shape, dtype=buffer_dtype(buf))
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


def print_bench_table(
    rows: list[BenchRow], program: str, ranks: int, backend: str, warmup: int, iters: int
) -> None:
    print(
        f"\nbench @{program} on {ranks} rank(s), backend {backend}: median of {iters} step(s) "
        f"after {warmup} warm-up, slowest rank per step"
    )
    width = max([len("schedule")] + [len(r.label) for r in rows])
    print(
        f"  {'schedule':<{width}}  {'median':>10}  {'min':>10}  {'bytes/rank':>12}  {'steps':>5}  {'launches':>8}"
    )
    for r in rows:
        print(
            f"  {r.label:<{width}}  {r.median_s * 1e3:>8.3f}ms  {r.min_s * 1e3:>8.3f}ms  "
            f"{_fmt_bytes(r.bytes_per_rank):>12}  {r.steps:>5}  {r.launches:>8}"
        )
    sys.stdout.flush()


def run_job(job: dict[str, Any], comm, guard) -> int:
    from coconet.lowering.lower_to_plan import LaunchConfig, lower
    from coconet.lowering.plan import Launch
    from coconet.runtime import sim
    from coconet.runtime import values as V
    from coconet.runtime.executor import PlanRunner, plan_traffic
    from coconet.tools.coco_run import print_summary, read_inputs

    from coconet.compile import apply_schedule, make_backend
    from coconet.program import load

    rank, size = comm.Get_rank(), comm.Get_size()
    backend_name = job["backend"]
    verbose = job.get("verbose", False)
    program = load(job["program"], job.get("entry"))
    given = read_inputs(job["inputs"]) if job.get("inputs") and rank == 0 else None
    config = LaunchConfig(**job["launch_config"]) if job.get("launch_config") else None
    rows: list[BenchRow] = []
    failures: list[str] = []
    saved = False
    for sched in job["schedules"]:
        label, spec = sched["label"], sched.get("spec")
        t0 = time.perf_counter()
        scheduled = apply_schedule(program, spec)
        plan = lower(scheduled, size, config)
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
        if rank == 0:
            logical = sim.prepare_inputs(scheduled, given, plan.grid_shape, job.get("seed", 0))
            reference_inputs = {k: v.copy() for k, v in logical.items()}
        pieces = scatter_inputs(comm, plan, logical)
        runner.check_inputs(pieces, lambda a: a.shape, lambda a: a.dtype)
        runner.set_inputs(pieces)
        guard.before_run()
        runner.run()
        mine = {name: backend.read(buf) for name, buf in plan.outputs.items()}
        if guard.corrupts_outputs() and mine:  # tests of --check (COCONET_FAULT=R:corrupt)
            first = next(iter(mine))
            mine[first] = (mine[first].astype(np.float64) + 0.5).astype(mine[first].dtype)
        per_rank = gather_outputs(comm, plan, mine)

        if rank == 0:
            assert per_rank is not None
            title = "" if len(job["schedules"]) == 1 and not spec else f" [{label}]"
            if not job.get("quiet"):
                print_summary(scheduled, per_rank, backend_name + title)
            checking = job.get("check")
            problems: list[str] = []
            if checking:
                problems = check_per_rank(label, scheduled, reference_inputs, per_rank, size)
                failures += problems
            if job.get("output") and not saved or checking and spec and not problems:
                # Assembling verifies that ranks sharing a value agree (skipped when the
                # per-rank check already found where they do not).
                outputs = {
                    name: V.assemble(
                        [p[name] for p in per_rank], buf.type, plan.grid_shape, check=not problems
                    )
                    for name, buf in plan.outputs.items()
                }
                if job.get("output") and not saved:
                    np.savez(job["output"], **outputs)
                    print(f"saved {len(outputs)} output(s) to {job['output']}")
                    saved = True
                if checking and spec and not problems:
                    failures += check_logical(label, program, reference_inputs, outputs, size)
        comm.Barrier()

        if job.get("bench"):
            warmup, iters = job.get("warmup", 3), job.get("iters", 10)
            for _ in range(warmup):
                guard.before_run()
                runner.run()
            times = []
            for _ in range(iters):
                guard.before_run()
                comm.Barrier()
                t0 = time.perf_counter()
                runner.run()
                dt = time.perf_counter() - t0
                times.append(comm.allreduce(dt, op=_max_op(comm)))
            traffic = comm.allreduce(plan_traffic(plan, rank), op=_max_op(comm))
            rows.append(
                BenchRow(
                    label,
                    statistics.median(times),
                    min(times),
                    traffic,
                    len(plan.steps),
                    sum(isinstance(s, Launch) for s in plan.steps),
                )
            )
        runner.close()

    if rank == 0 and rows:
        print_bench_table(
            rows, program.name, size, backend_name, job.get("warmup", 3), job.get("iters", 10)
        )
    failed = comm.bcast(failures if rank == 0 else None, root=0)
    if failed:
        if rank == 0:
            guard.record("check", "; ".join(failed))
            for f in failed:
                print(f"coco-run: error: check failed: {f}", file=sys.stderr, flush=True)
        return 1
    return 0


def _max_op(comm):
    from coconet.runtime.torch_comm import mpi_module_for

    return mpi_module_for(comm).MAX


def check_per_rank(label, scheduled, inputs, per_rank, size) -> list[str]:
    """Rank 0: every rank's pieces against the sim running the scheduled program."""
    from coconet.runtime import sim
    from coconet.runtime.check import compare_outputs

    ref = sim.run(scheduled, {k: v.copy() for k, v in inputs.items()}, ranks=size, inplace=False)
    result = compare_outputs(per_rank, ref.per_rank)
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
    except BaseException as e:  # noqa: BLE001 - every failure ends the whole job, with its reason
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
    from coconet.runtime.failures import FailureGuard
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    guard = FailureGuard(comm, prefix="coco-run")
    job: dict[str, Any] = {}
    try:
        job = json.loads(Path(argv[0]).read_text())
    except BaseException as e:  # noqa: BLE001 - an unreadable job ends the whole job
        guard.fail(e)
    sys.exit(run_job_guarded(job, comm, guard))


if __name__ == "__main__":
    main()
