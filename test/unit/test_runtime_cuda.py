"""The cuda backend's logic without a GPU: CudaBackend drives `StrictDevice`
(test/unit/cuda_double.py), which keeps arrays in host memory, runs the plan's kernels through
the host build of the same CUDA source, emulates NCCL and CUDA IPC between threads (one per
rank), takes and returns the types CuPy 14 does, and fails a test on any access to memory that
stream order does not make safe. Plan walking, buffer dtypes, typed kernel arguments, peer
tables, transports, cooperative launches and stream/event order all run for real and are
compared with the sim oracle. Contract tests check the same calls against the real CuPy and
NCCL wheels where they import without a GPU; the `gpu`-marked test runs on a real device."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import pytest
from cuda_double import (
    FakeTensor,
    FakeWorld,
    Hazard,
    NcclError,
    StrictDevice,
    on_fake_gpus,
)

import coconet
from coconet.compile import apply_schedule
from coconet.core import values as V
from coconet.core.program import CocoError, Program, parse_module
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import COMM_STREAM, COMPUTE_STREAM, Epoch, Launch, PeerTable
from coconet.runtime import sim
from coconet.runtime.check import compare_outputs
from coconet.runtime.cuda import (
    NCCL_DTYPES,
    TRANSPORT_ENV,
    CudaBackend,
    device_dtype,
    kernel_scalars,
    nccl_dtype,
    nccl_op,
)
from coconet.runtime.executor import KernelArg, PlanRunner, group_of
from coconet.runtime.inprocess import IN_PROCESS_MPI as FakeMPI, InProcessComm as FakeComm
from coconet.toolchain.nvrtc import nvrtc_available

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.skipif(
    not nvrtc_available(), reason="the cuda backend compiles with NVRTC"
)

# ---------------------------------------------------------------------------------------------
# Running a plan on N fake GPUs
# ---------------------------------------------------------------------------------------------


def run_fake(
    program,
    ranks: int,
    inputs: dict[str, np.ndarray],
    *,
    exact=False,
    steps=1,
    gpus: int | None = None,
    backend_class=CudaBackend,
    device_options: dict | None = None,
    on_device_inputs=False,
    close=True,
    nodes: tuple[int, ...] = (),
    plan_nodes: tuple[int, ...] | None = None,
):
    """Run `program` on `ranks` threads, each with a StrictDevice; `gpus` GPUs in all (ranks
    share them round-robin when fewer, as CupyDevice.for_rank assigns them); rank r's GPU in
    machine `nodes[r]`, the plan lowered for `plan_nodes` (default: those nodes)."""
    plan = lower(program, ranks, None, nodes if plan_nodes is None else plan_nodes)
    backends: list[CudaBackend] = [None] * ranks  # type: ignore[list-item]

    def body(r: int, runner: PlanRunner, backend: CudaBackend) -> dict[str, np.ndarray]:
        backends[r] = backend
        pieces = {
            name: V.piece_of(
                inputs[name], buf.type, V.coords_of(r, plan.grid_shape), plan.grid_shape
            )
            for name, buf in plan.arguments.items()
        }
        if on_device_inputs:
            device: Any = backend.device
            pieces = {
                n: backend.coerce_input(n, device.user_array(np.asarray(v)), plan.arguments[n])
                for n, v in pieces.items()
            }
        runner.check_inputs(pieces, backend.shape_of, backend.dtype_of)
        runner.set_inputs(pieces)
        for _ in range(steps):
            runner.run()
        return {name: backend.read(buf) for name, buf in plan.outputs.items()}

    results = on_fake_gpus(
        plan,
        ranks,
        body,
        gpus=gpus,
        nodes=nodes,
        device_options=device_options,
        backend_class=backend_class,
        exact=exact,
        close=close,
        timeout=120,
    )
    return plan, results, backends


SCHEDULES = {
    "sgd": ["", "coco-split-allreduce,coco-reorder,coco-as-slice,coco-fuse"],
    "adam": [
        "",
        "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v}",
        "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v},coco-fuse",
    ],
    "adam_bf16_grads": ["", "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v},coco-fuse"],
    "adam_f16_grads": ["coco-split-allreduce"],
    "lamb": ["", "coco-split-allreduce,coco-reorder,coco-as-slice,coco-fuse"],
    "model_parallel_mlp": [
        "",
        "coco-overlap",
        "coco-split-allreduce,coco-reorder,coco-as-slice,coco-fuse",
    ],
    "model_parallel_attention": ["coco-fuse,coco-overlap"],
    "pipeline_boundary": ["", "coco-sliced-send,coco-fuse"],
}
CASES = [(name, spec) for name, specs in SCHEDULES.items() for spec in specs]


@pytest.mark.parametrize(
    ("name", "spec"), CASES, ids=[f"{n}[{s or 'as-written'}]" for n, s in CASES]
)
def test_fake_gpus_match_the_oracle(name, spec):
    program = apply_schedule(coconet.load(EXAMPLES / f"{name}.mlir"), spec or None)
    ranks = 2
    inputs = sim.prepare_inputs(program, None, program.grid.bind(ranks), seed=3)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks, inplace=False)
    _plan, got, _ = run_fake(program, ranks, {k: v.copy() for k, v in inputs.items()})
    result = compare_outputs(got, want.per_rank)
    assert result.ok, "\n".join(map(str, result.differences))


def test_exact_collectives_on_four_fake_gpus_are_bit_exact():
    program = coconet.load(EXAMPLES / "sgd.mlir")
    inputs = sim.prepare_inputs(program, None, (4,), seed=1)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=4, inplace=False)
    _plan, got, backends = run_fake(program, 4, inputs, exact=True)
    assert compare_outputs(got, want.per_rank).bit_exact
    # exact mode gathers and combines instead of calling ncclAllReduce
    calls = [c[1] for c in backends[0].device.calls if c[0] == "nccl"]
    assert "all_gather" in calls
    assert "all_reduce" not in calls


def test_fused_collective_gets_typed_args_peer_tables_and_epochs():
    program = apply_schedule(
        coconet.load(EXAMPLES / "adam.mlir"),
        "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v},coco-fuse",
    )
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    plan, _got, backends = run_fake(program, 2, inputs, steps=3, close=False)
    launch = next(
        s
        for s in plan.steps
        if isinstance(s, Launch) and any(isinstance(a, PeerTable) for a in s.args)
    )
    calls = [c for c in backends[1].device.calls if c[0] == "launch" and c[1] == launch.kernel]
    # The first run() launches, the second captures a graph (its launch recorded, not run)
    # and replays it, the third replays it.
    assert len(calls) == 2
    assert [c[0] for c in backends[1].device.calls if "capture" in c[0] or c[0] == "replay"] == [
        "begin_capture",
        "end_capture",
        "replay",
        "replay",
    ]
    types = calls[0][3]
    at = next(i for i, a in enumerate(launch.args) if isinstance(a, Epoch))
    assert types[at] == "uint64"  # the address of the site's counter on the device
    # The same argument every step: the kernel advanced the counter on the device, once a
    # run, replays included (the last epoch, then the ticket back at 0).
    assert len({int(c[4][at]) for c in calls}) == 1
    for b in backends:
        alloc = b.device.find(int(b.address(launch.args[at].site)))
        assert alloc is not None
        assert list(alloc.array.reshape(-1).view(np.uint32)[-2:]) == [3, 0]
    # Peer tables hold the group members' addresses of the symmetric buffer, in group order.
    b1 = backends[1]
    for a in launch.args:
        if isinstance(a, PeerTable):
            table_addr = int(calls[0][4][launch.args.index(a)])
            table = b1.device.find(table_addr).array
            group = group_of(plan.grid_shape, a.span, 1)
            expect = [backends[m].own[a.buffer.name].ctypes.data for m in group]
            assert list(map(int, table)) == expect


def test_overlap_issues_chunk_collectives_on_the_comm_stream_after_each_event():
    program = apply_schedule(coconet.load(EXAMPLES / "model_parallel_mlp.mlir"), "coco-overlap")
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    _plan, _got, backends = run_fake(program, 2, inputs)
    trace = backends[0].trace
    chunks = [t for t in trace if t[0] == "all_reduce"]
    assert len(chunks) == 4
    assert all(t[1] == COMM_STREAM for t in chunks)
    assert all(t[1] == COMPUTE_STREAM for t in trace if t[0] == "matmul")
    # matmul chunk c, record on compute, wait on comm, all_reduce chunk c
    kinds = [t[0] for t in trace]
    first = kinds.index("matmul")
    assert kinds[first : first + 4] == ["matmul", "record", "wait", "all_reduce"]
    waits = [c for c in backends[0].device.calls if c[0] == "wait"]
    assert waits[0][2] == "s1"
    assert waits[-1][2] == "s0"
    nccl = [c for c in backends[0].device.calls if c[0] == "nccl"]
    assert all(c[2] == "s1" for c in nccl)
    assert {c[4] for c in nccl} == {NCCL_DTYPES["float16"]}


def test_pipeline_send_uses_point_to_point_in_a_group():
    program = coconet.load(EXAMPLES / "pipeline_boundary.mlir")
    inputs = sim.prepare_inputs(program, None, program.grid.bind(4), seed=0)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=4, inplace=False)
    _plan, got, backends = run_fake(program, 4, inputs)
    assert compare_outputs(got, want.per_rank).ok
    sends = [
        c for b in backends for c in b.device.calls if c[0] == "nccl" and c[1] in ("send", "recv")
    ]
    assert sends


def test_kernel_scalars_are_typed_by_the_signature():
    args = [
        KernelArg("ptr", 0x7F0012345678),
        KernelArg("u32", (1 << 32) + 5),
        KernelArg("i32", -3),
        KernelArg("i64", 1 << 40),
        KernelArg("f32", 0.5),
        KernelArg("f64", 0.25),
        KernelArg("bool", 1),
    ]
    out = kernel_scalars(args)
    assert [type(v) for v in out] == [
        np.uint64,
        np.uint32,
        np.int32,
        np.int64,
        np.float32,
        np.float64,
        np.bool_,
    ]
    assert int(out[1]) == 5
    assert int(out[0]) == 0x7F0012345678


def test_dtypes_on_the_device():
    assert device_dtype(np.dtype(ml_dtypes.bfloat16)) == np.uint16
    assert device_dtype(np.dtype(np.float16)) == np.float16
    assert nccl_dtype(np.dtype(ml_dtypes.bfloat16)) == NCCL_DTYPES["bfloat16"]
    assert nccl_dtype(np.dtype(np.bool_)) == NCCL_DTYPES["uint8"]
    assert nccl_op("sum", np.dtype(np.bool_)) == 2  # or == max on 0/1
    assert nccl_op("prod", np.dtype(np.bool_)) == 3
    assert nccl_op("sum", np.dtype(np.float32)) == 0


def test_bf16_device_arrays_of_cupy14_are_taken_as_bit_patterns():
    """CuPy 14 and DLPack hand bf16 over as ml_dtypes.bfloat16: the backend views it as the
    uint16 bit patterns it stores, before the ranks agree to run (no rank left waiting)."""
    program = apply_schedule(
        coconet.load(EXAMPLES / "adam_bf16_grads.mlir"),
        "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v},coco-fuse",
    )
    inputs = sim.prepare_inputs(program, None, (2,), seed=5)
    assert any(v.dtype == ml_dtypes.bfloat16 for v in inputs.values())
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    _plan, got, backends = run_fake(program, 2, inputs, on_device_inputs=True, close=False)
    assert compare_outputs(got, want.per_rank).ok
    g = backends[0].arrays["g"]
    assert backends[0].device.is_device_array(g)
    assert g.dtype == np.uint16


def test_device_inputs_are_ordered_after_their_producer_stream():
    """A caller's tensor still being written on its own stream (PyTorch's backward) is read
    only after that write: adoption orders it before the backend's streams."""
    program = coconet.load(EXAMPLES / "sgd.mlir")
    inputs = sim.prepare_inputs(program, None, (2,), seed=2)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    _plan, got, backends = run_fake(program, 2, inputs, on_device_inputs=True)
    assert compare_outputs(got, want.per_rank).ok
    assert not backends[0].device.hazards


