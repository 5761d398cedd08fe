"""The runtime's shared parts, in this process: the plan walker (with a recording backend),
kernel signatures, groups and collective regions, traffic, the oracle comparison, schedules,
`coconet.compile` (sim, and cpu on one MPI rank), coco-run's sim path and its errors, the
launcher's failure diagnosis, fault specs, and the NVRTC cubin cache. Multi-process runs are in
test/mpi/."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import coconet
from coconet.compile import apply_schedule, compile as coco_compile, is_pipeline
from coconet.core import values as V
from coconet.core.program import CocoError
from coconet.lowering.cuda_printer import c_type
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Epoch, Launch, PeerTable, RankValue
from coconet.lowering.signature import CType, KernelParam, ParamKind
from coconet.runtime import sim
from coconet.runtime.check import compare_outputs, compare_piece, tolerance
from coconet.runtime.executor import (
    PlanRunner,
    consecutive_blocks,
    flat_block,
    group_of,
    groups_of,
    kernel_signatures,
    member_region,
    plan_traffic,
)
from coconet.runtime.failures import parse_fault
from coconet.runtime.launcher import diagnose

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FUSED = "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v},coco-fuse"


def load(name: str):
    return coconet.load(EXAMPLES / f"{name}.mlir")


# ---------------------------------------------------------------------------------------------
# Signatures, groups, regions, traffic
# ---------------------------------------------------------------------------------------------


def test_kernel_signatures_type_every_parameter():
    plan = lower(apply_schedule(load("adam"), FUSED), 2)
    sigs = kernel_signatures(plan)
    assert {s.kernel for s in plan.steps if isinstance(s, Launch)} <= set(sigs)
    launch = next(
        s for s in plan.steps if isinstance(s, Launch) and any(isinstance(a, Epoch) for a in s.args)
    )
    kinds = sigs[launch.kernel]
    assert len(kinds) == len(launch.args)
    for a, k in zip(launch.args, kinds):
        if isinstance(a, Epoch | PeerTable):
            assert k == "ptr"
        elif isinstance(a, RankValue):
            assert k in ("i32", "i64")
    # The plan's signatures are the parameters the CUDA text declares, in order.
    for name, params in plan.signatures.items():
        head = plan.cuda_source.split(f"COCO_KERNEL({name},", 1)[1].split(") {", 1)[0]
        declared = [" ".join(d.split()) for d in head.split(",")]
        assert declared == [f"{c_type(p.ctype)} {p.name}" for p in params]
    assert [CType(t).abi for t in ("coco_u32", "double", "float", "bool", "coco_i64")] == [
        "u32",
        "f64",
        "f32",
        "bool",
        "i64",
    ]
    assert CType("float", pointer=True, const=True, restrict=True).abi == "ptr"
    f16 = KernelParam("h", ParamKind.IN, CType("coco_f16"))
    with pytest.raises(CocoError, match="cannot be passed"):
        kernel_signatures(dataclasses.replace(plan, signatures={"k": (f16,)}))
    with pytest.raises(ValueError, match="not a C type"):
        CType("struct foo")


def test_groups_follow_the_sim():
    interp = sim.Interpreter.__new__(sim.Interpreter)
    interp.grid_shape, interp.size = (2, 3), 6
    interp.coords = [V.coords_of(r, (2, 3)) for r in range(6)]
    for span in [(0,), (1,), (0, 1)]:
        assert groups_of((2, 3), span) == interp.groups(span)
    assert group_of((2, 3), (1,), 4) == [3, 4, 5]
    assert group_of((2, 3), (0,), 4) == [1, 4]


def test_regions_and_contiguity():
    from coconet.dialects.coco import TensorType  # noqa: F401  (types come from programs)

    program = apply_schedule(load("adam"), "coco-split-allreduce")
    plan = lower(program, 4)
    rs = next(s for s in plan.steps if getattr(s, "op", None) == "reduce_scatter")
    regions = [member_region(rs.src.type, 0, rs.dst.type, m, plan.grid_shape) for m in range(4)]
    assert regions == [(slice(1024 * m, 1024 * (m + 1)),) for m in range(4)]
    assert consecutive_blocks(regions, rs.src.shape)
    assert flat_block((slice(0, 1), slice(2, 3), slice(0, 8)), (1, 4, 8)) == (16, 8)
    assert flat_block((slice(0, 2), slice(0, 4)), (2, 8)) is None
    assert flat_block((slice(1, 2), slice(0, 8)), (2, 8)) == (8, 8)
    assert flat_block((), ()) == (0, 1)
    assert not consecutive_blocks([(slice(0, 2), slice(0, 4)), (slice(0, 2), slice(4, 8))], (2, 8))


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_schedule_of_adam_moves_the_same_bytes(ranks):
    n = 4096 * 4
    expect = 2 * (ranks - 1) / ranks * n
    for spec in ["", "coco-split-allreduce", FUSED]:
        plan = lower(apply_schedule(load("adam"), spec or None), ranks)
        assert plan_traffic(plan, 0) == pytest.approx(expect, rel=1e-6), spec


def test_send_traffic_counts_only_ranks_with_a_receiver():
    plan = lower(load("pipeline_boundary"), 4)
    sends = [plan_traffic(plan, r) for r in range(4)]
    assert len(set(sends)) > 1  # the last stage sends nothing along the pipeline


# ---------------------------------------------------------------------------------------------
# The walker, with a backend that records
# ---------------------------------------------------------------------------------------------


class RecordingBackend:
    name = "recording"

    def __init__(self, rank=0, size=1):
        self.rank, self.size = rank, size
        self.calls: list[tuple] = []
        self.arrays: dict[str, np.ndarray] = {}

    def prepare(self, plan):
        self.calls.append(("prepare",))

    def allocate(self, buffers):
        for b in buffers:
            self.arrays[b.name] = np.zeros(b.shape, np.uint8)

    def allocate_symmetric(self, buffers):
        self.allocate(buffers)
        return {b.name: {r: 1000 * (r + 1) for r in range(self.size)} for b in buffers}

    def peer_table(self, addresses):
        self.calls.append(("peer_table", tuple(addresses)))
        return 77

    def table(self, values, dtype, key=None):
        self.calls.append(("table", tuple(values)))
        return 88

    def address(self, name):
        return 0x1000 + sorted(self.arrays).index(name)

    def bind(self, buf, value):
        return False

    def write(self, buf, value):
        self.calls.append(("write", buf.name))

    def holds(self, buf, value):
        return False  # the caller's values are never this backend's own buffers

    def order_inputs(self, values):
        pass

    def unbind(self, buf):
        pass

    def launch(self, step, args):
        self.calls.append(("launch", step.kernel, tuple(args)))

    def collective(self, step):
        self.calls.append(("collective", step.op, step.stream))

    def matmul(self, step):
        self.calls.append(("matmul", step.stream))

    def copy(self, step):
        self.calls.append(("copy", step.dst.name))

    def record_event(self, event, stream):
        self.calls.append(("record", event, stream))

    def wait_event(self, event, stream):
        self.calls.append(("wait", event, stream))

    def synchronize(self):
        self.calls.append(("synchronize",))

    def barrier(self):
        pass

    def close(self):
        pass


def test_walker_resolves_rank_values_peer_tables_and_epochs():
    plan = lower(apply_schedule(load("adam"), FUSED), 2)
    backend = RecordingBackend(rank=1, size=2)
    runner = PlanRunner(plan, 1, backend)
    runner.setup()
    peer_tables = [c for c in backend.calls if c[0] == "peer_table"]
    assert peer_tables
    assert all(c[1] == (1000, 2000) for c in peer_tables)
    runner.run()
    runner.run()
    launches = [c for c in backend.calls if c[0] == "launch"]
    fused = next(
        s for s in plan.steps if isinstance(s, Launch) and any(isinstance(a, Epoch) for a in s.args)
    )
    calls = [c for c in launches if c[1] == fused.kernel]
    at = next(i for i, a in enumerate(fused.args) if isinstance(a, Epoch))
    # The epoch's counter: the last two words of the site's flag array, the same every step
    # (the kernel advances it on the device).
    site = next(b for b in plan.buffers if b.name == fused.args[at].site)
    counter = backend.address(site.name) + 4 * (site.count - 2)
    assert [(c[2][at].kind, c[2][at].value) for c in calls] == [("ptr", counter)] * 2
    for i, a in enumerate(fused.args):
        if isinstance(a, RankValue):
            assert calls[0][2][i].value == a.table[1]
        if isinstance(a, PeerTable):
            assert calls[0][2][i].value == 77
            assert calls[0][2][i].kind == "ptr"
    assert backend.calls[-1] == ("synchronize",)


class BindingBackend(RecordingBackend):
    """Binds a caller's array in place of an argument buffer, as the cpu backend does: the
    buffer's address is then the array's."""

    def __init__(self, rank=0, size=1):
        super().__init__(rank, size)
        self.bound: dict[str, np.ndarray] = {}
        self.lookups = 0  # address() calls

    def bind(self, buf, value):
        self.bound[buf.name] = value
        return True

    def unbind(self, buf):
        self.bound.pop(buf.name, None)

    def address(self, name):
        self.lookups += 1
        if name in self.bound:
            return self.bound[name].ctypes.data
        return super().address(name)


@pytest.mark.parametrize(
    ("example", "schedule"),
    [("adam", FUSED), ("adam_clip_global_norm", "fuse(rs-c-ag)")],  # plain and table launches
)
def test_walker_passes_moved_buffers_and_keeps_the_rest_resolved(example, schedule):
    """Launch arguments are resolved once, and again only when a buffer moves: callers'
    arrays bound at other addresses reach the next launches (directly, and through the
    argument tables of a table launch); the same arrays bound again resolve nothing."""
    plan = lower(apply_schedule(load(example), schedule), 2)
    backend = BindingBackend(rank=0, size=2)
    runner = PlanRunner(plan, 0, backend)
    runner.setup()
    pieces = {
        name: np.zeros(shape, dtype) for name, (shape, dtype, _) in runner.expected_inputs().items()
    }

    def run(inputs) -> tuple[list[tuple], set[int]]:
        """This run's calls, and every address its launches and table builds pass."""
        start = len(backend.calls)
        runner.set_inputs(inputs)
        backend.lookups = 0
        runner.run()
        calls = backend.calls[start:]
        launches = [c for c in calls if c[0] == "launch"]
        tables = [c[1] for c in calls if c[0] == "table"]
        passed = {a.value for c in launches for a in c[2] if a.kind == "ptr"}
        return calls, passed | {x for t in tables for x in t}

    first, passed = run(pieces)
    bound = [n for n in pieces if n in backend.bound]
    assert bound
    assert all(pieces[n].ctypes.data in passed for n in bound)
    again, _ = run(pieces)  # the same arrays: nothing moved, nothing looked up again
    assert backend.lookups == 0
    assert not [c for c in again if c[0] == "table"]

    def pointers(calls):
        return [[a for a in c[2] if a.kind == "ptr"] for c in calls if c[0] == "launch"]

    assert pointers(again) == pointers(first)
    moved = {n: (v.copy() if n in bound else v) for n, v in pieces.items()}
    _, passed = run(moved)
    assert all(moved[n].ctypes.data in passed for n in bound)
    assert not any(pieces[n].ctypes.data in passed for n in bound)


