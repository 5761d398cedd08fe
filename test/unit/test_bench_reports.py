"""The reports a performance engineer reads, without launching ranks: nccl-tests' bandwidth
conventions on lowered plans (busbw / algbw is the collective's factor under every schedule),
coco-bench's size sweep and its refusals, the trace hook of the plan walker (every step on its
stream's track, nothing bound when tracing is off), the trace-event document, the plot, and
`coco-opt --list-passes`. tests/mpi/test_bench_mpi.py runs all of it on real ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import coconet
from coconet.compile import apply_schedule
from coconet.core.program import CocoError
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import COMM_STREAM, COMPUTE_STREAM
from coconet.runtime.executor import PlanRunner, plan_traffic
from coconet.runtime.trace import StepTracer, trace_document
from coconet.schedule import named_schedules
from coconet.tools.coco_bench import (
    ProgressSink,
    op_program,
    parse_size,
    sweep_sizes,
    write_plot,
)
from coconet.tools.rank_job import (
    PROGRESS_MARKER,
    BenchRow,
    nccl_bus_factor,
    plan_size,
    program_size,
    sweep_header,
    sweep_row,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_tool(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


# ---------------------------------------------------------------------------------------------
# Bandwidth conventions
# ---------------------------------------------------------------------------------------------


def test_nccl_bus_factors():
    assert nccl_bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert nccl_bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert nccl_bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert nccl_bus_factor("broadcast", 4) == 1.0
    assert nccl_bus_factor("all_to_all", 4) == pytest.approx(0.75)  # nccl-tests' alltoall
    assert nccl_bus_factor("all_reduce", 1) == 0.0  # one rank moves nothing
    with pytest.raises(ValueError, match="no bus bandwidth factor for 'gather'"):
        nccl_bus_factor("gather", 4)


@pytest.mark.parametrize("ranks", [2, 4, 8])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
def test_every_schedule_of_a_collective_has_its_nccl_bus_factor(op, ranks):
    """busbw / algbw = plan_traffic / plan_size of the program as written: nccl-tests' factor of
    the collective, whether it runs as a library all_reduce, split into reduce_scatter +
    all_gather, or as coconet's fused kernel over symmetric memory."""
    count = 1024 * ranks
    program = op_program(op, "f32", count)
    size = program_size(program, ranks)
    # nccl-tests' size: the buffer, the RS input, the AG output, the all_to_all's input
    assert size == 4 * count
    schedules = list(named_schedules(program)) or [None]
    if op == "all_reduce":
        assert schedules == ["ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)"]
    for spec in schedules:
        plan = lower(apply_schedule(program, spec), ranks)
        traffic = max(plan_traffic(plan, r) for r in range(ranks))
        # the one-shot form: every peer reads this rank's whole input
        bus = ranks - 1 if spec == "fuse(ar-c)" else nccl_bus_factor(op, ranks)
        assert traffic / size == pytest.approx(bus), spec


@pytest.mark.parametrize(("dtype", "itemsize"), [("bf16", 2), ("f8E4M3FN", 1), ("f8E5M2", 1)])
def test_narrow_types_move_their_own_bytes(dtype, itemsize):
    """coco-bench -d bf16/f8E4M3FN/f8E5M2: the size and every schedule's traffic count the
    type's own bytes (fp8 moves a quarter of f32's), with the same bus factor."""
    count, ranks = 4096, 4
    program = op_program("all_reduce", dtype, count)
    size = program_size(program, ranks)
    assert size == itemsize * count
    for spec in named_schedules(program):
        plan = lower(apply_schedule(program, spec), ranks)
        traffic = max(plan_traffic(plan, r) for r in range(ranks))
        # the one-shot form: every peer reads this rank's whole input
        bus = ranks - 1 if spec == "fuse(ar-c)" else nccl_bus_factor("all_reduce", ranks)
        assert traffic / size == pytest.approx(bus), spec


def test_bench_row_bandwidths_follow_the_conventions():
    row = BenchRow("ar-c", 2e-3, 1e-3, 3 << 20, 2, 1, size_bytes=2 << 20)
    assert row.algbw == pytest.approx((2 << 20) / 2e-3 / 1e9)
    assert row.busbw == pytest.approx((3 << 20) / 2e-3 / 1e9)
    assert row.busbw / row.algbw == pytest.approx(1.5)  # 2(n-1)/n at n = 4
    doc = row.as_json()
    assert doc["busbw_factor"] == pytest.approx(1.5)
    assert doc["size_bytes"] == 2 << 20
    assert BenchRow("x", 1e-3, 1e-3, 10, 1, 0).algbw is None  # size unknown: no algbw


