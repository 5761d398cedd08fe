"""The cuda backend's logic without a GPU: CudaBackend drives a fake `Device` that keeps arrays
in host memory, runs the plan's kernels through the host build of the same CUDA source, and
emulates NCCL and CUDA IPC between threads (one per rank). So plan walking, buffer dtypes,
typed kernel arguments, peer tables, NCCL call selection and stream/event order all run for
real and are compared with the sim oracle. What is left for a GPU (CuPy, NVRTC modules, NCCL,
IPC) sits in CupyDevice, exercised by the `gpu`-marked test at the end."""

from __future__ import annotations

import contextlib
import ctypes
import threading
import uuid
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from coconet.lowering.host_compiler import compile_host
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.nvrtc import nvrtc_available
from coconet.lowering.plan import COMM_STREAM, COMPUTE_STREAM, Epoch, Launch, PeerTable
from coconet.runtime import sim
from coconet.runtime import values as V
from coconet.runtime.check import compare_outputs
from coconet.runtime.cuda import (
    NCCL_DTYPES,
    CudaBackend,
    device_dtype,
    kernel_scalars,
    nccl_dtype,
    nccl_op,
)
from coconet.runtime.executor import KernelArg, PlanRunner, buffer_dtype, group_of

import coconet
from coconet.compile import apply_schedule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.skipif(
    not nvrtc_available(), reason="the cuda backend compiles with NVRTC"
)

# ---------------------------------------------------------------------------------------------
# A fake world: MPI-like communicators, NCCL and IPC between threads
# ---------------------------------------------------------------------------------------------


class Board:
    """Rendezvous of the members of one communicator: each call contributes a value and gets
    every member's, in member order."""

    def __init__(self):
        self.cond = threading.Condition()
        self.slots: dict[tuple, dict[int, Any]] = {}

    def exchange(self, key: tuple, index: int, size: int, value: Any) -> list[Any]:
        with self.cond:
            slot = self.slots.setdefault(key, {})
            slot[index] = value
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: len(slot) == size, timeout=60):
                raise TimeoutError(f"fake collective {key} timed out")
            return [slot[i] for i in range(size)]


BOARD = Board()


class FakeComm:
    """The subset of mpi4py's Comm the backend uses, between threads."""

    def __init__(self, cid: str, members: list[int], rank: int):
        self.cid, self.members, self.world_rank = cid, members, rank
        self.seq = 0

    def Get_rank(self) -> int:
        return self.members.index(self.world_rank)

    def Get_size(self) -> int:
        return len(self.members)

    def allgather(self, value):
        self.seq += 1
        return BOARD.exchange((self.cid, self.seq), self.Get_rank(), self.Get_size(), value)

    def bcast(self, value, root=0):
        return self.allgather(value)[root]

    def Barrier(self):
        self.allgather(None)

    def Split(self, color, key=0):
        infos = self.allgather((color, key, self.world_rank))
        members = [r for c, k, r in sorted((i for i in infos if i[0] == color), key=lambda i: i[1])]
        return FakeComm(f"{self.cid}/{self.seq}/{color}", members, self.world_rank)

    def Split_type(self, split_type, key=0):
        return self.Split(0, key)

    def Free(self):
        pass


def _decode(a: np.ndarray, code: int) -> np.ndarray:
    if code == NCCL_DTYPES["bfloat16"]:
        return a.view(ml_dtypes.bfloat16).astype(np.float64)
    return a.astype(np.float64) if a.dtype.kind == "f" else a.astype(np.int64)


def _encode(x: np.ndarray, like: np.ndarray, code: int) -> np.ndarray:
    if code == NCCL_DTYPES["bfloat16"]:
        return x.astype(ml_dtypes.bfloat16).view(np.uint16)
    return x.astype(like.dtype)


class FakeNccl:
    def __init__(self, uid: str, size: int, rank: int):
        self.uid, self.size, self.rank, self.seq = uid, size, rank, 0

    def exchange(self, value):
        self.seq += 1
        return BOARD.exchange((self.uid, self.seq), self.rank, self.size, value)


