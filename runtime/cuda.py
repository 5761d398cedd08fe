"""The `cuda` backend: one MPI process per rank, a GPU each or several ranks sharing one; CuPy
for memory and kernels, NCCL or host-staged MPI for library collectives, CUDA IPC for
symmetric buffers, two streams with events for overlap.

Everything that needs a GPU sits behind `Device` (a small protocol, implemented for real by
`CupyDevice`); `CudaBackend` holds the logic -- buffers and their dtypes, typed kernel
arguments, peer tables, stream and event ordering, the choice of transport -- and is
unit-tested with a strict double that models CuPy 14's types and CUDA's stream semantics
(test/unit/test_runtime_cuda.py).

* Kernels: the plan's CUDA source compiled by NVRTC (toolchain/nvrtc.py: the same options as CI,
  the device headers in memory) for this GPU's architecture, the cubin cached on disk by content
  hash (`CUDA_CACHE`, like the host .so), loaded as a CuPy RawModule. Scalars are passed with
  the exact C type of each parameter (NumPy scalars), pointers as u64. Fused collective kernels
  (their blocks wait on peers' blocks) are launched cooperatively, with a grid clamped to what
  the occupancy API says is co-resident, agreed by every rank so block b meets block b.
* bf16 is stored as its uint16 bit pattern on the device; CuPy 14 arrays and DLPack tensors of
  `ml_dtypes.bfloat16` are viewed as such when they come in. NCCL reduces them as
  ncclBfloat16; exact combines round once from f64 (runtime/collectives.py). fp8 is stored as
  its uint8 bits, moved as bytes and reduced by the exact combine (NCCL's fp8 reductions
  round at every hop of a ring).
* Collectives: runtime/collectives.py over a transport (runtime/transport.py): NCCL when every
  rank has its own GPU (a communicator per set of grid axes, its unique id -- `bytes` since
  CuPy 14 -- from the group's first rank over MPI), MPI through host copies when ranks share a
  GPU (NCCL refuses two ranks on one device). `COCONET_CUDA_TRANSPORT=nccl|mpi` overrides.
* Symmetric buffers: cudaMalloc'd outside CuPy's pool (an IPC handle names a whole
  allocation), zeroed on the compute stream, handles exchanged with an MPI allgather on the
  node, peers' opened; peer access between distinct GPUs is checked first.
* Streams: every copy, memset, upload and launch runs on the compute (0) or communication (1)
  stream, never on CuPy's current (legacy) stream; CUDA events carry the plan's
  Record/WaitEvent; arrays adopted through DLPack are ordered against the compute stream.
* Graphs: a plan whose steps are all kernel launches, copies and events (a fused schedule on
  one node) is captured once as a CUDA graph on the compute stream and replayed at every later
  step (runtime/executor.py PlanRunner.run); its epochs advance on the device, so a replay's
  frozen arguments are right. `COCONET_CUDA_GRAPHS=0` launches every step instead.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol, cast

import numpy as np

from coconet.core import values as V
from coconet.core.env import env_count
from coconet.core.program import CocoError
from coconet.lowering.plan import (
    COMM_STREAM,
    COMPUTE_STREAM,
    MAX_COLLECTIVE_BLOCKS,
    ArgTable,
    Buffer,
    Collective,
    Copy,
    Launch,
    Matmul,
    PeerTable,
    Plan,
    shrink_grids,
)
from coconet.lowering.signature import KernelParam, range_positions
from coconet.runtime.collectives import CollectiveContext, collective_ops, narrow, widen
from coconet.runtime.executor import (
    KernelArg,
    accumulate_chunk,
    buffer_dtype,
    check_plan_size,
    groups_of,
    matmul_segments,
    reduction_runs,
)
from coconet.runtime.symmetric import node_communicator
from coconet.runtime.torch_comm import mpi_module_for
from coconet.runtime.transport import (
    NCCL_DTYPES,
    HostStagedTransport,
    MpiTransport,
    NcclTransport,
    Transport,
    nccl_dtype,
    nccl_op,
)
from coconet.toolchain.kernel_cache import KernelCache, content_key, pinned

__all__ = [
    "CUDA_CACHE",
    "NCCL_DTYPES",
    "CudaBackend",
    "CupyDevice",
    "Device",
    "compile_cubin",
    "device_dtype",
    "kernel_scalars",
    "nccl_dtype",
    "nccl_op",
]

CUDA_CACHE = KernelCache("cuda")
_RECIPE_VERSION = "cuda-v1"

# How many issued steps the backend remembers for debugging and tests (a long-running job
# must not grow without bound).
TRACE_LENGTH = 4096

# DLPack device types (dlpack.h): where a tensor's memory lives.
DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED = 1, 2, 3, 13

TRANSPORT_ENV = "COCONET_CUDA_TRANSPORT"
GRAPHS_ENV = "COCONET_CUDA_GRAPHS"

SCALAR_TYPES = {
    "ptr": np.uint64,
    "bool": np.bool_,
    "i32": np.int32,
    "u32": np.uint32,
    "i64": np.int64,
    "u64": np.uint64,
    "f32": np.float32,
    "f64": np.float64,
}


def device_dtype(host: np.dtype) -> np.dtype:
    """The dtype a buffer has on the device (bf16, fp8 -> their bit patterns)."""
    return V.bits_dtype(host) or np.dtype(host)


def kernel_scalars(args: Sequence[KernelArg]) -> list[Any]:
    """Kernel arguments as NumPy scalars of each parameter's exact C type (what a CuPy
    RawKernel passes by value); pointers as u64 addresses."""
    out = []
    for a in args:
        t = SCALAR_TYPES[a.kind]
        if a.kind in ("ptr", "u64", "u32"):
            out.append(t(int(a.value) & ((1 << (64 if t is np.uint64 else 32)) - 1)))
        else:
            out.append(t(a.value))
    return out


def dlpack_placement(value: Any, device_id: int) -> str:
    """Where a caller's value lives: "device" (CUDA memory of this rank's GPU, taken without a
    copy), or "host" (copied in). Refuses, with the reason, what cannot be either."""
    if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack_device__"):
        return "host"
    kind, index = (int(x) for x in value.__dlpack_device__())
    if kind in (DLPACK_CPU, DLPACK_CUDA_HOST):
        if getattr(value, "requires_grad", False):
            raise CocoError(
                "the tensor requires grad: pass tensor.detach() so it can be read and updated "
                "in place"
            )
        return "host"
    if kind not in (DLPACK_CUDA, DLPACK_CUDA_MANAGED):
        raise CocoError(f"the tensor lives on DLPack device type {kind}, which is not CUDA memory")
    if kind == DLPACK_CUDA and index != device_id:
        raise CocoError(f"the tensor is on GPU {index}, but this rank runs on GPU {device_id}")
    if getattr(value, "requires_grad", False):
        raise CocoError(
            "the tensor requires grad: pass tensor.detach() so it can be read and updated in place"
        )
    return "device"


def as_bit_patterns(array: Any, xp: Any) -> Any:
    """A device array as the backend stores it: bf16 and fp8 (ml_dtypes' types, how CuPy 14
    and DLPack hand them over) viewed as their bit patterns."""
    bits = V.bits_dtype(np.dtype(array.dtype))
    return array if bits is None else array.view(bits)


def needs_coresidency(step: Launch) -> bool:
    """A kernel that reaches peers waits on their blocks: all its blocks must be resident."""
    return any(isinstance(a, PeerTable) for a in step.args) or serves_tensor_table(step)


# Elements a block of a grown fused collective grid covers at least: a block also pays its
# flag handshakes with its peers, which tiny ranges would not amortise.
GROWN_BLOCK_ELEMENTS = 4096


# The most blocks a fused collective launch takes per rank (default: what the GPU holds at
# once, shared by the ranks on it; half of that for one overlapped with matmuls).
COLLECTIVE_BLOCKS_ENV = "COCONET_CUDA_COLLECTIVE_BLOCKS"


def overlaps_matmuls(plan: Plan) -> bool:
    """Whether a fused collective runs on the communication stream of a plan that computes
    matmuls (an overlap region: the GEMM of one chunk beside the collective of another)."""
    return any(isinstance(s, Matmul) for s in plan.steps) and any(
        isinstance(s, Launch) and s.stream == COMM_STREAM and needs_coresidency(s)
        for s in plan.steps
    )


def grown_grid(step: Launch, params: Sequence[KernelParam]) -> int:
    """The grid a fused collective launch asks the GPU for: the plan's grid (at most
    PLAN_COLLECTIVE_BLOCKS) grown to a block per GROWN_BLOCK_ELEMENTS of its range, up to
    MAX_COLLECTIVE_BLOCKS (what its flag and partial buffers hold); a table launch asks for the
    sum of its tensors' grown grids (`tensor_grids`). _clamp_grids then keeps what the GPU
    holds at once. A range that differs by rank keeps the plan's grid. Growing is sound
    because every fused kernel splits its range by the grid it runs with (coco_chunk; a row
    kernel by whole rows; a kernel finishing reductions has a partial per block and takes the
    last block's ticket out of the grid) and lays its flags out by it, the same grid on every
    rank. The range is read from the signature's begin/end parameters, not from the launch's
    `range_positions`, which only launches that may be cut into chunks carry."""
    if serves_tensor_table(step):
        return sum(tensor_grids(step, params))
    bounds = _range_args(step, params)
    return step.grid if bounds is None else _grown(step.grid, *bounds)


def _range_args(step: Launch, params: Sequence[KernelParam]) -> tuple[object, object] | None:
    """The launch's arguments for its kernel's begin and end parameters, if it has them."""
    try:
        begin, end = range_positions(params)
    except ValueError:
        return None
    return step.args[begin], step.args[end]


def _grown(grid: int, begin: object, end: object) -> int:
    if not (isinstance(begin, int) and isinstance(end, int)):
        return grid
    wanted = -(-(end - begin) // GROWN_BLOCK_ELEMENTS)
    return max(grid, min(wanted, MAX_COLLECTIVE_BLOCKS))


def tensor_grids(step: Launch, params: Sequence[KernelParam]) -> list[int]:
    """A table launch's grid per tensor: the plan's block table's, each grown as a single
    tensor's launch grows (each tensor has flags of its own, sized for MAX_COLLECTIVE_BLOCKS),
    where the tensor's range is the same on every rank."""
    blocks = step.args[-2]
    assert isinstance(blocks, ArgTable)
    starts = [b for b in blocks.items if isinstance(b, int)]
    assert len(starts) == len(blocks.items)  # each tensor's first block
    grids = [b - a for a, b in itertools.pairwise(starts)]
    bounds = _range_args(step, params)
    if bounds is None or not all(isinstance(t, ArgTable) for t in bounds):
        return grids
    begins, ends = cast(tuple[ArgTable, ArgTable], bounds)
    return [_grown(g, b, e) for g, b, e in zip(grids, begins.items, ends.items, strict=True)]


def serves_tensor_table(step: Launch) -> bool:
    """A fused collective's table form (one launch over many tensors: lower_to_plan.py
    `collective_table_launches`): its blocks are divided among the tensors by the plan."""
    return any(
        isinstance(a, ArgTable) and any(isinstance(x, PeerTable) for x in a.items)
        for a in step.args
    )


# ---------------------------------------------------------------------------------------------
# NVRTC output, cached like the host libraries
# ---------------------------------------------------------------------------------------------


def cubin_cache_key(source: str, arch: str) -> str:
    from coconet.toolchain import nvrtc

    headers = nvrtc.device_headers()
    parts = [p for name in sorted(headers) for p in (name, headers[name])]
    major, minor = nvrtc.nvrtc_version()
    return content_key(
        _RECIPE_VERSION,
        source,
        *parts,
        arch,
        "\0".join(nvrtc._EXACT_MATH_OPTIONS),
        f"nvrtc {major}.{minor}",
    )


def compile_cubin(source: str, arch: str):
    """The cubin of `source` for `arch` (e.g. "sm_90"), from the cache or built by NVRTC.
    Returns the cache artifact: its `value` a path to load the cubin from (the very file the
    cache checked, for the life of the process), `path` its place in the cache, `cache_hit`
    whether it was there."""
    from coconet.toolchain.nvrtc import NvrtcError, compile_cuda

    key = cubin_cache_key(source, arch)

    def build(out) -> None:
        out.write_bytes(compile_cuda(source, arch, warnings_as_errors=False).binary)

    def load(path) -> str:
        # CuPy reads the module on first use: a name that keeps naming the checked file
        if not path.stat().st_size:
            raise ValueError("empty cubin")
        return pinned(path)

    try:
        return CUDA_CACHE.get_or_build(key, ".cubin", build, load)
    except NvrtcError as e:
        raise CocoError(f"NVRTC could not compile the kernels for {arch}: {e}") from None


def call_nccl(comm: Any, call: str, address: Any, stream: int, **kw: Any) -> None:
    """`Device.nccl` on CuPy's NcclCommunicator: arrays become addresses, the stream its
    handle, in the order of the communicator's typed methods."""
    p = address
    if call == "all_reduce":
        comm.allReduce(p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], kw["op"], stream)
    elif call == "reduce_scatter":
        comm.reduceScatter(p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], kw["op"], stream)
    elif call == "all_gather":
        comm.allGather(p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], stream)
    elif call == "broadcast":
        comm.broadcast(p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], kw["root"], stream)
    elif call == "reduce":
        comm.reduce(
            p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], kw["op"], kw["root"], stream
        )
    elif call == "send":
        comm.send(p(kw["src"]), kw["count"], kw["dtype"], kw["peer"], stream)
    elif call == "recv":
        comm.recv(p(kw["dst"]), kw["count"], kw["dtype"], kw["peer"], stream)
    else:
        raise CocoError(f"unknown NCCL call {call}")