class ForgetfulAdoptionDevice(StrictDevice):
    """Adopts device arrays without ordering them (the defect: DLPack arrays were ordered only
    against the legacy stream)."""

    def adopt(self, value, stream):
        return value if self.is_device_array(value) else None


def test_the_stream_model_catches_unordered_device_inputs():
    program = coconet.load(EXAMPLES / "sgd.mlir")
    inputs = sim.prepare_inputs(program, None, (1,), seed=2)
    plan = lower(program, 1)
    world = FakeWorld()
    device = ForgetfulAdoptionDevice(world)
    backend = CudaBackend(device, FakeComm(world, "c", [0], 0), mpi=FakeMPI)
    runner = PlanRunner(plan, 0, backend)
    runner.setup()
    pieces = {n: device.user_array(np.asarray(v)) for n, v in inputs.items()}
    runner.set_inputs(pieces)
    with pytest.raises(Hazard, match="torch"):
        runner.run()


class LegacyStreamBackend(CudaBackend):
    """The defect: tables uploaded on CuPy's current (legacy) stream with nothing ordering
    them before the kernels that read them."""

    def table(self, values, dtype, key=None):
        table = self.device.upload(np.array(list(values), dtype=dtype), self.device.legacy)
        self.tables.append(table)
        return self.device.address(table)


