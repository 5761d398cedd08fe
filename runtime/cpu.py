"""The `cpu` backend: one MPI process per rank (mpi4py).

* Kernels: the plan's CUDA source compiled by the host C++ compiler against the host device
  layer (toolchain/host_compiler.py, cached on disk by content hash), called through ctypes with
  the parameter types of each kernel's signature.
* Symmetric buffers: MPI-3 shared-memory windows (`MPI.Win.Allocate_shared` on the node
  communicator, `Shared_query` for peers' addresses), zeroed before first use; fused collective
  kernels get a per-rank array of their group members' addresses (a PeerTable).
* Library collectives: runtime/collectives.py (shared with the cuda backend) over an
  `MpiTransport` on a communicator per set of grid axes (split by the coordinates off those
  axes, keyed by rank, so communicator rank order is the sim's group order).
  Exactness against the sim oracle (which accumulates in f64 in rank order and rounds once):
  - all_gather, broadcast and send move bytes: always bit-exact;
  - f16, bf16, fp8, i1, and max/min of floats are reduced by exchanging the pieces
    (Allgather / Alltoall / Gather) and combining them locally in rank order in f64, rounded
    once, as the sim does (floats in compiled host code: runtime/host_combine.py): bit-exact;
  - sum/prod of f32/f64 use MPI's reductions (MPI_Allreduce, MPI_Reduce_scatter_block,
    MPI_Reduce) in the data's own precision and MPI's order: equal to the oracle within the
    per-dtype tolerance (coconet.core.tolerances.TOLERANCES), usually bit-exact on 2 ranks;
    `exact_collectives=True` routes them through the exact path as well;
  - integer reductions use MPI's (wrapping, order-free): bit-exact.
* Matmul: NumPy (BLAS), computing in f32 for f16/bf16, as the sim does.
* Streams: compute-stream steps run in order, synchronously. Collectives on the communication
  stream become non-blocking MPI calls (Iallreduce, ...), started where the plan puts them
  (after the chunk's matmul and its event) and completed at the WaitEvent that needs them, a
  later conflicting communication step, or the end of the step, so the communication of chunk
  c overlaps the matmul of chunk c+1. MPICH progresses them when MPI is called, so the runner
  polls them between compute steps. Other work on the communication stream (a fused kernel's
  chunk, a copy) completes the pending communication first (stream order) and runs inline.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coconet.core import values as V
from coconet.core.program import CocoError
from coconet.lowering.plan import COMM_STREAM, Buffer, Collective, Copy, Launch, Matmul, Plan
from coconet.runtime.collectives import (
    CollectiveContext,
    CollectiveOps,
    blocking_call,
    collective_ops,
)
from coconet.runtime.executor import (
    KernelArg,
    accumulate_chunk,
    buffer_dtype,
    check_plan_size,
    groups_of,
    matmul_segments,
    reduction_runs,
)
from coconet.runtime.host_combine import HostCombine
from coconet.runtime.symmetric import MpiWindows, PosixSegments, node_communicator
from coconet.runtime.transport import MpiTransport
from coconet.toolchain.host_compiler import (
    HOST_CACHE,
    HostCompileError,
    PackedLaunch,
    compile_host,
)

CTYPES = {
    "ptr": ctypes.c_void_p,
    "bool": ctypes.c_bool,
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}

# Defaults for every rank process: ranks may outnumber cores, and a spinning OpenMP or BLAS
# worker would take the core a peer needs. Set before the kernels' libgomp is loaded; the
# user's own settings win.
RANK_ENV_DEFAULTS = {
    "OMP_NUM_THREADS": "1",
    "OMP_WAIT_POLICY": "PASSIVE",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def apply_rank_env_defaults(env: dict[str, str] | None = None) -> dict[str, str]:
    target = os.environ if env is None else env
    for k, v in RANK_ENV_DEFAULTS.items():
        target.setdefault(k, v)
    return target  # type: ignore[return-value]


def host_matmul(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, step: Matmul, acc: np.ndarray | None = None
) -> None:
    """c = a @ b computing in the result's compute dtype (f32 for f16/bf16), as the sim; an
    overlap chunk computes its rows only, or its part of the reduction dim into c or `acc`
    (lowering/plan.py `Matmul`)."""
    cdt = V.compute_dtype(step.c.type)
    if step.k_rows is not None:
        into = c if acc is None else acc
        for run, add in reduction_runs(step):
            x, y = a[..., run].astype(cdt, copy=False), b[run].astype(cdt, copy=False)
            if not add and into.dtype == cdt:
                np.matmul(x, y, out=into)  # (no temporary: the first run writes the sum)
            else:
                accumulate_chunk(into, np.matmul(x, y), add)
        if acc is not None and step.final:
            c[...] = acc.astype(c.dtype)
        return
    if step.rows is None and step.block is None:
        c[...] = np.matmul(a.astype(cdt, copy=False), b.astype(cdt, copy=False)).astype(c.dtype)
        return
    a2 = a.reshape(-1, a.shape[-1])
    c2 = c.reshape(-1, c.shape[-1])
    bc = b.astype(cdt, copy=False)
    b3 = bc.reshape(-1, *b.shape[-2:]) if b.ndim > 2 else bc
    cut = a if step.block_of == "a" else c
    for lo, hi, m in matmul_segments(
        step.rows, step.block, cut.shape, tuple(b.shape), tuple(c.shape)
    ):
        bm = b3 if m is None else b3[m]
        c2[lo:hi] = np.matmul(a2[lo:hi].astype(cdt, copy=False), bm).astype(c.dtype)


# PyTorch's types that NumPy lacks (DLPack does not carry them): viewed through their bits.
_TORCH_BITS = {
    "torch.bfloat16": "bf16",
    "torch.float8_e4m3fn": "f8E4M3FN",
    "torch.float8_e5m2": "f8E5M2",
}


def host_view(value: Any) -> np.ndarray | None:
    """A NumPy array sharing memory with `value` -- a NumPy array, or a host tensor of another
    library (PyTorch CPU tensors, any DLPack producer; bf16 and fp8 through their integer
    bits) -- or None
    when `value` is not host memory that can be viewed (Python numbers, lists)."""
    if isinstance(value, np.ndarray):
        return value
    if not hasattr(value, "__dlpack__") or not hasattr(value, "__dlpack_device__"):
        return None
    if int(value.__dlpack_device__()[0]) != 1:  # kDLCPU
        raise CocoError(
            "the tensor is not in host memory: the cpu backend takes CPU tensors (use the "
            "cuda backend for GPU tensors)"
        )
    if getattr(value, "requires_grad", False):
        raise CocoError("the tensor requires grad: pass tensor.detach() so it can be updated")
    try:
        elt = _TORCH_BITS.get(str(getattr(value, "dtype", "")))
        if elt is not None:
            import torch

            bits = torch.int16 if elt == "bf16" else torch.uint8
            return np.from_dlpack(value.view(bits)).view(V.NUMPY_DTYPES[elt])
        return np.from_dlpack(value)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise CocoError(f"cannot view the tensor's memory: {e}") from None


class LibraryClock:
    """Seconds spent inside the libraries a step calls -- the kernels' foreign calls and
    every MPI call (starting a collective, waiting or testing for it) -- so that a
    benchmark can report a step's host overhead as its time less these (opt-in:
    `CpuBackend.clock_library`; benchmarks/bench_latency.py). What coconet's Python does
    around them (walking the plan, packing, the collectives' bookkeeping) stays outside."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, fn: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - t0

        return call


class _ClockedComm:
    """A communicator whose calls are timed by a LibraryClock (its non-blocking buffer
    collectives and point-to-point calls, and the blocking collectives a step makes)."""

    TIMED_BLOCKING = frozenset({"Allreduce"})  # (collectives.blocking_call)

    def __init__(self, comm: Any, clock: LibraryClock):
        self._comm, self._clock = comm, clock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._comm, name)
        timed = name[:1] == "I" or name in self.TIMED_BLOCKING
        return self._clock.timed(attr) if timed and callable(attr) else attr