def test_walker_keeps_stream_and_event_order():
    plan = lower(apply_schedule(load("model_parallel_mlp"), "coco-overlap"), 2)
    backend = RecordingBackend(size=2)
    runner = PlanRunner(plan, 0, backend)
    runner.setup()
    runner.run()
    seq = [c for c in backend.calls if c[0] in ("matmul", "record", "wait", "collective")]
    assert seq[:4] == [
        ("matmul", 0),
        ("record", "layer_chunk0", 0),
        ("wait", "layer_chunk0", 1),
        ("collective", "all_reduce", 1),
    ]
    assert seq[-1] == ("wait", "layer_done", 0)


def test_inputs_are_checked_before_anything_runs():
    plan = lower(load("sgd"), 2)
    backend = RecordingBackend(size=2)
    runner = PlanRunner(plan, 1, backend)
    runner.setup()
    good = {"g": np.zeros(4096, np.float32), "w": np.zeros(4096, np.float32), "lr": np.float32(1)}
    runner.check_inputs(good, np.shape, lambda a: np.asarray(a).dtype)
    with pytest.raises(
        CocoError, match=r"rank 1 must pass its piece of shape \[4096\], got \[2, 4096\]"
    ):
        runner.check_inputs(
            good | {"g": np.zeros((2, 4096), np.float32)}, np.shape, lambda a: a.dtype
        )
    with pytest.raises(CocoError, match="expected dtype f32 .*got float64"):
        runner.check_inputs(good | {"w": np.zeros(4096)}, np.shape, lambda a: a.dtype)
    with pytest.raises(CocoError, match="missing input"):
        runner.check_inputs({"g": good["g"]}, np.shape, lambda a: a.dtype)
    with pytest.raises(CocoError, match="no argument"):
        runner.check_inputs(good | {"x": 1}, np.shape, lambda a: np.asarray(a).dtype)
    assert not [c for c in backend.calls if c[0] == "launch"]


