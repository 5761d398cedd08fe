"""benchmarks/gpu_check.py (`make gpu-check`) on a machine without a GPU: the one-line exit, the
case enumeration it would run on a GPU, and the arithmetic and parsing of its reports."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from coconet.compile import gpu_available
from coconet.core.program import load
from coconet.schedule import named_schedules

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
EXAMPLES = REPO / "examples"
NO_GPU_PREFIX = "gpu-check: no CUDA GPU visible ("
NO_GPU_SUFFIX = "); nothing to check on this machine"


@functools.cache
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@functools.cache
def matrix(ranks: tuple[int, ...] = (1, 2, 4)):
    """The matrix (cases, skipped), enumerated once a process: it lists every example's named
    schedules (seconds)."""
    return gpu_check().enumerate_matrix(EXAMPLES, ranks)


@functools.cache
def offered(path: Path) -> set[str]:
    """The named schedules of an example, or the matrix's "as written" where none fits."""
    return set(named_schedules(load(path))) or {gpu_check().AS_WRITTEN}


def nvidia_smi_lists_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return any(line.startswith("GPU ") for line in listing.stdout.splitlines())


needs_no_gpu = pytest.mark.skipif(
    gpu_available(), reason="a GPU is visible: gpu_check.py would run the whole check"
)


# ---------------------------------------------------------------------------------------------
# Without a GPU: one line, status 0, nothing run
# ---------------------------------------------------------------------------------------------


@needs_no_gpu
def test_script_without_gpu_prints_one_line_and_exits_0(tmp_path: Path):
    out = tmp_path / "report.md"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith(NO_GPU_PREFIX)
    assert lines[0].endswith(NO_GPU_SUFFIX)
    reason = lines[0][len(NO_GPU_PREFIX) : -len(NO_GPU_SUFFIX)]
    assert reason.strip(), "the line must say why there is no GPU"
    assert r.stderr == ""
    assert not out.exists(), "without a GPU nothing runs, so no report is written"