class _ClockedMPI:
    """The MPI module, its requests' waits and tests timed by a LibraryClock."""

    def __init__(self, mpi: Any, clock: LibraryClock):
        self._mpi = mpi
        self.Request = type(
            "Request",
            (),
            {
                "Waitall": staticmethod(clock.timed(mpi.Request.Waitall)),
                "Testall": staticmethod(clock.timed(mpi.Request.Testall)),
            },
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mpi, name)


@dataclass
class Pending:
    """A non-blocking collective in flight on the communication stream."""

    seq: int
    step: Collective
    ops: CollectiveOps
    request: Any = None
    done: bool = False

    def advance(self) -> None:
        try:
            self.request = next(self.ops)
        except StopIteration:
            self.request, self.done = None, True

    def test(self, MPI) -> None:
        while not self.done:
            if self.request and not MPI.Request.Testall(self.request):
                return
            self.advance()

    def wait(self, MPI) -> None:
        while not self.done:
            if self.request:
                MPI.Request.Waitall(self.request)
            self.advance()

    def touches(self, other: Collective) -> bool:
        mine = {self.step.src.name, self.step.dst.name}
        if not mine & {other.src.name, other.dst.name}:
            return False
        a, b = self.step.rows, other.rows
        x, y = self.step.block, other.block
        if x is not None and y is not None and x[0] == y[0]:  # all_to_all chunks of one dim
            return x[1] < y[2] and y[1] < x[2]
        return a is None or b is None or (a[0] < b[1] and b[0] < a[1])