def test_the_stream_model_catches_a_table_read_before_its_upload_lands():
    program = apply_schedule(
        coconet.load(EXAMPLES / "adam.mlir"),
        "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v},coco-fuse",
    )
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    with pytest.raises(Hazard, match="legacy"):
        run_fake(program, 2, inputs, backend_class=LegacyStreamBackend)


SHARED_GPU_CASES = [
    ("sgd", "coco-split-allreduce,coco-reorder,coco-as-slice,coco-fuse", 4),
    ("adam", "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v}", 2),
    ("adam_bf16_grads", "", 2),
    ("adam_f16_grads", "coco-split-allreduce", 4),
    ("model_parallel_mlp", "coco-overlap", 2),
    ("pipeline_boundary", "coco-sliced-send,coco-fuse", 4),
]


@pytest.mark.parametrize(("name", "spec", "ranks"), SHARED_GPU_CASES)
def test_ranks_sharing_one_gpu_run_library_collectives_through_mpi(name, spec, ranks):
    """NCCL refuses two ranks on one GPU; with one GPU for all ranks the backend moves library
    collectives through host copies and MPI, and every schedule still matches the oracle."""
    program = apply_schedule(coconet.load(EXAMPLES / f"{name}.mlir"), spec or None)
    inputs = sim.prepare_inputs(program, None, program.grid.bind(ranks), seed=4)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks, inplace=False)
    _plan, got, backends = run_fake(program, ranks, inputs, gpus=1)
    result = compare_outputs(got, want.per_rank)
    assert result.ok, "\n".join(map(str, result.differences))
    assert all(b.transport_kind == "mpi" and b.ranks_on_my_gpu == ranks for b in backends)
    assert not [c for b in backends for c in b.device.calls if c[0] == "nccl"]


def test_two_gpus_for_four_ranks_also_avoid_nccl():
    program = coconet.load(EXAMPLES / "sgd.mlir")
    inputs = sim.prepare_inputs(program, None, (4,), seed=1)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=4, inplace=False)
    _plan, got, backends = run_fake(program, 4, inputs, gpus=2)
    assert compare_outputs(got, want.per_rank).ok
    assert {b.transport_kind for b in backends} == {"mpi"}


def test_the_double_refuses_two_ranks_of_one_gpu_in_one_nccl_communicator(monkeypatch):
    monkeypatch.setenv(TRANSPORT_ENV, "nccl")
    program = coconet.load(EXAMPLES / "sgd.mlir")
    inputs = sim.prepare_inputs(program, None, (2,), seed=1)
    with pytest.raises(CocoError, match="share a GPU"):
        run_fake(program, 2, inputs, gpus=1)
    world = FakeWorld()
    a, b = StrictDevice(world), StrictDevice(world)
    uid = a.nccl_unique_id()
    a.nccl_comm(uid, 2, 0)
    with pytest.raises(NcclError, match="Duplicate GPU"):
        b.nccl_comm(uid, 2, 1)


def test_transport_can_be_forced_to_mpi(monkeypatch):
    monkeypatch.setenv(TRANSPORT_ENV, "mpi")
    program = coconet.load(EXAMPLES / "sgd.mlir")
    inputs = sim.prepare_inputs(program, None, (2,), seed=1)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    _plan, got, backends = run_fake(program, 2, inputs)
    assert compare_outputs(got, want.per_rank).ok
    assert backends[0].transport_kind == "mpi"
    monkeypatch.setenv(TRANSPORT_ENV, "gloo")
    with pytest.raises(CocoError, match="auto, nccl or mpi"):
        run_fake(program, 2, inputs)


def test_nccl_unique_ids_are_bytes_and_communicators_refuse_tuples():
    world = FakeWorld()
    device = StrictDevice(world)
    uid = device.nccl_unique_id()
    assert isinstance(uid, bytes)
    assert len(uid) == 128
    with pytest.raises(TypeError, match="commId"):
        device.nccl_comm(tuple(uid), 1, 0)


def _fused_adam():
    return apply_schedule(
        coconet.load(EXAMPLES / "adam.mlir"),
        "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v},coco-fuse",
    )


class UnevenGpus(CudaBackend):
    """Rank 0's GPU holds fewer co-resident blocks than rank 1's."""

    def prepare(self, plan):
        self.device.coresident = 1 if self.rank == 0 else 5
        super().prepare(plan)


def test_fused_kernels_launch_cooperatively_with_a_grid_every_rank_can_hold():
    program = _fused_adam()
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    plan, got, backends = run_fake(program, 2, inputs, backend_class=UnevenGpus)
    assert compare_outputs(got, want.per_rank).ok
    fused = {
        s.kernel: s.grid
        for s in plan.steps
        if isinstance(s, Launch) and any(isinstance(a, PeerTable) for a in s.args)
    }
    assert fused
    assert max(fused.values()) > 1
    for b in backends:
        launches = [c for c in b.device.calls if c[0] == "launch" and c[1] in fused]
        assert launches
        assert all(c[6] for c in launches)
        assert {c[5] for c in launches} == {1}  # rank 1 could hold 5, but meets rank 0's 1
    others = [c for c in backends[0].device.calls if c[0] == "launch" and c[1] not in fused]
    assert all(not c[6] for c in others)


@pytest.mark.parametrize(("coresident", "grid"), [(1000, 128), (100, 100)])
def test_a_large_fused_kernel_grows_its_grid_to_what_the_gpu_holds(coresident, grid):
    """The plan caps a fused collective at 64 blocks; on a GPU the backend grows a large one
    to a block per 4096 elements (2^19 per rank here: 128), up to what the GPU holds (an
    H200 holds 1056 blocks of 256 threads; 64 left half its SMs idle), and it still matches
    the oracle."""
    import runpy

    program = apply_schedule(
        runpy.run_path(str(EXAMPLES / "adam.py"))["build"](1 << 20), "fuse(rs-c-ag)"
    )
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    plan, got, backends = run_fake(
        program, 2, inputs, device_options={"coresident_blocks": coresident}
    )
    assert compare_outputs(got, want.per_rank).ok
    (fused,) = [s for s in plan.steps if isinstance(s, Launch)]
    assert fused.grid == 64
    for b in backends:
        (launch,) = [c for c in b.device.calls if c[0] == "launch"]
        assert launch[5] == grid


