"""`coco-run`: run a coconet program on N ranks and summarize what every rank holds.

    coco-run examples/adam.mlir --np 4 --backend sim
    coco-run examples/adam.py --np 4 --inputs in.npz --output out.npz
    coco-run examples/adam.mlir --np 4 --backend cpu --check --bench \
        -p ar-c=coco-fuse -p rs-c-ag=coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v}

Backends: `sim` (the reference interpreter, in this process), `cpu` (N MPI processes started
with the mpich wheel's `mpiexec`; host-compiled kernels, MPI collectives, shared-memory
windows), `cuda` (N MPI processes, one GPU each). Default: cuda when a GPU is visible, else cpu.

Inputs are seeded random logical values (runtime/values.py) unless `--inputs` names an .npz
with one array per argument. `--schedule NAME` (a named schedule) and `-p [LABEL=]PIPELINE`
may repeat: each is run in turn (one row of the `--bench` table each). `--check` compares every
rank's outputs with the sim oracle (exact for integers, per-dtype tolerance for floats) and
fails naming the output, the rank and the error. `--bench` times warm steps (3 warm-up, 10
timed, barrier-synchronized, the slowest rank's time; median) and prints the bytes each rank
sends per step. Every user-facing problem ends in one `coco-run: error:` line and exit status
1 (2 for bad command-line usage), never a traceback; when a rank fails, the line names it.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from coconet.program import CocoError, Program, load

BACKENDS = ("sim", "cpu", "cuda")


def _schedule(value: str) -> tuple[str, str]:
    return ("schedule", value)


def _pipeline(value: str) -> tuple[str, str]:
    return ("pipeline", value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coco-run",
        description="Run a coconet program (.mlir or .py) on N ranks.",
    )
    p.add_argument("program", help="a .mlir file, or a .py file defining `program` or `build()`")
    p.add_argument(
        "--np",
        dest="ranks",
        type=int,
        default=None,
        help="number of ranks (default 1; under torchrun, its WORLD_SIZE: each torchrun process "
        "is one rank)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="sim: the reference interpreter; cpu: MPI ranks; cuda: MPI ranks with one GPU "
        "each (default: cuda when a GPU is visible, else cpu)",
    )
    p.add_argument("--entry", help="the function to run (default: the module's first)")
    p.add_argument("--inputs", help=".npz file with one logical array per argument")
    p.add_argument("--output", help="save every output's logical value to this .npz")
    p.add_argument("--seed", type=int, default=0, help="seed of generated inputs (default 0)")
    p.add_argument(
        "-p",
        "--passes",
        dest="schedules",
        action="append",
        type=_pipeline,
        default=[],
        metavar="[LABEL=]PIPELINE",
        help="pass pipeline to apply before running (repeatable: one run per pipeline)",
    )
    p.add_argument(
        "--schedule",
        dest="schedules",
        action="append",
        type=_schedule,
        metavar="NAME",
        help="named schedule to apply (repeatable: one run per schedule)",
    )
    p.add_argument(
        "--check", action="store_true", help="compare every rank's outputs with the sim oracle"
    )
    p.add_argument("--bench", action="store_true", help="time warm steps and print a table")
    p.add_argument("--warmup", type=int, default=3, help="--bench warm-up steps (default 3)")
    p.add_argument("--iters", type=int, default=10, help="--bench timed steps (default 10)")
    p.add_argument(
        "--exact-collectives",
        action="store_true",
        help="cpu/cuda: reduce f32/f64 by exchanging pieces and combining them in rank order "
        "(bit-exact with the oracle) instead of the MPI/NCCL reductions",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="cpu/cuda: stop the whole job after this many seconds",
    )
    p.add_argument(
        "--step-timeout",
        type=float,
        default=300.0,
        help="cpu/cuda: abort when a rank makes no progress in one plan step for this many "
        "seconds (default 300; 0 disables)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="report lowering, setup and kernel-cache counts",
    )
    p.add_argument(
        "-q", "--quiet", action="store_true", help="leave out the per-rank output summaries"
    )
    return p


def schedule_label(kind: str, value: str) -> tuple[str, str | None]:
    """(label, spec) of one --schedule / -p value; `-p NAME=PIPELINE` labels a pipeline."""
    if kind == "pipeline" and "=" in value:
        head, rest = value.split("=", 1)
        if "{" not in head and "," not in head and not is_pipeline(head):
            return head.strip(), rest.strip() or None
    if not value:
        return "as written", None
    return value, value


def read_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise CocoError(f"no such inputs file: {path}") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise CocoError(f"cannot read inputs from {path}: {e}") from None


def apply_pipeline(program: Program, pipeline: str) -> Program:
    """A copy of `program` with the pass pipeline applied (see coconet.compile)."""
    from coconet.compile import apply_pipeline as apply

    return apply(program, pipeline)


def is_pipeline(spec: str) -> bool:
    from coconet.compile import is_pipeline as check

    return check(spec)


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


def run(args: argparse.Namespace) -> int:
    from coconet.runtime.torch_comm import torchrun_world

    from coconet.compile import default_backend, require_gpu

    torch_world = torchrun_world()
    under_torchrun = torch_world is not None and torch_world[1] > 1
    if under_torchrun:
        assert torch_world is not None
        if args.ranks not in (None, torch_world[1]):
            raise CocoError(
                f"--np {args.ranks}, but torchrun started {torch_world[1]} process(es): each is "
                "one rank (leave --np out under torchrun)"
            )
        args.ranks = torch_world[1]
    args.ranks = 1 if args.ranks is None else args.ranks
    if args.ranks < 1:
        raise CocoError(f"--np must be at least 1, got {args.ranks}")
    backend = args.backend or default_backend()
    if backend == "cuda":
        require_gpu()
    schedules = [schedule_label(k, v) for k, v in args.schedules] or [("as written", None)]
    program = load(args.program, args.entry)
    if backend == "sim":
        return run_sim(args, program, schedules)
    if under_torchrun:
        return run_in_torchrun(args, backend, program, schedules)
    return run_mpi(args, backend, program, schedules)


def run_sim(
    args: argparse.Namespace, program: Program, schedules: list[tuple[str, str | None]]
) -> int:
    import time

    from coconet.runtime.check import compare_piece
    from coconet.runtime.sim import run as sim_run

    from coconet.compile import apply_schedule

    inputs = read_inputs(args.inputs) if args.inputs else None
    bench_rows = []
    failures = []
    saved = False
    for label, spec in schedules:
        scheduled = apply_schedule(program, spec)
        result = sim_run(scheduled, inputs, ranks=args.ranks, seed=args.seed, inplace=False)
        title = "" if len(schedules) == 1 and spec is None else f" [{label}]"
        if not args.quiet:
            print_summary(scheduled, result.per_rank, "sim" + title)
        if args.output and not saved:
            try:
                np.savez(args.output, **result.outputs)
            except OSError as e:
                raise CocoError(f"cannot write {args.output}: {e}") from None
            print(f"saved {len(result.outputs)} output(s) to {args.output}")
            saved = True
        if args.check:
            if spec is None:
                print(f"check [{label}]: the sim backend is the oracle")
            else:
                original = sim_run(program, result.inputs, ranks=args.ranks, inplace=False)
                bad = [
                    name
                    for name, want in original.outputs.items()
                    if name in result.outputs
                    and compare_piece(name, -1, result.outputs[name], want)[0] is not None
                ]
                if bad:
                    failures.append(
                        f"[{label}] output(s) {', '.join(bad)} differ from the program as written"
                    )
                else:
                    print(f"check [{label}]: outputs match the program as written")
        if args.bench:
            given = {k: v.copy() for k, v in result.inputs.items()}
            for _ in range(args.warmup):
                sim_run(scheduled, given, ranks=args.ranks, inplace=False)
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                sim_run(scheduled, given, ranks=args.ranks, inplace=False)
                times.append(time.perf_counter() - t0)
            bench_rows.append((label, sorted(times)[len(times) // 2], min(times)))
    if bench_rows:
        print(
            f"\nbench @{program.name} on {args.ranks} rank(s), backend sim (all ranks in one process)"
        )
        width = max(len(r[0]) for r in bench_rows + [("schedule", 0, 0)])
        print(f"  {'schedule':<{width}}  {'median':>10}  {'min':>10}")
        for label, med, low in bench_rows:
            print(f"  {label:<{width}}  {med * 1e3:>8.3f}ms  {low * 1e3:>8.3f}ms")
    if failures:
        raise CocoError("check failed: " + "; ".join(failures))
    return 0


def run_mpi(
    args: argparse.Namespace,
    backend: str,
    program: Program,
    schedules: list[tuple[str, str | None]],
) -> int:
    """Check everything that can be checked here (schedules apply, the program fits the grid,
    given inputs fit the signature), then run the job on `--np` MPI processes."""
    from coconet.runtime.launcher import launch

    job = prepared_job(args, backend, program, schedules)
    result = launch(job, args.ranks, timeout=args.timeout)
    if result.returncode != 0:
        raise CocoError(result.message or f"the job failed with status {result.returncode}")
    if args.verbose and result.stderr.strip():
        sys.stderr.write(result.stderr)
    return 0


def run_in_torchrun(
    args: argparse.Namespace,
    backend: str,
    program: Program,
    schedules: list[tuple[str, str | None]],
) -> int:
    """This process is one rank of a torchrun job: run the job here, over torch.distributed
    (no mpiexec). A failing rank ends the job through torchrun (it stops the others)."""
    from coconet.runtime.cpu import apply_rank_env_defaults
    from coconet.runtime.failures import FailureGuard
    from coconet.runtime.mpi_worker import run_job_guarded
    from coconet.runtime.torch_comm import TorchComm

    apply_rank_env_defaults()
    job = prepared_job(args, backend, program, schedules)
    comm = TorchComm.world()
    return run_job_guarded(job, comm, FailureGuard(comm, prefix="coco-run"))


def prepared_job(
    args: argparse.Namespace,
    backend: str,
    program: Program,
    schedules: list[tuple[str, str | None]],
) -> dict:
    """The job description every rank runs, once everything checkable here is checked."""
    from coconet.lowering.lower_to_plan import lower
    from coconet.runtime.sim import prepare_inputs

    from coconet.compile import apply_schedule

    given = read_inputs(args.inputs) if args.inputs else None
    for label, spec in schedules:
        scheduled = apply_schedule(program, spec)
        plan = lower(scheduled, args.ranks)
        if given is not None:
            prepare_inputs(scheduled, given, plan.grid_shape, args.seed)
    if args.output:
        try:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CocoError(f"cannot write {args.output}: {e}") from None
    job = {
        "program": str(Path(args.program).resolve()),
        "entry": args.entry,
        "backend": backend,
        "schedules": [{"label": label, "spec": spec} for label, spec in schedules],
        "inputs": str(Path(args.inputs).resolve()) if args.inputs else None,
        "output": str(Path(args.output).resolve()) if args.output else None,
        "seed": args.seed,
        "check": args.check,
        "bench": args.bench,
        "warmup": args.warmup,
        "iters": args.iters,
        "verbose": args.verbose,
        "quiet": args.quiet,
        "exact_collectives": args.exact_collectives,
        "step_timeout": args.step_timeout,
    }
    return job


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        sys.exit(run(args))
    except CocoError as e:
        print(f"coco-run: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("coco-run: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