class FakeDevice:
    """`Device` on host memory; records every call."""

    xp = np

    def __init__(self):
        self.calls: list[tuple] = []
        self.keep: list[np.ndarray] = []
        self.current = None
        self.group_ops: list[tuple] | None = None

    def arch(self) -> str:
        return "sm_90"

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype)

    def address(self, array) -> int:
        return array.ctypes.data

    def upload(self, host):
        host = np.ascontiguousarray(host)
        return host.view(np.uint16).copy() if host.dtype == ml_dtypes.bfloat16 else host.copy()

    def download(self, array):
        return array.copy()

    def adopt(self, value):
        return None

    def alloc_ipc(self, shape, dtype):
        a = np.zeros(shape, dtype)
        self.keep.append(a)
        return a, a.ctypes.data.to_bytes(8, "little")

    def open_ipc(self, handle: bytes) -> int:
        self.calls.append(("open_ipc",))
        return int.from_bytes(handle, "little")

    def load_module(self, cubin_path: str, source: str):
        self.calls.append(("load_module", Path(cubin_path).suffix))
        return compile_host(source)

    def launch(self, module, kernel, grid, block, args, shared_bytes, stream):
        self.calls.append(
            ("launch", kernel, stream, tuple(type(a).__name__ for a in args), tuple(args))
        )
        ctypes_of = {
            np.uint64: ctypes.c_uint64,
            np.int64: ctypes.c_int64,
            np.int32: ctypes.c_int32,
            np.uint32: ctypes.c_uint32,
            np.float32: ctypes.c_float,
            np.float64: ctypes.c_double,
            np.bool_: ctypes.c_bool,
        }
        fn = module.kernel(kernel, *(ctypes_of[type(a)] for a in args))
        fn(grid, block, *(a.item() for a in args), shared_bytes=shared_bytes)

    def stream(self, index: int):
        return f"s{index}"

    @contextlib.contextmanager
    def on(self, stream):
        self.current = stream
        yield
        self.current = None

    def record(self, event, stream):
        self.calls.append(("record", event, stream))

    def wait(self, event, stream):
        self.calls.append(("wait", event, stream))

    def synchronize(self):
        pass

    def nccl_unique_id(self):
        return uuid.uuid4().hex

    def nccl_comm(self, uid, size, rank):
        return FakeNccl(uid, size, rank)

    def nccl(self, call, comm: FakeNccl, stream, **kw):
        self.calls.append(("nccl", call, stream, kw.get("count"), kw.get("dtype")))
        if call in ("send", "recv"):
            assert self.group_ops is not None, "point-to-point outside a group"
            self.group_ops.append((call, kw))
            return
        src, dst, code = kw["src"], kw["dst"], kw["dtype"]
        parts = comm.exchange(np.ascontiguousarray(src).reshape(-1).copy())
        n = kw["count"]
        flat = dst.reshape(-1) if dst is not None else None
        if call in ("all_reduce", "reduce_scatter", "reduce"):
            op = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum}[kw["op"]]
            acc = _decode(parts[0], code)
            for p in parts[1:]:
                acc = op(acc, _decode(p, code))
            total = _encode(acc, parts[0], code)
            if call == "all_reduce":
                flat[...] = total
            elif call == "reduce_scatter":
                flat[...] = total[comm.rank * n : (comm.rank + 1) * n]
            elif comm.rank == kw["root"]:
                flat[...] = total
        elif call == "all_gather":
            flat[...] = np.concatenate(parts)
        elif call == "broadcast":
            flat[...] = parts[kw["root"]]

    @contextlib.contextmanager
    def group(self):
        self.group_ops = []
        yield
        ops, self.group_ops = self.group_ops, None
        # Every rank of the world enters the group for a send step; exchange what was sent.
        sends = {
            kw["peer"]: np.ascontiguousarray(kw["src"]).reshape(-1).copy()
            for c, kw in ops
            if c == "send"
        }
        posted = self._world.exchange(sends)
        for c, kw in ops:
            if c == "recv":
                kw["dst"].reshape(-1)[...] = posted[kw["peer"]][self._rank]

    def close(self):
        pass


class GroupAwareBackend(CudaBackend):
    """CudaBackend whose fake device learns the world NCCL communicator for p2p groups."""

    def _world(self):
        world = super()._world()
        self.device._world = world  # type: ignore[attr-defined]
        self.device._rank = self.rank  # type: ignore[attr-defined]
        return world


# ---------------------------------------------------------------------------------------------
# Running a plan on N fake GPUs
# ---------------------------------------------------------------------------------------------


def run_fake(program, ranks: int, inputs: dict[str, np.ndarray], *, exact=False, steps=1):
    plan = lower(program, ranks)
    cid = uuid.uuid4().hex
    results: list[Any] = [None] * ranks
    backends: list[CudaBackend] = [None] * ranks  # type: ignore[list-item]
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        try:
            device = FakeDevice()
            backend = GroupAwareBackend(
                device, FakeComm(cid, list(range(ranks)), r), exact_collectives=exact
            )
            backends[r] = backend
            runner = PlanRunner(plan, r, backend)
            runner.setup()
            pieces = {
                name: V.piece_of(
                    inputs[name], buf.type, V.coords_of(r, plan.grid_shape), plan.grid_shape
                )
                for name, buf in plan.arguments.items()
            }
            runner.check_inputs(pieces, backend.shape_of, backend.dtype_of)
            runner.set_inputs(pieces)
            for _ in range(steps):
                runner.run()
            results[r] = {name: backend.read(buf) for name, buf in plan.outputs.items()}
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
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