def test_collective_blocks_are_capped_by_the_variable(monkeypatch):
    """COCONET_CUDA_COLLECTIVE_BLOCKS bounds a fused collective's grid (the 2^19 elements a
    rank that would take 128 blocks take 16), and it still matches the oracle; a bad value is
    one clear error."""
    import runpy

    from coconet.runtime.cuda import COLLECTIVE_BLOCKS_ENV

    program = apply_schedule(
        runpy.run_path(str(EXAMPLES / "adam.py"))["build"](1 << 20), "fuse(rs-c-ag)"
    )
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    monkeypatch.setenv(COLLECTIVE_BLOCKS_ENV, "16")
    _plan, got, backends = run_fake(program, 2, inputs, device_options={"coresident_blocks": 1000})
    assert compare_outputs(got, want.per_rank).ok
    for b in backends:
        assert [c[5] for c in b.device.calls if c[0] == "launch"] == [16]
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv(COLLECTIVE_BLOCKS_ENV, bad)
        with pytest.raises(CocoError, match=f"{COLLECTIVE_BLOCKS_ENV}=.*positive integer"):
            run_fake(program, 2, inputs)


def test_a_collective_overlapped_with_matmuls_leaves_half_the_gpu_to_them():
    """ol(mm,fuse(rs-c-ag)): the chunks' fused kernels run on the communication stream beside
    the matmuls, with half the blocks the GPU would hold for them (8 of 16 here); the same
    kernel alone takes them all."""
    import runpy

    from coconet.frontend import F32
    from coconet.runtime.cuda import overlaps_matmuls

    # 4 x 128 rows of 256: 2^17 elements, a block per 4096 of a rank's slice (16) asked for
    build = runpy.run_path(str(EXAMPLES / "model_parallel_mlp.py"))["build"]
    program = build(F32, batch=4, seq=128, hidden=256)
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    grids = {}
    for schedule in ("ol(mm,fuse(rs-c-ag))", "fuse(rs-c-ag)"):
        scheduled = apply_schedule(program, schedule)
        plan, got, backends = run_fake(
            scheduled, 2, inputs, device_options={"coresident_blocks": 16}
        )
        assert compare_outputs(got, want.per_rank).ok, schedule
        fused = {
            s.kernel
            for s in plan.steps
            if isinstance(s, Launch) and s.args and any(isinstance(a, PeerTable) for a in s.args)
        }
        grids[schedule] = (
            overlaps_matmuls(plan),
            {c[5] for b in backends for c in b.device.calls if c[0] == "launch" and c[1] in fused},
        )
    assert grids["ol(mm,fuse(rs-c-ag))"][0]
    assert not grids["fuse(rs-c-ag)"][0]
    assert max(grids["ol(mm,fuse(rs-c-ag))"][1]) <= 8
    assert max(grids["fuse(rs-c-ag)"][1]) > 8


def test_a_fused_kernel_finishing_norms_grows_its_grid_too():
    """LAMB's first fused kernel finishes ||w|| and ||r|| (a partial per block, the last
    block's ticket): the plan gives it no range_positions, as it may not be cut into chunks,
    but its range is in its signature, and it grows like the second kernel (it stayed at 64
    blocks: single-tensor LAMB ran slower fused than ar-c on an H200)."""
    import runpy

    program = apply_schedule(
        runpy.run_path(str(EXAMPLES / "lamb.py"))["build"](1 << 20), "fuse(rs-c-ag)"
    )
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    plan, got, backends = run_fake(program, 2, inputs, device_options={"coresident_blocks": 1000})
    assert compare_outputs(got, want.per_rank).ok
    launches = [s for s in plan.steps if isinstance(s, Launch)]
    assert [s.range_positions is None for s in launches] == [True, False]
    for b in backends:
        grids = [c[5] for c in b.device.calls if c[0] == "launch"]
        assert grids == [128, 128]


def test_a_table_launch_grows_each_tensors_grid_to_what_the_gpu_holds():
    """LAMB over seven odd tensors and one of 2^20: the plan's table launch gives the eight
    tensors 64 blocks in all; on a GPU holding 1000, the large tensor grows to a block per
    4096 of its elements (128 at 2 ranks) and the small ones keep theirs, in one launch that
    still matches the oracle."""
    import runpy

    from coconet.runtime.cuda import tensor_grids

    sizes = (1000, 33, 4097, 12345, 7, 65537, 999, 1 << 20)
    program = apply_schedule(
        runpy.run_path(str(EXAMPLES / "lamb_odd_sizes.py"))["build"](sizes), "fuse(rs-c-ag)"
    )
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    plan, got, backends = run_fake(program, 2, inputs, device_options={"coresident_blocks": 1000})
    assert compare_outputs(got, want.per_rank).ok
    tables = [s for s in plan.steps if isinstance(s, Launch) and s.kernel.endswith("_table")]
    assert tables
    for step in tables:
        assert step.grid <= 64
        grids = tensor_grids(step, plan.signatures[step.kernel])
        assert grids[-1] == 128
        for b in backends:
            (launch,) = [c for c in b.device.calls if c[0] == "launch" and c[1] == step.kernel]
            assert launch[5] == sum(grids) > 128


def test_a_fused_kernel_that_cannot_be_resident_is_refused():
    program = _fused_adam()
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    with pytest.raises(CocoError, match="resident at once"):
        run_fake(program, 2, inputs, device_options={"coresident_blocks": 1}, gpus=1)


def test_fused_kernels_without_peer_access_are_refused_on_every_rank():
    program = _fused_adam()
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    with pytest.raises(CocoError, match="peer-to-peer"):
        run_fake(program, 2, inputs, device_options={"peer_access": False})


def test_the_trace_is_bounded():
    program = coconet.load(EXAMPLES / "sgd.mlir")
    inputs = sim.prepare_inputs(program, None, (1,), seed=0)
    _plan, _got, backends = run_fake(program, 1, inputs, steps=3000)
    from coconet.runtime.cuda import TRACE_LENGTH

    assert len(backends[0].trace) == TRACE_LENGTH


class OrderedClose(StrictDevice):
    log: ClassVar[list[tuple[str, int]]] = []

    def close_peers(self):
        OrderedClose.log.append(("close_peers", self.id))
        super().close_peers()

    def close(self):
        OrderedClose.log.append(("free", self.id))
        super().close()


class SlowToClose(CudaBackend):
    def close(self):
        if self.rank == 1:
            import time

            time.sleep(0.3)
        super().close()


def test_exported_memory_is_freed_only_after_every_peer_closed_its_mappings():
    program = _fused_adam()
    sim.prepare_inputs(program, None, (2,), seed=0)
    OrderedClose.log = []
    world = FakeWorld()
    plan = lower(program, 2)
    errors = []

    def rank_main(r):
        try:
            device = OrderedClose(world, bus=f"bus{r}", device_id=r)
            backend = SlowToClose(device, FakeComm(world, "c", [0, 1], r), mpi=FakeMPI)
            runner = PlanRunner(plan, r, backend)
            runner.setup()
            runner.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    kinds = [k for k, _ in OrderedClose.log]
    assert kinds.index("free") > max(i for i, k in enumerate(kinds) if k == "close_peers")


