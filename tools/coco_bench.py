"""`coco-bench`: sweep message sizes like nccl-tests, one row per size and schedule.

    coco-bench --op all_reduce -b 1K -e 16M -f 4 --np 2 --backend cpu
    coco-bench examples/adam.py -b 64K -e 4M --schedule ar-c --schedule 'fuse(rs-c-ag)' \\
        --json adam.json --plot adam.png --trace adam-trace.json
    torchrun --standalone --nproc-per-node 2 -m coconet.tools.coco_bench --op all_reduce

What runs at each size: `--op OP` generates the program `y = OP(x)` (coconet.frontend; x of
`-d/--dtype`, f32 by default, with the layout OP reads); a `.py` program file is rebuilt by its
`build(n)` (examples/adam.py) with n chosen so that the program's collectives move the size
(the bytes per n come from building it once at a probe size); a `.mlir` file runs at its own
size. Sizes are `-b`, `-b*f`, `-b*f^2`, ... up to `-e` (nccl-tests' -b/-e/-f; K, M, G are
powers of 1024); a size is rounded down to a whole number of elements divisible by the ranks.

Schedules: `--schedule NAME` / `-p [LABEL=]PIPELINE` (repeatable), by default every named
schedule of the program (coconet.schedule.named_schedules). The whole sweep is one job on the
coco-run machinery: `--np` MPI ranks started by runtime/launcher.py running
tools/rank_job.py, or, under torchrun, the torchrun processes themselves. Times are
medians of `-n` timed steps after `-w` warm-up steps, each the slowest rank's; algbw and busbw
follow nccl-tests (tools/rank_job.py ALGBW_CONVENTION, BUSBW_CONVENTION).

`--json FILE` writes every row; `--plot FILE.png` draws time and busbw against size (log axes,
one line per schedule; matplotlib, from the `bench` extra); `--trace FILE.json` writes the
timed steps' timeline (runtime/trace.py). A progress bar (tqdm) shows on a terminal. Every
problem ends in one `coco-bench: error:` line and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from coconet.core import env
from coconet.core.program import CocoError, Program, load
from coconet.tools.rank_job import add_timeout_options, job_description, tool_main

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")
DTYPES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str, option: str) -> int:
    """A byte count as nccl-tests writes them: 1024, 64K, 16M, 1G (powers of 1024; KiB too)."""
    m = _SIZE.match(text)
    if not m:
        raise CocoError(f"{option} {text!r}: expected a byte count such as 1024, 64K, 16M or 1G")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def sweep_sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """nccl-tests' sweep: minbytes, then times `factor` while at most maxbytes."""
    if minbytes < 1:
        raise CocoError(f"-b/--minbytes must be at least 1 byte, got {minbytes}")
    if minbytes > maxbytes:
        raise CocoError(
            f"-b/--minbytes ({minbytes} bytes) is larger than -e/--maxbytes ({maxbytes} bytes)"
        )
    if factor < 2:
        raise CocoError(
            f"-f/--stepfactor must be at least 2 (each size is the previous one times it), "
            f"got {factor}"
        )
    sizes = [minbytes]
    while sizes[-1] * factor <= maxbytes:
        sizes.append(sizes[-1] * factor)
    return sizes


def _schedule(value: str) -> tuple[str, str]:
    return ("schedule", value)


