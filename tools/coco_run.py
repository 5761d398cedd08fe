"""`coco-run`: run a coconet program on N ranks and summarize what every rank holds.

    coco-run examples/adam.mlir --np 4 --backend sim
    coco-run examples/adam.py --np 4 --inputs in.npz --output out.npz
    coco-run examples/adam.mlir --np 4 --backend cpu --check --bench \
        -p ar-c=coco-fuse -p rs-c-ag=coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v}

Backends: `sim` (the reference interpreter, in this process), `cpu` (N MPI processes started
with the mpich wheel's `mpiexec`; host-compiled kernels, MPI collectives, shared-memory
windows), `cuda` (N MPI processes, one GPU each). Default: cuda when a GPU is visible, else cpu.

Inputs are seeded random logical values (core/values.py) unless `--inputs` names an .npz
with one array per argument. `--schedule NAME` (a named schedule, or `auto`: the one the cost
model ranks fastest on `--profile`, coconet/tune/autotune.py) and `-p [LABEL=]PIPELINE` may repeat:
each is run in turn (one row of the `--bench` table each). `--check` compares every
rank's outputs with the sim oracle (exact for integers, per-dtype tolerance for floats) and
fails naming the output, the rank and the error. `--bench` times warm steps (3 warm-up, 10
timed, barrier-synchronized, the slowest rank's time; median) and prints, per schedule, the
program's collective size, algbw and busbw in nccl-tests' conventions (tools/rank_job.py
ALGBW_CONVENTION, BUSBW_CONVENTION) and the bytes each rank sends per step; `--json FILE`
writes the rows. `--trace FILE.json` (cpu/cuda) writes a Chrome/Perfetto timeline of every
rank's plan steps on both streams (runtime/trace.py): of the timed steps with `--bench`, else
of the one run. Every user-facing problem ends in one `coco-run: error:` line and exit status
1 (2 for bad command-line usage), never a traceback; when a rank fails, the line names it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from coconet.core import env
from coconet.core.program import CocoError, Program, load
from coconet.core.values import load_arrays
from coconet.dialects import coco
from coconet.tools.rank_job import add_timeout_options, job_description, print_summary, tool_main

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
    p.add_argument(
        "--numerics",
        choices=("exact", "fast"),
        default=None,
        help="the numerics policy of the transcendental ops that name none of their own "
        "(default: the module's coco.numerics, else exact; docs/usage.md)",
    )
    p.add_argument(
        "--inputs",
        help=".npz file with one logical array per argument; bf16 and fp8 arrays as their "
        "uint16 / uint8 bits, named in a '__coconet_dtypes__' entry: "
        "np.savez(f, x=x.view(np.uint16), "
        '__coconet_dtypes__=np.array(\'{"x": "bf16"}\')) (--output writes the same)',
    )
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
        help="named schedule to apply (repeatable: one run per schedule); 'auto': the "
        "schedule the cost model ranks fastest for --np ranks on --profile "
        "(coconet/tune/autotune.py)",
    )
    p.add_argument(
        "--profile",
        metavar="NAME|FILE.json",
        default=None,
        help="--schedule auto: the machine profile to rank schedules on: 'cpu' (this host, "
        "measured once per rank count and cached; the default for the cpu and sim backends), "
        "a published GPU node (dgx2-v100, dgx-a100, dgx-h100, dgx-h200), or a profile's JSON",
    )
    p.add_argument(
        "--check", action="store_true", help="compare every rank's outputs with the sim oracle"
    )
    p.add_argument("--bench", action="store_true", help="time warm steps and print a table")
    p.add_argument("--warmup", type=int, default=3, help="--bench warm-up steps (default 3)")
    p.add_argument("--iters", type=int, default=10, help="--bench timed steps (default 10)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="--bench over several schedules: time --iters steps of each per round, the "
        "schedules taking turns, for this many rounds (default 1: one schedule after another)",
    )
    p.add_argument(
        "--json",
        metavar="FILE",
        help="--bench: also write every row (times, size, algbw, busbw, bytes/rank) as JSON",
    )
    p.add_argument(
        "--trace",
        metavar="FILE.json",
        help="cpu/cuda: write a Chrome/Perfetto trace-event timeline of every rank's plan "
        "steps, one track per rank and stream (the timed steps with --bench, else the run)",
    )
    p.add_argument(
        "--exact-collectives",
        action="store_true",
        help="cpu/cuda: reduce f32/f64 by exchanging pieces and combining them in rank order "
        "(bit-exact with the oracle) instead of the MPI/NCCL reductions",
    )
    add_timeout_options(p)
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


def resolve_auto(
    args: argparse.Namespace,
    backend: str,
    program: Program,
    schedules: list[tuple[str, str | None]],
    comm=None,
) -> list[tuple[str, str | None]]:
    """Each `--schedule auto` replaced by the schedule the cost model ranks fastest for
    `--np` ranks (labelled `auto=NAME`), with one line saying what it picked and why; with
    --verbose, the top of the ranking too. With `comm` (a torchrun job) every rank calls this:
    the profile is measured on the job, and rank 0 reports."""
    from coconet.tune.autotune import is_auto, rank_schedules, resolve_profile

    if not any(is_auto(spec) for _label, spec in schedules):
        if args.profile:
            raise CocoError("--profile is for --schedule auto: add --schedule auto")
        return schedules
    quiet = comm is not None and comm.Get_rank() != 0
    profile = resolve_profile(
        args.profile,
        backend,
        args.ranks,
        comm,
        log=None if quiet else lambda m: print(f"coco-run: {m}", flush=True),
    )
    ranking = rank_schedules(program, args.ranks, profile)
    best = ranking.best
    if not quiet:
        text = ranking.explain() if args.verbose else ranking.headline()
        print("coco-run: " + text, flush=True)
    return [
        (f"auto={best.name}", best.spec) if is_auto(spec) else (label, spec)
        for label, spec in schedules
    ]


def check_bench_options(args: argparse.Namespace, backend: str) -> None:
    """--warmup/--iters/--json/--trace make sense, and their files can be written: refused
    here, before anything is launched, rather than by rank 0 after the whole run."""
    if args.warmup < 0:
        raise CocoError(f"--warmup must be at least 0, got {args.warmup}")
    if args.seed < 0:
        raise CocoError(f"--seed must be at least 0, got {args.seed}")
    if args.iters < 1:
        raise CocoError(f"--iters must be at least 1, got {args.iters}")
    if args.rounds < 1:
        raise CocoError(f"--rounds must be at least 1, got {args.rounds}")
    if args.rounds > 1 and not args.bench:
        raise CocoError("--rounds times --bench steps: add --bench")
    if args.json and not args.bench:
        raise CocoError("--json writes the --bench rows: add --bench")
    if args.trace and backend == "sim":
        raise CocoError(
            "--trace times the steps of a lowered plan: use --backend cpu or cuda (the sim "
            "backend interprets the program and has no plan steps or streams)"
        )
    if args.json:
        args.json = writable_path(args.json, "the JSON rows")
    if args.trace:
        args.trace = writable_path(args.trace, "the trace")


def writable_path(path: str, what: str) -> str:
    """The absolute path of an output file once it is known to be writable (its folder is
    created if missing); else one CocoError naming it. A file that did not exist is removed
    again: the job writes it at the end."""
    p = Path(path).expanduser().absolute()
    if p.is_dir():
        raise CocoError(f"cannot write {what} to {path}: it is a directory")
    folder = next(a for a in p.parents if a.exists())
    if not folder.is_dir():
        raise CocoError(f"cannot write {what} to {path}: {folder} is not a directory")
    existed = p.exists()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a"):
            pass
        if not existed:
            p.unlink()
    except OSError as e:
        raise CocoError(f"cannot write {what} to {path}: {e.strerror or e}") from None
    return str(p)


def apply_pipeline(program: Program, pipeline: str) -> Program:
    """A copy of `program` with the pass pipeline applied (see coconet.compile)."""
    from coconet.compile import apply_pipeline as apply

    return apply(program, pipeline)


def is_pipeline(spec: str) -> bool:
    from coconet.compile import is_pipeline as check

    return check(spec)


def job_ranks(requested: int | None, default: int) -> tuple[int, bool]:
    """(the job's rank count, whether this process is one rank of a torchrun job): under
    torchrun the rank count is torchrun's, and an --np that disagrees is refused."""
    from coconet.runtime.torch_comm import torchrun_world

    torch_world = torchrun_world()
    under_torchrun = torch_world is not None and torch_world[1] > 1
    if under_torchrun:
        assert torch_world is not None
        if requested not in (None, torch_world[1]):
            raise CocoError(
                f"--np {requested}, but torchrun started {torch_world[1]} process(es): each is "
                "one rank (leave --np out under torchrun)"
            )
        requested = torch_world[1]
    ranks = default if requested is None else requested
    if ranks < 1:
        raise CocoError(f"--np must be at least 1, got {ranks}")
    return ranks, under_torchrun


def run(args: argparse.Namespace) -> int:
    from coconet.compile import default_backend, require_gpu

    args.ranks, under_torchrun = job_ranks(args.ranks, default=1)
    backend = args.backend or default_backend()
    if backend == "cuda":
        require_gpu()
    check_bench_options(args, backend)
    schedules = [schedule_label(k, v) for k, v in args.schedules] or [("as written", None)]
    program = load(args.program, args.entry)
    if args.numerics:  # the ops' own policies still win (docs/usage.md)
        coco.set_numerics_default(program.module, args.numerics)
    if not under_torchrun:  # under torchrun the ranks resolve it together (run_in_torchrun)
        schedules = resolve_auto(args, backend, program, schedules)
    if backend == "sim":
        return run_sim(args, program, schedules)
    if under_torchrun:
        return run_in_torchrun(args, backend, program, schedules)
    return run_mpi(args, backend, program, schedules)


def run_sim(
    args: argparse.Namespace, program: Program, schedules: list[tuple[str, str | None]]
) -> int:
    import time

    from coconet.compile import apply_schedule
    from coconet.runtime.check import compare_piece
    from coconet.runtime.sim import run as sim_run
    from coconet.tools.rank_job import BenchRow, bench_document, program_size, write_json

    inputs = load_arrays(args.inputs) if args.inputs else None
    bench_rows: list[BenchRow] = []
    collective_size = program_size(program, args.ranks) if args.bench else None
    failures = []
    saved = False
    for label, spec in schedules:
        scheduled = apply_schedule(program, spec)
        result = sim_run(scheduled, inputs, ranks=args.ranks, seed=args.seed, inplace=False)
        title = "" if len(schedules) == 1 and spec is None else f" [{label}]"
        if not args.quiet:
            print_summary(scheduled, result.per_rank, "sim" + title)
        if args.output and not saved:
            from coconet.core.values import save_arrays

            written = save_arrays(args.output, result.outputs)
            print(f"saved {len(result.outputs)} output(s) to {written}")
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
            bench_rows.append(sim_bench_row(label, spec, scheduled, times, collective_size, args))
    if bench_rows:
        from coconet.tools.rank_job import print_bench_table

        print_bench_table(
            bench_rows,
            program.name,
            args.ranks,
            "sim",
            args.warmup,
            args.iters,
            timing="every rank in this process",
        )
        if args.json:
            job = {"backend": "sim", "warmup": args.warmup, "iters": args.iters}
            write_json(args.json, bench_document(job, bench_rows, args.ranks))
    if failures:
        raise CocoError("check failed: " + "; ".join(failures))
    return 0


def sim_bench_row(
    label: str,
    spec: str | None,
    scheduled: Program,
    times: list[float],
    collective_size: int | None,
    args: argparse.Namespace,
):
    """A --bench row of the sim backend: its times, with the bytes/rank, steps and launches of
    the plan the cpu/cuda backends would run (0 when the program does not lower)."""
    import statistics

    from coconet.lowering.lower_to_plan import lower
    from coconet.lowering.plan import Launch
    from coconet.runtime.executor import plan_traffic
    from coconet.tools.rank_job import BenchRow

    try:
        plan = lower(scheduled, args.ranks)
    except CocoError:
        plan = None
    return BenchRow(
        label,
        statistics.median(times),
        min(times),
        max(plan_traffic(plan, r) for r in range(args.ranks)) if plan else 0,
        len(plan.steps) if plan else 0,
        sum(isinstance(s, Launch) for s in plan.steps) if plan else 0,
        size_bytes=collective_size,
        times_s=times,
        meta={
            "program": scheduled.name,
            "pipeline": spec,
            "ranks": args.ranks,
            "backend": "sim",
        },
    )


def run_mpi(
    args: argparse.Namespace,
    backend: str,
    program: Program,
    schedules: list[tuple[str, str | None]],
) -> int:
    """Check everything that can be checked here (schedules apply, the program fits the grid,
    given inputs fit the signature), then run the job on `--np` MPI processes."""
    from coconet.runtime.launcher import launch
    from coconet.tools.rank_job import RANK_WORKER

    job = prepared_job(args, backend, program, schedules)
    result = launch(job, args.ranks, worker=RANK_WORKER, timeout=args.timeout)
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
    from coconet.runtime.torch_comm import TorchComm
    from coconet.tools.rank_job import run_job_guarded

    apply_rank_env_defaults()
    comm = TorchComm.world()
    schedules = resolve_auto(args, backend, program, schedules, comm)
    job = prepared_job(args, backend, program, schedules)
    return run_job_guarded(job, comm, FailureGuard(comm, prefix="coco-run"))


def prepared_job(
    args: argparse.Namespace,
    backend: str,
    program: Program,
    schedules: list[tuple[str, str | None]],
) -> dict:
    """The job description every rank runs, once everything checkable here is checked."""
    from coconet.compile import apply_schedule
    from coconet.runtime.sim import prepare_inputs
    from coconet.runtime.symmetric import declared_nodes
    from coconet.tools.rank_job import job_plan

    given = load_arrays(args.inputs) if args.inputs else None
    nodes = declared_nodes(args.ranks)  # one machine's: mpiexec's local launch
    for _label, spec in schedules:
        scheduled = apply_schedule(program, spec) if given is not None else None
        # lowered into the plan cache, where the ranks find it (rank_job.job_plan)
        plan = job_plan(program, args.entry, spec, args.ranks, None, nodes, backend, scheduled)
        if scheduled is not None:
            prepare_inputs(scheduled, given, plan.grid_shape, args.seed)
    if args.output:
        try:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CocoError(f"cannot write {args.output}: {e}") from None
    return job_description(
        backend,
        schedules,
        program=str(Path(args.program).resolve()),
        entry=args.entry,
        inputs=str(Path(args.inputs).resolve()) if args.inputs else None,
        output=str(Path(args.output).resolve()) if args.output else None,
        seed=args.seed,
        check=args.check,
        bench=args.bench,
        json_path=args.json,
        trace=args.trace,
        warmup=args.warmup,
        iters=args.iters,
        rounds=args.rounds,
        verbose=args.verbose,
        quiet=args.quiet,
        exact_collectives=args.exact_collectives,
        step_timeout=env.step_timeout(args.step_timeout),
        numerics=args.numerics,
    )


def main(argv: Sequence[str] | None = None) -> None:
    tool_main("coco-run", build_parser(), run, argv)


if __name__ == "__main__":
    main()