def test_dlpack_placement_of_torch_like_tensors():
    from coconet.runtime.cuda import dlpack_placement

    world = FakeWorld()
    device = StrictDevice(world, device_id=0)
    data = device.user_array(np.zeros(3, np.float32))
    assert dlpack_placement(FakeTensor(data), 0) == "device"
    assert dlpack_placement(FakeTensor(data, device_type=1), 0) == "host"
    assert dlpack_placement(np.zeros(3), 0) == "host"
    with pytest.raises(CocoError, match="detach"):
        dlpack_placement(FakeTensor(data, requires_grad=True), 0)
    with pytest.raises(CocoError, match="detach"):
        dlpack_placement(FakeTensor(data, device_type=1, requires_grad=True), 0)
    with pytest.raises(CocoError, match="on GPU 1"):
        dlpack_placement(FakeTensor(data, device_index=1), 0)
    with pytest.raises(CocoError, match="not CUDA memory"):
        dlpack_placement(FakeTensor(data, device_type=10), 0)


def test_a_tensor_that_requires_grad_is_refused_with_one_clear_message():
    program = coconet.load(EXAMPLES / "sgd.mlir")
    plan = lower(program, 1)
    world = FakeWorld()
    device = StrictDevice(world)
    backend = CudaBackend(device, FakeComm(world, "c", [0], 0), mpi=FakeMPI)
    g = FakeTensor(device.user_array(np.zeros(4096, np.float32)), requires_grad=True)
    with pytest.raises(CocoError, match="input 'g': .*detach"):
        backend.coerce_input("g", g, plan.arguments["g"])


def test_a_host_tensor_passed_again_does_not_stand_in_for_a_device_one():
    """order_inputs waits once per kind of DEVICE value: a CPU tensor of the same kind ahead
    of the CUDA one (in argument order) orders nothing, so the CUDA tensor's pending write
    must still be ordered before the compute stream."""
    world = FakeWorld()
    device = StrictDevice(world)
    backend = CudaBackend(device, FakeComm(world, "c", [0], 0), mpi=FakeMPI)
    host = FakeTensor(device.user_array(np.zeros(4, np.float32)), device_type=1)
    grad = FakeTensor(device.user_array(np.zeros(4, np.float32)))
    device.produce(grad.data, np.ones(4, np.float32))  # the backward pass, not yet ordered
    written = device.find(grad.data.ctypes.data).last_write
    compute = device.stream(0).name
    assert not device._ordered(compute, written)
    backend.order_inputs([host, grad])
    assert device._ordered(compute, written)


def _compiled_on_fake_gpus(program, plan, ranks: int, call) -> list[tuple[Any, set[str]]]:
    """`call(r, device, compiled)` on each of `ranks` threads, each rank a CompiledProgram of
    `plan` on its own strict fake GPU (compile()'s call path): (what it returned, the names
    the runner bound) per rank; the first rank's failure is raised."""
    from coconet.compile import CompiledProgram

    def body(r: int, runner: PlanRunner, backend: CudaBackend) -> tuple[Any, set[str]]:
        compiled = CompiledProgram(program, plan, runner, "cuda", backend.comm)
        return call(r, backend.device, compiled), set(runner.bound)

    return on_fake_gpus(plan, ranks, body, timeout=120)


@pytest.mark.parametrize("schedule", ["ar-c", "fuse(rs-c-ag)"])
def test_dlpack_tensors_are_updated_in_their_own_memory(schedule):
    """PyTorch tensors on the GPU (DLPack), through compile()'s call path: every updated
    argument changes in the tensor's own memory -- also a non-contiguous one (here `w`, a
    strided view), which the program cannot bind and reads through a copy: it used to come
    back as a new array, leaving the user's tensor as it was."""
    program = apply_schedule(coconet.load(EXAMPLES / "adam.mlir"), schedule)
    ranks = 2
    plan = lower(program, ranks)
    inputs = sim.prepare_inputs(program, None, plan.grid_shape, seed=3)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks, inplace=False)
    tensors: list[dict[str, Any]] = [{} for _ in range(ranks)]

    def call(r: int, device: Any, compiled: Any) -> Any:
        coords = V.coords_of(r, plan.grid_shape)
        for name, buf in plan.arguments.items():
            piece = V.piece_of(inputs[name], buf.type, coords, plan.grid_shape)
            if name == "w":  # every other element of a buffer twice its size
                wide = np.zeros((piece.size, 2), piece.dtype)
                wide[:, 0] = piece
                data = device.user_array(wide)[:, 0]
                assert not data.flags.c_contiguous
            else:
                data = device.user_array(np.asarray(piece))
            tensors[r][name] = FakeTensor(data, device_index=r)
        return compiled(**tensors[r])

    ranks_out = _compiled_on_fake_gpus(program, plan, ranks, call)
    updated = [n for n, b in plan.outputs.items() if plan.arguments.get(n) is b]
    assert set(updated) >= {"w", "m", "v"}
    for r, (result, bound) in enumerate(ranks_out):
        assert "w" not in bound
        assert {"m", "v"} <= bound  # contiguous: the program works in them directly
        for name in updated:
            mine = np.asarray(tensors[r][name].data)
            np.testing.assert_array_equal(mine, want.per_rank[r][name], err_msg=f"{name}@{r}")
            assert result[name] is tensors[r][name], name


@pytest.mark.parametrize("schedule", ["ar-c", "fuse(rs-c-ag)"])
def test_tensors_passed_again_are_ordered_after_their_producer(schedule):
    """compile()'s fast path takes a tensor passed again without adopting it anew; what a
    backward pass wrote into it since, on PyTorch's stream, must still come first (one wait a
    call): without it the strict double reports the step's read of the gradient (the library
    all_reduce's, or the copy into symmetric memory) as a stream hazard -- on a GPU the step
    could read a half-written gradient. Three steps, a new gradient each, as the sim."""
    program = apply_schedule(coconet.load(EXAMPLES / "sgd.mlir"), schedule)
    ranks = 2
    plan = lower(program, ranks)
    steps = [sim.prepare_inputs(program, None, plan.grid_shape, seed=s) for s in range(3)]
    w = steps[0]["w"]
    want = []
    for inputs in steps:
        out = sim.run(program, {**inputs, "w": w.copy()}, ranks=ranks, inplace=False)
        w = out.outputs["w"]
        want.append(w)

    def call(r: int, device: Any, compiled: Any) -> list[np.ndarray]:
        coords = V.coords_of(r, plan.grid_shape)

        def piece(inputs: dict[str, np.ndarray], name: str) -> np.ndarray:
            t = plan.arguments[name].type
            return np.asarray(V.piece_of(inputs[name], t, coords, plan.grid_shape))

        g, w = (FakeTensor(device.user_array(piece(steps[0], n)), device_index=r) for n in "gw")
        got = []
        for i, inputs in enumerate(steps):
            if i:  # the next backward pass, on PyTorch's stream
                device.produce(g.data, piece(inputs, "g"))
            compiled(g=g, w=w, lr=float(inputs["lr"]))
            got.append(np.array(w.data))
        return got

    for got, _bound in _compiled_on_fake_gpus(program, plan, ranks, call):
        for step, (a, b) in enumerate(zip(got, want, strict=True)):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