def _pipeline(value: str) -> tuple[str, str]:
    return ("pipeline", value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coco-bench",
        description="Sweep message sizes like nccl-tests: time every schedule of a collective "
        "or a program at each size, with nccl-tests' algbw and busbw.",
    )
    p.add_argument(
        "program",
        nargs="?",
        help="a .py program file whose build(n) makes it at n elements (examples/adam.py), or "
        "a .mlir file (its one size); default: --op",
    )
    p.add_argument(
        "--op",
        choices=OPS,
        default=None,
        help="benchmark this collective alone: y = OP(x) (default all_reduce when no program "
        "file is given)",
    )
    p.add_argument(
        "-d", "--dtype", choices=tuple(DTYPES), default="f32", help="--op element type (f32)"
    )
    p.add_argument("--entry", help="the function of a program file (default: its first)")
    p.add_argument("-b", "--minbytes", default=None, help="smallest size (default 1K)")
    p.add_argument("-e", "--maxbytes", default=None, help="largest size, at most (default 1M)")
    p.add_argument(
        "-f", "--stepfactor", default="2", help="multiply the size by this each step (default 2)"
    )
    p.add_argument(
        "--np",
        dest="ranks",
        type=int,
        default=None,
        help="number of ranks (default 2; under torchrun, its WORLD_SIZE)",
    )
    p.add_argument(
        "--backend",
        choices=("cpu", "cuda"),
        default=None,
        help="cpu: MPI ranks; cuda: MPI ranks with one GPU each (default: cuda when a GPU is "
        "visible, else cpu)",
    )
    p.add_argument(
        "--schedule",
        dest="schedules",
        action="append",
        type=_schedule,
        default=[],
        metavar="NAME",
        help="named schedule to time (repeatable; default: every named schedule of the program)",
    )
    p.add_argument(
        "-p",
        "--passes",
        dest="schedules",
        action="append",
        type=_pipeline,
        metavar="[LABEL=]PIPELINE",
        help="pass pipeline to time (repeatable)",
    )
    p.add_argument("-w", "--warmup", type=int, default=3, help="warm-up steps (default 3)")
    p.add_argument("-n", "--iters", type=int, default=10, help="timed steps (default 10)")
    p.add_argument(
        "-c",
        "--check",
        action="store_true",
        help="check every rank's outputs against the sim oracle at every size first",
    )
    p.add_argument("--json", metavar="FILE", help="write every row as JSON")
    p.add_argument(
        "--plot", metavar="FILE.png", help="plot time and busbw against size (matplotlib)"
    )
    p.add_argument(
        "--trace",
        metavar="FILE.json",
        help="write a Chrome/Perfetto timeline of the timed steps of every rank and stream",
    )
    add_timeout_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")
    p.add_argument("-v", "--verbose", action="store_true", help="report lowering and setup")
    return p


# ---------------------------------------------------------------------------------------------
# What runs at each size
# ---------------------------------------------------------------------------------------------


@dataclass
class SizePoint:
    """One size of the sweep: the program file every rank loads, and what its rows report."""

    path: str
    meta: dict[str, Any] = field(default_factory=dict)


def op_program(op: str, dtype: str, count: int) -> Program:
    """`y = OP(x)` over `count` elements: x in the layout the collective reads (local for the
    reductions, sliced for all_gather, local for all_to_all: each rank's buffer, block j of
    which goes to rank j, as nccl-tests' alltoall and torch's all_to_all_single), y
    returned."""
    from coconet import frontend
    from coconet.frontend import (
        BF16,
        F8E4M3FN,
        F8E5M2,
        F16,
        F32,
        F64,
        AllGather,
        AllReduce,
        AllToAll,
        Broadcast,
        Local,
        Reduce,
        ReduceScatter,
        Sliced,
        Tensor,
    )

    elt = {
        "f32": F32,
        "f64": F64,
        "f16": F16,
        "bf16": BF16,
        "f8E4M3FN": F8E4M3FN,
        "f8E5M2": F8E5M2,
    }[dtype]
    layout = Sliced(0) if op == "all_gather" else Local
    collective: Callable[[Any], Any] = {
        "all_reduce": lambda x: AllReduce("+", x),
        "reduce_scatter": lambda x: ReduceScatter("+", x),
        "all_gather": lambda x: AllGather(x),
        "all_to_all": lambda x: AllToAll(x),
        "broadcast": lambda x: Broadcast(x, 0),
        "reduce": lambda x: Reduce("+", x, 0),
    }[op]

    def body(x=Tensor(elt, [count], layout, "x")):
        return collective(x)

    body.__name__ = op
    return frontend.program(grid=[None])(body)


def whole_multiple(n: int, ranks: int) -> int:
    """n rounded down to a multiple of the ranks (sliced layouts split evenly)."""
    return n // ranks * ranks