# ---------------------------------------------------------------------------------------------
# The device interface
# ---------------------------------------------------------------------------------------------


class Device(Protocol):
    """The GPU operations the cuda backend uses. `xp` is the array module of its arrays;
    every operation that touches device memory names the stream it runs on, and array work
    the backend does through `xp` runs inside `on(stream)`."""

    xp: Any

    def arch(self) -> str: ...

    def device_id(self) -> int: ...

    def bus_id(self) -> str:
        """A name of the physical GPU that two processes agree on (its PCI bus id)."""
        ...

    def can_access_peer(self, other: int) -> bool: ...

    def is_device_array(self, value: Any) -> bool:
        """Whether `value` is an array of this device's kind (not host memory)."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype, stream: Any) -> Any: ...

    def address(self, array: Any) -> int: ...

    def upload(self, host: np.ndarray, stream: Any) -> Any:
        """A new device array holding `host` (bf16 as bit patterns), copied on `stream`."""
        ...

    def copy_from_host(self, dst: Any, host: np.ndarray, stream: Any) -> None: ...

    def download(self, array: Any, stream: Any) -> np.ndarray:
        """`array` on the host, copied on `stream` once its work is done (blocks)."""
        ...

    def adopt(self, value: Any, stream: Any) -> Any | None:
        """The caller's value as a device array without a copy (CuPy array, __dlpack__),
        ordered before `stream`'s later work; None when it is host memory. Raises CocoError
        for values it cannot take."""
        ...

    def order_after(self, value: Any, stream: Any) -> bool:
        """`stream`'s later work after the caller's pending work on a device value (its
        producer's current stream), as adopting it orders it; False for host memory, which
        has nothing to order."""
        ...

    def alloc_ipc(self, shape: tuple[int, ...], dtype: np.dtype, stream: Any) -> tuple[Any, bytes]:
        """A zeroed array in its own allocation, and the IPC handle of that allocation."""
        ...

    def open_ipc(self, handle: bytes) -> int: ...

    def load_module(self, cubin_path: str, source: str) -> Any:
        """The compiled kernels (`source` is what the cubin was compiled from)."""
        ...

    def max_coresident_blocks(self, module: Any, kernel: str, block: int, shared: int) -> int:
        """How many blocks of `kernel` the whole GPU holds at once (occupancy x SMs)."""
        ...

    def launch(
        self,
        module: Any,
        kernel: str,
        grid: int,
        block: int,
        args: list[Any],
        shared_bytes: int,
        stream: Any,
        *,
        cooperative: bool = False,
    ) -> None: ...

    def stream(self, index: int) -> Any: ...

    def on(self, stream: Any) -> contextlib.AbstractContextManager: ...

    def record(self, event: str, stream: Any) -> None: ...

    def wait(self, event: str, stream: Any) -> None: ...

    def synchronize(self) -> None:
        """Wait for all work on the device, whatever stream it was issued on (set-up and
        teardown only: ranks sharing a GPU would wait for each other's kernels)."""

    def sync_streams(self) -> None:
        """Wait for the work issued on this rank's streams (the compute and communication
        streams every step runs on), not for other work on the device."""

    def copy(self, dst: Any, src: Any, stream: Any) -> None:
        """`dst` becomes `src`'s values (as many elements, `src` reshaped to `dst`'s shape): a
        device-to-device copy on `stream`."""

    def begin_capture(self, stream: Any) -> None:
        """Record the work issued to `stream` (and to the streams that wait on its events)
        into a graph from now on, instead of running it."""

    def end_capture(self, stream: Any) -> Any:
        """The graph recorded since `begin_capture(stream)`."""

    def replay(self, graph: Any, stream: Any) -> None:
        """Run `graph` on `stream`."""

    def nccl_unique_id(self) -> bytes: ...

    def nccl_comm(self, unique_id: bytes, size: int, rank: int) -> Any: ...

    def nccl(self, call: str, comm: Any, stream: Any, **kw: Any) -> None:
        """One NCCL call: all_reduce(src, dst, count, dtype, op), reduce_scatter(src, dst,
        count, dtype, op), all_gather(src, dst, count, dtype), broadcast(src, dst, count, dtype,
        root), reduce(src, dst, count, dtype, op, root), send(src, count, dtype, peer),
        recv(dst, count, dtype, peer); src/dst are device arrays, counts in elements (of dst
        for reduce_scatter, of src for all_gather)."""

    def group(self) -> contextlib.AbstractContextManager:
        """ncclGroupStart/End around point-to-point calls."""
        ...

    def close_peers(self) -> None:
        """Close the peers' IPC mappings this process opened."""

    def close(self) -> None:
        """Free this process's own allocations (peers must have closed theirs first)."""


class CupyDevice:
    """`Device` on a real GPU through CuPy 14 (thin by design; everything testable lives in
    CudaBackend)."""

    def __init__(self, device_id: int = 0):
        import cupy
        from cupy.cuda import nccl

        self.cp = cupy
        self.xp = cupy
        # cupy.cuda.nccl is a compiled module without type information
        self.nccl_mod: Any = nccl
        self.device = cupy.cuda.Device(device_id)
        self.device.use()
        self.streams = {
            COMPUTE_STREAM: cupy.cuda.Stream(non_blocking=True),
            COMM_STREAM: cupy.cuda.Stream(non_blocking=True),
        }
        self.events: dict[str, Any] = {}
        self.functions: dict[tuple[int, str, bool], Any] = {}  # (module, kernel, cooperative)
        self.raw: list[int] = []
        self.opened: list[int] = []

    @classmethod
    def for_rank(cls, comm: Any) -> CupyDevice:
        """The GPU of this rank: its index on its node, modulo the node's GPUs (ranks share
        GPUs when they outnumber them)."""
        import cupy

        node = comm.Split_type(mpi_module_for(comm).COMM_TYPE_SHARED, key=comm.Get_rank())
        local = node.Get_rank()
        node.Free()
        count = cupy.cuda.runtime.getDeviceCount()
        return cls(local % count)

    def arch(self) -> str:
        return f"sm_{self.device.compute_capability}"

    def device_id(self) -> int:
        return int(self.device.id)

    def bus_id(self) -> str:
        return str(self.device.pci_bus_id)

    def can_access_peer(self, other: int) -> bool:
        return bool(self.cp.cuda.runtime.deviceCanAccessPeer(self.device_id(), other))

    def is_device_array(self, value) -> bool:
        return isinstance(value, self.cp.ndarray)

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype, stream):
        with stream:
            return self.cp.zeros(shape, dtype=dtype)

    def address(self, array) -> int:
        return int(array.data.ptr)

    @staticmethod
    def _bits(host: np.ndarray) -> np.ndarray:
        host = np.ascontiguousarray(host)
        bits = V.bits_dtype(host.dtype)
        return host if bits is None else host.view(bits)

    def upload(self, host, stream):
        with stream:
            return self.cp.asarray(self._bits(host))

    def copy_from_host(self, dst, host, stream) -> None:
        with stream:
            dst.set(self._bits(host).reshape(dst.shape), stream=stream)

    def download(self, array, stream) -> np.ndarray:
        # asnumpy on a stream copies after that stream's work and blocks until the copy is done
        return self.cp.asnumpy(array, stream=stream, blocking=True)

    def adopt(self, value, stream):
        cp = self.cp
        if isinstance(value, cp.ndarray):
            if value.device.id != self.device_id():
                raise CocoError(
                    f"the CuPy array is on GPU {value.device.id}, but this rank runs on GPU "
                    f"{self.device_id()}"
                )
            self.order_after(value, stream)  # the caller's work on its current stream first
            return as_bit_patterns(value, cp)
        if dlpack_placement(value, self.device_id()) != "device":
            return None
        try:
            # Under `stream`, from_dlpack asks the producer to order its pending work
            # (PyTorch's current stream, e.g. the backward pass) before this stream's.
            with stream:
                array = cp.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError, ValueError) as e:
            raise CocoError(f"cannot use the tensor as device memory: {e}") from None
        return as_bit_patterns(array, cp)

    def order_after(self, value, stream):
        cp = self.cp
        if isinstance(value, cp.ndarray):
            stream.wait_event(cp.cuda.get_current_stream().record())
            return True
        if dlpack_placement(value, self.device_id()) == "device":
            # The DLPack exchange's own ordering: the producer makes `stream` wait for its
            # pending work (PyTorch's current stream); the capsule itself is not used.
            value.__dlpack__(stream=stream.ptr)
            return True
        return False

    def alloc_ipc(self, shape, dtype, stream):
        rt = self.cp.cuda.runtime
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 256)
        ptr = rt.malloc(nbytes)
        self.raw.append(ptr)
        rt.memsetAsync(ptr, 0, nbytes, stream.ptr)
        mem = self.cp.cuda.UnownedMemory(ptr, nbytes, self)
        array = self.cp.ndarray(shape, dtype=dtype, memptr=self.cp.cuda.MemoryPointer(mem, 0))
        return array, bytes(rt.ipcGetMemHandle(ptr))

    def open_ipc(self, handle: bytes) -> int:
        rt = self.cp.cuda.runtime
        ptr = rt.ipcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess)
        self.opened.append(ptr)
        return int(ptr)

    def load_module(self, cubin_path: str, source: str):
        # Two handles on one cubin: cooperative launches need a module that asks for them.
        return (
            self.cp.RawModule(path=cubin_path),
            self.cp.RawModule(path=cubin_path, enable_cooperative_groups=True),
        )

    def _function(self, module, kernel: str, cooperative: bool):
        key = (id(module), kernel, cooperative)
        fn = self.functions.get(key)
        if fn is None:
            fn = self.functions[key] = module[1 if cooperative else 0].get_function(kernel)
        return fn

    def max_coresident_blocks(self, module, kernel, block, shared) -> int:
        fn = self._function(module, kernel, True)
        per_sm = self.cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            fn.kernel.ptr, block, shared
        )
        return int(per_sm) * int(self.device.attributes["MultiProcessorCount"])

    def launch(self, module, kernel, grid, block, args, shared_bytes, stream, *, cooperative=False):
        fn = self._function(module, kernel, cooperative)
        with stream:
            fn((grid,), (block,), tuple(args), shared_mem=shared_bytes)

    def stream(self, index: int):
        return self.streams[index]

    def on(self, stream):
        return stream

    def record(self, event: str, stream) -> None:
        ev = self.events.get(event)
        if ev is None:
            ev = self.events[event] = self.cp.cuda.Event(disable_timing=True)
        ev.record(stream)

    def wait(self, event: str, stream) -> None:
        stream.wait_event(self.events[event])

    def synchronize(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()

    def sync_streams(self) -> None:
        for stream in self.streams.values():
            stream.synchronize()

    def copy(self, dst, src, stream) -> None:
        with stream:
            self.cp.copyto(dst, src.reshape(dst.shape))

    def begin_capture(self, stream) -> None:
        # CuPy's default mode is relaxed: another thread's allocation (PyTorch's backward,
        # while coconet.torch's worker thread captures a bucket) does not break the capture
        stream.begin_capture()

    def end_capture(self, stream):
        return stream.end_capture()

    def replay(self, graph, stream) -> None:
        graph.launch(stream)

    def nccl_unique_id(self) -> bytes:
        return self.nccl_mod.get_unique_id()

    def nccl_comm(self, unique_id: bytes, size: int, rank: int):
        return self.nccl_mod.NcclCommunicator(size, unique_id, rank)

    def nccl(self, call: str, comm, stream, **kw) -> None:
        call_nccl(comm, call, self.address, stream.ptr, **kw)

    @contextlib.contextmanager
    def group(self):
        self.nccl_mod.groupStart()
        try:
            yield
        finally:
            self.nccl_mod.groupEnd()

    def close_peers(self) -> None:
        self.synchronize()
        rt = self.cp.cuda.runtime
        for ptr in self.opened:
            rt.ipcCloseMemHandle(ptr)
        self.opened.clear()

    def close(self) -> None:
        self.synchronize()
        rt = self.cp.cuda.runtime
        for ptr in self.raw:
            rt.free(ptr)
        self.raw.clear()


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


def choose_transport(shared_gpu: bool) -> str:
    """'nccl' or 'mpi' (host-staged): NCCL unless ranks share a GPU, or the user says."""
    asked = os.environ.get(TRANSPORT_ENV, "auto").strip().lower() or "auto"
    if asked not in ("auto", "nccl", "mpi"):
        raise CocoError(f"{TRANSPORT_ENV}={asked!r}: use auto, nccl or mpi")
    if asked == "nccl" and shared_gpu:
        raise CocoError(
            f"{TRANSPORT_ENV}=nccl, but ranks share a GPU, which NCCL refuses: run one rank per "
            f"GPU, or leave {TRANSPORT_ENV} unset (library collectives then go through MPI)"
        )
    if asked == "auto":
        return "mpi" if shared_gpu else "nccl"
    return asked


def graphs_wanted() -> bool:
    """Whether steps are replayed from CUDA graphs where the plan allows (COCONET_CUDA_GRAPHS:
    1, the default, or 0)."""
    asked = os.environ.get(GRAPHS_ENV, "1").strip().lower() or "1"
    if asked not in ("0", "1"):
        raise CocoError(f"{GRAPHS_ENV}={asked!r}: use 1 (replay steps from CUDA graphs) or 0")
    return asked == "1"


class CudaBackend:
    """One rank of the cuda backend (see the module docstring)."""

    name = "cuda"
    # the plan's events that fork the side streams into a capture and join them back
    _FORK, _JOIN = "coco_capture_fork", "coco_capture_join"

    def __init__(
        self, device: Device, comm: Any, *, exact_collectives: bool = False, mpi: Any = None
    ):
        self.device = device
        self.mpi = mpi  # the mpi4py.MPI module (None: import it); tests pass a double
        self.xp = device.xp
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.exact = exact_collectives
        self.plan: Plan | None = None
        self.grid_shape: tuple[int, ...] = ()
        self.arrays: dict[str, Any] = {}
        self.own: dict[str, Any] = {}
        self.host_dtypes: dict[str, np.dtype] = {}
        self.addresses: dict[str, int] = {}
        self.tables: list[Any] = []
        self.module = None
        self.transport_kind = "nccl"
        self.shared_gpu = False
        self.ranks_on_my_gpu = 1
        # (span, part) -> (MPI comm, NCCL comm)
        self.comms: dict[tuple[tuple[int, ...], str], tuple[Any, Any]] = {}
        self.world_nccl = None
        self.launch_grids: dict[int, int] = {}  # id(Launch) -> the grid it is launched with
        # id(Launch) -> the turns of a table launch that does not fit at once: (first
        # tensor, tensors, device block table, grid)
        self.table_blocks: dict[int, list[tuple[int, int, int, int]]] = {}
        self.compiled = 0
        self.cached = 0
        # (what, stream, detail) of the last steps issued: stream order for tests and debugging.
        self.trace: deque[tuple[str, int, str]] = deque(maxlen=TRACE_LENGTH)
        # steps replayed from CUDA graphs where the plan allows (PlanRunner.run)
        self.graphs = graphs_wanted()

    # -- setup -------------------------------------------------------------------------------

    def prepare(self, plan: Plan) -> None:
        check_plan_size(plan, self.size)
        self.plan = plan
        self.grid_shape = plan.grid_shape
        self._find_shared_gpus()
        launches = [s for s in plan.steps if isinstance(s, Launch)]
        if launches:
            # the plan's text with its compile-time constants (the peers a vector loads)
            source = plan.device_source()
            artifact = compile_cubin(source, self.device.arch())
            if artifact.cache_hit:
                self.cached += 1
            else:
                self.compiled += 1
            self.module = self.device.load_module(artifact.value, source)
            self._clamp_grids(launches)
        for step in plan.steps:
            if isinstance(step, Collective) and step.op != "send":
                self.group_comm(step.axes, step.part)
        if self.transport_kind == "nccl" and any(
            isinstance(s, Collective) and s.op == "send" for s in plan.steps
        ):
            self._world()

    def _mpi(self) -> Any:
        return self.mpi if self.mpi is not None else mpi_module_for(self.comm)

    def _find_shared_gpus(self) -> None:
        """How many ranks run on this rank's GPU, whether any GPU of the job is shared, and
        so the transport (collective)."""
        node = self.comm.Split_type(self._mpi().COMM_TYPE_SHARED, key=self.rank)
        buses = node.allgather(self.device.bus_id())
        node.Free()
        self.ranks_on_my_gpu = buses.count(self.device.bus_id())
        self.shared_gpu = any(self.comm.allgather(self.ranks_on_my_gpu > 1))
        self.transport_kind = choose_transport(self.shared_gpu)

    def _clamp_grids(self, launches: Sequence[Launch]) -> None:
        """Fused collective kernels are launched cooperatively with at most as many blocks as
        the GPU holds at once (shared among the ranks on it); every rank takes the smallest
        grid any rank can hold, so block b of each rank meets block b of its peers."""
        assert self.plan is not None
        signatures = self.plan.signatures
        fused = [s for s in launches if needs_coresidency(s)]
        asked = {id(s): grown_grid(s, signatures[s.kernel]) for s in fused}
        cap = env_count(COLLECTIVE_BLOCKS_ENV)
        # A collective overlapped with matmuls (on the communication stream beside them)
        # takes half of what it could hold, leaving SMs to the GEMM it hides behind.
        share = 2 if overlaps_matmuls(self.plan) else 1
        wanted: dict[str, int] = {}
        for step in fused:
            fits = self.device.max_coresident_blocks(
                self.module, step.kernel, step.block, step.shared_bytes
            )
            mine = fits // self.ranks_on_my_gpu
            if step.stream == COMM_STREAM:
                mine = max(1, mine // share) if mine else 0
            if cap is not None:
                mine = min(mine, cap)
            wanted[step.kernel] = min(wanted.get(step.kernel, asked[id(step)]), mine)
        limits = {
            name: min(w[name] for w in self.comm.allgather(wanted)) for name in sorted(wanted)
        }
        for step in fused:
            grid = min(asked[id(step)], limits[step.kernel])
            if grid < 1:
                raise CocoError(
                    f"{step.kernel} needs all its blocks resident at once, but not one block of "
                    f"{step.block} threads fits per rank on this GPU "
                    f"({self.ranks_on_my_gpu} rank(s) share it)"
                )
            if not serves_tensor_table(step):
                self.launch_grids[id(step)] = grid
                continue
            per_tensor = tensor_grids(step, signatures[step.kernel])
            if grid == step.grid == sum(per_tensor):
                continue  # the plan's own block table
            # The tensors' grids, grown or shrunk in proportion to fit `grid` (every tensor
            # keeps at least one block), in a block table of this backend's instead of the
            # plan's. Fewer blocks than tensors: the tensors go in turns of `grid` tensors, one
            # launch each (their tables read from the turn's first tensor on).
            turns = []
            for first in range(0, len(per_tensor), grid):
                part = per_tensor[first : first + grid]
                starts = [0, *itertools.accumulate(shrink_grids(part, grid))]
                table = self.table(starts, np.dtype(np.int64))
                turns.append((first, len(part), table, starts[-1]))
            self.table_blocks[id(step)] = turns

    def _nccl_for(self, mpi_comm: Any) -> Any:
        uid = self.device.nccl_unique_id() if mpi_comm.Get_rank() == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        return self.device.nccl_comm(uid, mpi_comm.Get_size(), mpi_comm.Get_rank())

    def _world(self) -> Any:
        if self.world_nccl is None:
            self.world_nccl = self._nccl_for(self.comm)
        return self.world_nccl

    def group_comm(self, span: tuple[int, ...], part: str = "all") -> tuple[Any, Any]:
        """(MPI communicator, NCCL communicator or None) of this rank's group over `span`, or
        of its part within or across nodes; its rank order is the group order."""
        key = (span, part)
        if key not in self.comms:
            if part == "all":
                groups = groups_of(self.grid_shape, span)
            else:
                assert self.plan is not None
                groups = V.part_groups(self.grid_shape, span, self.plan.nodes, part)
            nccl = self.transport_kind == "nccl"
            if len(groups) == 1:
                self.comms[key] = (self.comm, self._world() if nccl else None)
            else:
                color = next(i for i, g in enumerate(groups) if self.rank in g)
                key_in = next(g for g in groups if self.rank in g).index(self.rank)
                sub = self.comm.Split(color, key_in)
                self.comms[key] = (sub, self._nccl_for(sub) if nccl else None)
        return self.comms[key]

    def _track(self, buf: Buffer, array: Any) -> None:
        self.own[buf.name] = self.arrays[buf.name] = array
        self.host_dtypes[buf.name] = buffer_dtype(buf)
        self.addresses[buf.name] = self.device.address(array)

    def _compute(self) -> Any:
        return self.device.stream(COMPUTE_STREAM)

    def allocate(self, buffers: Sequence[Buffer]) -> None:
        for buf in buffers:
            dtype = device_dtype(buffer_dtype(buf))
            self._track(buf, self.device.zeros(buf.shape_at(self.rank), dtype, self._compute()))

    def allocate_symmetric(self, buffers: Sequence[Buffer]) -> dict[str, dict[int, int]]:
        node = node_communicator(self.comm, self._mpi(), self.plan.nodes if self.plan else ())
        try:
            world_of = node.allgather(self.rank)
            self._check_peer_access(node, world_of)
            peers: dict[str, dict[int, int]] = {}
            for buf in buffers:
                array, handle = self.device.alloc_ipc(
                    buf.shape, device_dtype(buffer_dtype(buf)), self._compute()
                )
                if buf.rank_shapes:
                    # Every rank allocates the largest piece; its own (uneven) is the start.
                    mine = buf.shape_at(self.rank)
                    array = array.reshape(-1)[: buf.count_at(self.rank)].reshape(mine)
                self._track(buf, array)
                handles = node.allgather(handle)
                peers[buf.name] = {}
                for q, h in enumerate(handles):
                    r = world_of[q]
                    peers[buf.name][r] = (
                        self.addresses[buf.name] if r == self.rank else self.device.open_ipc(h)
                    )
            self.device.synchronize()
            node.Barrier()  # every rank's buffers (and flags) are zero before any kernel runs
        finally:
            node.Free()
        return peers

    def _check_peer_access(self, node: Any, world_of: list[int]) -> None:
        """Kernels load and store peers' memory: distinct GPUs must reach each other (P2P).
        Every rank of the node learns the verdict, so all refuse together."""
        devices = node.allgather(self.device.device_id())
        mine = self.device.device_id()
        blocked = sorted({d for d in devices if d != mine and not self.device.can_access_peer(d)})
        problem = (
            f"rank {self.rank} on GPU {mine} cannot access GPU(s) {blocked} (no peer-to-peer "
            "access)"
            if blocked
            else None
        )
        problems = [p for p in node.allgather(problem) if p]
        if problems:
            raise CocoError(
                "fused collective kernels read and write their peers' GPU memory, but "
                + "; ".join(problems)
                + ": schedule the split collectives instead (e.g. rs-c-ag)"
            )

    def peer_table(self, addresses: Sequence[int]) -> int:
        return self.table(addresses, np.dtype(np.uint64))

    def table(self, values: Sequence[int], dtype: np.dtype, key: object = None) -> int:
        """A small device array a kernel reads (peer addresses, argument tables). Uploaded on
        the compute stream and waited for: a kernel on either stream may read it next. Kept
        until close() even when replaced: a launch on a stream may still read it."""
        stream = self._compute()
        table = self.device.upload(np.array(list(values), dtype=dtype), stream)
        self.device.record("coco_table_ready", stream)
        self.device.wait("coco_table_ready", self.device.stream(COMM_STREAM))
        self.tables.append(table)
        return self.device.address(table)

    # -- data ----------------------------------------------------------------------------------

    def address(self, name: str) -> int:
        return self.addresses[name]

    def coerce_input(self, name: str, value: Any, buf: Buffer) -> Any:
        """Device arrays (CuPy, DLPack) as they are (bf16 viewed as its bit pattern); host
        values become NumPy arrays (copied to the device when written)."""
        try:
            adopted = self.device.adopt(value, self._compute())
        except CocoError as e:
            raise CocoError(f"input '{name}': {e}") from None
        if adopted is not None:
            return adopted
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, (int, float, bool, np.generic)) and not buf.shape:
            return np.asarray(value, dtype=buffer_dtype(buf))
        if hasattr(value, "__array__"):
            try:
                return np.asarray(value)
            except Exception as e:
                raise CocoError(f"input '{name}': cannot read it as a host array: {e}") from None
        raise CocoError(
            f"input '{name}': expected a CuPy array, a DLPack tensor or a NumPy array of shape "
            f"{list(buf.shape_at(self.rank))} and dtype {buf.type.elt}, "
            f"got a {type(value).__name__}"
        )

    @staticmethod
    def shape_of(value: Any) -> tuple[int, ...]:
        return tuple(value.shape)

    def dtype_of(self, value: Any) -> np.dtype:
        """A value's dtype; uint16 on the device is how bf16 travels (no coco type is u16), so
        a device array of it reads as bf16."""
        dt = np.dtype(value.dtype)
        if self.device.is_device_array(value) and dt == np.uint16:
            return np.dtype(V.NUMPY_DTYPES["bf16"])
        return dt

    def _device_value_ok(self, buf: Buffer, value: Any) -> bool:
        return (
            self.device.is_device_array(value)
            and tuple(value.shape) == tuple(buf.shape_at(self.rank))
            and np.dtype(value.dtype) == device_dtype(buffer_dtype(buf))
            and bool(value.flags.c_contiguous)
        )

    def order_inputs(self, values: Sequence[Any]) -> None:
        """Device values the caller passed again (a compiled program's fast path, which does
        not adopt them anew): the compute stream waits for the caller's work on them since
        (a backward pass writing the gradient), as their first adoption ordered it. One wait
        per kind of device value: a producer's current stream is the same for all its arrays
        (a host value of that kind -- a CPU tensor -- orders nothing and counts for none)."""
        stream, ordered = self._compute(), set()
        for value in values:
            if type(value) not in ordered and self.device.order_after(value, stream):
                ordered.add(type(value))
        if ordered:
            self._inputs_ready()

    def _inputs_ready(self) -> None:
        """Inputs are placed on the compute stream: the communication stream waits for them."""
        self.device.record("coco_inputs_ready", self._compute())
        self.device.wait("coco_inputs_ready", self.device.stream(COMM_STREAM))

    def bind(self, buf: Buffer, value: Any) -> bool:
        if not self._device_value_ok(buf, value):
            return False
        self.arrays[buf.name] = value
        self.addresses[buf.name] = self.device.address(value)
        self._inputs_ready()
        return True

    def unbind(self, buf: Buffer) -> None:
        self.arrays[buf.name] = self.own[buf.name]
        self.addresses[buf.name] = self.device.address(self.own[buf.name])

    def write(self, buf: Buffer, value: Any) -> None:
        target = self.arrays[buf.name]
        stream = self._compute()
        if not self.device.is_device_array(value):
            self.device.copy_from_host(target, np.asarray(value), stream)
        else:
            with self.device.on(stream):
                self.xp.copyto(target, value.reshape(target.shape))
        self._inputs_ready()

    def holds(self, buf: Buffer, value: Any) -> bool:
        own = self.own[buf.name]
        return (
            self.device.is_device_array(value)
            and tuple(value.shape) == tuple(own.shape)
            and np.dtype(value.dtype) == np.dtype(own.dtype)
            and bool(own.size)
            and self.device.address(value) == self.device.address(own)
        )

    def array(self, name: str) -> Any:
        """This rank's buffer `name` (a CuPy array; bf16 as its uint16 bit pattern)."""
        return self.own[name]

    def read(self, buf: Buffer) -> np.ndarray:
        """The buffer's content on the host (bf16 restored from its bit pattern)."""
        self.device.sync_streams()
        host = self.device.download(self.arrays[buf.name], self._compute())
        dtype = self.host_dtypes[buf.name]
        return host.view(dtype) if host.dtype != dtype else host

    def write_back(self, buf: Buffer, caller: Any, *, bound: bool) -> Any:
        if bound:
            return caller
        if (
            isinstance(caller, np.ndarray)
            and caller.flags.writeable
            and caller.shape == tuple(buf.shape_at(self.rank))
        ):
            caller[...] = self.read(buf)
            return caller
        target = caller
        if not self.device.is_device_array(caller):
            # A DLPack tensor (PyTorch) on this GPU: its memory, as a device array. A tensor the
            # program read through a copy (a symmetric buffer) is updated there all the same.
            target = self.device.adopt(caller, self._compute())
        if target is not None and tuple(target.shape) == buf.shape_at(self.rank):
            # e.g. a non-contiguous CuPy array: updated in place, as coco.update says
            with self.device.on(self._compute()):
                self.xp.copyto(as_bit_patterns(target, self.xp), self.arrays[buf.name])
            self.device.sync_streams()
            return caller
        return self.output(buf)

    def output(self, buf: Buffer) -> Any:
        """A device copy of an output buffer."""
        self.device.sync_streams()
        with self.device.on(self._compute()):
            copy = self.arrays[buf.name].copy()
        self.device.sync_streams()  # the caller may use it on any stream
        return copy

    # -- steps ---------------------------------------------------------------------------------

    def _stream(self, step) -> Any:
        return self.device.stream(step.stream)

    def launch(self, step: Launch, args: Sequence[KernelArg]) -> None:
        self.trace.append(("launch", step.stream, step.kernel))
        cooperative = needs_coresidency(step)
        for first, count, blocks, grid in self.table_blocks.get(id(step), ()):
            # One turn of a table launch that does not fit at once: each per-tensor table
            # read from tensor `first` on (8-byte entries), this turn's block table.
            turn = [
                KernelArg("ptr", a.value + 8 * first) if isinstance(p, ArgTable) else a
                for p, a in zip(step.args[:-2], args[:-2], strict=True)
            ]
            self.device.launch(
                self.module,
                step.kernel,
                grid,
                step.block,
                kernel_scalars([*turn, KernelArg("ptr", blocks), KernelArg("i32", count)]),
                step.shared_bytes,
                self._stream(step),
                cooperative=cooperative,
            )
        if id(step) in self.table_blocks:
            return
        self.device.launch(
            self.module,
            step.kernel,
            self.launch_grids.get(id(step), step.grid),
            step.block,
            kernel_scalars(args),
            step.shared_bytes,
            self._stream(step),
            cooperative=cooperative,
        )

    def matmul(self, step: Matmul) -> None:
        self.trace.append(("matmul", step.stream, str(step.rows)))
        xp = self.xp
        a, b, c = self.arrays[step.a.name], self.arrays[step.b.name], self.arrays[step.c.name]
        ta, tb, tc = (self.host_dtypes[n] for n in (step.a.name, step.b.name, step.c.name))
        cdt = V.compute_dtype(step.c.type)
        with self.device.on(self._stream(step)):

            def value(x, t):
                # f16/bf16 compute in f32 (the sim's compute dtype), decoded from storage
                return widen(xp, x, t).astype(cdt) if V.bits_dtype(t) else x.astype(cdt)

            if step.k_rows is not None:
                into = c if step.acc is None else self.arrays[step.acc.name]
                for run, add in reduction_runs(step):
                    part = xp.matmul(value(a[..., run], ta), value(b[run], tb))
                    accumulate_chunk(into, part, add)
                if step.acc is not None and step.final:
                    c[...] = narrow(xp, into, tc, c.dtype)
                return
            bc = value(b, tb)
            if step.rows is None and step.block is None:
                c[...] = narrow(xp, xp.matmul(value(a, ta), bc), tc, c.dtype)
                return
            a2 = a.reshape(-1, a.shape[-1])
            c2 = c.reshape(-1, c.shape[-1])
            b3 = bc.reshape(-1, *b.shape[-2:]) if b.ndim > 2 else bc
            cut = a if step.block_of == "a" else c
            for lo, hi, m in matmul_segments(
                step.rows, step.block, tuple(cut.shape), tuple(b.shape), tuple(c.shape)
            ):
                bm = b3 if m is None else b3[m]
                c2[lo:hi] = narrow(xp, xp.matmul(value(a2[lo:hi], ta), bm), tc, c.dtype)

    def copy(self, step: Copy) -> None:
        self.trace.append(("copy", step.stream, step.dst.name))
        # a coco.reshape, or an update that peers' reads kept waiting
        self.device.copy(self.arrays[step.dst.name], self.arrays[step.src.name], self._stream(step))

    def record_event(self, event: str, stream: int) -> None:
        self.trace.append(("record", stream, event))
        self.device.record(event, self.device.stream(stream))

    def wait_event(self, event: str, stream: int) -> None:
        self.trace.append(("wait", stream, event))
        self.device.wait(event, self.device.stream(stream))

    def synchronize(self) -> None:
        """The end of a step: this rank's streams, never the whole device (ranks sharing a
        GPU would wait for each other's spinning kernels)."""
        self.device.sync_streams()

    # -- graphs --------------------------------------------------------------------------------

    def _side_streams(self) -> list[Any]:
        assert self.plan is not None
        return [self.device.stream(i) for i in sorted({s.stream for s in self.plan.steps}) if i]

    def begin_capture(self) -> None:
        """Capture from now on, on the compute stream; the plan's other streams join the
        capture by waiting on its start (CUDA's fork pattern)."""
        compute = self._compute()
        self.device.begin_capture(compute)
        sides = self._side_streams()
        if sides:
            self.device.record(self._FORK, compute)
            for side in sides:
                self.device.wait(self._FORK, side)

    def end_capture(self) -> Any:
        """The graph of the steps issued since begin_capture: the side streams' work joined
        back into the compute stream first, as a capture requires."""
        compute = self._compute()
        for i, side in enumerate(self._side_streams()):
            self.device.record(f"{self._JOIN}{i}", side)
            self.device.wait(f"{self._JOIN}{i}", compute)
        return self.device.end_capture(compute)

    def replay(self, graph: Any) -> None:
        self.trace.append(("replay", COMPUTE_STREAM, ""))
        self.device.replay(graph, self._compute())

    def barrier(self) -> None:
        self.device.sync_streams()
        self.comm.Barrier()

    def close(self) -> None:
        """Collective: peers may still read this rank's exported memory until every rank has
        finished and closed its mappings, so free only after a barrier."""
        self.device.synchronize()
        self.arrays.clear()
        self.own.clear()
        self.tables.clear()
        for c, _nccl in self.comms.values():
            if c is not self.comm and hasattr(c, "Free"):
                c.Free()
        self.comms.clear()
        self.device.close_peers()
        self.comm.Barrier()
        self.device.close()

    # -- collectives ---------------------------------------------------------------------------

    def transport(self, span: tuple[int, ...] | None, stream: Any, part: str = "all") -> Transport:
        """The transport of this rank's group over `span` (None: the world), or of its `part`,
        on `stream`."""
        mpi_comm, nccl = (self.comm, None) if span is None else self.group_comm(span, part)
        if self.transport_kind == "nccl":
            if nccl is None:
                nccl = self._world()
            return NcclTransport(
                self.device, nccl, mpi_comm.Get_size(), mpi_comm.Get_rank(), stream
            )
        return HostStagedTransport(self.device, MpiTransport(mpi_comm, self._mpi()), stream)

    def _collective_context(self, stream: Any) -> CollectiveContext:
        return CollectiveContext(
            xp=self.xp,
            rank=self.rank,
            grid_shape=self.grid_shape,
            exact=self.exact,
            transport=lambda span, part: self.transport(span, stream, part),
            world=lambda: self.transport(None, stream),
            empty=self.device.empty,
            nodes=self.plan.nodes if self.plan else (),
        )

    def gather_into(self, step: Collective, target: Any) -> None:
        """Run the all_gather `step` now, after the plan, from its source buffer into
        `target` (the caller's array, on the device or the host, standing for its
        destination; coconet/convention.py): on the device, through the plan's transports."""
        stream = self._compute()
        dtype = self.host_dtypes[step.src.name]
        on_device = self.device.is_device_array(target)
        direct = on_device and bool(target.flags.c_contiguous)
        with self.device.on(stream):
            src = self.arrays[step.src.name]
            if src is not self.own[step.src.name]:
                src = src.copy()  # bound to a view into `target`: no aliased send and receive
            dst = (
                as_bit_patterns(target, self.xp)
                if direct
                else self.device.empty(tuple(target.shape), src.dtype)
            )
            ctx = self._collective_context(stream)
            for request in collective_ops(ctx, step, src, dst, dtype, dtype):
                assert request is None, "device transports are stream-ordered"
            if on_device and not direct:
                self.xp.copyto(as_bit_patterns(target, self.xp), dst)
        if not on_device:  # a NumPy array the caller passed: the gathered value copied back
            host = self.device.download(dst, stream)
            target[...] = host.view(target.dtype) if host.dtype != target.dtype else host
        self.device.sync_streams()

    def collective(self, step: Collective) -> None:
        self.trace.append((step.op, step.stream, str(step.rows)))
        stream = self._stream(step)
        ctx = self._collective_context(stream)
        with self.device.on(stream):
            for request in collective_ops(
                ctx,
                step,
                self.arrays[step.src.name],
                self.arrays[step.dst.name],
                self.host_dtypes[step.src.name],
                self.host_dtypes[step.dst.name],
            ):
                assert request is None, "device transports are stream-ordered"
