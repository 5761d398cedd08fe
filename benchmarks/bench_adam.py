"""Adam, data parallel, on the cpu backend: AR-C vs RS-C-AG vs fuse(RS-C-AG) (CoCoNet sec. 4.1).

    .venv/bin/python benchmarks/bench_adam.py                 # 2 ranks, 2^24 parameters
    .venv/bin/python benchmarks/bench_adam.py --np 4 --log2n 22 --iters 20

Runs itself under the mpich wheel's `mpiexec` (one process per rank) and uses the Python API
as a data-parallel trainer would: the program is built with the front end (coconet.frontend)
at the requested size, each schedule is compiled with `coconet.compile(...)` (collective), every
rank passes its own gradient and its pieces of w, m, v (`pieces=True`, the zero-copy calling
convention: the buffers the schedule holds, sliced m and v under rs-c-ag), calls the
step once (the check against the sim oracle is `coco-run --check`; this is timing only), then
times warm steps on its resident buffers (`compiled.step()`): barrier, step, the slowest
rank's time; the median over the timed steps. Bytes/rank is what each rank sends per step,
from the plan (lowering/traffic.py plan_traffic). A script that prints a table, not a test.
benchmarks/bench_suite.py runs the same schedules beside mpi4py + NumPy and torch.distributed +
torch.optim.Adam, and the machine's memory floor.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

SCHEDULES = ("ar-c", "rs-c-ag", "fuse(rs-c-ag)")


def build(n: int):
    """The Adam example itself (examples/adam.py), at n parameters."""
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "adam.py"
    return runpy.run_path(str(example))["build"](n)


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    from mpi4py import MPI

    from coconet.compile import compile as coco_compile
    from coconet.core import values as V
    from coconet.tools.rank_job import BenchRow, print_bench_table

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = 1 << args.log2n
    program = build(n)
    rows = []
    for name in args.schedules:
        t0 = time.perf_counter()
        compiled = coco_compile(program, schedule=name, backend="cpu", pieces=True)
        setup = time.perf_counter() - t0
        plan = compiled.plan
        coords = V.coords_of(rank, plan.grid_shape)
        shared = np.random.default_rng(1)  # the same replicated state on every rank
        mine = np.random.default_rng(100 + rank)  # this rank's own gradient
        inputs = {}
        for arg, buf in plan.arguments.items():
            if buf.shape == ():
                inputs[arg] = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "step": 1.0}[
                    arg
                ]
            elif arg == "g":
                inputs[arg] = mine.standard_normal(buf.shape, dtype=np.float32)
            else:
                full = shared.random(n, dtype=np.float32) * (0.01 if arg == "v" else 1.0)
                inputs[arg] = V.piece_of(full, buf.type, coords, plan.grid_shape)
        compiled(**inputs)  # binds the arrays; later steps run on them in place
        for _ in range(args.warmup):
            compiled.step()
        times = []
        for _ in range(args.iters):
            comm.Barrier()
            t0 = time.perf_counter()
            compiled.step()
            times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        traffic = comm.allreduce(compiled.bytes_per_rank, op=MPI.MAX)
        from coconet.lowering.plan import Launch

        rows.append(
            BenchRow(
                name,
                statistics.median(times),
                min(times),
                traffic,
                len(plan.steps),
                sum(isinstance(s, Launch) for s in plan.steps),
            )
        )
        if rank == 0 and args.verbose:
            print(f"[{name}] compiled and set up in {setup:.2f} s", flush=True)
        compiled.close()
    if rank == 0:
        print_bench_table(
            rows,
            f"adam (n = 2^{args.log2n} = {n} f32 parameters)",
            size,
            "cpu",
            args.warmup,
            args.iters,
        )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--np", type=int, default=2, help="MPI ranks (default 2)")
    p.add_argument("--log2n", type=int, default=24, help="parameters = 2^LOG2N (default 24)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    from coconet.runtime.cpu import apply_rank_env_defaults
    from coconet.runtime.launcher import find_mpiexec

    env = apply_rank_env_defaults(dict(os.environ))
    if args.np > (os.cpu_count() or 1):
        env.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
    cmd = [
        find_mpiexec(),
        "-n",
        str(args.np),
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--log2n",
        str(args.log2n),
        "--warmup",
        str(args.warmup),
        "--iters",
        str(args.iters),
        "--schedules",
        *args.schedules,
    ] + (["-v"] if args.verbose else [])
    sys.exit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