def test_table_form_arguments_become_device_tables():
    program = coconet.load(EXAMPLES / "lamb_scattered.mlir")
    plan = lower(program, 2)
    backend = RecordingBackend(size=2)
    runner = PlanRunner(plan, 0, backend)
    runner.setup()
    runner.run()
    runner.run()
    tables = [c for c in backend.calls if c[0] == "table"]
    assert tables  # built once, reused while the buffers stay put
    first_run = len(tables)
    runner.run()
    assert len([c for c in backend.calls if c[0] == "table"]) == first_run


# ---------------------------------------------------------------------------------------------
# Comparing with the oracle
# ---------------------------------------------------------------------------------------------


def test_compare_pieces():
    a = np.array([1.0, 2.0, np.nan], np.float32)
    assert compare_piece("x", 0, a, a.copy())[:2] == (None, True)
    d, bits, err = compare_piece("x", 0, a + np.float32(1e-7), a)
    assert d is None
    assert not bits
    assert err > 0
    d, _, _ = compare_piece("x", 3, a + 1, a)
    assert d is not None
    assert "rank 3" in str(d)
    assert "max abs error 1" in str(d)
    i = np.arange(4, dtype=np.int32)
    assert compare_piece("i", 0, i + 1, i)[0] is not None
    assert tolerance(np.dtype(np.int64)) == (0.0, 0.0)
    assert tolerance(np.dtype(ml_dtypes.bfloat16))[0] > tolerance(np.dtype(np.float16))[0]
    res = compare_outputs([{"x": a}], [{"x": a, "y": a}])
    assert not res.ok
    assert "missing" in str(res.differences[0])


