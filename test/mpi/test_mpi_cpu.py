"""The cpu backend on real MPI ranks (the mpich wheel's mpiexec), through `coco-run` and the
Python API: every example under every schedule that applies, at 2 and 4 ranks, against the
sim oracle (--check); the kernel cache (a second run compiles nothing); and failures — a rank
that raises, is killed, segfaults, hangs, or cannot compile its kernels ends the whole job
promptly with one line naming it; bad inputs are refused before anything is launched.

The heavier sweep (more rank counts, exact collectives, the bench path) runs with
COCONET_FULL=1."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from mpi_env import MPI_MARKS, MPIEXEC, run_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))
FULL = os.environ.get("COCONET_FULL") == "1"

pytestmark = MPI_MARKS


def slow(test):
    """The heavier sweep: marked `slow`, run only with COCONET_FULL=1."""
    skip = pytest.mark.skipif(not FULL, reason="heavier sweep: set COCONET_FULL=1")
    return pytest.mark.slow(skip(test))


# Used when coconet.schedule (named schedules) is not there.
FALLBACK_PIPELINES = [
    "coco-split-allreduce",
    "coco-split-allreduce,coco-reorder,coco-as-slice",
    "coco-split-allreduce,coco-reorder,coco-as-slice,coco-fuse",
]


def coco_run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    return run_job(
        [sys.executable, "-m", "coconet.tools.coco_run", *args],
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


@functools.cache
def schedules_for(example: Path, ranks: int) -> tuple[list[str], list[str]] | None:
    """(named schedules, pipelines) that apply to `example` and lower on `ranks` ranks, without
    duplicates of the same scheduled IR; None when the program itself cannot run there."""
    import coconet
    from coconet.compile import apply_schedule
    from coconet.core.program import CocoError
    from coconet.lowering.lower_to_plan import lower

    program = coconet.load(example)
    try:
        lower(program, ranks)
    except CocoError:
        return None
    seen = {str(program)}
    names: list[str] = []
    pipelines: list[str] = []
    try:
        from coconet.schedule import named_schedules

        candidates = [("name", n) for n in named_schedules(program)]
    except ImportError:
        candidates = [("pipeline", p) for p in FALLBACK_PIPELINES]
    for kind, spec in candidates:
        try:
            scheduled = apply_schedule(program, spec)
            lower(scheduled, ranks)
        except CocoError:
            continue
        if str(scheduled) in seen:
            continue
        seen.add(str(scheduled))
        (names if kind == "name" else pipelines).append(spec)
    return names, pipelines


def schedule_args(names: list[str], pipelines: list[str]) -> list[str]:
    args = ["-p", ""]  # as written
    for n in names:
        args += ["--schedule", n]
    for p in pipelines:
        args += ["-p", p]
    return args


def assert_checked(r: subprocess.CompletedProcess, runs: int) -> None:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    checks = [ln for ln in r.stdout.splitlines() if ln.startswith("check [")]
    assert len(checks) == runs, r.stdout
    assert all("match the sim oracle" in ln for ln in checks)


# ---------------------------------------------------------------------------------------------
# Every example, every schedule, 2 and 4 ranks
# ---------------------------------------------------------------------------------------------


def _example_ranks():
    """Every example at 2 and 4 ranks under COCONET_FULL=1; otherwise each at one of them, in
    turn (the threaded kernels run every example at 1, 2 and 4 ranks in test_lowering: this
    sweep is about MPI ranks, which both counts cover across the examples)."""
    for i, example in enumerate(EXAMPLES):
        for ranks in (2, 4):
            marks = () if ranks == (2, 4)[i % 2] else SLOW
            yield pytest.param(example, ranks, id=f"{example.stem}-{ranks}", marks=marks)


SLOW = [
    pytest.mark.slow,
    pytest.mark.skipif(not FULL, reason="heavier sweep: set COCONET_FULL=1"),
]


@pytest.mark.parametrize(("example", "ranks"), list(_example_ranks()))
def test_example_under_every_schedule_matches_the_oracle(example, ranks):
    found = schedules_for(example, ranks)
    if found is None:
        pytest.skip(f"{example.stem} cannot run on {ranks} ranks")
    names, pipelines = found
    r = coco_run(
        str(example),
        "--np",
        str(ranks),
        "--backend",
        "cpu",
        "--check",
        *schedule_args(names, pipelines),
    )
    assert_checked(r, 1 + len(names) + len(pipelines))
    assert f"on {ranks} rank(s), backend cpu" in r.stdout


def test_dense_constants_on_real_ranks():
    """Dense constants (their values in the kernels' text) read at slices and broadcasts by
    every named schedule, on 2 MPI ranks, against the oracle."""
    program = ROOT / "test" / "unit" / "programs" / "dense_constants.mlir"
    schedules = ["ar-c", "rs-c-ag", "fuse(rs-c-ag)"]
    args = [a for n in schedules for a in ("--schedule", n)]
    r = coco_run(str(program), "--np", "2", "--backend", "cpu", "--check", "-p", "", *args)
    assert_checked(r, 1 + len(schedules))


@slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_softmax_under_every_enumerated_schedule(ranks):
    """examples/softmax_rows: every schedule of the enumerator's space (not only the named
    ones), on real MPI ranks, against the oracle."""
    import coconet
    from coconet.schedule import enumerate_schedules

    example = ROOT / "examples" / "softmax_rows.mlir"
    pipelines = [p for _, p in enumerate_schedules(coconet.load(example)) if p]
    args = [a for p in pipelines for a in ("-p", p)]
    r = coco_run(str(example), "--np", str(ranks), "--backend", "cpu", "--check", *args)
    assert_checked(r, len(pipelines))


def test_given_inputs_and_outputs_round_trip(tmp_path):
    import coconet
    from coconet.runtime import sim

    program = coconet.load(ROOT / "examples" / "sgd.mlir")
    inputs = sim.prepare_inputs(program, None, (2,), seed=7)
    np.savez(tmp_path / "in.npz", **inputs)
    r = coco_run(
        "examples/sgd.mlir",
        "--np",
        "2",
        "--backend",
        "cpu",
        "--schedule",
        "fuse(rs-c-ag)",
        "--inputs",
        str(tmp_path / "in.npz"),
        "--output",
        str(tmp_path / "out.npz"),
        "--check",
    )
    assert r.returncode == 0, r.stderr
    want = sim.run(program, inputs, ranks=2, inplace=False).outputs
    with np.load(tmp_path / "out.npz") as got:
        np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6)


def test_bench_prints_a_table():
    r = coco_run(
        "examples/adam.mlir",
        "--np",
        "2",
        "--backend",
        "cpu",
        "--bench",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--schedule",
        "ar-c",
        "--schedule",
        "fuse(rs-c-ag)",
    )
    assert r.returncode == 0, r.stderr
    table = r.stdout[r.stdout.index("bench @adam") :].split("\n\n")[0].splitlines()
    assert "bytes/rank" in table[1]
    assert "busbw GB/s" in table[1]
    rows = {ln.split()[0]: ln for ln in table[2:] if ln.strip()}
    assert set(rows) == {"ar-c", "fuse(rs-c-ag)"}
    # size: the all_reduce's 16 KiB buffer; bytes/rank: 2 (p-1)/p x 16 KiB at p = 2
    assert all(row.count("16.00 KiB") == 2 for row in rows.values())
    assert "busbw = bytes/rank / time" in r.stdout  # the table says which convention it uses


# ---------------------------------------------------------------------------------------------
# The kernel cache: the second run compiles nothing
# ---------------------------------------------------------------------------------------------


def test_second_run_compiles_nothing(tmp_path):
    env = {"COCONET_CACHE_DIR": str(tmp_path / "cache")}
    args = [
        "examples/adam.mlir",
        "--np",
        "2",
        "--backend",
        "cpu",
        "--schedule",
        "fuse(rs-c-ag)",
        "-v",
    ]
    first = coco_run(*args, env=env)
    second = coco_run(*args, env=env)
    assert first.returncode == 0, first.stderr + second.stderr
    assert second.returncode == 0, first.stderr + second.stderr
    assert "kernel cache: 1 compiled, 1 loaded from cache (2 rank(s))" in first.stdout
    assert "kernel cache: 0 compiled, 2 loaded from cache (2 rank(s))" in second.stdout
    assert list((tmp_path / "cache" / "host").glob("*/*.so"))
    # the launcher lowered the schedule into the plan cache and every rank took it from there:
    # one plan for both runs (a rank whose key differed would have lowered a second)
    assert len(list((tmp_path / "cache" / "plans").glob("*/*.plan.pickle"))) == 1


# ---------------------------------------------------------------------------------------------
# Failures: every rank exits promptly, one line names the failing rank
# ---------------------------------------------------------------------------------------------


def run_fault(
    fault: str, *extra: str, ranks: int = 2, timeout: float = 60
) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = coco_run(
        "examples/sgd.mlir",
        "--np",
        str(ranks),
        "--backend",
        "cpu",
        "--schedule",
        "rs-c-ag",
        *extra,
        env={"COCONET_FAULT": fault, "COCONET_FAULT_INJECTION": "1"},
        timeout=timeout,
    )
    return r, time.monotonic() - t0


def error_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines, r.stderr
    assert lines[0].startswith("coco-run: error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert "BAD TERMINATION" not in r.stdout + r.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("fault", "expect"),
    [
        ("1:raise:1", "rank 1: InjectedFault: injected fault at step 1"),
        ("1:kill:1", "rank 1 (pid"),
        ("1:segv:0", "Segmentation fault"),
        ("1:exit:1", "rank 1 (pid"),
        ("1:compile", "rank 1: compiling the kernels of @sgd failed"),
        ("0:raise:0:2", "rank 0: InjectedFault"),
    ],
    ids=["raise", "sigkill", "sigsegv", "hard-exit", "compile-error", "second-call"],
)
def test_a_failing_rank_ends_the_job(fault, expect):
    extra = ("--bench", "--iters", "1", "--warmup", "0") if fault.endswith(":2") else ()
    r, elapsed = run_fault(fault, *extra)
    assert r.returncode == 1
    line = error_line(r)
    assert expect in line, line
    if "kill" in fault:
        assert "SIGKILL" in line
    if "segv" in fault:
        assert line.startswith("coco-run: error: rank 1 (pid")
    assert elapsed < 30


def test_a_failing_rank_on_four_ranks():
    r, elapsed = run_fault("2:kill:2", ranks=4)
    assert r.returncode == 1
    assert "rank 2 (pid" in error_line(r)
    assert elapsed < 40


def test_a_hanging_rank_trips_the_watchdog():
    r, elapsed = run_fault("1:hang:1", "--step-timeout", "3")
    assert r.returncode == 1
    assert "no progress for 3 s in plan step" in error_line(r)
    assert elapsed < 30


def test_the_launcher_timeout_stops_everything():
    r, elapsed = run_fault("1:hang:1", "--step-timeout", "0", "--timeout", "4")
    assert r.returncode == 1
    assert "ran past --timeout 4 s" in error_line(r)
    assert elapsed < 20


def test_check_failure_names_output_rank_and_error():
    r, _ = run_fault("1:corrupt", "--check")
    assert r.returncode == 1
    line = error_line(r)
    assert "check failed" in line
    assert "output 'w' on rank 1" in line
    assert "max abs error 0.5" in line


def test_bad_inputs_are_refused_before_launch(tmp_path):
    np.savez(
        tmp_path / "bad.npz",
        g=np.zeros((3, 4096), np.float32),
        w=np.zeros(4096, np.float32),
        lr=np.float32(0.1),
    )
    t0 = time.monotonic()
    r = coco_run(
        "examples/sgd.mlir", "--np", "2", "--backend", "cpu", "--inputs", str(tmp_path / "bad.npz")
    )
    assert r.returncode == 1
    assert "input 'g'" in error_line(r)
    assert "expected shape [2, 4096]" in r.stderr
    np.savez(
        tmp_path / "bad2.npz",
        g=np.zeros((2, 4096), np.float64),
        w=np.zeros(4096, np.float32),
        lr=np.float32(0.1),
    )
    r = coco_run(
        "examples/sgd.mlir", "--np", "2", "--backend", "cpu", "--inputs", str(tmp_path / "bad2.npz")
    )
    assert r.returncode == 1
    assert "expected dtype f32" in error_line(r)
    assert time.monotonic() - t0 < 30


# ---------------------------------------------------------------------------------------------
# The Python API under mpiexec
# ---------------------------------------------------------------------------------------------

API_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import coconet
    from coconet.compile import compile
    from coconet.core import values as V
    from coconet.runtime import sim
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    program = coconet.load(sys.argv[1])
    step = compile(program, schedule=sys.argv[2], backend="cpu", pieces=True)
    logical = sim.prepare_inputs(program, None, program.grid.bind(size), seed=5)
    coords = V.coords_of(rank, step.plan.grid_shape)
    mine = {n: V.piece_of(logical[n], b.type, coords, step.plan.grid_shape) for n, b in step.plan.arguments.items()}
    w = mine["w"]
    out = step(**mine)
    assert out["w"] is w, "updates land in the caller's array"
    want = sim.run(program, logical, ranks=size, inplace=False)
    for name in out:
        ref = V.piece_of(want.outputs[name], step.plan.outputs[name].type, coords, step.plan.grid_shape)
        np.testing.assert_allclose(out[name], ref, rtol=1e-5, atol=1e-6)
    for _ in range(3):  # the same arrays: steady calls, on the fast path
        step(**mine)
    bad = dict(mine)
    if rank == 1:
        bad["g"] = np.zeros(3, np.float32)
    try:
        step(**bad)
        raise SystemExit("rank %d: bad inputs were not refused" % rank)
    except coconet.CocoError as e:
        assert "rank 1" in str(e) and "got [3]" in str(e), str(e)
    step(**mine)  # and the job goes on
    step.close()
    comm.Barrier()
    if rank == 0:
        print("API OK")
    if len(sys.argv) > 3 and rank == 1:
        raise ValueError("user code failed on rank 1")
    comm.Barrier()
    """
)


