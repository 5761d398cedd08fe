"""Validate the `cuda` backend end to end on a machine with a CUDA GPU: `make gpu-check`.

    .venv/bin/python benchmarks/gpu_check.py                    # everything, report in
                                                                # gpu-check-results.md
    .venv/bin/python benchmarks/gpu_check.py --quick --ranks 1,2 --out /tmp/gpu.md

Without a usable GPU (no CuPy, no driver, no device) it prints one line saying so and exits 0,
so it is safe to run anywhere. With one it runs four parts and writes them all to ONE markdown
file (rewritten after each part, so a run cut short still leaves what it finished):

1. matrix: every `examples/*.mlir` x every named schedule that fits it x every rank count the
   schedule is legal at (asked of the API: the grid must bind and the scheduled program must
   lower), each as `coco-run FILE --np N --backend cuda --schedule NAME --check -q`;
2. tests: `python -m pytest -q -m gpu test`;
3. bandwidth: all_reduce bus bandwidth (nccl-tests convention) of every named schedule of a
   generated all_reduce program (library `ar-c`, `rs-c-ag`; fused `fuse(rs-c-ag)`), f32 sizes
   1 MiB .. 1 GiB, timed with `coco-run --bench`;
4. adam: one Adam step of examples/adam.py at 2^24 .. 2^28 parameters under `fuse(rs-c-ag)`
   against torch.distributed + `torch.optim.Adam(fused=True)`, both in a one-process world;
5. graphs: the fused all_reduce steps at 4 KiB .. 1 MiB launched every step
   (`COCONET_CUDA_GRAPHS=0`) and replayed from a CUDA graph, side by side.

Exit status: 0 when every matrix case and every GPU test passed (or there is no GPU), 1 when
one failed (or, with --require-gpu, there is no usable GPU), 2 for bad usage or a GPU without
coconet installed. Benchmarks never decide the status: their errors are in the report.
`--quick` measures fewer sizes with fewer steps; the matrix and the tests are always complete.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Only the standard library at module level: the no-GPU path must stay fast and light.

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DEFAULT_OUT = REPO / "gpu-check-results.md"
DEFAULT_RANKS = (1, 2, 4)
PARTS = ("matrix", "tests", "bandwidth", "adam", "graphs")
TAIL_LINES = 15  # lines of a failure's output kept in the report

MIB = 1 << 20
BW_SIZES = tuple(MIB * 4**k for k in range(6))  # 1 MiB, 4 MiB, ..., 1 GiB
BW_SIZES_QUICK = (MIB, 16 * MIB, 256 * MIB)
ADAM_LOG2N = (24, 25, 26, 27, 28)
ADAM_LOG2N_QUICK = (24,)
ADAM_SCHEDULE = "fuse(rs-c-ag)"
ADAM_HYPER = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
BACKEND = "cuda"  # what every coco-run here runs on (a smoke test of this script may use cpu)
GRAPH_SIZES = (4 << 10, 64 << 10, MIB)
GRAPH_SCHEDULES = ("fuse(ar-c)", "fuse(rs-c-ag)")
GRAPHS_ENV = "COCONET_CUDA_GRAPHS"  # runtime/cuda.py's (not imported: the no-GPU path is light)


# ---------------------------------------------------------------------------------------------
# Is there a GPU?
# ---------------------------------------------------------------------------------------------


def detect_gpu() -> tuple[bool, str]:
    """(usable, reason it is not). coconet's own test decides; the reason is probed only to
    make the one line useful."""
    with warnings.catch_warnings():
        # CuPy warns on import about optional libraries (NCCL, cuTENSOR): not our one line.
        warnings.simplefilter("ignore")
        try:
            from coconet.compile import gpu_available
        except ImportError:
            gpu_available = None  # coconet not installed here: still say whether a GPU is
        if gpu_available is not None and gpu_available():
            return True, ""
        reason = _why_no_gpu()
    if gpu_available is None and not reason:
        raise NotInstalled(
            "a CUDA GPU is visible but coconet is not installed in this Python "
            f"({sys.executable}); run `make gpu-check`, which installs it"
        )
    return False, reason


class NotInstalled(Exception):
    """A GPU to check, but no coconet to check it with."""


def _why_no_gpu() -> str:
    """Why CuPy sees no device ("" if it does see one)."""
    try:
        import cupy
    except ModuleNotFoundError:
        return "CuPy is not installed"
    except Exception as e:
        return _one_line(f"CuPy cannot be imported: {e}")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return _one_line(str(e))
    return "" if count > 0 else "CuPy sees 0 CUDA devices"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def machine_info() -> dict[str, str]:
    """GPU, CUDA, CuPy, NCCL, torch and repository versions, each best effort."""
    info: dict[str, str] = {"python": platform.python_version(), "platform": platform.platform()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cupy

        rt = cupy.cuda.runtime
        count = rt.getDeviceCount()
        info["GPUs"] = str(count)
        for d in range(count):
            info[f"GPU {d}"] = _describe_gpu(rt, d)
        info["CuPy"] = cupy.__version__
        info["CUDA runtime"] = _cuda_version(rt.runtimeGetVersion())
        info["CUDA driver"] = _cuda_version(rt.driverGetVersion())
        try:
            from cupy.cuda import nccl

            v = nccl.get_version()
            info["NCCL"] = f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else str(v)
        except Exception as e:
            info["NCCL"] = _one_line(f"unavailable ({e})")
    info["torch"] = _dist_version("torch") or "not installed"
    info["coconet commit"] = _git_commit()
    return info


def _describe_gpu(rt, device: int) -> str:
    try:
        props = rt.getDeviceProperties(device)
    except Exception as e:
        return _one_line(f"properties unavailable ({e})")
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    mem = props.get("totalGlobalMem", 0) / 2**30
    return f"{name}, sm_{props['major']}{props['minor']}, {mem:.0f} GiB"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _git_commit() -> str:
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain")
    except OSError:
        return "unknown (no git)"
    return (head or "unknown") + (" (with uncommitted changes)" if dirty else "")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip()


# ---------------------------------------------------------------------------------------------
# Running a command with a hard time limit
# ---------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    returncode: int  # -1: killed at the time limit
    seconds: float
    output: str  # stdout and stderr, interleaved

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.output.rstrip().splitlines()[-lines:])


def run_command(cmd: Sequence[str], timeout: float, env: dict[str, str] | None = None) -> Outcome:
    """Run `cmd` in its own process group and kill the whole group at `timeout`: coco-run has
    its own --timeout, this is the backstop for whatever outlives it (mpiexec, stray ranks)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\ngpu-check: killed after {timeout:.0f} s"
        code = -1
    return Outcome(code, time.perf_counter() - t0, out or "")