def test_the_default_convention_gathers_sliced_state_on_the_device():
    """compile()'s default calling convention on fake GPUs: m and v, replicated as written and
    sliced by fuse(rs-c-ag), are passed whole (m a DLPack tensor on the GPU, v a NumPy array)
    over 1001 elements on 2 ranks (uneven pieces); each rank's piece is bound, and after the
    step the updated pieces are all-gathered back on the device into the caller's arrays."""
    from coconet.convention import written_changes

    text = (EXAMPLES / "adam.mlir").read_text().replace("4096", "1001")
    written = Program(parse_module(text))
    program = apply_schedule(written, "fuse(rs-c-ag)")
    ranks = 2
    plan = lower(program, ranks)
    plan.written_types = written_changes(
        plan,
        {a.name: a.type for a in written.arguments},
        {o.name: o.type for o in written.outputs if not o.updated_argument},
    )
    inputs = sim.prepare_inputs(written, None, plan.grid_shape, seed=3)
    want = sim.run(written, {k: v.copy() for k, v in inputs.items()}, ranks=ranks, inplace=False)
    given: list[dict[str, Any]] = [{} for _ in range(ranks)]

    def call(r: int, device: Any, compiled: Any) -> Any:
        assert set(compiled.resliced) == {"m", "v"}
        assert compiled.input_shapes()["m"][0] == (1001,)
        coords = V.coords_of(r, plan.grid_shape)
        for name, t in [(a.name, a.type) for a in written.arguments]:
            value = np.asarray(V.piece_of(inputs[name], t, coords, plan.grid_shape))
            if name == "m":
                value = FakeTensor(device.user_array(value), device_index=r)
            given[r][name] = value
        return compiled(**given[r])

    ranks_out = _compiled_on_fake_gpus(program, plan, ranks, call)
    for r, (result, bound) in enumerate(ranks_out):
        assert "m" in bound  # this rank's piece of the caller's tensor, zero copy
        for name in ("w", "m", "v"):
            assert result[name] is given[r][name], name
            mine = given[r][name]
            mine = np.asarray(mine.data) if name == "m" else mine
            np.testing.assert_array_equal(mine, want.outputs[name], err_msg=f"{name}@{r}")


# ---------------------------------------------------------------------------------------------
# A real GPU (skipped without one)
# ---------------------------------------------------------------------------------------------


def _gpu() -> bool:
    from coconet.compile import gpu_available

    return gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")
def test_cupy_device_runs_sgd_on_one_gpu():
    from mpi4py import MPI

    from coconet.compile import compile as coco_compile

    program = coconet.load(EXAMPLES / "sgd.mlir")
    compiled = coco_compile(program, backend="cuda", comm=MPI.COMM_SELF, abort_on_error=False)
    g = np.full(4096, 2.0, np.float32)
    w = np.ones(4096, np.float32)
    out = compiled(g=g, w=w, lr=0.25)
    assert np.all(out["w"] == 0.5)
    assert out["w"] is w
    compiled.close()


# ---------------------------------------------------------------------------------------------
# Examples under their named schedules, ranks sharing ONE GPU (the double)
# ---------------------------------------------------------------------------------------------


# Ranks sharing the GPU is what this matrix adds to the fake-GPU tests above: CI runs 2 of them
# on a checkerboard of examples x schedules (below); every pair, and the 1- and 4-rank cases,
# under COCONET_FULL=1.
FULL_ONE_GPU = os.environ.get("COCONET_FULL") == "1"
ONE_GPU_RANKS = (1, 2, 4) if FULL_ONE_GPU else (2,)


def _one_gpu_matrix():
    from coconet.schedule import named_schedules

    cases, seen = [], set()
    for i, path in enumerate(sorted(EXAMPLES.glob("*.mlir"))):
        program = coconet.load(path)
        for j, name in enumerate(named_schedules(program)):
            # a checkerboard outside COCONET_FULL: each example runs every other of its
            # schedules, each schedule on every other example that offers it, and every
            # schedule at least once (the host kernels of every pair run in test_lowering)
            if not FULL_ONE_GPU and (i + j) % 2 and name in seen:
                continue
            seen.add(name)
            for ranks in ONE_GPU_RANKS:
                try:
                    program.grid.bind(ranks)
                except ValueError:
                    continue
                cases.append((path.stem, name, ranks))
    return cases


ONE_GPU = _one_gpu_matrix()


@pytest.mark.parametrize(
    ("name", "schedule", "ranks"), ONE_GPU, ids=[f"{n}[{s}]x{r}" for n, s, r in ONE_GPU]
)
def test_every_named_schedule_on_one_shared_gpu_matches_the_oracle(name, schedule, ranks):
    from coconet.schedule import apply_schedule as apply_named

    program = apply_named(coconet.load(EXAMPLES / f"{name}.mlir"), schedule)
    try:
        lower(program, ranks)
    except CocoError as e:  # a schedule the lowering refuses at this size says so
        pytest.skip(f"not legal at {ranks} rank(s): {e}")
    inputs = sim.prepare_inputs(program, None, program.grid.bind(ranks), seed=6)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks, inplace=False)
    _plan, got, backends = run_fake(program, ranks, inputs, gpus=1)
    result = compare_outputs(got, want.per_rank)
    assert result.ok, "\n".join(map(str, result.differences))
    assert not backends[0].device.hazards


# ---------------------------------------------------------------------------------------------
# CupyDevice against a strict stand-in for the `cupy` module
# ---------------------------------------------------------------------------------------------


class _Recorder:
    def __init__(self):
        self.calls: list[tuple] = []
        self.current = "legacy"


class FakeCupyStream:
    def __init__(self, rec: _Recorder, name: str, ptr: int):
        self.rec, self.name, self.ptr = rec, name, ptr
        self.prev: list[str] = []

    def __enter__(self):
        self.prev.append(self.rec.current)
        self.rec.current = self.name
        return self

    def __exit__(self, *exc):
        self.rec.current = self.prev.pop()

    def wait_event(self, ev):
        self.rec.calls.append(("wait_event", self.name))

    def record(self, event=None):
        return ("event", self.name)