def run_script(
    tmp_path: Path, *args: str, ranks: int = 2, timeout: float = 60
) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(API_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(MPIEXEC), "-n", str(ranks), sys.executable, str(script), *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize("schedule", ["ar-c", "fuse(rs-c-ag)"])
def test_python_api_with_each_rank_passing_its_piece(tmp_path, schedule):
    r = run_script(tmp_path, str(ROOT / "examples" / "adam.mlir"), schedule)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "API OK" in r.stdout


def test_python_api_user_error_aborts_every_rank(tmp_path):
    t0 = time.monotonic()
    r = run_script(tmp_path, str(ROOT / "examples" / "sgd.mlir"), "rs-c-ag", "fail")
    assert r.returncode != 0
    assert "coconet: error: rank 1: ValueError: user code failed on rank 1" in r.stderr
    assert time.monotonic() - t0 < 40


# ---------------------------------------------------------------------------------------------
# The heavier sweep (COCONET_FULL=1)
# ---------------------------------------------------------------------------------------------


@slow
@pytest.mark.parametrize("ranks", [1, 3, 8])
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_more_rank_counts(example, ranks):
    found = schedules_for(example, ranks)
    if found is None:
        pytest.skip(f"{example.stem} cannot run on {ranks} ranks")
    names, pipelines = found
    r = coco_run(
        str(example),
        "--np",
        str(ranks),
        "--backend",
        "cpu",
        "--check",
        *schedule_args(names, pipelines),
        timeout=600,
    )
    assert_checked(r, 1 + len(names) + len(pipelines))


@slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_exact_collectives_at_four_ranks(example):
    found = schedules_for(example, 4)
    if found is None:
        pytest.skip(f"{example.stem} cannot run on 4 ranks")
    names, pipelines = found
    r = coco_run(
        str(example),
        "--np",
        "4",
        "--backend",
        "cpu",
        "--check",
        "--exact-collectives",
        *schedule_args(names, pipelines),
        timeout=600,
    )
    assert_checked(r, 1 + len(names) + len(pipelines))


POW_ROUNDING = pytest.mark.xfail(
    strict=False,
    reason="the sim computes f32 pow with NumPy (SIMD, not correctly rounded) and the kernels "
    "with powf: 1 ulp apart, and Adam's 1 - beta1^step cancellation at these seeded inputs "
    "amplifies it past the f32 tolerance (the threaded executor shows the same)",
)


@slow
@pytest.mark.parametrize("seed", [pytest.param(1, marks=POW_ROUNDING), 2])
def test_other_seeds(seed):
    for example in EXAMPLES:
        found = schedules_for(example, 2)
        if found is None:
            continue
        names, pipelines = found
        r = coco_run(
            str(example),
            "--np",
            "2",
            "--backend",
            "cpu",
            "--check",
            "--seed",
            str(seed),
            *schedule_args(names, pipelines),
            timeout=600,
        )
        assert_checked(r, 1 + len(names) + len(pipelines))