def coco_run_command() -> list[str]:
    """`coco-run` of this interpreter's environment (the one gpu-check installed into)."""
    script = Path(sys.executable).parent / "coco-run"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "coconet.tools.coco_run"]


def job_limits(timeout: float) -> list[str]:
    """coco-run's own limits: the step watchdog fires well before the whole-job timeout, so a
    hung collective is reported with the rank and step that hung rather than just killed."""
    return ["--timeout", f"{timeout:g}", "--step-timeout", f"{max(10.0, timeout / 3):g}"]


# ---------------------------------------------------------------------------------------------
# Part 1: the example x schedule x ranks matrix
# ---------------------------------------------------------------------------------------------


AS_WRITTEN = "as-written"  # coco-run's --schedule for the program unscheduled


@dataclass(frozen=True)
class Case:
    example: Path
    schedule: str
    ranks: int


@dataclass(frozen=True)
class Skipped:
    example: Path
    schedule: str | None  # None: the program itself does not run on this many ranks
    ranks: int
    reason: str


def enumerate_matrix(examples_dir: Path, ranks: Sequence[int]) -> tuple[list[Case], list[Skipped]]:
    """Every (example, named schedule, rank count) the API says is legal, and why the others
    are not. Legal means what coco-run checks before launching: the process grid binds to
    that many ranks and the scheduled program lowers for them. An example no named schedule
    fits (examples/fp8_allgather_matmul) runs as written (`--schedule as-written`)."""
    from coconet.compile import apply_schedule
    from coconet.core.program import CocoError, load
    from coconet.lowering.lower_to_plan import lower
    from coconet.schedule import named_schedules

    cases: list[Case] = []
    skipped: list[Skipped] = []
    for path in sorted(Path(examples_dir).glob("*.mlir")):
        program = load(path)
        names = list(named_schedules(program)) or [AS_WRITTEN]
        scheduled = {name: apply_schedule(program, name) for name in names}
        for n in ranks:
            try:
                program.grid.bind(n)
            except ValueError as e:
                skipped.append(Skipped(path, None, n, str(e)))
                continue
            for name, sp in scheduled.items():
                try:
                    lower(sp, n)
                except CocoError as e:
                    skipped.append(Skipped(path, name, n, _one_line(str(e))))
                    continue
                cases.append(Case(path, name, n))
    return cases, skipped


def matrix_cases(examples_dir: Path, ranks: Sequence[int]) -> list[Case]:
    """The legal cases of `enumerate_matrix`."""
    return enumerate_matrix(examples_dir, ranks)[0]


@dataclass
class CaseResult:
    case: Case
    outcome: Outcome


def case_command(case: Case, timeout: float) -> list[str]:
    return [
        *coco_run_command(),
        str(case.example),
        "--np",
        str(case.ranks),
        "--backend",
        BACKEND,
        "--schedule",
        case.schedule,
        "--check",
        "-q",
        *job_limits(timeout),
    ]