def test_compare_bounds_a_cancelled_element_by_the_pieces_largest_value():
    """The case an H200 showed (sequence_parallel_mlp under ol(ag,mm)): an f16 GEMM output that
    cancels to 0.004 in a tensor reaching 64 moved by one ulp of the hidden activation
    (0.0156). The norm-wise term admits it; a real error of the same size on an element-wise
    tensor of O(1) values, or a wrong value anywhere, is still caught."""
    want = np.array([0.00342, 12.5, -63.9, 7.0], np.float16)
    got = want.copy()
    got[0] = np.float16(0.00342 + 0.015625)
    assert compare_piece("out", 1, got, want)[0] is None
    small = np.array([0.00342, 0.5, -0.9, 0.7], np.float16)
    moved = small.copy()
    moved[0] = np.float16(0.00342 + 0.015625)
    d, _, _ = compare_piece("out", 1, moved, small)
    assert d is not None
    assert d.num_different == 1
    wrong = want.copy()
    wrong[1] = np.float16(13.0)
    assert compare_piece("out", 1, wrong, want)[0] is not None
    inf = np.array([np.inf, 1.0], np.float32)  # an infinity does not widen the bound
    assert compare_piece("x", 0, np.array([np.inf, 1.01], np.float32), inf)[0] is not None


# ---------------------------------------------------------------------------------------------
# Schedules and coconet.compile
# ---------------------------------------------------------------------------------------------


def test_schedules_are_names_or_pipelines():
    assert is_pipeline("coco-split-allreduce,coco-reorder")
    assert is_pipeline("coco-fuse{mode=all_reduce}")
    assert not is_pipeline("fuse(rs-c-ag)")
    program = load("adam")
    assert apply_schedule(program, None) is program
    fused = apply_schedule(program, "fuse(rs-c-ag)")
    assert "comm.fused" in str(fused)
    with pytest.raises(CocoError):
        apply_schedule(program, "no-such-schedule")
    with pytest.raises(CocoError, match="bad pass pipeline"):
        apply_schedule(program, "coco-split-allreduce,coco-nonsense")