def test_plan_size_counts_chunked_collectives_once():
    """An overlapped matmul + all_reduce runs its all_reduce in row chunks: together they are
    the all_reduce of the program as written."""
    program = coconet.load(EXAMPLES / "model_parallel_mlp.mlir")
    whole = lower(program, 2)
    chunked = lower(apply_schedule(program, "coco-overlap{ops=layer}"), 2)
    assert sum(s.stream == COMM_STREAM for s in chunked.steps) > 1
    assert plan_size(chunked, 0) == plan_size(whole, 0) == 2 * 16 * 64 * 2  # f16


# ---------------------------------------------------------------------------------------------
# coco-bench: sizes, rows, progress, refusals
# ---------------------------------------------------------------------------------------------


def test_sizes_follow_min_max_and_factor():
    assert sweep_sizes(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    assert sweep_sizes(1024, 10000, 4) == [1024, 4096]  # at most -e, as nccl-tests
    assert sweep_sizes(64, 64, 2) == [64]
    assert parse_size("64K", "-b") == 64 << 10
    assert parse_size("1G", "-e") == 1 << 30
    assert parse_size("16MiB", "-e") == 16 << 20
    assert parse_size("100", "-b") == 100
    with pytest.raises(CocoError, match="larger than -e"):
        sweep_sizes(4096, 1024, 2)
    with pytest.raises(CocoError, match="at least 2"):
        sweep_sizes(1024, 4096, 1)
    with pytest.raises(CocoError, match="byte count"):
        parse_size("12Q", "-b")


def test_sweep_rows_line_up_under_their_header():
    labels = ["ar-c", "fuse(rs-c-ag)"]
    header = sweep_header("coco-bench: test", labels).splitlines()
    assert header[0] == "# coco-bench: test"
    assert any("busbw = bytes/rank / time" in ln for ln in header)
    columns = header[-1]
    row = BenchRow(
        "ar-c", 1e-4, 9e-5, 1536, 1, 0, size_bytes=1024, meta={"count": 256, "dtype": "f32"}
    )
    line = sweep_row(row, labels)
    assert line.split() == ["1024", "256", "f32", "ar-c", "100.0", "90.0", "0.010", "0.015", "1536"]
    # Right-aligned columns end where their titles end.
    assert line.index("1536") + 4 == len(columns)


class FakeBar:
    def __init__(self):
        self.n = 0
        self.written: list[str] = []

    def update(self, k):
        self.n += k

    def write(self, line, file=None):
        self.written.append(line)


def test_progress_markers_move_the_bar_and_are_not_shown():
    import io

    out, bar = io.StringIO(), FakeBar()
    sink = ProgressSink(out, bar)
    sink.write(f"# header\n{PROGRESS_MARKER}\n  1024 row")
    sink.write(f"\n{PROGRESS_MARKER}\n")
    assert bar.n == 2
    assert bar.written == ["# header", "  1024 row"]
    plain = ProgressSink(out)  # no bar (not a terminal): rows pass, markers vanish
    plain.write(f"row\n{PROGRESS_MARKER}\n")
    assert out.getvalue() == "row\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-b", "4K", "-e", "1K"], "larger than -e/--maxbytes"),
        (["-f", "1"], "-f/--stepfactor must be at least 2"),
        (["-f", "two"], "expected an integer"),
        (["-b", "1Q"], "byte count"),
        (["-b", "2", "-e", "4"], "less than one element per rank"),
        (["--json", "README.md/rows.json"], "is not a directory"),
        (["--plot", "examples"], "is a directory"),
        (["--trace", "README.md/t.json"], "is not a directory"),
        (["--schedule", "no-such-schedule"], "no-such-schedule"),
        (["--op", "reduce_scatter", "--schedule", "ar-c"], "needs an all_reduce"),
        (["examples/adam.mlir", "-b", "1K"], "one size"),
        (["examples/model_parallel_mlp.py"], "build(n) to take the tensor size"),
        (["examples/adam.py", "--op", "all_reduce"], "not both"),
        (["-n", "0"], "-n/--iters"),
        (["--np", "0"], "--np must be at least 1"),
    ],
)
def test_bad_invocations_are_one_clear_error(args, message):
    r = run_tool("coconet.tools.coco_bench", *args, "--backend", "cpu")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("coco-bench: error: "), r.stderr
    assert message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--np", "2", "--backend", "sim", "--trace", "t.json"], "--backend cpu or cuda"),
        (["--np", "2", "--backend", "sim", "--bench", "--json", "README.md/x"], "not a directory"),
        (["--np", "2", "--backend", "sim", "--json", "x.json"], "add --bench"),
        (["--np", "2", "--backend", "cpu", "--trace", "examples"], "is a directory"),
    ],
)
def test_coco_run_refuses_bad_report_options(args, message):
    r = run_tool("coconet.tools.coco_run", str(EXAMPLES / "sgd.mlir"), *args)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("coco-run: error: "), r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_sim_bench_rows_have_size_and_bandwidths(tmp_path):
    rows = tmp_path / "rows.json"
    r = run_tool(
        "coconet.tools.coco_run",
        str(EXAMPLES / "adam.mlir"),
        *("--np", "4", "--backend", "sim", "--bench", "-q", "--iters", "2", "--warmup", "0"),
        *("--schedule", "ar-c", "--schedule", "rs-c-ag", "--json", str(rows)),
    )
    assert r.returncode == 0, r.stderr
    assert "algbw GB/s" in r.stdout
    assert "busbw = bytes/rank / time" in r.stdout
    doc = json.loads(rows.read_text())
    assert {row["schedule"] for row in doc["rows"]} == {"ar-c", "rs-c-ag"}
    for row in doc["rows"]:
        assert row["size_bytes"] == 4096 * 4
        assert row["bytes_per_rank"] == 4096 * 4 * 3 // 2
        assert row["busbw_GBps"] / row["algbw_GBps"] == pytest.approx(1.5)