def run_matrix(
    cases: Sequence[Case], timeout: float, progress: Callable[[str], None], jobs: int = 1
) -> list[CaseResult]:
    """Run the cases, `jobs` at a time (each is its own coco-run job: its own ranks, its own
    NCCL communicators, so concurrent jobs share the GPU and nothing else); results in case
    order, progress as they finish."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    width = len(str(len(cases)))
    outcomes: dict[int, Outcome] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # the extra minute lets coco-run's own timeout report before the backstop kills it
        futures = {
            pool.submit(run_command, case_command(case, timeout), timeout + 60): i
            for i, case in enumerate(cases)
        }
        for done, future in enumerate(as_completed(futures), 1):
            i = futures[future]
            case, outcome = cases[i], future.result()
            outcomes[i] = outcome
            verdict = "pass" if outcome.ok else "FAIL"
            progress(
                f"  [{done:>{width}}/{len(cases)}] {verdict}  {case.example.name} "
                f"{case.schedule} --np {case.ranks}  ({outcome.seconds:.1f} s)"
            )
            if not outcome.ok:
                progress("      " + outcome.tail(3).replace("\n", "\n      "))
    return [CaseResult(case, outcomes[i]) for i, case in enumerate(cases)]


# ---------------------------------------------------------------------------------------------
# Part 2: the GPU-marked tests
# ---------------------------------------------------------------------------------------------


@dataclass
class TestRun:
    outcome: Outcome
    summary: str  # pytest's last line ("3 passed, 1 skipped in 4.20s")

    @property
    def ok(self) -> bool:
        # 5: no test carries the mark; nothing failed
        return self.outcome.returncode in (0, 5)

    @property
    def ran_none(self) -> bool:
        return self.outcome.returncode == 5 or not re.search(r"\d+ (passed|failed)", self.summary)


def run_gpu_tests(timeout: float) -> TestRun:
    outcome = run_command([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "test"], timeout)
    return TestRun(outcome, pytest_summary(outcome.output))


def pytest_summary(output: str) -> str:
    """pytest's closing line ("2 passed, 1 skipped, 40 deselected in 3.10s"), rules stripped."""
    lines = [ln.strip().strip("=").strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


# ---------------------------------------------------------------------------------------------
# Part 3: all_reduce bus bandwidth
# ---------------------------------------------------------------------------------------------


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, the nccl-tests convention for all_reduce: algbw = bytes / time;
    busbw = algbw * 2(n-1)/n, the per-link traffic of a ring, comparable across rank counts."""
    if seconds <= 0 or ranks < 1:
        raise ValueError(f"need a positive time and rank count, got {seconds} s on {ranks}")
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


def allreduce_program(n: int):
    """An all_reduce of a local f32 gradient, scaled into a replicated tensor. The scale gives
    the split/reorder/fuse passes a computation to move, so the program has the library
    schedules (ar-c, rs-c-ag) and the fused one (fuse(rs-c-ag))."""
    from coconet import frontend
    from coconet.frontend import F32, AllReduce, Local, Replicated, Tensor, Update

    @frontend.program(grid=[None])
    def all_reduce(g: Tensor(F32, [n], Local), w: Tensor(F32, [n], Replicated)):
        g1 = AllReduce("+", g)
        Update(w, g1 * 0.5)

    return all_reduce


_BENCH_ROW = re.compile(r"^\s+(\S+)\s+([0-9.]+)ms\s+([0-9.]+)ms\s")


def parse_bench_table(output: str) -> dict[str, tuple[float, float]]:
    """{schedule: (median s, min s)} from coco-run --bench's table (tools/rank_job.py
    print_bench_table: milliseconds with three decimals, so 1 us resolution)."""
    rows: dict[str, tuple[float, float]] = {}
    in_table = False
    for line in output.splitlines():
        if line.startswith("bench @"):
            in_table = True
            continue
        m = _BENCH_ROW.match(line) if in_table else None
        if m and m.group(1) != "schedule":
            rows[m.group(1)] = (float(m.group(2)) / 1e3, float(m.group(3)) / 1e3)
    return rows


def bench_command(
    path: Path, ranks: int, schedules: Sequence[str], iters: int, timeout: float
) -> list[str]:
    cmd = [*coco_run_command(), str(path), "--np", str(ranks), "--backend", BACKEND]
    for s in schedules:
        cmd += ["--schedule", s]
    return [*cmd, "--bench", "-q", "--warmup", "5", "--iters", str(iters), *job_limits(timeout)]


@dataclass
class BenchResult:
    label: str  # a size ("16 MiB") or a parameter count ("2^24")
    times: dict[str, tuple[float, float]] = field(default_factory=dict)  # schedule: (med, min)
    error: str = ""


def write_program(program, directory: Path, stem: str) -> Path:
    """coco-run takes a file: the generated program as .mlir text."""
    path = directory / f"{stem}.mlir"
    path.write_text(program.print())
    return path


def run_bandwidth(
    sizes: Sequence[int], ranks: int, iters: int, timeout: float, progress: Callable[[str], None]
) -> tuple[list[str], list[BenchResult]]:
    """(schedules, one result per size) at `ranks` ranks."""
    from coconet.schedule import named_schedules

    schedules = list(named_schedules(allreduce_program(1024)))
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for nbytes in sizes:
            path = write_program(allreduce_program(nbytes // 4), Path(tmp), f"ar_{nbytes}")
            outcome = run_command(bench_command(path, ranks, schedules, iters, timeout), timeout)
            result = BenchResult(fmt_bytes(nbytes), parse_bench_table(outcome.output))
            if not outcome.ok or len(result.times) < len(schedules):
                result.error = outcome.tail(5)
            results.append(result)
            progress(f"  all_reduce {fmt_bytes(nbytes):>8} on {ranks} rank(s): " + _brief(result))
    return schedules, results


@dataclass
class GraphResult:
    label: str  # a size
    eager: dict[str, tuple[float, float]] = field(default_factory=dict)  # schedule: (med, min)
    graph: dict[str, tuple[float, float]] = field(default_factory=dict)
    error: str = ""


def run_graphs(
    sizes: Sequence[int], ranks: int, iters: int, timeout: float, progress: Callable[[str], None]
) -> list[GraphResult]:
    """Each size's fused all_reduce steps timed launched every step and replayed from a
    CUDA graph: the same coco-run --bench twice, COCONET_CUDA_GRAPHS=0 then 1."""
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for nbytes in sizes:
            path = write_program(allreduce_program(nbytes // 4), Path(tmp), f"ar_{nbytes}")
            result = GraphResult(fmt_bytes(nbytes))
            for mode, times in (("0", result.eager), ("1", result.graph)):
                cmd = bench_command(path, ranks, GRAPH_SCHEDULES, iters, timeout)
                outcome = run_command(cmd, timeout, {**os.environ, GRAPHS_ENV: mode})
                times.update(parse_bench_table(outcome.output))
                if not outcome.ok or len(times) < len(GRAPH_SCHEDULES):
                    result.error = outcome.tail(5)
            results.append(result)
            progress(f"  graphs {result.label:>8}: " + graph_brief(result))
    return results


def graph_brief(result: GraphResult) -> str:
    cells = []
    for s in GRAPH_SCHEDULES:
        eager, graph = result.eager.get(s), result.graph.get(s)
        if eager is None or graph is None:
            cells.append(f"{s} failed")
        else:
            cells.append(f"{s} {eager[0] * 1e6:.0f} -> {graph[0] * 1e6:.0f} us")
    return ", ".join(cells)


def graphs_section(results: Sequence[GraphResult], ranks: int, iters: int) -> str:
    lines = [
        f"## CUDA graphs: a step launched or replayed, {ranks} rank(s)\n",
        (
            "The all_reduce program of the bandwidth part (`w = 0.5 * all_reduce(g)`, f32) at "
            "small sizes, where the host's launches are most of a step. Each fused schedule "
            f"under `coco-run --bench` (median of {iters} steps after 5 warm-up, slowest rank; "
            "1 us resolution), once with `COCONET_CUDA_GRAPHS=0` (every kernel launched every "
            "step) and once replayed from the graph captured at the second step."
        ),
        "",
        "| size | schedule | launched | replayed | launched / replayed |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        for s in GRAPH_SCHEDULES:
            eager, graph = r.eager.get(s), r.graph.get(s)
            if eager is None or graph is None:
                lines.append(f"| {r.label} | `{s}` | failed | failed | - |")
                continue
            ratio = f"{eager[0] / graph[0]:.2f}x" if graph[0] > 0 else "-"
            lines.append(
                f"| {r.label} | `{s}` | {eager[0] * 1e6:.0f} us | {graph[0] * 1e6:.0f} us "
                f"| {ratio} |"
            )
    for r in results:
        if r.error:
            lines.append(f"\n{r.label} failed:\n\n```\n{r.error}\n```")
    return "\n".join(lines) + "\n"


def _brief(result: BenchResult) -> str:
    if result.error and not result.times:
        return "FAILED: " + _one_line(result.error)[-200:]
    text = ", ".join(f"{s} {med * 1e3:.3f} ms" for s, (med, _) in result.times.items())
    return text + (" (some schedules failed)" if result.error else "")


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------------------------
# Part 4: one Adam step against PyTorch
# ---------------------------------------------------------------------------------------------


def adam_program(n: int):
    """examples/adam.py at n parameters (as benchmarks/bench_adam.py builds it)."""
    import runpy

    return runpy.run_path(str(EXAMPLES / "adam.py"))["build"](n)


def torch_adam_step(log2n: int, warmup: int, iters: int) -> dict[str, object]:
    """One process, one GPU: the data-parallel step torch users run — all_reduce the gradient
    in a world of one (nccl, else gloo), then fused Adam. Times are of the whole step, made to
    finish with a device synchronize, as coconet's step ends with one."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if dist.is_nccl_available() else "gloo"
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory(prefix="gpu-check-torch-") as tmp:
        dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            n = 1 << log2n
            param = torch.nn.Parameter(torch.rand(n, device="cuda"))
            param.grad = torch.randn(n, device="cuda")
            opt = torch.optim.Adam(
                [param],
                lr=ADAM_HYPER["lr"],
                betas=(ADAM_HYPER["beta1"], ADAM_HYPER["beta2"]),
                eps=ADAM_HYPER["eps"],
                fused=True,
            )

            def step() -> None:
                dist.all_reduce(param.grad)
                opt.step()

            for _ in range(warmup):
                step()
            torch.cuda.synchronize()
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                step()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        finally:
            dist.destroy_process_group()
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "backend": backend,
        "torch": torch.__version__,
    }