def test_compile_sim_takes_logical_values():
    compiled = coco_compile(EXAMPLES / "sgd.mlir", backend="sim", ranks=2)
    g = np.ones((2, 4096), np.float32)
    w = np.zeros(4096, np.float32)
    out = compiled(g=g, w=w, lr=np.float32(0.5))
    assert np.all(out["w"] == -1.0)
    assert np.all(w == -1.0)


def test_compile_cpu_on_one_rank_updates_in_place():
    # One MPI rank in this process (an MPI singleton): the cpu backend end to end.
    pytest.importorskip("mpi4py")
    compiled = coco_compile(load("adam"), schedule="fuse(rs-c-ag)", backend="cpu")
    shapes = compiled.input_shapes()
    rng = np.random.default_rng(0)
    inputs = {n: rng.uniform(0.1, 1, s).astype(d) for n, (s, d) in shapes.items()}
    logical = {n: v.copy() for n, v in inputs.items()}
    logical["g"] = logical["g"][None]
    want = sim.run(load("adam"), logical, ranks=1, inplace=False).outputs
    w = inputs["w"]
    out = compiled(**inputs)
    assert out["w"] is w
    for name in ("w", "m", "v"):
        assert np.array_equal(out[name], want[name]), name
    with pytest.raises(CocoError, match="must pass its piece"):
        compiled(**(inputs | {"g": np.zeros(5, np.float32)}))
    with pytest.raises(CocoError, match="got a str"):
        compiled(**(inputs | {"g": "nope"}))
    with pytest.raises(CocoError, match=r"compile\(ranks=3\)"):
        coco_compile(load("sgd"), backend="cpu", ranks=3)
    compiled.close()


def test_compile_cuda_without_a_gpu_is_one_clear_error():
    from coconet.compile import gpu_available

    if gpu_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(CocoError, match="backend 'cuda' needs"):
        coco_compile(load("sgd"), backend="cuda")


# ---------------------------------------------------------------------------------------------
# coco-run without MPI
# ---------------------------------------------------------------------------------------------


def coco_run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coconet.tools.coco_run", *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_coco_run_sim_with_schedules_check_and_bench():
    r = coco_run(
        "examples/adam.mlir",
        "--np",
        "2",
        "--backend",
        "sim",
        "--schedule",
        "rs-c-ag",
        "-p",
        "fused=" + FUSED,
        "--check",
        "--bench",
        "--iters",
        "2",
        "--warmup",
        "0",
    )
    assert r.returncode == 0, r.stderr
    assert "check [rs-c-ag]: outputs match the program as written" in r.stdout
    assert "check [fused]" in r.stdout
    assert "bench @adam on 2 rank(s), backend sim" in r.stdout


def test_coco_run_errors_are_one_line():
    r = coco_run("examples/sgd.mlir", "--backend", "cuda")
    from coconet.compile import gpu_available

    if not gpu_available():
        assert r.returncode == 1
        assert r.stderr.startswith("coco-run: error: backend 'cuda' needs")
        assert r.stderr.count("\n") == 1
    r = coco_run("examples/sgd.mlir", "--backend", "cpu", "--schedule", "nonsense")
    assert r.returncode == 1
    assert r.stderr.startswith("coco-run: error: ")
    assert "Traceback" not in r.stderr


def test_pipeline_labels():
    from coconet.tools.coco_run import schedule_label

    assert schedule_label("pipeline", "fused=coco-fuse") == ("fused", "coco-fuse")
    assert (
        schedule_label("pipeline", "coco-fuse{mode=all_reduce}")
        == ("coco-fuse{mode=all_reduce}",) * 2
    )
    assert schedule_label("pipeline", "") == ("as written", None)
    assert schedule_label("schedule", "ar-c") == ("ar-c", "ar-c")


# ---------------------------------------------------------------------------------------------
# Failure reports
# ---------------------------------------------------------------------------------------------