class CpuBackend:
    """One rank of the cpu backend (see the module docstring)."""

    name = "cpu"

    def __init__(
        self,
        comm=None,
        *,
        exact_collectives: bool = False,
        nonblocking: bool = True,
        mpi: Any = None,
    ):
        from coconet.runtime.torch_comm import TORCH_MPI, TorchComm

        if mpi is None and isinstance(comm, TorchComm):
            mpi = TORCH_MPI
        if mpi is None:
            from mpi4py import MPI as mpi
        # mpi4py's MPI module, or its stand-in for a torch.distributed job
        self.MPI = mpi
        self.comm = comm if comm is not None else mpi.COMM_WORLD
        self.symmetric = MpiWindows(mpi) if hasattr(mpi, "Win") else PosixSegments()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.exact = exact_collectives
        self.nonblocking = nonblocking
        self.plan: Plan | None = None
        self.grid_shape: tuple[int, ...] = ()
        self.arrays: dict[str, np.ndarray] = {}
        self.own: dict[str, np.ndarray] = {}
        self.addresses: dict[str, int] = {}
        self.tables: list[np.ndarray] = []
        self.keyed_tables: dict[object, np.ndarray] = {}
        self.node = None
        self.comms: dict[tuple[tuple[int, ...], str], Any] = {}  # (span, part) -> MPI comm
        self.transports: dict[tuple[tuple[int, ...], str], MpiTransport] = {}
        self.clock: LibraryClock | None = None  # clock_library (benchmarks)
        self._mpi_module = mpi
        self.ctx: CollectiveContext | None = None
        # each collective step's (source, destination) dtypes, by id(step)
        self.dtypes: dict[int, tuple[Collective, np.dtype, np.dtype]] = {}
        # each blocking collective step's one library call (or None), by id(step), with the
        # arrays it was bound to
        self.calls: dict[int, tuple[Collective, np.ndarray, np.ndarray, Any]] = {}
        self.library = None
        self.kernels: dict[str, Any] = {}
        self.pending: list[Pending] = []
        self.issued = 0
        self.events: dict[str, int] = {}
        self.compiled = 0
        self.cached = 0

    # -- setup -------------------------------------------------------------------------------

    def prepare(self, plan: Plan) -> None:
        check_plan_size(plan, self.size)
        self.plan = plan
        self.grid_shape = plan.grid_shape
        if any(isinstance(s, Launch) for s in plan.steps):
            builds = HOST_CACHE.stats.builds
            try:
                self.library = compile_host(plan.cuda_source)
            except HostCompileError as e:
                errors = [ln for ln in e.output.splitlines() if "error" in ln][:8]
                if errors and e.note:  # a full disk, which the error lines may not say
                    errors.insert(0, e.note)
                detail = "\n".join(errors) if errors else str(e)
                raise CocoError(
                    f"compiling the kernels of @{plan.program} failed:\n{detail}"
                ) from None
            if HOST_CACHE.stats.builds > builds:
                self.compiled += 1
            else:
                self.cached += 1
        for step in plan.steps:
            if isinstance(step, Collective) and step.op != "send":
                self.group_comm(step.axes, step.part)

    def group_comm(self, span: tuple[int, ...], part: str = "all"):
        """The communicator of this rank's group over `span`, or of its part within or across
        nodes (collective on first use); its rank order is the group order."""
        key = (span, part)
        if key not in self.comms:
            if part == "all":
                groups = groups_of(self.grid_shape, span)
            else:
                assert self.plan is not None
                groups = V.part_groups(self.grid_shape, span, self.plan.nodes, part)
            if len(groups) == 1:
                self.comms[key] = self.comm
            else:
                color = next(i for i, g in enumerate(groups) if self.rank in g)
                key_in = next(g for g in groups if self.rank in g).index(self.rank)
                self.comms[key] = self.comm.Split(color, key_in)
        return self.comms[key]

    def allocate(self, buffers: Sequence[Buffer]) -> None:
        for buf in buffers:
            arr = np.zeros(buf.shape_at(self.rank), dtype=buffer_dtype(buf))
            self.own[buf.name] = self.arrays[buf.name] = arr
            self.addresses[buf.name] = arr.ctypes.data

    def allocate_symmetric(self, buffers: Sequence[Buffer]) -> dict[str, dict[int, int]]:
        if self.node is None:
            self.node = node_communicator(self.comm, self.MPI, self.plan.nodes if self.plan else ())
        node = self.node
        world_of = node.allgather(self.rank)
        peers: dict[str, dict[int, int]] = {}
        for buf in buffers:
            dtype = buffer_dtype(buf)
            nbytes = buf.count * dtype.itemsize
            mine, addresses = self.symmetric.allocate(node, nbytes)
            # Every rank allocates the largest piece; its own (uneven slices) is the start.
            arr = mine.view(dtype)[: buf.count_at(self.rank)].reshape(buf.shape_at(self.rank))
            mine.view(dtype)[...] = 0
            self.own[buf.name] = self.arrays[buf.name] = arr
            self.addresses[buf.name] = arr.ctypes.data if nbytes else 0
            peers[buf.name] = {world_of[q]: a for q, a in enumerate(addresses)}
        node.Barrier()  # every rank's flags are zero before any kernel can set them
        return peers

    def peer_table(self, addresses: Sequence[int]) -> int:
        return self.table(addresses, np.dtype(np.uint64))

    def table(self, values: Sequence[int], dtype: np.dtype, key: object = None) -> int:
        table = np.array(list(values), dtype=dtype)
        if key is None:
            self.tables.append(table)
        else:
            self.keyed_tables[key] = table  # kernels run synchronously: the old one is free
        return table.ctypes.data

    # -- data ----------------------------------------------------------------------------------

    def address(self, name: str) -> int:
        return self.addresses[name]

    def bind(self, buf: Buffer, value: Any) -> bool:
        if not isinstance(value, np.ndarray) or not value.ndim:
            # a scalar is copied in: a Python number comes as a new 0-d array each call, and
            # binding it would move the buffer, re-resolving every launch's arguments
            return False
        if (
            value.dtype != buffer_dtype(buf)
            or value.shape != tuple(buf.shape_at(self.rank))
            or not value.flags.c_contiguous
            or not value.flags.writeable
        ):
            return False
        for name, arr in self.arrays.items():
            if arr is not self.own.get(name) and np.may_share_memory(arr, value):
                return False  # the caller passed one array twice: copy, do not alias
        self.arrays[buf.name] = value
        self.addresses[buf.name] = value.ctypes.data
        return True

    def unbind(self, buf: Buffer) -> None:
        self.arrays[buf.name] = self.own[buf.name]
        self.addresses[buf.name] = self.own[buf.name].ctypes.data

    def write(self, buf: Buffer, value: Any) -> None:
        self.arrays[buf.name][...] = np.asarray(value)

    def order_inputs(self, values: Sequence[Any]) -> None:
        """Host memory: the caller's writes are done when it calls."""

    def holds(self, buf: Buffer, value: Any) -> bool:
        own = self.own[buf.name]
        return (
            isinstance(value, np.ndarray)
            and value.shape == own.shape
            and value.dtype == own.dtype
            and bool(own.size)
            and value.ctypes.data == own.ctypes.data
        )

    def read(self, buf: Buffer) -> np.ndarray:
        return self.arrays[buf.name].copy()

    def array(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def coerce_input(self, name: str, value: Any, buf: Buffer) -> np.ndarray:
        """The caller's value as a host array (not converted: dtypes must match exactly);
        tensors of other libraries (PyTorch) as views of their memory, so updates land in
        them. An argument the program updates must be writeable."""
        try:
            view = host_view(value)
        except CocoError as e:
            raise CocoError(f"input '{name}': {e}") from None
        if view is not None:
            if not view.flags.writeable and self._updated(name, buf):
                raise CocoError(
                    f"input '{name}' is updated in place (coco.update), but the array passed is "
                    "read-only"
                )
            return view
        if isinstance(value, (int, float, bool, np.generic)) and not buf.shape:
            return np.asarray(value, dtype=buffer_dtype(buf))
        if hasattr(value, "__array__") or hasattr(value, "__dlpack__"):
            try:
                return np.asarray(value)
            except Exception as e:
                raise CocoError(f"input '{name}': cannot read it as a host array: {e}") from None
        raise CocoError(
            f"input '{name}': expected a NumPy array of shape {list(buf.shape_at(self.rank))} "
            f"and dtype {buf.type.elt}, got a {type(value).__name__}"
        )

    @staticmethod
    def shape_of(value: np.ndarray) -> tuple[int, ...]:
        return value.shape

    @staticmethod
    def dtype_of(value: np.ndarray) -> np.dtype:
        return value.dtype

    def _updated(self, name: str, buf: Buffer) -> bool:
        plan = self.plan
        return plan is not None and plan.outputs.get(name) is buf

    def write_back(self, buf: Buffer, caller: Any, *, bound: bool) -> Any:
        """An updated argument: already in the caller's array when it was bound, else copied
        there (a non-contiguous array or tensor too, through a view of its memory); a caller
        value that cannot take it (a Python number) gets a new array."""
        if bound:
            return caller
        arr = self.arrays[buf.name]
        target = host_view(caller)
        if (
            target is not None
            and target.flags.writeable
            and target.shape == arr.shape
            and target.dtype == arr.dtype
        ):
            target[...] = arr
            return caller
        return arr.copy()

    def output(self, buf: Buffer) -> np.ndarray:
        return self.read(buf)

    # -- steps ---------------------------------------------------------------------------------

    def kernel(self, name: str, kinds: Sequence[str]):
        if name not in self.kernels:
            assert self.library is not None
            self.kernels[name] = self.library.kernel(name, *(CTYPES[k] for k in kinds))
        return self.kernels[name]

    def launch(self, step: Launch, args: Sequence[KernelArg]) -> None:
        if step.stream == COMM_STREAM:
            self.drain()
        else:
            self.poll()
        kernel = self.kernel(step.kernel, [a.kind for a in args])
        kernel(step.grid, step.block, *(a.value for a in args), shared_bytes=step.shared_bytes)

    def pack(self, step: Launch, args: Sequence[KernelArg]) -> PackedLaunch:
        """The launch's arguments as C values, once per placement (PlanRunner._launch_packed)."""
        kernel = self.kernel(step.kernel, [a.kind for a in args])
        return kernel.pack(
            step.grid, step.block, *(a.value for a in args), shared_bytes=step.shared_bytes
        )

    def launch_packed(self, step: Launch, packed: PackedLaunch) -> None:
        if step.stream == COMM_STREAM:
            self.drain()
        elif self.pending:
            self.poll()
        if self.clock is None:
            packed()
        else:
            self.clock.timed(packed)()

    def clock_library(self, clock: LibraryClock | None) -> None:
        """Time every kernel's foreign call and every MPI call of the steps from now on into
        `clock` (None: stop). Benchmarks only: the timing wraps cost a little."""
        self.drain()
        if clock is not None and self.clock is None:
            self._mpi_module = self.MPI
        self.clock = clock
        self.MPI = self._mpi_module if clock is None else _ClockedMPI(self._mpi_module, clock)
        self.transports.clear()  # remade over timed communicators (or plain ones again)
        self.ctx = None
        self.calls.clear()  # (bound to the old communicators)

    def matmul(self, step: Matmul) -> None:
        if step.stream == COMM_STREAM:
            self.drain()
        a, b, c = self.arrays[step.a.name], self.arrays[step.b.name], self.arrays[step.c.name]
        host_matmul(a, b, c, step, None if step.acc is None else self.arrays[step.acc.name])
        self.poll()

    def copy(self, step: Copy) -> None:
        if step.stream == COMM_STREAM:
            self.drain()
        dst = self.arrays[step.dst.name]
        np.copyto(dst, self.arrays[step.src.name].reshape(dst.shape))  # a coco.reshape
        self.poll()

    def collective(self, step: Collective) -> None:
        if step.stream != COMM_STREAM or not self.nonblocking:
            call = self._blocking_call(step)
            if call is not None:  # one library call, bound once: the microsecond regime
                if step.stream == COMM_STREAM:
                    self.drain()
                call()
                return
        ops = self.collective_ops(step)
        if step.stream == COMM_STREAM and self.nonblocking:
            for p in list(self.pending):
                if p.touches(step):
                    p.wait(self.MPI)
            pending = Pending(self.issued, step, ops)
            self.issued += 1
            pending.advance()
            self.pending.append(pending)
            self.pending = [p for p in self.pending if not p.done]
            return
        if step.stream == COMM_STREAM:
            self.drain()
        pending = Pending(-1, step, ops)
        pending.advance()
        pending.wait(self.MPI)

    def record_event(self, event: str, stream: int) -> None:
        # Compute-stream work is done when its record is reached; a record on the
        # communication stream covers the collectives issued before it.
        self.events[event] = self.issued if stream == COMM_STREAM else -1

    def wait_event(self, event: str, stream: int) -> None:
        marker = self.events.get(event, -1)
        if stream == COMM_STREAM or marker < 0:
            return
        for p in self.pending:
            if p.seq < marker:
                p.wait(self.MPI)
        self.pending = [p for p in self.pending if not p.done]

    def poll(self) -> None:
        for p in self.pending:
            p.test(self.MPI)
        self.pending = [p for p in self.pending if not p.done]

    def drain(self) -> None:
        for p in self.pending:
            p.wait(self.MPI)
        self.pending = []

    def synchronize(self) -> None:
        self.drain()

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        self.drain()
        self.arrays.clear()
        self.own.clear()
        self.tables.clear()
        self.keyed_tables.clear()
        if self.node is not None:
            self.node.Barrier()  # peers are done reading this rank's segments
        self.symmetric.close()
        for c in self.comms.values():
            if c is not self.comm:
                c.Free()
        self.comms.clear()
        self.transports.clear()
        self.calls.clear()
        self.ctx = None
        if self.node is not None:
            self.node.Free()
            self.node = None

    # -- collectives ---------------------------------------------------------------------------

    def transport(self, span: tuple[int, ...], part: str = "all") -> MpiTransport:
        key = (span, part)
        t = self.transports.get(key)
        if t is None:
            comm = self.group_comm(span, part)
            if self.clock is not None:
                comm = _ClockedComm(comm, self.clock)
            t = self.transports[key] = MpiTransport(comm, self.MPI)
        return t

    def _world(self) -> MpiTransport:
        t = self.transports.get(((), "world"))
        if t is None:
            comm = self.comm if self.clock is None else _ClockedComm(self.comm, self.clock)
            t = self.transports[((), "world")] = MpiTransport(comm, self.MPI)
        return t

    def _context(self) -> CollectiveContext:
        if self.ctx is None:  # made once: every collective step of every call uses it
            self.ctx = CollectiveContext(
                xp=np,
                rank=self.rank,
                grid_shape=self.grid_shape,
                exact=self.exact,
                transport=self.transport,
                world=self._world,
                empty=lambda shape, dtype: np.empty(shape, dtype),
                nodes=self.plan.nodes if self.plan else (),
                combiner=HostCombine(),
            )
        return self.ctx

    def _dtypes(self, step: Collective) -> tuple[Collective, np.dtype, np.dtype]:
        known = self.dtypes.get(id(step))
        if known is None or known[0] is not step:  # (the step itself: an id outlives it)
            known = self.dtypes[id(step)] = (step, buffer_dtype(step.src), buffer_dtype(step.dst))
        return known

    def collective_ops(
        self, step: Collective, src: np.ndarray | None = None, dst: np.ndarray | None = None
    ) -> CollectiveOps:
        """`step` on its buffers, or on the arrays given in their place."""
        known = self._dtypes(step)
        return collective_ops(
            self._context(),
            step,
            self.arrays[step.src.name] if src is None else src,
            self.arrays[step.dst.name] if dst is None else dst,
            known[1],
            known[2],
        )

    def _blocking_call(self, step: Collective) -> Any:
        """`step` as one bound library call (collectives.py `blocking_call`), made again only
        when its buffers moved (bound to other arrays)."""
        src, dst = self.arrays[step.src.name], self.arrays[step.dst.name]
        hit = self.calls.get(id(step))
        if hit is None or hit[0] is not step or hit[1] is not src or hit[2] is not dst:
            known = self._dtypes(step)
            call = blocking_call(self._context(), step, src, dst, known[1], known[2])
            hit = self.calls[id(step)] = (step, src, dst, call)
        return hit[3]

    def gather_into(self, step: Collective, target: np.ndarray) -> None:
        """Run the all_gather `step` now, after the plan, from its source buffer into
        `target` (the caller's array, standing for its destination; coconet/convention.py)."""
        self.drain()
        src = self.arrays[step.src.name]
        if src is not self.own[step.src.name]:
            # bound to the caller's array, i.e. a view into `target`: MPI refuses aliased
            # send and receive buffers, so the piece travels from a copy
            src = src.copy()
        dst = target if target.flags.c_contiguous else np.empty(target.shape, target.dtype)
        pending = Pending(-1, step, self.collective_ops(step, src, dst))
        pending.advance()
        pending.wait(self.MPI)
        if dst is not target:
            target[...] = dst