def op_points(
    op: str, dtype: str, sizes: Sequence[int], ranks: int, directory: Path
) -> list[SizePoint]:
    itemsize = DTYPES[dtype]
    points = []
    for size in sizes:
        count = whole_multiple(size // itemsize, ranks)
        if count == 0:
            raise CocoError(
                f"{size} byte(s) of {dtype} is less than one element per rank on {ranks} "
                f"rank(s): make -b/--minbytes at least {itemsize * ranks}"
            )
        program = op_program(op, dtype, count)
        path = directory / f"{op}_{count * itemsize}.mlir"
        path.write_text(program.print())
        meta = {"op": op, "dtype": dtype, "count": count, "requested_bytes": size}
        points.append(SizePoint(str(path), meta))
    return points


def file_builder(path: str) -> Callable[[int], Program]:
    """`n -> Program` of a .py program file's `build(n)`."""
    import runpy

    try:
        namespace = runpy.run_path(path, run_name="coconet_program")
    except Exception as e:
        raise CocoError(f"{path}: running the program file failed: {type(e).__name__}: {e}")
    build = namespace.get("build")
    if not callable(build):
        raise CocoError(
            f"{path}: coco-bench rebuilds a program at each size through `build(n)`, which "
            "this file does not define (a .mlir file runs at its one size)"
        )

    def make(n: int) -> Program:
        try:
            program = build(n)
        except CocoError as e:
            raise CocoError(
                f"{path}: build({n}) failed ({e}); coco-bench needs build(n) to take the tensor "
                "size n"
            ) from None
        except Exception as e:
            raise CocoError(
                f"{path}: build({n}) failed ({type(e).__name__}: {e}); coco-bench needs "
                "build(n) to take the tensor size n"
            ) from None
        if hasattr(program, "program") and not isinstance(program, Program):
            program = getattr(program, "program")  # a Scheduled result
        if not isinstance(program, Program):
            raise CocoError(
                f"{path}: build({n}) returned a {type(program).__name__}, not a program"
            )
        return program

    return make


def file_points(
    path: str, entry: str | None, sizes: Sequence[int], ranks: int, directory: Path
) -> list[SizePoint]:
    """The program file rebuilt at each size: n from the bytes its collectives move per n at
    a probe size (so a program whose collectives carry 4n bytes gets n = size / 4)."""
    from coconet.tools.rank_job import program_size

    make = file_builder(path)
    probe_n = 1024 * ranks
    probe = make(probe_n)
    if entry is not None:
        probe = Program(probe.module, entry)
    probe_bytes = program_size(probe, ranks)
    if not probe_bytes:
        raise CocoError(
            f"{path}: build({probe_n}) has no collective that moves data on {ranks} rank(s): "
            "there is no size to sweep"
        )
    per_n = probe_bytes / probe_n
    points = []
    for size in sizes:
        n = whole_multiple(int(size / per_n), ranks)
        if n == 0:
            raise CocoError(
                f"{path}: {size} byte(s) is less than one element per rank (its collectives "
                f"move {per_n:g} bytes per n): raise -b/--minbytes"
            )
        file = directory / f"{Path(path).stem}_{n}.mlir"
        file.write_text(make(n).print())
        points.append(SizePoint(str(file), {"count": n, "requested_bytes": size}))
    return points


# ---------------------------------------------------------------------------------------------
# Progress and output
# ---------------------------------------------------------------------------------------------


class ProgressSink:
    """Rank 0's standard output on its way to the terminal: progress markers advance the bar
    (and are not shown), everything else is written above it."""

    def __init__(self, out: IO[str], bar: Any = None):
        self.out = out
        self.bar = bar
        self.pending = ""

    def write(self, text: str) -> int:
        from coconet.tools.rank_job import PROGRESS_MARKER

        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if line.strip() == PROGRESS_MARKER:
                if self.bar is not None:
                    self.bar.update(1)
            elif self.bar is not None:
                self.bar.write(line, file=self.out)
            else:
                self.out.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return False


def progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr when it is a terminal (and tqdm is installed), else None."""
    if not enabled or total < 2 or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="run", desc="coco-bench", leave=False, file=sys.stderr)


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CocoError(
            "--plot needs matplotlib: pip install 'coconet[bench]' (or leave --plot out)"
        ) from None


def write_plot(path: str, rows: Sequence[dict[str, Any]], title: str) -> None:
    """Time and busbw against size, one line per schedule, log axes; a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    schedules: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("size_bytes"):
            schedules.setdefault(r["schedule"], []).append(r)
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, points in schedules.items():
        points.sort(key=lambda r: r["size_bytes"])
        sizes = [r["size_bytes"] for r in points]
        ax_t.plot(sizes, [r["time_s"] * 1e6 for r in points], marker="o", label=label)
        ax_b.plot(sizes, [r["busbw_GBps"] for r in points], marker="o", label=label)
    for ax, ylabel in ((ax_t, "time (us, median)"), (ax_b, "busbw (GB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=110)
    except OSError as e:
        raise CocoError(f"cannot write the plot to {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def average_busbw(rows: Sequence[dict[str, Any]]) -> list[str]:
    """nccl-tests' closing line, per schedule: the mean busbw over the sizes."""
    per: dict[str, list[float]] = {}
    for r in rows:
        if r.get("busbw_GBps") is not None:
            per.setdefault(r["schedule"], []).append(r["busbw_GBps"])
    return [
        f"# Avg bus bandwidth [{label}]: {sum(v) / len(v):.3f} GB/s over {len(v)} size(s)"
        for label, v in per.items()
    ]


# ---------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from coconet.compile import default_backend, require_gpu
    from coconet.tools.coco_run import job_ranks, schedule_label, writable_path

    ranks, under_torchrun = job_ranks(args.ranks, default=2)
    if args.warmup < 0:
        raise CocoError(f"-w/--warmup must be at least 0, got {args.warmup}")
    if args.iters < 1:
        raise CocoError(f"-n/--iters must be at least 1, got {args.iters}")
    try:
        factor = int(args.stepfactor)
    except ValueError:
        raise CocoError(f"-f/--stepfactor {args.stepfactor!r}: expected an integer") from None
    fixed = args.program is not None and Path(args.program).suffix == ".mlir"
    if fixed and (args.minbytes or args.maxbytes):
        raise CocoError(
            f"{args.program} is .mlir text of one size: -b/-e need a .py program whose build(n) "
            "rebuilds it (or --op)"
        )
    if args.program is not None and args.op is not None:
        raise CocoError("give a program file or --op, not both")
    sizes = sweep_sizes(
        parse_size(args.minbytes or "1K", "-b/--minbytes"),
        parse_size(args.maxbytes or "1M", "-e/--maxbytes"),
        factor,
    )
    backend = args.backend or default_backend()
    if backend == "cuda":
        require_gpu()
    if args.plot:
        require_matplotlib()
    outputs = {}
    for option, what in (("json", "the JSON rows"), ("plot", "the plot"), ("trace", "the trace")):
        value = getattr(args, option)
        outputs[option] = writable_path(value, what) if value else None

    with tempfile.TemporaryDirectory(prefix="coco-bench-") as tmp:
        directory = Path(tmp)
        if args.program is None:
            op = args.op or "all_reduce"
            points = op_points(op, args.dtype, sizes, ranks, directory)
            what = f"{op} ({args.dtype})"
        elif fixed:
            points = [SizePoint(str(Path(args.program).resolve()))]
            what = f"{args.program} (its one size)"
        else:
            if not Path(args.program).exists():
                raise CocoError(f"no such file: {args.program}")
            points = file_points(args.program, args.entry, sizes, ranks, directory)
            what = args.program
        schedules: list[tuple[str, str | None]] = [schedule_label(k, v) for k, v in args.schedules]
        first = load(points[0].path, args.entry)
        if not schedules:
            from coconet.schedule import named_schedules

            offers = named_schedules(first, explain=True, ranks=ranks)
            schedules = [(name, name) for name in offers.offered] or [("as written", None)]
            # what a step refused (a size, a layout) is said; what needs a structure the
            # program lacks (a matmul, a send) is not a schedule of it
            for name, why in offers.dropped.items():
                if not why.startswith("[schedule-unknown]") and is_rank_zero():
                    print(f"# not offered: {name}: {why}", file=sys.stderr)
        check_schedules(first, schedules, ranks)

        json_path = outputs["json"] or str(directory / "rows.json")
        title = (
            f"coco-bench: {what} on {ranks} rank(s), backend {backend}; median of "
            f"{args.iters} step(s) after {args.warmup} warm-up, slowest rank per step"
        )
        job = job_description(
            backend,
            schedules,
            programs=[
                {"path": str(Path(pt.path).resolve()), "entry": args.entry, "meta": pt.meta}
                for pt in points
            ],
            check=args.check,
            bench=True,
            json_path=json_path,
            trace=outputs["trace"],
            warmup=args.warmup,
            iters=args.iters,
            verbose=args.verbose,
            quiet=True,
            step_timeout=env.step_timeout(args.step_timeout),
            report="sweep",
            title=title,
            progress=True,
        )
        total = len(points) * len(schedules)
        bar = progress_bar(total, not args.no_progress and is_rank_zero())
        try:
            if under_torchrun:
                code = run_in_torchrun(job, ProgressSink(sys.stdout, bar))
            else:
                code = run_mpi(job, ranks, args.timeout, ProgressSink(sys.stdout, bar))
        finally:
            if bar is not None:
                bar.close()
        if code != 0 or (under_torchrun and not is_rank_zero()):
            return code
        import json

        document = json.loads(Path(json_path).read_text())
        for line in average_busbw(document["rows"]):
            print(line)
        if outputs["json"]:
            print(f"# rows: {outputs['json']}")
        if outputs["plot"]:
            write_plot(outputs["plot"], document["rows"], title.split(";")[0])
            print(f"# plot: {outputs['plot']}")
    return 0


def check_schedules(program: Program, schedules: list[tuple[str, str | None]], ranks: int) -> None:
    """Every schedule applies to the program and lowers on `ranks` ranks: refused here, before
    anything is launched, not by every rank at once."""
    from coconet.compile import apply_schedule
    from coconet.lowering.lower_to_plan import lower

    for _label, spec in schedules:
        lower(apply_schedule(program, spec), ranks)


def is_rank_zero() -> bool:
    from coconet.runtime.torch_comm import torchrun_world

    world = torchrun_world()
    return world is None or world[0] == 0


def run_mpi(job: dict[str, Any], ranks: int, timeout: float | None, sink: ProgressSink) -> int:
    from coconet.runtime.launcher import launch
    from coconet.tools.rank_job import RANK_WORKER

    result = launch(
        job,
        ranks,
        worker=RANK_WORKER,
        timeout=timeout,
        stdout=sink,  # type: ignore[arg-type]
    )
    if result.returncode != 0:
        raise CocoError(result.message or f"the job failed with status {result.returncode}")
    if job.get("verbose") and result.stderr.strip():
        sys.stderr.write(result.stderr)
    return 0


def run_in_torchrun(job: dict[str, Any], sink: ProgressSink) -> int:
    """This process is one rank of a torchrun job (tools/coco_run.py run_in_torchrun): rank 0's
    output goes through the progress sink as a launched job's would."""
    from coconet.runtime.cpu import apply_rank_env_defaults
    from coconet.runtime.failures import FailureGuard
    from coconet.runtime.torch_comm import TorchComm
    from coconet.tools.rank_job import run_job_guarded

    apply_rank_env_defaults()
    comm = TorchComm.world()
    stdout = sys.stdout
    sys.stdout = sink  # type: ignore[assignment]
    try:
        return run_job_guarded(job, comm, FailureGuard(comm, prefix="coco-bench"))
    finally:
        if sink.pending:
            sink.write("\n")
        sys.stdout = stdout


def main(argv: Sequence[str] | None = None) -> None:
    tool_main("coco-bench", build_parser(), run, argv)


if __name__ == "__main__":
    main()