@pytest.mark.parametrize("name,spec", CASES, ids=[f"{n}[{s or 'as-written'}]" for n, s in CASES])
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
    assert "all_gather" in calls and "all_reduce" not in calls


def test_fused_collective_gets_typed_args_peer_tables_and_epochs():
    program = apply_schedule(
        coconet.load(EXAMPLES / "adam.mlir"),
        "coco-split-allreduce,coco-reorder,coco-as-slice{ops=m,v},coco-fuse",
    )
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    plan, _got, backends = run_fake(program, 2, inputs, steps=3)
    launch = next(
        s
        for s in plan.steps
        if isinstance(s, Launch) and any(isinstance(a, PeerTable) for a in s.args)
    )
    calls = [c for c in backends[1].device.calls if c[0] == "launch" and c[1] == launch.kernel]
    assert len(calls) == 3  # one per run()
    types = calls[0][3]
    for a, t in zip(launch.args, types):
        if isinstance(a, Epoch):
            assert t == "uint32"
    epochs = [
        c[4][next(i for i, a in enumerate(launch.args) if isinstance(a, Epoch))] for c in calls
    ]
    assert [int(e) for e in epochs] == [1, 2, 3]
    # Peer tables hold the group members' addresses of the symmetric buffer, in group order.
    b1 = backends[1]
    for a in launch.args:
        if isinstance(a, PeerTable):
            table_addr = int(calls[0][4][launch.args.index(a)])
            table = next(t for t in b1.tables if t.ctypes.data == table_addr)
            group = group_of(plan.grid_shape, a.span, 1)
            expect = [backends[m].own[a.buffer.name].ctypes.data for m in group]
            assert list(map(int, table)) == expect


def test_overlap_issues_chunk_collectives_on_the_comm_stream_after_each_event():
    program = apply_schedule(coconet.load(EXAMPLES / "model_parallel_mlp.mlir"), "coco-overlap")
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    _plan, _got, backends = run_fake(program, 2, inputs)
    trace = backends[0].trace
    chunks = [t for t in trace if t[0] == "all_reduce"]
    assert len(chunks) == 4 and all(t[1] == COMM_STREAM for t in chunks)
    assert all(t[1] == COMPUTE_STREAM for t in trace if t[0] == "matmul")
    # matmul chunk c, record on compute, wait on comm, all_reduce chunk c
    kinds = [t[0] for t in trace]
    first = kinds.index("matmul")
    assert kinds[first : first + 4] == ["matmul", "record", "wait", "all_reduce"]
    waits = [c for c in backends[0].device.calls if c[0] == "wait"]
    assert (
        waits[0][2] == "s1" and waits[-1][2] == "s0"
    )  # the compute stream waits for the last chunk
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
    assert int(out[1]) == 5 and int(out[0]) == 0x7F0012345678


def test_dtypes_on_the_device():
    assert device_dtype(np.dtype(ml_dtypes.bfloat16)) == np.uint16
    assert device_dtype(np.dtype(np.float16)) == np.float16
    assert nccl_dtype(np.dtype(ml_dtypes.bfloat16)) == NCCL_DTYPES["bfloat16"]
    assert nccl_dtype(np.dtype(np.bool_)) == NCCL_DTYPES["uint8"]
    assert nccl_op("sum", np.dtype(np.bool_)) == 2  # or == max on 0/1
    assert nccl_op("prod", np.dtype(np.bool_)) == 3
    assert nccl_op("sum", np.dtype(np.float32)) == 0


def test_bf16_inputs_travel_as_uint16_on_the_device():
    program = coconet.load(EXAMPLES / "adam_bf16_grads.mlir")
    plan = lower(program, 2)
    buf = plan.arguments["g"]
    assert buffer_dtype(buf) == ml_dtypes.bfloat16
    backend = CudaBackend(FakeDevice(), FakeComm(uuid.uuid4().hex, [0], 0))

    class DeviceArray:  # looks like a CuPy array of bf16 bit patterns: not a NumPy ndarray
        shape, dtype = buf.shape, np.dtype(np.uint16)

    assert backend.dtype_of(DeviceArray()) == ml_dtypes.bfloat16
    assert backend.dtype_of(np.zeros(3, np.uint16)) == np.uint16  # host arrays say what they are


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
    assert np.all(out["w"] == 0.5) and out["w"] is w
    compiled.close()