def test_diagnosis_names_the_failing_rank(tmp_path):
    (tmp_path / "rank0.pid").write_text("100")
    (tmp_path / "rank1.pid").write_text("101")
    banner = (
        "\n=====\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   PID 101 RUNNING AT vm\n"
        "=   EXIT CODE: 9\n=====\nYOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n"
    )
    assert diagnose(tmp_path, 2, 9, banner).startswith("rank 1 (pid 101) was killed by SIGKILL")
    # The monitor saw rank 0 vanish first: hydra's banner named a rank it killed afterwards.
    assert diagnose(tmp_path, 2, 9, banner, [(0, 100), (1, 101)]).startswith(
        "rank 0 (pid 100) died without reporting an error (the job ended with SIGKILL)"
    )
    assert diagnose(tmp_path, 2, 3, "", [(1, 101)]).startswith(
        "rank 1 (pid 101) exited with status 3"
    )
    (tmp_path / "rank1.watchdog").write_text(
        json.dumps({"rank": 1, "message": "no progress", "step": 3, "time": 2})
    )
    (tmp_path / "rank0.watchdog").write_text(
        json.dumps({"rank": 0, "message": "no progress", "step": 4, "time": 1})
    )
    assert diagnose(tmp_path, 2, 1, "") == "rank 1: no progress"
    (tmp_path / "rank0.error").write_text(json.dumps({"rank": 0, "message": "boom", "time": 5}))
    assert diagnose(tmp_path, 2, 1, "") == "rank 0: boom"
    # A rank killed before any rank reported a failure: the peers' reports (an MPI call
    # failing on the dead rank) are reactions, the death is the cause.
    assert diagnose(tmp_path, 2, 1, "", [(1, 101)]) == "rank 0: boom"
    assert diagnose(tmp_path, 2, 1, "", [(1, 101)], death_first=True).startswith(
        "rank 1 (pid 101) exited with status 1"
    )
    assert "status 3" in diagnose(tmp_path / "nothing", 2, 3, "")


def test_the_monitor_orders_a_death_before_the_failures_it_causes(tmp_path):
    """The monitor's order of events, over real sockets: a rank whose connection closes
    without a word (killed) before a peer says `failing` came first; a rank that says
    `failing` before another vanishes (its abort kills the rest) did not. Each event is sent
    once the monitor has seen the one before (no timing)."""
    import socket
    import time

    from coconet.runtime.launcher import Monitor

    def until(seen) -> None:
        deadline = time.monotonic() + 30
        while not seen():
            assert time.monotonic() < deadline, "the monitor saw nothing in 30 s"
            time.sleep(0.01)

    def run(events) -> Monitor:
        monitor = Monitor(tmp_path / f"m{len(list(tmp_path.iterdir()))}")
        monitor.start()
        conns = {}
        for rank in (0, 1):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(monitor.path))
            c.sendall(f"hello {rank} {100 + rank}\n".encode())
            conns[rank] = c
        for what, rank in events:
            if what == "die":
                conns[rank].close()
                until(lambda: monitor.deaths)
            else:
                conns[rank].sendall(b"failing\n")
                until(lambda: monitor.first_failing is not None)
        for c in conns.values():
            c.close()
        monitor.stop()
        monitor.join(timeout=5)
        return monitor

    killed_first = run([("die", 1), ("fail", 0)])
    assert killed_first.deaths[0] == (1, 101)
    assert killed_first.death_came_first()
    failed_first = run([("fail", 0), ("die", 1)])
    assert failed_first.deaths[0] == (1, 101)
    assert not failed_first.death_came_first()


def test_fault_specs():
    assert parse_fault("1:kill") == (1, "kill", 0, 1)
    assert parse_fault("0:hang:4:2") == (0, "hang", 4, 2)
    assert parse_fault(None) is None
    with pytest.raises(CocoError):
        parse_fault("1:explode")


# ---------------------------------------------------------------------------------------------
# The NVRTC cubin cache
# ---------------------------------------------------------------------------------------------


def test_cubins_are_cached_by_content(tmp_path, monkeypatch):
    from coconet.runtime.cuda import CUDA_CACHE, compile_cubin
    from coconet.toolchain.nvrtc import nvrtc_available

    if not nvrtc_available():
        pytest.skip("NVRTC is not installed")
    monkeypatch.setenv("COCONET_CACHE_DIR", str(tmp_path))
    source = lower(load("sgd"), 2).cuda_source
    builds = CUDA_CACHE.stats.builds
    first = compile_cubin(source, "sm_80")
    second = compile_cubin(source, "sm_80")
    assert not first.cache_hit
    assert second.cache_hit
    assert CUDA_CACHE.stats.builds == builds + 1
    assert first.path == second.path
    assert first.path.suffix == ".cubin"
    assert tmp_path in first.path.parents
    assert compile_cubin(source, "sm_90").path != first.path