def _cupy_double():
    """A `cupy` look-alike that records what CupyDevice calls, with CuPy 14's types."""
    import types

    rec = _Recorder()

    class ndarray:
        def __init__(self, data, dtype=None, memptr=None):
            self.data_ = np.zeros(data, dtype) if memptr is not None else np.asarray(data, dtype)
            self.dtype, self.shape = self.data_.dtype, self.data_.shape
            self.device = types.SimpleNamespace(id=0)

        def view(self, dtype):
            return ndarray(self.data_.view(dtype))

    class Function:
        ptr = 0xF00

    class RawKernel:
        kernel = Function()

        def __call__(self, grid, block, args, shared_mem=0):
            rec.calls.append(("kernel", rec.current, grid, block))

    class RawModule:
        def __init__(self, code=None, *, path=None, enable_cooperative_groups=False):
            self.cooperative = enable_cooperative_groups

        def get_function(self, name):
            rec.calls.append(("get_function", name, self.cooperative))
            return RawKernel()

    runtime = types.SimpleNamespace(
        deviceSynchronize=lambda: rec.calls.append(("deviceSynchronize",)),
        malloc=lambda n: 0x1000,
        memset=lambda *a: rec.calls.append(("memset_on_legacy_stream",)),
        memsetAsync=lambda ptr, v, n, s: rec.calls.append(("memsetAsync", s)),
        ipcGetMemHandle=lambda ptr: b"\0" * 64,
    )

    def from_dlpack(value):
        rec.calls.append(("from_dlpack", rec.current))
        return ndarray(value.host, dtype=value.host.dtype)

    def zeros(shape, dtype=None):
        rec.calls.append(("zeros", rec.current))
        return ndarray(np.zeros(shape, dtype))

    def asarray(host):
        rec.calls.append(("asarray", rec.current))
        return ndarray(host)

    cuda = types.SimpleNamespace(
        runtime=runtime,
        driver=types.SimpleNamespace(occupancyMaxActiveBlocksPerMultiprocessor=lambda f, b, s: 3),
        UnownedMemory=lambda ptr, n, owner: ("mem", ptr, n),
        MemoryPointer=lambda mem, off: ("ptr", mem, off),
        get_current_stream=lambda: FakeCupyStream(rec, rec.current, 0),
    )
    cp = types.SimpleNamespace(
        ndarray=ndarray,
        RawModule=RawModule,
        cuda=cuda,
        from_dlpack=from_dlpack,
        zeros=zeros,
        asarray=asarray,
        uint16=np.uint16,
    )
    return cp, rec


def _cupy_device():
    from coconet.runtime.cuda import CupyDevice

    cp, rec = _cupy_double()
    d = object.__new__(CupyDevice)
    d.cp = d.xp = cp
    d.device = type("Dev", (), {"id": 0, "attributes": {"MultiProcessorCount": 132}})()
    d.streams = {
        COMPUTE_STREAM: FakeCupyStream(rec, "s0", 0x10),
        COMM_STREAM: FakeCupyStream(rec, "s1", 0x20),
    }
    d.events, d.functions, d.raw, d.opened = {}, {}, [], []
    return d, cp, rec


def test_cupy_device_synchronizes_the_whole_device():
    d, _cp, rec = _cupy_device()
    d.synchronize()
    assert rec.calls == [("deviceSynchronize",)]


def test_cupy_device_zeroes_and_uploads_on_the_given_stream():
    d, _cp, rec = _cupy_device()
    s0 = d.stream(COMPUTE_STREAM)
    d.zeros((4,), np.float32, s0)
    d.upload(np.zeros(4, np.float32), s0)
    d.alloc_ipc((4,), np.float32, s0)
    assert ("zeros", "s0") in rec.calls
    assert ("asarray", "s0") in rec.calls
    assert ("memsetAsync", 0x10) in rec.calls
    assert not [c for c in rec.calls if c[0] == "memset_on_legacy_stream"]


def test_cupy_device_looks_kernels_up_once_and_launches_fused_ones_cooperatively():
    d, _cp, rec = _cupy_device()
    module = d.load_module("k.cubin", "")
    s0 = d.stream(COMPUTE_STREAM)
    for _ in range(3):
        d.launch(module, "k", 4, 256, [], 0, s0)
        d.launch(module, "k_fused", 4, 256, [], 0, s0, cooperative=True)
    lookups = [c for c in rec.calls if c[0] == "get_function"]
    assert lookups == [("get_function", "k", False), ("get_function", "k_fused", True)]
    assert all(c[1] == "s0" for c in rec.calls if c[0] == "kernel")
    assert d.max_coresident_blocks(module, "k_fused", 256, 0) == 3 * 132


def test_cupy_device_adopts_dlpack_tensors_under_the_compute_stream_and_views_bf16():
    d, _cp, rec = _cupy_device()

    class Tensor:
        requires_grad = False

        def __init__(self, host):
            self.host = host

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, stream=None):
            raise AssertionError("the double's from_dlpack reads .host")

    s0 = d.stream(COMPUTE_STREAM)
    bf = d.adopt(Tensor(np.zeros(4, ml_dtypes.bfloat16)), s0)
    assert ("from_dlpack", "s0") in rec.calls
    assert bf.dtype == np.uint16
    assert d.adopt(np.zeros(3), s0) is None
    t = Tensor(np.zeros(3, np.float32))
    t.requires_grad = True
    with pytest.raises(CocoError, match="detach"):
        d.adopt(t, s0)


def test_two_nodes_of_fake_gpus_run_the_hierarchical_plan():
    """A fused Adam on 4 GPUs in 2 machines: IPC only within a machine, NCCL between them,
    and the oracle's results bit for bit (node partials in double, rounded once)."""
    program = apply_schedule(coconet.load(EXAMPLES / "adam.mlir"), "fuse(rs-c-ag)")
    inputs = sim.prepare_inputs(program, None, (4,), seed=2)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=4, inplace=False)
    nodes = (0, 0, 1, 1)
    plan, got, backends = run_fake(program, 4, inputs, nodes=nodes)
    assert plan.nodes == nodes
    assert compare_outputs(got, want.per_rank).bit_exact
    symmetric = [b for b in plan.buffers if b.symmetric]
    for b in backends:
        # Every symmetric buffer's handle of the one other GPU in the machine (the double
        # refuses a handle from another machine).
        opened = [c for c in b.device.calls if c[0] == "open_ipc"]
        assert len(opened) == len(symmetric)
        nccl = [c[1] for c in b.device.calls if c[0] == "nccl"]
        assert "all_gather" in nccl  # the gathered slices between machines