def run_torch_adam(log2n: int, iters: int, timeout: float) -> tuple[dict[str, object], str]:
    """The torch step in a subprocess (a crash or a hung NCCL init must not take gpu-check
    down): (its JSON result, "") or ({}, the error)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--torch-adam-worker", str(log2n)]
    outcome = run_command([*cmd, "--iters", str(iters)], timeout)
    for line in reversed(outcome.output.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(line), ""
    return {}, outcome.tail(5) or f"exit status {outcome.returncode}"


@dataclass
class AdamResult:
    log2n: int
    coconet: tuple[float, float] | None = None  # (median s, min s)
    coconet_error: str = ""
    torch: dict[str, object] = field(default_factory=dict)
    torch_error: str = ""
    checked: bool | None = None  # the smallest size also runs --check against the sim oracle


# An Adam step's fewest bytes per f32 parameter on one rank: g, w, m, v read; w, m, v written.
ADAM_BYTES_PER_PARAM = 7 * 4


def copy_bandwidth() -> float | None:
    """Device memory bandwidth in bytes/s, bytes read plus written, of a 1 GiB device-to-device
    copy timed with CUDA events (best of 10 after a warm-up): the floor's denominator, measured
    in the same run as the steps it judges."""
    try:
        import cupy

        n = 1 << 28
        src = cupy.ones(n, cupy.float32)
        dst = cupy.empty_like(src)
        cupy.copyto(dst, src)
        best = float("inf")
        for _ in range(10):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            cupy.copyto(dst, src)
            stop.record()
            stop.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        del src, dst
        cupy.get_default_memory_pool().free_all_blocks()
        return 2 * 4 * n / best
    except Exception:
        return None


def run_adam(
    log2ns: Sequence[int], iters: int, timeout: float, progress: Callable[[str], None]
) -> list[AdamResult]:
    have_torch = importlib.util.find_spec("torch") is not None
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for k in log2ns:
            r = AdamResult(k)
            path = write_program(adam_program(1 << k), Path(tmp), f"adam_{k}")
            cmd = bench_command(path, 1, [ADAM_SCHEDULE], iters, timeout)
            check = k == log2ns[0]
            outcome = run_command([*cmd, "--check"] if check else cmd, timeout)
            if check:
                r.checked = outcome.ok and "match the sim oracle" in outcome.output
            r.coconet = parse_bench_table(outcome.output).get(ADAM_SCHEDULE)
            if r.coconet is None:
                r.coconet_error = outcome.tail(5) or f"exit status {outcome.returncode}"
            if have_torch:
                r.torch, r.torch_error = run_torch_adam(k, iters, timeout)
            else:
                r.torch_error = "torch is not installed"
            results.append(r)
            progress(f"  adam 2^{k}: coconet {_ms(r.coconet)}, torch {_ms(_torch_times(r))}")
    return results


def _torch_times(r: AdamResult) -> tuple[float, float] | None:
    if "median_s" not in r.torch:
        return None
    return float(r.torch["median_s"]), float(r.torch["min_s"])  # type: ignore[arg-type]


def _ms(t: tuple[float, float] | None) -> str:
    return "n/a" if t is None else f"{t[0] * 1e3:.3f} ms"


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


@dataclass
class Report:
    path: Path
    command: str
    started: str
    sections: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, text: str) -> None:
        """Add or replace a section and rewrite the file: a run cut short keeps its parts."""
        self.sections[name] = text.rstrip() + "\n"
        self.save()

    def save(self) -> None:
        head = (
            "# coconet gpu-check results\n\n"
            f"`{self.command}`, started {self.started}. Generated by benchmarks/gpu_check.py; "
            "each part is rewritten as it finishes.\n"
        )
        body = "\n".join(self.sections.values())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(head + "\n" + body)


def _code_cell(text: str) -> str:
    """Output inside a table cell: one line, pipes escaped."""
    return "`" + _one_line(text).replace("`", "'").replace("|", "\\|") + "`"


def machine_section(info: dict[str, str]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in info.items())
    return f"## Machine\n\n| | |\n|---|---|\n{rows}\n"


def matrix_section(
    results: Sequence[CaseResult], skipped: Sequence[Skipped], gpus: int, timeout: float
) -> str:
    failed = [r for r in results if not r.outcome.ok]
    lines = [
        f"## Matrix: examples x named schedules x ranks, `--backend {BACKEND} --check`\n",
        (
            f"{len(results) - len(failed)} of {len(results)} case(s) passed; "
            f"{len(skipped)} combination(s) are not legal and were not run. Command per case: "
            f"`coco-run FILE --np N --backend {BACKEND} --schedule NAME --check -q "
            f"{' '.join(job_limits(timeout))}`."
        ),
    ]
    if any(r.case.ranks > gpus for r in results):
        lines.append(
            f"\nThis machine has {gpus} GPU(s): ranks beyond that share GPUs (rank r uses GPU "
            "r mod count) and their collectives cannot use NCCL, which refuses two ranks on one "
            "GPU (runtime/cuda.py picks the transport); such rows say `shared`."
        )
    lines += ["", "| example | schedule | ranks | result | seconds |", "|---|---|---|---|---|"]
    for r in results:
        c = r.case
        shared = " (shared)" if c.ranks > gpus else ""
        verdict = "pass" if r.outcome.ok else f"**FAIL** (status {r.outcome.returncode})"
        lines.append(
            f"| {c.example.name} | `{c.schedule}` | {c.ranks}{shared} | {verdict} "
            f"| {r.outcome.seconds:.1f} |"
        )
    if failed:
        lines.append("\n### Failures (last lines of output)\n")
        for r in failed:
            c = r.case
            lines.append(f"**{c.example.name} `{c.schedule}` --np {c.ranks}**\n")
            lines.append("```\n" + r.outcome.tail() + "\n```\n")
    if skipped:
        lines.append("\n### Not legal, not run\n")
        lines += ["| example | schedule | ranks | why |", "|---|---|---|---|"]
        for s in skipped:
            lines.append(
                f"| {s.example.name} | {f'`{s.schedule}`' if s.schedule else '(all)'} "
                f"| {s.ranks} | {_code_cell(s.reason)} |"
            )
    return "\n".join(lines) + "\n"


def tests_section(run: TestRun) -> str:
    verdict = "passed" if run.ok else "**FAILED**"
    text = (
        "## GPU tests: `python -m pytest -q -m gpu test`\n\n"
        f"{verdict} (status {run.outcome.returncode}, {run.outcome.seconds:.0f} s): "
        f"`{run.summary}`\n"
    )
    if run.ran_none:
        text += "\nNo GPU test ran on this GPU machine: check their skip conditions.\n"
    if not run.ok:
        text += "\n```\n" + run.outcome.tail(40) + "\n```\n"
    return text


def bandwidth_section(
    schedules: Sequence[str],
    results: Sequence[BenchResult],
    ranks: int,
    iters: int,
    gpus: int | None = None,
) -> str:
    gpus = ranks if gpus is None else gpus
    if ranks <= gpus:
        where = f"{ranks} rank(s), one GPU each"
        transport = (
            "`ar-c` and `rs-c-ag` use NCCL collectives; `fuse(rs-c-ag)` is coconet's fused "
            "kernel over CUDA IPC buffers."
        )
    else:
        where = f"{ranks} rank(s) sharing {gpus} GPU(s)"
        transport = (
            "The ranks share a GPU, which NCCL refuses: `ar-c` and `rs-c-ag` run their "
            "collectives through MPI with host copies (runtime/cuda.py picks the transport), so "
            "their figures measure that path, not NCCL. `fuse(rs-c-ag)` is coconet's fused "
            "kernel over CUDA IPC buffers in the one GPU's memory; its ranks' kernels take turns "
            "on the GPU (time slices, no MPS), so every step pays for the peers' handshakes "
            "across a context switch (a floor near 5 ms per step on an H200). Neither is a "
            "figure of a multi-GPU fabric."
        )
    lines = [
        f"## all_reduce bandwidth on {where}\n",
        (
            "A generated program: `w = 0.5 * all_reduce(g)`, f32, g local, w replicated. Each "
            f"schedule runs under `coco-run --bench` (median of {iters} steps after 5 warm-up, "
            "slowest rank per step; 1 us resolution). busbw follows nccl-tests: algbw = bytes "
            "/ time, busbw = algbw * 2(n-1)/n. The step also scales and stores w, so these are "
            "lower bounds on the collective's own bandwidth. " + transport
        ),
        "",
    ]
    head = "| size |" + "".join(f" `{s}` median | `{s}` busbw GB/s |" for s in schedules)
    lines += [head, "|---|" + "---|---|" * len(schedules)]
    for r in results:
        cells = []
        for s in schedules:
            t = r.times.get(s)
            if t is None:
                cells += ["failed", "-"]
                continue
            nbytes = parse_size(r.label)
            busbw = bus_bandwidth(nbytes, t[0], ranks)[1] if t[0] > 0 else float("nan")
            cells += [f"{t[0] * 1e3:.3f} ms", f"{busbw:.1f}"]
        lines.append(f"| {r.label} | " + " | ".join(cells) + " |")
    errors = [r for r in results if r.error]
    for r in errors:
        lines.append(f"\n{r.label} failed:\n\n```\n{r.error}\n```")
    return "\n".join(lines) + "\n"


def parse_size(label: str) -> int:
    value, unit = label.split()
    return int(value) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]


def adam_section(results: Sequence[AdamResult], iters: int, bandwidth: float | None = None) -> str:
    floor_note = (
        f"The floor is the step's fewest bytes ({ADAM_BYTES_PER_PARAM} per parameter: g, w, m, "
        f"v read, w, m, v written) over the device copy bandwidth measured in this run, "
        f"{bandwidth / 1e12:.2f} TB/s (1 GiB device-to-device copy, read + written)."
        if bandwidth
        else "No copy bandwidth was measured, so no floor."
    )
    lines = [
        "## Adam step: coconet `fuse(rs-c-ag)` vs PyTorch\n",
        (
            "One process, one GPU, f32. coconet: examples/adam.py at the size, "
            f"`coco-run --np 1 --backend cuda --schedule '{ADAM_SCHEDULE}' --bench` (median "
            f"of {iters}; the smallest size also with `--check`). PyTorch: "
            "`dist.all_reduce(grad)` in a one-process world + "
            "`torch.optim.Adam(fused=True).step()`, synchronized, median of the same count. "
            + floor_note
        ),
        "",
        "Above 1x in the ratio column, the coconet step is the faster one.",
        "",
        "| parameters | coconet median | torch median | torch / coconet | coconet / floor "
        "| torch / floor | torch backend |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        tt = _torch_times(r)
        ratio = f"{tt[0] / r.coconet[0]:.2f}x" if tt and r.coconet and r.coconet[0] > 0 else "-"
        floor = ADAM_BYTES_PER_PARAM * (1 << r.log2n) / bandwidth if bandwidth else None
        ours = f"{r.coconet[0] / floor:.2f}x" if floor and r.coconet else "-"
        theirs = f"{tt[0] / floor:.2f}x" if floor and tt else "-"
        backend = str(r.torch.get("backend", "-"))
        lines.append(
            f"| 2^{r.log2n} | {_ms(r.coconet)} | {_ms(tt)} | {ratio} | {ours} | {theirs} "
            f"| {backend} |"
        )
    for r in results:
        if r.checked is not None:
            verdict = "match the sim oracle" if r.checked else "**do NOT match the sim oracle**"
            lines.append(f"\nAt 2^{r.log2n}, `--check`: the outputs {verdict}.")
        if r.coconet_error:
            lines.append(f"\ncoconet at 2^{r.log2n} failed:\n\n```\n{r.coconet_error}\n```")
        if r.torch_error:
            lines.append(f"\ntorch at 2^{r.log2n}: {_code_cell(r.torch_error)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse_ranks(text: str) -> tuple[int, ...]:
    try:
        ranks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rank counts like 1,2,4, got '{text}'") from None
    if not ranks or min(ranks) < 1:
        raise argparse.ArgumentTypeError(f"rank counts must be at least 1, got '{text}'")
    return ranks


def parse_parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise argparse.ArgumentTypeError(f"parts are {','.join(PARTS)}; got '{text}'")
    return parts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu_check.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="the markdown report (gpu-check-results.md)"
    )
    p.add_argument("--quick", action="store_true", help="fewer benchmark sizes and steps")
    p.add_argument(
        "--ranks", type=parse_ranks, default=DEFAULT_RANKS, help="matrix rank counts (1,2,4)"
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per matrix case (default 300)"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="matrix cases run at once (default 1; they share the GPU, so timings are not "
        "measured in the matrix)",
    )
    p.add_argument(
        "--parts", type=parse_parts, default=PARTS, help=f"what to run (default {','.join(PARTS)})"
    )
    p.add_argument(
        "--bw-ranks",
        type=int,
        default=None,
        help="ranks of the bandwidth benchmark (default: GPUs visible, at most max(--ranks))",
    )
    p.add_argument(
        "--require-gpu",
        action="store_true",
        help="no usable GPU is an error, not a note (make gpu-check, once nvidia-smi saw one)",
    )
    p.add_argument("--torch-adam-worker", type=int, metavar="LOG2N", help=argparse.SUPPRESS)
    p.add_argument(
        "--iters", type=int, default=None, help="timed steps per benchmark (20; --quick: 10)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.torch_adam_worker is not None:
        result = torch_adam_step(args.torch_adam_worker, 5, args.iters or 20)
        print(json.dumps(result), flush=True)
        return 0
    try:
        usable, reason = detect_gpu()
    except NotInstalled as e:
        print(f"gpu-check: error: {e}", file=sys.stderr)
        return 2
    if not usable:
        if args.require_gpu:
            print(f"gpu-check: error: no usable CUDA GPU ({reason})", file=sys.stderr)
            return 1
        print(f"gpu-check: no CUDA GPU visible ({reason}); nothing to check on this machine")
        return 0
    return check(args, argv)


def _progress(line: str) -> None:
    print(line, flush=True)


@contextlib.contextmanager
def _part(name: str) -> Iterator[None]:
    _progress(f"gpu-check: {name} ...")
    t0 = time.perf_counter()
    yield
    _progress(f"gpu-check: {name} done in {time.perf_counter() - t0:.0f} s")


def check(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Everything, with a GPU present; returns the exit status."""
    info = machine_info()
    gpus = int(info["GPUs"])
    command = "python benchmarks/gpu_check.py " + shlex.join(argv)
    report = Report(args.out, command.strip(), time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    report.set("machine", machine_section(info))
    _progress(f"gpu-check: {gpus} GPU(s): {info.get('GPU 0', '?')}; report: {args.out}")
    summary: list[str] = []
    status = 0
    iters = args.iters or (10 if args.quick else 20)

    if "matrix" in args.parts:
        with _part("matrix"):
            cases, skipped = enumerate_matrix(EXAMPLES, args.ranks)
            _progress(f"  {len(cases)} case(s), {len(skipped)} illegal combination(s) left out")
            results = run_matrix(cases, args.timeout, _progress, args.jobs)
        report.set("matrix", matrix_section(results, skipped, gpus, args.timeout))
        failed = sum(not r.outcome.ok for r in results)
        shared = sum(not r.outcome.ok and r.case.ranks > gpus for r in results)
        note = f" ({shared} of the failures on ranks sharing a GPU)" if shared else ""
        summary.append(f"matrix: {len(results) - failed}/{len(results)} passed{note}")
        status |= failed > 0

    if "tests" in args.parts:
        with _part("GPU tests"):
            run = run_gpu_tests(timeout=max(args.timeout, 1800.0))
        report.set("tests", tests_section(run))
        summary.append(f"GPU tests: {run.summary}" + ("" if run.ok else " (FAILED)"))
        status |= not run.ok

    if "bandwidth" in args.parts:
        bw_ranks = args.bw_ranks or min(gpus, max(args.ranks))
        if bw_ranks < 2:
            text = (
                "## all_reduce bandwidth\n\nNot measured: it needs at least 2 GPUs (an all_reduce "
                f"on one rank moves nothing; busbw = 0), and this machine has {gpus}.\n"
            )
            report.set("bandwidth", text)
            summary.append("bandwidth: skipped (needs 2 GPUs)")
        else:
            with _part(f"all_reduce bandwidth on {bw_ranks} rank(s)"):
                sizes = BW_SIZES_QUICK if args.quick else BW_SIZES
                schedules, bw = run_bandwidth(sizes, bw_ranks, iters, 3 * args.timeout, _progress)
            report.set("bandwidth", bandwidth_section(schedules, bw, bw_ranks, iters, gpus))
            bad = sum(bool(r.error) for r in bw)
            summary.append(f"bandwidth: {len(bw) - bad}/{len(bw)} sizes measured")

    if "adam" in args.parts:
        with _part("Adam vs PyTorch"):
            log2ns = ADAM_LOG2N_QUICK if args.quick else ADAM_LOG2N
            bandwidth = copy_bandwidth()
            adam = run_adam(log2ns, iters, 3 * args.timeout, _progress)
        report.set("adam", adam_section(adam, iters, bandwidth))
        bad = sum(r.coconet is None for r in adam)
        status |= any(r.checked is False for r in adam)
        torch_note = "" if all(_torch_times(r) for r in adam) else ", torch side incomplete"
        summary.append(f"adam: {len(adam) - bad}/{len(adam)} sizes measured{torch_note}")

    if "graphs" in args.parts:
        ranks = min(gpus, 2)
        with _part(f"CUDA graphs on {ranks} rank(s)"):
            graphs = run_graphs(GRAPH_SIZES, ranks, max(iters, 50), 3 * args.timeout, _progress)
        report.set("graphs", graphs_section(graphs, ranks, max(iters, 50)))
        bad = sum(bool(r.error) for r in graphs)
        summary.append(f"graphs: {len(graphs) - bad}/{len(graphs)} sizes measured")

    verdict = "FAILED" if status else "ok"
    _progress(f"gpu-check: {verdict}: " + "; ".join(summary) + f". Report: {args.out}")
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
