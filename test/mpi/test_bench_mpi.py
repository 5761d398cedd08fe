"""coco-bench and coco-run's reports on real MPI ranks (the mpich wheel's mpiexec): the sweep's
JSON rows follow -b/-e/-f and nccl-tests' bus factors, the plot is a PNG, and `--trace` writes
a trace-event timeline with every rank's steps on the streams its plan uses (both, under an
overlap schedule)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_env import MPI_MARKS

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = MPI_MARKS


def tool(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ),
    )


def bus_factor(op: str, n: int) -> float:
    return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n}[op]


def test_all_reduce_sweep_rows_plot_and_trace(tmp_path):
    rows_file, plot, trace = tmp_path / "rows.json", tmp_path / "sweep.png", tmp_path / "t.json"
    r = tool(
        "coconet.tools.coco_bench",
        *("--op", "all_reduce", "-b", "1K", "-e", "8K", "-f", "2", "--np", "2"),
        *("--backend", "cpu", "-n", "2", "-w", "1"),
        *("--json", str(rows_file), "--plot", str(plot), "--trace", str(trace)),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "#coco-bench-progress" not in r.stdout  # progress markers never reach the user
    doc = json.loads(rows_file.read_text())
    schedules = ["ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)"]
    assert doc["conventions"]["busbw"].startswith("busbw = bytes/rank / time")
    rows = doc["rows"]
    for s in schedules:
        mine = [row for row in rows if row["schedule"] == s]
        assert [row["size_bytes"] for row in mine] == [1024, 2048, 4096, 8192]
        assert [row["count"] for row in mine] == [256, 512, 1024, 2048]
    for row in rows:
        assert row["ranks"] == 2
        assert row["backend"] == "cpu"
        assert len(row["times_s"]) == 2
        assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / row["time_s"] / 1e9)
        assert row["busbw_GBps"] / row["algbw_GBps"] == pytest.approx(bus_factor("all_reduce", 2))
        assert row["min_time_s"] <= row["time_s"]
    # One printed row per size and schedule, in nccl-tests' column order.
    printed = [ln.split() for ln in r.stdout.splitlines() if ln and ln.split()[0].isdigit()]
    assert len(printed) == 16
    assert [p[0] for p in printed[:4]] == ["1024"] * 4
    assert plot.read_bytes()[:8] == PNG_MAGIC
    events = json.loads(trace.read_text())["traceEvents"]
    steps = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in steps} == {0, 1}
    assert {e["args"]["schedule"] for e in steps} == set(schedules)
    # The timed steps only: -n 2 iterations of every size and schedule.
    assert {e["args"]["iteration"] for e in steps} == {0, 1}


@pytest.mark.parametrize(("op", "ranks"), [("reduce_scatter", 2), ("all_reduce", 4)])
def test_busbw_over_algbw_is_the_collectives_factor(tmp_path, op, ranks):
    rows_file = tmp_path / "rows.json"
    r = tool(
        "coconet.tools.coco_bench",
        *("--op", op, "-b", "4K", "-e", "16K", "-f", "4", "--np", str(ranks)),
        *("--backend", "cpu", "-n", "2", "-w", "0", "--json", str(rows_file)),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    rows = json.loads(rows_file.read_text())["rows"]
    assert sorted({row["size_bytes"] for row in rows}) == [4096, 16384]
    for row in rows:
        # the one-shot all_reduce's peers each read this rank's whole buffer: (n-1) x size
        want = ranks - 1 if row["schedule"] == "fuse(ar-c)" else bus_factor(op, ranks)
        assert row["busbw_factor"] == pytest.approx(want)
        assert row["busbw_GBps"] / row["algbw_GBps"] == pytest.approx(want)
    if op == "all_reduce":
        assert "fuse(ar-c)" in {row["schedule"] for row in rows}


def test_a_program_file_is_rebuilt_at_each_size(tmp_path):
    rows_file = tmp_path / "rows.json"
    r = tool(
        "coconet.tools.coco_bench",
        *("examples/adam.py", "-b", "16K", "-e", "32K", "--np", "2", "--backend", "cpu"),
        *("--schedule", "fuse(rs-c-ag)", "-n", "2", "-w", "0", "--json", str(rows_file)),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    rows = json.loads(rows_file.read_text())["rows"]
    # build(n): the gradient all_reduce carries 4n bytes, so n = size / 4.
    assert [(row["size_bytes"], row["count"]) for row in rows] == [(16384, 4096), (32768, 8192)]
    assert all(row["program"] == "adam" for row in rows)


def test_coco_run_trace_of_an_overlap_schedule_has_both_streams(tmp_path):
    """model_parallel_mlp's matmul overlapped with its all_reduce (CoCoNet's overlapped GEMM +
    AllReduce, `coco-overlap`), and its named overlap schedule: every rank's events, on the
    streams each plan uses."""
    import coconet
    from coconet.compile import apply_schedule
    from coconet.lowering.lower_to_plan import lower
    from coconet.schedule import named_schedules

    example = ROOT / "examples" / "model_parallel_mlp.mlir"
    named = next(n for n in named_schedules(coconet.load(example)) if n.startswith("ol("))
    trace, rows_file = tmp_path / "trace.json", tmp_path / "rows.json"
    r = tool(
        "coconet.tools.coco_run",
        *(str(example), "--np", "2", "--backend", "cpu", "--bench", "-q", "--check"),
        *("--iters", "2", "--warmup", "1", "--json", str(rows_file), "--trace", str(trace)),
        *("-p", "overlap=coco-overlap{ops=layer}", "--schedule", named),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert f"in {trace}" in r.stdout
    doc = json.loads(trace.read_text())
    steps = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    for label, spec in (("overlap", "coco-overlap{ops=layer}"), (named, named)):
        plan = lower(apply_schedule(coconet.load(example), spec), 2)
        mine = [e for e in steps if e["args"]["schedule"] == label]
        streams = {s.stream for s in plan.steps}
        assert {(e["pid"], e["tid"]) for e in mine} == {(p, s) for p in (0, 1) for s in streams}
        # Every plan step of both timed iterations on both ranks, plus the synchronize.
        assert len(mine) == 2 * 2 * (len(plan.steps) + 1)
        if label == "overlap":
            assert streams == {0, 1}
            cats = {e["cat"] for e in mine if e["tid"] == 1}
            assert {"collective", "event"} <= cats
    named_threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert named_threads[(1, 1)] == "stream 1 (comm)"
    rows = json.loads(rows_file.read_text())["rows"]
    assert [row["schedule"] for row in rows] == ["overlap", named]
    assert all(row["size_bytes"] == 2 * 16 * 64 * 2 for row in rows)  # the f16 all_reduce


def test_a_failing_rank_still_ends_the_sweep_with_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "coconet.tools.coco_bench", "--op", "all_reduce"]
        + ["-b", "1K", "-e", "1K", "--np", "2", "--backend", "cpu", "-n", "1", "-w", "0"],
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "COCONET_FAULT": "1:raise", "COCONET_FAULT_INJECTION": "1"},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("coco-bench: error:")]
    assert err, r.stderr
    assert "rank 1" in err[0], r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_bench_rounds_take_turns_between_schedules(tmp_path):
    """`--rounds 3`: every schedule's timed steps come in three rounds, the schedules taking
    turns (the trace's iterations interleave), and each row holds all of its steps."""
    example = ROOT / "examples" / "sgd.mlir"
    trace, rows_file = tmp_path / "trace.json", tmp_path / "rows.json"
    r = tool(
        "coconet.tools.coco_run",
        *(str(example), "--np", "2", "--backend", "cpu", "--bench", "-q"),
        *("--iters", "2", "--warmup", "0", "--rounds", "3"),
        *("--json", str(rows_file), "--trace", str(trace)),
        *("--schedule", "ar-c", "--schedule", "fuse(rs-c-ag)"),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    rows = json.loads(rows_file.read_text())["rows"]
    assert [row["schedule"] for row in rows] == ["ar-c", "fuse(rs-c-ag)"]
    assert all(len(row["times_s"]) == 2 * 3 for row in rows)
    events = [
        e
        for e in json.loads(trace.read_text())["traceEvents"]
        if e["ph"] == "X" and e["pid"] == 0 and "iteration" in e["args"]
    ]
    order: list[tuple[str, int]] = []
    for e in sorted(events, key=lambda e: e["ts"]):
        key = (e["args"]["schedule"], e["args"]["iteration"] // 2)
        if not order or order[-1] != key:
            order.append(key)
    # round r: both schedules, the first one rotating
    assert order == [
        ("ar-c", 0), ("fuse(rs-c-ag)", 0),
        ("fuse(rs-c-ag)", 1), ("ar-c", 1),
        ("ar-c", 2), ("fuse(rs-c-ag)", 2),
    ]  # fmt: skip


def test_rounds_without_bench_is_refused(tmp_path):
    r = tool(
        "coconet.tools.coco_run",
        *(str(ROOT / "examples" / "sgd.mlir"), "--np", "2", "--rounds", "2"),
    )
    assert r.returncode != 0
    assert "--rounds times --bench steps: add --bench" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_model_parallel_table_of_the_suite_runs(tmp_path):
    """benchmarks/bench_suite.py's attention output + LayerNorm table (the model-parallel
    tables' code path) end to end at a small size on 2 MPI ranks -- a broken table fails here,
    not in the next benchmark run: every offered schedule's row, the baselines, the floor."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_suite.py"
    r = subprocess.run(
        [sys.executable, str(script), "--np", "2", "--tables", "ln", "--ln-size", "1,8,64"]
        + ["--rounds", "1", "--iters", "1", "--warmup", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "examples/megatron_sp_layernorm.py" in r.stdout
    assert "LayerNorm" in r.stdout
    for row in ("coconet ar-c", "coconet fuse(rs-c-ag)", "mpi4py + NumPy", "floor"):
        assert f"  {row} " in r.stdout, row