def test_a_plan_that_ignores_the_nodes_cannot_reach_across_them():
    """The double models machines: a single-node plan on GPUs of two machines fails to open
    the other machine's IPC handles (as CUDA does), which the hierarchical plan never asks."""
    program = apply_schedule(coconet.load(EXAMPLES / "sgd.mlir"), "fuse(rs-c-ag)")
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    with pytest.raises(RuntimeError, match="another node"):
        run_fake(program, 2, inputs, nodes=(0, 1), plan_nodes=())


@pytest.mark.parametrize("nodes", [(), (0, 1)], ids=["one-machine", "stages-on-two"])
def test_fused_send_on_fake_gpus(nodes):
    """fuse(sliced-send) on 2 stages of 1 GPU: within a machine the send kernel stores into the
    next stage's buffer through IPC (no NCCL send); stages on two machines send with NCCL.
    2 GPUs per stage: test_pipeline_boundary_on_four_fake_gpus."""
    program = apply_schedule(coconet.load(EXAMPLES / "pipeline_boundary.mlir"), "fuse(sliced-send)")
    inputs = sim.prepare_inputs(program, None, program.grid.bind(2), seed=1)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=2, inplace=False)
    plan, got, backends = run_fake(program, 2, inputs, nodes=nodes)
    assert compare_outputs(got, want.per_rank).bit_exact
    p2p = [
        c for b in backends for c in b.device.calls if c[0] == "nccl" and c[1] in ("send", "recv")
    ]
    pushed = "comm.send into the receiver" in plan.cuda_source
    assert pushed == (not nodes)
    assert bool(p2p) == bool(nodes)


@pytest.mark.parametrize(
    "schedule", ["rs-c-ag", "sliced-send", "fuse(sliced-send)", "ol(mm,rs,fuse(sliced-send),ag)"]
)
def test_pipeline_boundary_on_four_fake_gpus(schedule):
    """2 stages of 2 GPUs: the reduce_scatter splits dim 1 of a [2, 16, 64] tensor, so each
    member's region is two blocks of rows, packed before NCCL reduces them. The packed array
    must be device memory of the rank (it once was a host array from `xp.stack`, which NCCL
    -- and the double -- refuse)."""
    from coconet.schedule import apply_schedule as apply_named

    program = apply_named(coconet.load(EXAMPLES / "pipeline_boundary.mlir"), schedule)
    inputs = sim.prepare_inputs(program, None, program.grid.bind(4), seed=2)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=4, inplace=False)
    _plan, got, backends = run_fake(program, 4, inputs)
    result = compare_outputs(got, want.per_rank)
    assert result.ok, "\n".join(map(str, result.differences))
    assert not any(b.device.hazards for b in backends)
    scatters = [c for b in backends for c in b.device.calls if c[:2] == ("nccl", "reduce_scatter")]
    assert scatters  # NCCL reduced the packed regions


ALL_TO_ALL = """
func.func @a2a(%x: !coco.tensor<7x10x9x{elt}, sliced<2>>, %d: !coco.tensor<{rows}x5x{elt}, local>)
    -> (!coco.tensor<7x10x9x{elt}, sliced<0>>, !coco.tensor<7x10x9x{elt}, sliced<2>>,
        !coco.tensor<{rows}x5x{elt}, local>) attributes {{coco.grid = #coco.grid<[?]>}} {{
  %y = comm.all_to_all %x : !coco.tensor<7x10x9x{elt}, sliced<2>> -> !coco.tensor<7x10x9x{elt}, sliced<0>>
  %z = coco.add %y, %y : !coco.tensor<7x10x9x{elt}, sliced<0>>
  %w = comm.all_to_all %z : !coco.tensor<7x10x9x{elt}, sliced<0>> -> !coco.tensor<7x10x9x{elt}, sliced<2>>
  %e = comm.all_to_all %d : !coco.tensor<{rows}x5x{elt}, local>
  return %y, %w, %e : !coco.tensor<7x10x9x{elt}, sliced<0>>, !coco.tensor<7x10x9x{elt}, sliced<2>>, !coco.tensor<{rows}x5x{elt}, local>
}}
"""


@pytest.mark.parametrize(("ranks", "gpus"), [(2, None), (3, None), (4, None), (3, 1), (4, 2)])
@pytest.mark.parametrize("elt", ["f32", "bf16", "i64"])
def test_all_to_all_on_fake_gpus(ranks, gpus, elt):
    """comm.all_to_all (uneven pieces, the innermost dim re-cut both ways, the dispatch form):
    NCCL grouped send/recv of each member's run of a packed device array, and no empty run
    posted; ranks sharing a GPU move the same runs through host copies and MPI Alltoallv."""
    text = ALL_TO_ALL.format(elt=elt, rows=ranks * 2).replace("return ", "func.return ")
    program = Program(parse_module(text))
    inputs = sim.prepare_inputs(program, None, (ranks,), seed=5)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks, inplace=False)
    _plan, got, backends = run_fake(program, ranks, inputs, gpus=gpus)
    result = compare_outputs(got, want.per_rank)
    assert result.bit_exact, "\n".join(map(str, result.differences))
    assert not any(b.device.hazards for b in backends)
    p2p = [
        c for b in backends for c in b.device.calls if c[:2] in (("nccl", "send"), ("nccl", "recv"))
    ]
    if gpus is None:
        assert p2p
        assert all(c[3] for c in p2p)  # counts: never an empty run
    else:
        assert not p2p
        assert {b.transport_kind for b in backends} == {"mpi"}


def test_the_double_refuses_a_recv_of_another_size_than_its_send():
    """NCCL pairs each recv with the peer's send of as many bytes (else it hangs): an uneven
    all_to_all whose counts disagree must fail in the double too, not write what was sent."""
    world = FakeWorld()
    devices = [StrictDevice(world, bus=f"0000:0{r + 1}:00.0", device_id=r) for r in range(2)]
    uid = devices[0].nccl_unique_id()
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        d = devices[r]
        try:
            comm = d.nccl_comm(uid, 2, r)
            s = d.stream(COMM_STREAM)
            send = d.zeros((4,), np.uint8, s)
            recv = d.zeros((8 if r == 0 else 4,), np.uint8, s)
            with d.group():
                d.nccl("send", comm, s, src=send, count=4, dtype=NCCL_DTYPES["uint8"], peer=1 - r)
                d.nccl(
                    "recv",
                    comm,
                    s,
                    dst=recv,
                    count=recv.size,
                    dtype=NCCL_DTYPES["uint8"],
                    peer=1 - r,
                )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(errors) == 1
    assert isinstance(errors[0], NcclError)
    assert "recv of 8 bytes from rank 1, which sent 4 bytes" in str(errors[0])