@needs_no_gpu
def test_script_require_gpu_is_an_error_without_one(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--require-gpu", "--out", str(tmp_path / "r.md")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.startswith("gpu-check: error: no usable CUDA GPU (")
    assert len(r.stderr.splitlines()) == 1


def run_make(env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "gpu-check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


needs_make_without_gpu = pytest.mark.skipif(
    shutil.which("make") is None or nvidia_smi_lists_gpu(),
    reason="no make, or nvidia-smi lists a GPU (make gpu-check would install and run it all)",
)


@needs_make_without_gpu
def test_make_gpu_check_without_gpu_prints_one_line_and_exits_0():
    venv_before = (REPO / ".venv-gpu").exists()
    r = run_make()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith(NO_GPU_PREFIX)
    assert lines[0].endswith(NO_GPU_SUFFIX)
    assert r.stderr == ""
    assert (REPO / ".venv-gpu").exists() == venv_before, "nothing is installed without a GPU"


@needs_make_without_gpu
def test_make_gpu_check_when_nvidia_smi_lists_nothing(tmp_path: Path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    r = run_make(env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{NO_GPU_PREFIX}nvidia-smi lists no GPU{NO_GPU_SUFFIX}"]


# ---------------------------------------------------------------------------------------------
# The matrix it would run
# ---------------------------------------------------------------------------------------------


def test_matrix_covers_every_example_with_every_schedule_it_is_offered():
    cases, _ = matrix()
    examples = {p.name for p in EXAMPLES.glob("*.mlir")}
    assert len(examples) >= 9
    assert {c.example.name for c in cases} == examples
    several = 0
    for name in examples:
        schedules = {c.schedule for c in cases if c.example.name == name}
        # as written where no named schedule fits (examples/fp8_allgather_matmul)
        assert schedules == offered(EXAMPLES / name), name
        several += len(schedules) >= 3
    assert several >= 9  # (ZeRO-3's step is offered one schedule; the others several)
    assert len(set(cases)) == len(cases), "no case twice"


def test_matrix_adam_has_the_three_coconet_schedules_at_2_ranks():
    cases, _ = matrix()
    at2 = {c.schedule for c in cases if c.example.name == "adam.mlir" and c.ranks == 2}
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)"} <= at2


def test_matrix_includes_overlap_and_sliced_send_schedules():
    cases, _ = matrix()
    mlp = {c.schedule for c in cases if c.example.name == "model_parallel_mlp.mlir"}
    assert "ol(mm,fuse(rs-c-ag))" in mlp
    boundary = {c.schedule for c in cases if c.example.name == "pipeline_boundary.mlir"}
    assert {"sliced-send", "fuse(sliced-send)"} <= boundary


def test_matrix_schedules_are_named_schedules_of_their_program():
    cases, _ = matrix()
    for c in cases:
        assert c.schedule in offered(c.example), c


def test_matrix_only_legal_rank_counts_and_says_why_not():
    cases, skipped = matrix()
    for c in cases:
        load(c.example).grid.bind(c.ranks)  # raises if the grid cannot take that many ranks
    boundary = {c.ranks for c in cases if c.example.name == "pipeline_boundary.mlir"}
    assert boundary == {2, 4}, "its grid is [2, ?]: 1 rank cannot fill it"
    why = [s for s in skipped if s.example.name == "pipeline_boundary.mlir" and s.ranks == 1]
    assert why
    assert "multiple of 2" in why[0].reason
    # Every example x named schedule x rank count is either a case or explained.
    run = {(c.example, c.schedule, c.ranks) for c in cases}
    for path in EXAMPLES.glob("*.mlir"):
        for name in offered(path) - {gpu_check().AS_WRITTEN}:
            for n in (1, 2, 4):
                if (path, name, n) in run:
                    continue
                assert any(
                    s.example == path and s.ranks == n and s.schedule in (None, name)
                    for s in skipped
                ), (path.name, name, n)


def test_matrix_cases_follows_the_ranks_asked_for():
    cases = gpu_check().matrix_cases(EXAMPLES, (2,))
    assert cases
    assert {c.ranks for c in cases} == {2}


def test_case_command_is_a_checked_cuda_coco_run_with_limits():
    gc = gpu_check()
    case = gc.Case(EXAMPLES / "adam.mlir", "fuse(rs-c-ag)", 2)
    cmd = gc.case_command(case, 120)
    i = cmd.index(str(case.example))
    assert cmd[i + 1 :][:6] == ["--np", "2", "--backend", "cuda", "--schedule", "fuse(rs-c-ag)"]
    assert {"--check", "-q", "--timeout", "--step-timeout"} <= set(cmd)


def test_bandwidth_program_has_library_and_fused_schedules():
    program = gpu_check().allreduce_program(1 << 20)
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)"} <= set(named_schedules(program))


# ---------------------------------------------------------------------------------------------
# Arithmetic and parsing
# ---------------------------------------------------------------------------------------------


def test_bus_bandwidth_follows_nccl_tests():
    bus_bandwidth = gpu_check().bus_bandwidth
    algbw, busbw = bus_bandwidth(1 << 30, 0.010, 8)
    assert algbw == pytest.approx((1 << 30) / 0.010 / 1e9)  # 107.37 GB/s
    assert busbw == pytest.approx(algbw * 2 * 7 / 8)  # 187.9 GB/s
    algbw2, busbw2 = bus_bandwidth(4 << 20, 1e-3, 2)
    assert busbw2 == pytest.approx(algbw2) == pytest.approx(4.194304)
    assert bus_bandwidth(1 << 20, 1e-3, 1)[1] == 0.0, "one rank moves nothing"
    with pytest.raises(ValueError, match="need a positive time"):
        bus_bandwidth(1 << 20, 0.0, 2)


def test_benchmark_sizes():
    gc = gpu_check()
    assert gc.BW_SIZES[0] == 1 << 20
    assert gc.BW_SIZES[-1] == 1 << 30
    assert set(gc.BW_SIZES_QUICK) < set(gc.BW_SIZES)
    assert [gc.parse_size(gc.fmt_bytes(n)) for n in gc.BW_SIZES] == list(gc.BW_SIZES)
    assert gc.fmt_bytes(1 << 30) == "1 GiB"
    assert gc.fmt_bytes(4 << 20) == "4 MiB"
    assert gc.ADAM_LOG2N == (24, 25, 26, 27, 28)


def test_parse_bench_table_reads_coco_run_bench_output(capsys):
    from coconet.tools.rank_job import BenchRow, print_bench_table

    rows = [
        BenchRow("ar-c", 1.5e-3, 1.2e-3, 4 << 20, 2, 1),
        BenchRow("fuse(rs-c-ag)", 0.000123, 0.0001, 4 << 20, 2, 1),
    ]
    print("check [ar-c]: every rank's outputs match the sim oracle (bit-exact)")
    print_bench_table(rows, "all_reduce", 2, "cuda", 5, 20)
    table = gpu_check().parse_bench_table(capsys.readouterr().out)
    assert table == {
        "ar-c": pytest.approx((1.5e-3, 1.2e-3)),
        "fuse(rs-c-ag)": pytest.approx((0.000123, 0.0001)),
    }


def test_bandwidth_section_reports_busbw():
    gc = gpu_check()
    results = [gc.BenchResult("1 GiB", {"ar-c": (0.010, 0.009), "fuse(rs-c-ag)": (0.005, 0.004)})]
    text = gc.bandwidth_section(["ar-c", "fuse(rs-c-ag)"], results, 2, 20)
    row = next(line for line in text.splitlines() if line.startswith("| 1 GiB"))
    assert "| 10.000 ms | 107.4 |" in row
    assert "| 5.000 ms | 214.7 |" in row


def test_bandwidth_section_says_when_ranks_share_a_gpu():
    gc = gpu_check()
    results = [gc.BenchResult("1 GiB", {"ar-c": (1.3, 1.2), "fuse(rs-c-ag)": (0.0116, 0.011)})]
    own = gc.bandwidth_section(["ar-c", "fuse(rs-c-ag)"], results, 2, 20, gpus=2)
    shared = gc.bandwidth_section(["ar-c", "fuse(rs-c-ag)"], results, 2, 20, gpus=1)
    assert "2 rank(s), one GPU each" in own
    assert "use NCCL collectives" in own
    assert "2 rank(s) sharing 1 GPU(s)" in shared
    assert "MPI with host copies" in shared
    assert "use NCCL collectives" not in shared


def test_adam_section_prices_both_steps_against_the_floor_of_this_run():
    gc = gpu_check()
    n = 1 << 24
    bandwidth = 4.0e12
    floor = gc.ADAM_BYTES_PER_PARAM * n / bandwidth  # 0.117 ms
    r = gc.AdamResult(24, coconet=(2 * floor, 2 * floor), checked=True)
    r.torch = {"median_s": 4 * floor, "min_s": 4 * floor, "backend": "nccl"}
    text = gc.adam_section([r], 20, bandwidth)
    row = next(line for line in text.splitlines() if line.startswith("| 2^24"))
    assert "| 2.00x | 2.00x | 4.00x | nccl |" in row
    assert "4.00 TB/s" in text
    assert "outputs match the sim oracle" in text
    r.checked = False
    assert "do NOT match" in gc.adam_section([r], 20, bandwidth)
    assert "no floor" in gc.adam_section([r], 20, None)


def test_pytest_summary_takes_the_closing_line():
    out = "....s\n===== 4 passed, 1 skipped, 300 deselected in 3.10s =====\n"
    assert gpu_check().pytest_summary(out) == "4 passed, 1 skipped, 300 deselected in 3.10s"
    assert gpu_check().pytest_summary("") == "(no output)"


def test_parse_ranks():
    gc = gpu_check()
    assert gc.parse_ranks("1,2,4") == (1, 2, 4)
    for bad in ("", "0,2", "two"):
        with pytest.raises(Exception, match="rank counts"):
            gc.parse_ranks(bad)


def test_run_command_kills_the_whole_process_group_at_the_limit():
    # The grandchild keeps the output pipe open: only killing the group lets this return.
    t0 = time.perf_counter()
    outcome = gpu_check().run_command(["sh", "-c", "echo started; sleep 60 & wait"], timeout=1)
    assert time.perf_counter() - t0 < 30
    assert outcome.returncode == -1
    assert not outcome.ok
    assert outcome.output.startswith("started")
    assert "killed after 1 s" in outcome.tail()


# slow (COCONET_FULL=1): pip's install into the new venv is ~45 s of CPU, a twentieth of the
# suite's on two cores; `make gpu-check` runs this setup first on every GPU machine.
@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("make") is None or sys.prefix == sys.base_prefix,
    reason="needs make, and this interpreter must be a venv's",
)
def test_gpu_setup_from_a_venvs_interpreter_reuses_that_venvs_packages(tmp_path: Path):
    """A GPU image's python3 may itself be a venv's (/opt/torch/.venv on this project's H200
    machine): --system-site-packages alone would reach only its base interpreter's packages,
    so the GPU venv would not see the image's CuPy and torch. Here the test's own venv plays
    the image's; nothing needs fetching, as every requirement is already in it."""
    gpu_venv = tmp_path / "gv"
    r = subprocess.run(
        ["make", "-s", "gpu-setup", f"GPU_VENV={gpu_venv}", f"GPU_PYTHON={sys.executable}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    python = gpu_venv / "bin" / "python"
    probe = "import numpy, xdsl, coconet; print(numpy.__file__)"
    where = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert where.startswith(sys.prefix), where  # the parent venv's numpy, not a new copy


def test_graphs_part_times_both_modes_and_names_the_runtimes_variable(monkeypatch):
    """The graphs part runs each size twice, COCONET_CUDA_GRAPHS=0 then 1 (the variable
    runtime/cuda.py reads), and its section prices launched against replayed."""
    from coconet.runtime.cuda import GRAPHS_ENV

    gc = gpu_check()
    assert gc.GRAPHS_ENV == GRAPHS_ENV
    assert "graphs" in gc.PARTS
    seen = []

    def fake_run(cmd, timeout, env=None):
        seen.append(env[GRAPHS_ENV])
        ms = 0.050 if env[GRAPHS_ENV] == "0" else 0.020
        rows = "".join(f"  {s}  {ms:.3f}ms  {ms:.3f}ms  x\n" for s in gc.GRAPH_SCHEDULES)
        return gc.Outcome(0, 0.1, "bench @all_reduce\n  schedule median min\n" + rows)

    monkeypatch.setattr(gc, "run_command", fake_run)
    results = gc.run_graphs([4096], 1, 50, 60.0, lambda _line: None)
    assert seen == ["0", "1"]
    text = gc.graphs_section(results, 1, 50)
    assert "| 4 KiB | `fuse(ar-c)` | 50 us | 20 us | 2.50x |" in text
    assert "| 4 KiB | `fuse(rs-c-ag)` | 50 us | 20 us | 2.50x |" in text