# ---------------------------------------------------------------------------------------------
# The trace hook and the trace-event document
# ---------------------------------------------------------------------------------------------


class NullBackend:
    """Does nothing, fast: the walker's steps are all that is observed."""

    name = "null"

    def __init__(self, size):
        self.rank, self.size = 0, size
        self.synchronized = 0

    def allocate_symmetric(self, buffers):
        return {b.name: {r: 4096 * (r + 1) for r in range(self.size)} for b in buffers}

    def peer_table(self, addresses):
        return 1

    def address(self, name):
        return 8

    def synchronize(self):
        self.synchronized += 1

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def overlap_plan():
    program = coconet.load(EXAMPLES / "model_parallel_mlp.mlir")
    return lower(apply_schedule(program, "coco-overlap{ops=layer}"), 2)


def test_traced_runs_record_every_step_on_its_streams_track():
    plan = overlap_plan()
    runner = PlanRunner(plan, 1, NullBackend(2))
    runner.setup()
    assert "execute" not in runner.__dict__  # tracing off: the class's walker, untouched
    tracer = StepTracer(1)
    tracer.context = {"schedule": "overlap"}
    runner.trace(tracer)
    runner.run()
    runner.run()
    runner.trace(None)
    assert "execute" not in runner.__dict__
    assert runner.tracer is None
    runner.run()  # after tracing stops, nothing more is recorded
    steps = [e for e in tracer.events if e["cat"] != "sync"]
    assert len(steps) == 2 * len(plan.steps)
    assert [e["args"]["step"] for e in steps] == 2 * list(range(len(plan.steps)))
    assert [e["tid"] for e in steps[: len(plan.steps)]] == [s.stream for s in plan.steps]
    assert {e["tid"] for e in steps} == {COMPUTE_STREAM, COMM_STREAM}
    assert {e["cat"] for e in steps} == {"matmul", "event", "collective", "kernel"}
    assert all(e["pid"] == 1 and e["ph"] == "X" and e["dur"] >= 0 for e in steps)
    assert all(e["args"]["schedule"] == "overlap" for e in steps)
    assert [e["name"] for e in tracer.events if e["cat"] == "sync"] == ["synchronize"] * 2
    starts = [e["ts"] for e in tracer.events]
    assert starts == sorted(starts)


def test_trace_document_names_ranks_and_streams():
    events = []
    for rank in range(2):
        t = StepTracer(rank, origin_ns=0)
        t.record("matmul %c", "matmul", COMPUTE_STREAM, 5_000_000 + rank, 5_002_000)
        t.record("all_reduce sum", "collective", COMM_STREAM, 5_001_000, 5_003_000)
        events.append(t.events)
    doc = json.loads(json.dumps(trace_document(events, {"program": "p"})))
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    steps = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = {(e["pid"], e.get("tid"), e["args"].get("name")) for e in meta}
    assert (0, 0, "rank 0") in names
    assert (1, 1, "stream 1 (comm)") in names
    assert {(e["pid"], e["tid"]) for e in steps} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert min(e["ts"] for e in steps) == 0  # the timeline starts at the first step
    assert all(set(e) >= {"name", "ph", "ts", "dur", "pid", "tid"} for e in steps)
    assert doc["otherData"]["program"] == "p"


def test_nvtx_is_optional():
    from coconet.runtime.trace import load_nvtx

    nvtx = load_nvtx()  # None without CuPy's NVTX library; never raises
    pushed: list[str] = []

    class Recorder:
        def RangePush(self, name):
            pushed.append(name)

        def RangePop(self):
            pushed.append("pop")

    plan = overlap_plan()
    runner = PlanRunner(plan, 0, NullBackend(2))
    runner.setup()
    runner.trace(StepTracer(0, nvtx=Recorder()))
    runner.run()
    assert pushed[:2] == ["matmul %layer", "pop"]
    assert pushed.count("pop") == len(pushed) // 2
    assert nvtx is None or hasattr(nvtx, "RangePush")


# ---------------------------------------------------------------------------------------------
# The plot
# ---------------------------------------------------------------------------------------------


def test_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [
        {"schedule": s, "size_bytes": n, "time_s": n / 1e9 * k, "busbw_GBps": 1 / k}
        for s, k in (("ar-c", 2.0), ("fuse(rs-c-ag)", 1.0))
        for n in (1024, 4096, 16384)
    ]
    out = tmp_path / "sweep.png"
    write_plot(str(out), rows, "coco-bench: test")
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert out.stat().st_size > 10_000


# ---------------------------------------------------------------------------------------------
# coco-opt --list-passes / --help
# ---------------------------------------------------------------------------------------------


def test_list_passes_puts_coconet_first_with_options_and_descriptions():
    from coconet.tools.coco_opt import get_all_passes  # the schedule's, then the lowering's

    r = run_tool("coconet.tools.coco_opt", "--list-passes")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    coco = list(get_all_passes())
    assert lines[0].startswith("coconet passes")
    listed = [ln.split()[0] for ln in lines[1 : 1 + len(coco)]]
    assert [n.split("{")[0] for n in listed] == coco
    for ln in lines[1 : 1 + len(coco)]:
        assert "(no description)" not in ln, ln
        assert len(ln.split(None, 1)[1]) > 20, ln
    assert "coco-split-allreduce{ops=str,... dim=int(0)}" in r.stdout
    assert "coco-schedule{name=str}" in r.stdout  # the option as -p spells it
    assert "coco-choose-topology{ranks=int ranks-per-node=int(0) nodes=int,...}" in r.stdout
    xdsl_at = next(i for i, ln in enumerate(lines) if ln.startswith("xDSL passes"))
    assert xdsl_at == len(coco) + 2
    xdsl = [ln.split()[0].split("{")[0] for ln in lines[xdsl_at + 1 :]]
    assert "canonicalize" in xdsl
    assert not set(xdsl) & set(coco)
    assert "Applies all canonicalization patterns" in r.stdout


def test_help_lists_coconet_passes_not_every_xdsl_pass():
    r = run_tool("coconet.tools.coco_opt", "--help")
    assert r.returncode == 0, r.stderr
    assert "--list-passes" in r.stdout
    assert "coconet passes:" in r.stdout
    assert "coco-overlap{chunks=int(4)" in r.stdout
    assert "convert-arith-to-riscv" not in r.stdout  # no dump of xDSL's pass names


def test_coco_bench_is_installed_with_its_extras():
    """`coco-bench` is a console script, and both the `bench` extra and the `test` extra bring
    what --plot and the progress bar import."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["coco-bench"] == "coconet.tools.coco_bench:main"
    for extra in ("bench", "test"):
        names = {
            r.split(">")[0].split("=")[0].strip() for r in project["optional-dependencies"][extra]
        }
        assert {"matplotlib", "tqdm"} <= names, extra


def test_the_latency_report_prints_both_crossovers_from_its_times(capsys):
    """benchmarks/bench_latency.py's table and crossover lines from given times (no ranks):
    one-shot wins up to the size where two-shot first wins, in the measured p50s and in the
    cost model's picks; a form that never wins is said to win at no size."""
    import argparse

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import bench_latency
    finally:
        sys.path.pop(0)
    sizes = (1024, 8192, 65536)
    rows = {(t, n): {} for t in ("all_reduce", "AR + RMSNorm") for n in sizes}
    one = {1024: 10e-6, 8192: 20e-6, 65536: 90e-6}  # one-shot loses at 64 KiB
    times = {}
    for t, n in rows:
        for form in bench_latency.FORMS:
            if t == "AR + RMSNorm" and form == "fuse(ar-c)":
                base = 99e-6  # never ahead of two-shot here
            else:
                base = one[n] if form == "fuse(ar-c)" else 50e-6
            times[(t, n, f"coconet {form}")] = [base] * 5
        times[(t, n, "mpi4py")] = [12e-6] * 5
        rows[(t, n)] = {"mpi4py": None}
    chosen = {f"all_reduce/{n}": "fuse(ar-c)" if n <= 1024 else "fuse(rs-c-ag)" for n in sizes}
    args = argparse.Namespace(rounds=1, iters=5, warmup=1)
    bench_latency.report(2, rows, times, chosen, args)
    out = capsys.readouterr().out
    assert (
        "all_reduce: one-shot beats two-shot at every size up to 8 KiB measured, at every "
        "size up to 1 KiB predicted" in out
    )
    assert "AR + RMSNorm: one-shot beats two-shot at no size measured, at no size predicted" in out
    assert "    64 KiB" in out
