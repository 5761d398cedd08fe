"""The `cuda` backend: one MPI process per GPU; CuPy for memory and kernels, NCCL collectives,
CUDA IPC for symmetric buffers, two streams with events for overlap.

Everything that needs a GPU sits behind `Device` (a small protocol, implemented for real by
`CupyDevice`); `CudaBackend` holds the logic — buffers and their dtypes, typed kernel
arguments, peer tables, which NCCL call each plan collective becomes (packing regions that
are not one contiguous run), stream and event ordering — and is unit-tested with a fake device
that runs on host memory (test/unit/test_runtime_cuda.py).

* Kernels: the plan's CUDA source compiled by NVRTC (lowering/nvrtc.py: the same options as CI,
  the device headers in memory) for this GPU's architecture, the cubin cached on disk by content
  hash (`CUDA_CACHE`, like the host .so), loaded as a CuPy RawModule. Scalars are passed with
  the exact C type of each parameter (NumPy scalars), pointers as u64.
* bf16 has no CuPy dtype: bf16 buffers are uint16 on the device (bit patterns); NCCL reduces
  them as ncclBfloat16, matmuls and exact combines decode them to f32.
* Collectives: NCCL on a communicator per set of grid axes (unique id from the group's first
  rank, broadcast over MPI); `comm.send` is ncclSend/ncclRecv on the world communicator.
  NCCL reduces in the data's precision and its own order: equal to the oracle within the
  per-dtype tolerance. `exact_collectives` gathers the pieces and combines them in rank order
  in f64 on the device (bit-exact except bf16, which rounds through f32).
* Symmetric buffers: cudaMalloc'd outside CuPy's pool (an IPC handle names a whole
  allocation), zeroed, handles exchanged with an MPI allgather on the node, peers' opened.
* Streams: compute (0) and communication (1), CUDA events for the plan's Record/WaitEvent.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from coconet.lowering.kernel_cache import KernelCache, content_key
from coconet.lowering.plan import (
    COMM_STREAM,
    COMPUTE_STREAM,
    Buffer,
    Collective,
    Copy,
    Launch,
    Matmul,
    Plan,
)
from coconet.runtime import values as V
from coconet.runtime.executor import (
    KernelArg,
    buffer_dtype,
    consecutive_blocks,
    group_of,
    groups_of,
    is_bf16,
    member_region,
)

from coconet.program import CocoError

CUDA_CACHE = KernelCache("cuda")
_RECIPE_VERSION = "cuda-v1"

# NCCL's enums (nccl.h); CuPy exposes the same numbers as cupy.cuda.nccl.NCCL_*.
NCCL_DTYPES = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "uint32": 3,
    "int64": 4,
    "uint64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
    "bfloat16": 9,
}
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}

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
    """The dtype a buffer has on the device (bf16 -> its uint16 bit pattern)."""
    return np.dtype(np.uint16) if is_bf16(host) else np.dtype(host)


def nccl_dtype(host: np.dtype) -> int:
    if is_bf16(host):
        return NCCL_DTYPES["bfloat16"]
    if host == np.bool_:
        return NCCL_DTYPES["uint8"]
    if host.name not in NCCL_DTYPES:
        raise CocoError(f"NCCL cannot move elements of dtype {host.name}")
    return NCCL_DTYPES[host.name]


def nccl_op(kind: str, host: np.dtype) -> int:
    if host == np.bool_:  # i1: sum is or, prod is and (the sim's semantics) on 0/1 bytes
        return NCCL_OPS[{"sum": "max", "prod": "min"}.get(kind, kind)]
    return NCCL_OPS[kind]


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


# ---------------------------------------------------------------------------------------------
# NVRTC output, cached like the host libraries
# ---------------------------------------------------------------------------------------------


def cubin_cache_key(source: str, arch: str) -> str:
    from coconet.lowering import nvrtc

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
    Returns the cache artifact (its `path` is the .cubin file, `cache_hit` says if it was)."""
    from coconet.lowering.nvrtc import NvrtcError, compile_cuda

    key = cubin_cache_key(source, arch)

    def build(out) -> None:
        out.write_bytes(compile_cuda(source, arch, warnings_as_errors=False).binary)

    def load(path) -> bytes:
        data = path.read_bytes()
        if not data:
            raise ValueError("empty cubin")
        return data

    try:
        return CUDA_CACHE.get_or_build(key, ".cubin", build, load)
    except NvrtcError as e:
        raise CocoError(f"NVRTC could not compile the kernels for {arch}: {e}") from None


# ---------------------------------------------------------------------------------------------
# The device interface
# ---------------------------------------------------------------------------------------------


class Device(Protocol):
    """The GPU operations the cuda backend uses. `xp` is the array module of its arrays
    (CuPy; NumPy for the test double); array work the backend does through `xp` runs inside
    `on(stream)`."""

    xp: Any

    def arch(self) -> str: ...

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def address(self, array: Any) -> int: ...

    def upload(self, host: np.ndarray) -> Any: ...

    def download(self, array: Any) -> np.ndarray: ...

    def adopt(self, value: Any) -> Any | None:
        """The caller's value as a device array without a copy (CuPy array, __dlpack__), or
        None when it is not device memory."""

    def alloc_ipc(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Any, bytes]:
        """A zeroed array in its own allocation, and the IPC handle of that allocation."""

    def open_ipc(self, handle: bytes) -> int: ...

    def load_module(self, cubin_path: str, source: str) -> Any:
        """The compiled kernels (`source` is what the cubin was compiled from)."""

    def launch(
        self,
        module: Any,
        kernel: str,
        grid: int,
        block: int,
        args: list[Any],
        shared_bytes: int,
        stream: Any,
    ) -> None: ...

    def stream(self, index: int) -> Any: ...

    def on(self, stream: Any) -> contextlib.AbstractContextManager: ...

    def record(self, event: str, stream: Any) -> None: ...

    def wait(self, event: str, stream: Any) -> None: ...

    def synchronize(self) -> None: ...

    def nccl_unique_id(self) -> Any: ...

    def nccl_comm(self, unique_id: Any, size: int, rank: int) -> Any: ...

    def nccl(self, call: str, comm: Any, stream: Any, **kw: Any) -> None:
        """One NCCL call: all_reduce(src, dst, count, dtype, op), reduce_scatter(src, dst,
        count, dtype, op), all_gather(src, dst, count, dtype), broadcast(src, dst, count, dtype,
        root), reduce(src, dst, count, dtype, op, root), send(src, count, dtype, peer),
        recv(dst, count, dtype, peer); src/dst are device arrays, counts in elements."""

    def group(self) -> contextlib.AbstractContextManager:
        """ncclGroupStart/End around point-to-point calls."""

    def close(self) -> None: ...


class CupyDevice:
    """`Device` on a real GPU through CuPy (thin by design; everything testable lives in
    CudaBackend)."""

    def __init__(self, device_id: int = 0):
        import cupy
        from cupy.cuda import nccl

        self.cp = cupy
        self.xp = cupy
        self.nccl_mod = nccl
        self.device = cupy.cuda.Device(device_id)
        self.device.use()
        self.streams = {
            COMPUTE_STREAM: cupy.cuda.Stream(non_blocking=True),
            COMM_STREAM: cupy.cuda.Stream(non_blocking=True),
        }
        self.events: dict[str, Any] = {}
        self.raw: list[int] = []
        self.opened: list[int] = []

    @classmethod
    def for_rank(cls, comm: Any) -> CupyDevice:
        """The GPU of this rank: its index on its node, modulo the node's GPUs."""
        import cupy
        from mpi4py import MPI

        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        local = node.Get_rank()
        node.Free()
        count = cupy.cuda.runtime.getDeviceCount()
        return cls(local % count)

    def arch(self) -> str:
        return f"sm_{self.device.compute_capability}"

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype):
        return self.cp.zeros(shape, dtype=dtype)

    def address(self, array) -> int:
        return int(array.data.ptr)

    def upload(self, host: np.ndarray):
        host = np.ascontiguousarray(host)
        if is_bf16(host.dtype):
            host = host.view(np.uint16)
        return self.cp.asarray(host)

    def download(self, array) -> np.ndarray:
        return self.cp.asnumpy(array)

    def adopt(self, value):
        if isinstance(value, self.cp.ndarray):
            return value
        if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
            return self.cp.from_dlpack(value)
        return None

    def alloc_ipc(self, shape, dtype):
        rt = self.cp.cuda.runtime
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 256)
        ptr = rt.malloc(nbytes)
        self.raw.append(ptr)
        rt.memset(ptr, 0, nbytes)
        mem = self.cp.cuda.UnownedMemory(ptr, nbytes, self)
        array = self.cp.ndarray(shape, dtype=dtype, memptr=self.cp.cuda.MemoryPointer(mem, 0))
        return array, bytes(rt.ipcGetMemHandle(ptr))

    def open_ipc(self, handle: bytes) -> int:
        rt = self.cp.cuda.runtime
        ptr = rt.ipcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess)
        self.opened.append(ptr)
        return int(ptr)

    def load_module(self, cubin_path: str, source: str):
        return self.cp.RawModule(path=cubin_path)

    def launch(self, module, kernel, grid, block, args, shared_bytes, stream) -> None:
        fn = module.get_function(kernel)
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
        for s in self.streams.values():
            s.synchronize()

    def nccl_unique_id(self):
        return self.nccl_mod.get_unique_id()

    def nccl_comm(self, unique_id, size: int, rank: int):
        return self.nccl_mod.NcclCommunicator(size, tuple(unique_id), rank)

    def nccl(self, call: str, comm, stream, **kw) -> None:
        s = stream.ptr
        p = self.address
        if call == "all_reduce":
            comm.allReduce(p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], kw["op"], s)
        elif call == "reduce_scatter":
            comm.reduceScatter(p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], kw["op"], s)
        elif call == "all_gather":
            comm.allGather(p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], s)
        elif call == "broadcast":
            comm.broadcast(p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], kw["root"], s)
        elif call == "reduce":
            comm.reduce(
                p(kw["src"]), p(kw["dst"]), kw["count"], kw["dtype"], kw["op"], kw["root"], s
            )
        elif call == "send":
            comm.send(p(kw["src"]), kw["count"], kw["dtype"], kw["peer"], s)
        elif call == "recv":
            comm.recv(p(kw["dst"]), kw["count"], kw["dtype"], kw["peer"], s)
        else:
            raise CocoError(f"unknown NCCL call {call}")

    @contextlib.contextmanager
    def group(self):
        self.nccl_mod.groupStart()
        try:
            yield
        finally:
            self.nccl_mod.groupEnd()

    def close(self) -> None:
        self.synchronize()
        rt = self.cp.cuda.runtime
        for ptr in self.opened:
            rt.ipcCloseMemHandle(ptr)
        for ptr in self.raw:
            rt.free(ptr)
        self.opened.clear()
        self.raw.clear()


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


def _f32_of(xp, a, host: np.dtype):
    """Values of a device array as f32 (bf16 bit patterns decoded)."""
    if is_bf16(host):
        return (a.astype(xp.uint32) << 16).view(xp.float32)
    return a.astype(xp.float32)


def _encode(xp, x, host: np.dtype):
    """f32/f64 device values rounded to `host` in device storage (bf16: round to nearest even
    through f32)."""
    if is_bf16(host):
        bits = x.astype(xp.float32).view(xp.uint32)
        rounded = ((bits + xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))) >> 16).astype(
            xp.uint16
        )
        nan = ((bits >> 16) | xp.uint32(0x40)).astype(xp.uint16)
        return xp.where((bits & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000), nan, rounded)
    return x.astype(host)


class CudaBackend:
    """One rank of the cuda backend (see the module docstring)."""

    name = "cuda"

    def __init__(self, device: Device, comm: Any, *, exact_collectives: bool = False):
        self.device = device
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
        self.comms: dict[tuple[int, ...], tuple[Any, Any]] = {}  # span -> (MPI comm, NCCL comm)
        self.world_nccl = None
        self.compiled = 0
        self.cached = 0
        # (what, stream, detail) of every step issued: stream order for tests and debugging.
        self.trace: list[tuple[str, int, str]] = []

    # -- setup -------------------------------------------------------------------------------

    def prepare(self, plan: Plan) -> None:
        if plan.size != self.size:
            raise CocoError(
                f"the plan of @{plan.program} is for {plan.size} rank(s), but this job has "
                f"{self.size} MPI process(es)"
            )
        self.plan = plan
        self.grid_shape = plan.grid_shape
        if any(isinstance(s, Launch) for s in plan.steps):
            artifact = compile_cubin(plan.cuda_source, self.device.arch())
            if artifact.cache_hit:
                self.cached += 1
            else:
                self.compiled += 1
            self.module = self.device.load_module(str(artifact.path), plan.cuda_source)
        for step in plan.steps:
            if isinstance(step, Collective):
                if step.op == "send":
                    self._world()
                else:
                    self.group_comm(step.axes)

    def _nccl_for(self, mpi_comm: Any) -> Any:
        uid = self.device.nccl_unique_id() if mpi_comm.Get_rank() == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        return self.device.nccl_comm(uid, mpi_comm.Get_size(), mpi_comm.Get_rank())

    def _world(self) -> Any:
        if self.world_nccl is None:
            self.world_nccl = self._nccl_for(self.comm)
        return self.world_nccl

    def group_comm(self, span: tuple[int, ...]) -> tuple[Any, Any]:
        if span not in self.comms:
            groups = groups_of(self.grid_shape, span)
            if len(groups) == 1:
                self.comms[span] = (self.comm, self._world())
            else:
                color = next(i for i, g in enumerate(groups) if self.rank in g)
                sub = self.comm.Split(color, self.rank)
                self.comms[span] = (sub, self._nccl_for(sub))
        return self.comms[span]

    def _track(self, buf: Buffer, array: Any) -> None:
        self.own[buf.name] = self.arrays[buf.name] = array
        self.host_dtypes[buf.name] = buffer_dtype(buf)
        self.addresses[buf.name] = self.device.address(array)

    def allocate(self, buffers: Sequence[Buffer]) -> None:
        for buf in buffers:
            self._track(buf, self.device.zeros(buf.shape, device_dtype(buffer_dtype(buf))))

    def allocate_symmetric(self, buffers: Sequence[Buffer]) -> dict[str, dict[int, int]]:
        node = self.comm.Split_type(_comm_type_shared(), key=self.rank)
        world_of = node.allgather(self.rank)
        peers: dict[str, dict[int, int]] = {}
        for buf in buffers:
            array, handle = self.device.alloc_ipc(buf.shape, device_dtype(buffer_dtype(buf)))
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
        node.Free()
        return peers

    def peer_table(self, addresses: Sequence[int]) -> int:
        return self.table(addresses, np.dtype(np.uint64))

    def table(self, values: Sequence[int], dtype: np.dtype, key: object = None) -> int:
        # Kept until close() even when replaced: a launch on a stream may still read it.
        table = self.device.upload(np.array(list(values), dtype=dtype))
        self.tables.append(table)
        return self.device.address(table)

    # -- data ----------------------------------------------------------------------------------

    def address(self, name: str) -> int:
        return self.addresses[name]

    def coerce_input(self, name: str, value: Any, buf: Buffer) -> Any:
        """Device arrays (CuPy, DLPack) as they are; host values become NumPy arrays (copied
        to the device when written)."""
        adopted = self.device.adopt(value)
        if adopted is not None:
            return adopted
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, (int, float, bool, np.generic)) and not buf.shape:
            return np.asarray(value, dtype=buffer_dtype(buf))
        if hasattr(value, "__array__"):
            return np.asarray(value)
        raise CocoError(
            f"input '{name}': expected a CuPy array, a DLPack tensor or a NumPy array of shape "
            f"{list(buf.shape)} and dtype {buf.type.elt}, got a {type(value).__name__}"
        )

    @staticmethod
    def shape_of(value: Any) -> tuple[int, ...]:
        return tuple(value.shape)

    def dtype_of(self, value: Any) -> np.dtype:
        """A device array's dtype; uint16 on the device is how bf16 travels (no coco type is
        u16), so it reads as bf16."""
        dt = np.dtype(value.dtype)
        if not isinstance(value, np.ndarray) and dt == np.uint16:
            return np.dtype(V.NUMPY_DTYPES["bf16"])
        return dt

    def _device_value_ok(self, buf: Buffer, value: Any) -> bool:
        return (
            not isinstance(value, np.ndarray)
            and tuple(value.shape) == tuple(buf.shape)
            and np.dtype(value.dtype) == device_dtype(buffer_dtype(buf))
            and bool(value.flags.c_contiguous)
        )

    def bind(self, buf: Buffer, value: Any) -> bool:
        if isinstance(value, np.ndarray) or not self._device_value_ok(buf, value):
            return False
        self.arrays[buf.name] = value
        self.addresses[buf.name] = self.device.address(value)
        return True

    def unbind(self, buf: Buffer) -> None:
        self.arrays[buf.name] = self.own[buf.name]
        self.addresses[buf.name] = self.device.address(self.own[buf.name])

    def write(self, buf: Buffer, value: Any) -> None:
        target = self.arrays[buf.name]
        with self.device.on(self.device.stream(COMPUTE_STREAM)):
            if isinstance(value, np.ndarray):
                value = self.device.upload(value)
            self.xp.copyto(target, value.reshape(target.shape))

    def read(self, buf: Buffer) -> np.ndarray:
        """The buffer's content on the host (bf16 restored from its bit pattern)."""
        self.device.synchronize()
        host = self.device.download(self.arrays[buf.name])
        dtype = self.host_dtypes[buf.name]
        return host.view(dtype) if host.dtype != dtype else host

    def write_back(self, buf: Buffer, caller: Any, *, bound: bool) -> Any:
        if bound:
            return caller
        if (
            isinstance(caller, np.ndarray)
            and caller.flags.writeable
            and caller.shape == tuple(buf.shape)
        ):
            caller[...] = self.read(buf)
            return caller
        return self.output(buf)

    def output(self, buf: Buffer) -> Any:
        """A device copy of an output buffer."""
        self.device.synchronize()
        return self.arrays[buf.name].copy()

    # -- steps ---------------------------------------------------------------------------------

    def _stream(self, step) -> Any:
        return self.device.stream(step.stream)

    def launch(self, step: Launch, args: Sequence[KernelArg]) -> None:
        self.trace.append(("launch", step.stream, step.kernel))
        self.device.launch(
            self.module,
            step.kernel,
            step.grid,
            step.block,
            kernel_scalars(args),
            step.shared_bytes,
            self._stream(step),
        )

    def matmul(self, step: Matmul) -> None:
        self.trace.append(("matmul", step.stream, str(step.rows)))
        xp = self.xp
        a, b, c = self.arrays[step.a.name], self.arrays[step.b.name], self.arrays[step.c.name]
        ta, tb, tc = (self.host_dtypes[n] for n in (step.a.name, step.b.name, step.c.name))
        cdt = V.compute_dtype(step.c.type)
        with self.device.on(self._stream(step)):

            def value(x, t):
                return _f32_of(xp, x, t) if cdt == np.float32 else x.astype(cdt)

            bc = value(b, tb)
            if step.rows is None:
                c[...] = _encode(xp, xp.matmul(value(a, ta), bc), tc)
                return
            a2 = a.reshape(-1, a.shape[-1])
            c2 = c.reshape(-1, c.shape[-1])
            for lo, hi in step.rows:
                c2[lo:hi] = _encode(xp, xp.matmul(value(a2[lo:hi], ta), bc), tc)

    def copy(self, step: Copy) -> None:
        self.trace.append(("copy", step.stream, step.dst.name))
        with self.device.on(self._stream(step)):
            self.xp.copyto(self.arrays[step.dst.name], self.arrays[step.src.name])

    def record_event(self, event: str, stream: int) -> None:
        self.trace.append(("record", stream, event))
        self.device.record(event, self.device.stream(stream))

    def wait_event(self, event: str, stream: int) -> None:
        self.trace.append(("wait", stream, event))
        self.device.wait(event, self.device.stream(stream))

    def synchronize(self) -> None:
        self.device.synchronize()

    def barrier(self) -> None:
        self.device.synchronize()
        self.comm.Barrier()

    def close(self) -> None:
        self.device.synchronize()
        self.arrays.clear()
        self.own.clear()
        self.tables.clear()
        for c, _nccl in self.comms.values():
            if c is not self.comm and hasattr(c, "Free"):
                c.Free()
        self.comms.clear()
        self.device.close()

    # -- collectives ---------------------------------------------------------------------------

    def _rows(self, a: Any, rows: tuple[int, int] | None) -> Any:
        return a if rows is None else a.reshape(-1, a.shape[-1])[rows[0] : rows[1]]

    def _library_reduction(self, host: np.dtype, kind: str) -> bool:
        return not self.exact or host.kind in "iub"

    def collective(self, step: Collective) -> None:
        if step.rows is not None and step.op in ("reduce_scatter", "all_gather"):
            raise CocoError(f"the cuda backend cannot run {step.op} on a row chunk ({step})")
        self.trace.append((step.op, step.stream, str(step.rows)))
        src = self._rows(self.arrays[step.src.name], step.rows)
        dst = self._rows(self.arrays[step.dst.name], step.rows)
        host = self.host_dtypes[step.src.name]
        stream = self._stream(step)
        with self.device.on(stream):
            if step.op == "send":
                self._send(step, src, dst, host, stream)
                return
            _mpi_comm, nccl = self.group_comm(step.axes)
            group = group_of(self.grid_shape, step.axes, self.rank)
            getattr(self, "_" + step.op)(step, nccl, group, src, dst, host, stream)

    def _exact_combine(
        self, kind: str, gathered: Any, src_host: np.dtype, dst_host: np.dtype
    ) -> Any:
        """Rank-order combination in f64 (int64) of gathered pieces, rounded once."""
        xp = self.xp
        if src_host == np.bool_:  # i1: sum is or, prod is and
            ops = {
                "sum": xp.logical_or,
                "prod": xp.logical_and,
                "max": xp.maximum,
                "min": xp.minimum,
            }
            acc = gathered[0].astype(xp.bool_)
            for g in gathered[1:]:
                acc = ops[kind](acc, g.astype(xp.bool_))
            return acc
        wide = xp.float64 if src_host.kind == "f" or is_bf16(src_host) else xp.int64

        def load(x: Any) -> Any:
            return _f32_of(xp, x, src_host).astype(wide) if is_bf16(src_host) else x.astype(wide)

        ops = {"sum": xp.add, "prod": xp.multiply, "max": xp.maximum, "min": xp.minimum}
        acc = load(gathered[0])
        for g in gathered[1:]:
            acc = ops[kind](acc, load(g))
        return _encode(xp, acc, dst_host)

    def _all_reduce(self, step, nccl, group, src, dst, host, stream) -> None:
        n = int(np.prod(src.shape, dtype=np.int64))
        if self._library_reduction(host, step.kind):
            self.device.nccl(
                "all_reduce",
                nccl,
                stream,
                src=src,
                dst=dst,
                count=n,
                dtype=nccl_dtype(host),
                op=nccl_op(step.kind, host),
            )
            return
        gathered = self.device.empty((len(group), *src.shape), src.dtype)
        self.device.nccl(
            "all_gather",
            nccl,
            stream,
            src=self.xp.ascontiguousarray(src),
            dst=gathered,
            count=n,
            dtype=nccl_dtype(host),
        )
        dst[...] = self._exact_combine(step.kind, gathered, host, self.host_dtypes[step.dst.name])

    def _reduce_scatter(self, step, nccl, group, src, dst, host, stream) -> None:
        regions = [
            member_region(step.src.type, self.rank, step.dst.type, m, self.grid_shape)
            for m in group
        ]
        if consecutive_blocks(regions, src.shape):
            packed = src.reshape(len(group), -1)
        else:
            packed = self.xp.stack([self.xp.ascontiguousarray(src[r]).reshape(-1) for r in regions])
        count = int(packed.shape[1])
        if self._library_reduction(host, step.kind):
            self.device.nccl(
                "reduce_scatter",
                nccl,
                stream,
                src=packed,
                dst=dst,
                count=count,
                dtype=nccl_dtype(host),
                op=nccl_op(step.kind, host),
            )
            return
        me = group.index(self.rank)
        gathered = self.device.empty((len(group), len(group), count), packed.dtype)
        self.device.nccl(
            "all_gather",
            nccl,
            stream,
            src=self.xp.ascontiguousarray(packed),
            dst=gathered,
            count=len(group) * count,
            dtype=nccl_dtype(host),
        )
        mine = gathered[:, me, :]
        dst[...] = self._exact_combine(
            step.kind, mine, host, self.host_dtypes[step.dst.name]
        ).reshape(dst.shape)

    def _all_gather(self, step, nccl, group, src, dst, host, stream) -> None:
        regions = [
            member_region(step.dst.type, self.rank, step.src.type, m, self.grid_shape)
            for m in group
        ]
        piece = self.xp.ascontiguousarray(src)
        count = int(np.prod(piece.shape, dtype=np.int64))
        if consecutive_blocks(regions, dst.shape):
            self.device.nccl(
                "all_gather", nccl, stream, src=piece, dst=dst, count=count, dtype=nccl_dtype(host)
            )
            return
        gathered = self.device.empty((len(group), *piece.shape), piece.dtype)
        self.device.nccl(
            "all_gather", nccl, stream, src=piece, dst=gathered, count=count, dtype=nccl_dtype(host)
        )
        for j, r in enumerate(regions):
            dst[r] = gathered[j]

    def _root(self, step, group) -> int:
        if step.root is None or step.root >= len(group):
            raise CocoError(
                f"{step.op} names root {step.root}, but its groups have {len(group)} rank(s)"
            )
        return step.root

    def _broadcast(self, step, nccl, group, src, dst, host, stream) -> None:
        root = self._root(step, group)
        n = int(np.prod(src.shape, dtype=np.int64))
        self.device.nccl(
            "broadcast", nccl, stream, src=src, dst=dst, count=n, dtype=nccl_dtype(host), root=root
        )

    def _reduce(self, step, nccl, group, src, dst, host, stream) -> None:
        root = self._root(step, group)
        me = group.index(self.rank)
        n = int(np.prod(src.shape, dtype=np.int64))
        if self._library_reduction(host, step.kind):
            out = dst if me == root else self.device.empty(dst.shape, dst.dtype)
            self.device.nccl(
                "reduce",
                nccl,
                stream,
                src=src,
                dst=out,
                count=n,
                dtype=nccl_dtype(host),
                op=nccl_op(step.kind, host),
                root=root,
            )
        else:
            gathered = self.device.empty((len(group), *src.shape), src.dtype)
            self.device.nccl(
                "all_gather",
                nccl,
                stream,
                src=self.xp.ascontiguousarray(src),
                dst=gathered,
                count=n,
                dtype=nccl_dtype(host),
            )
            if me == root:
                dst[...] = self._exact_combine(
                    step.kind, gathered, host, self.host_dtypes[step.dst.name]
                )
        if me != root and step.src.name != step.dst.name:
            self.xp.copyto(dst, src)  # the sim: ranks other than the root keep their input

    def _send(self, step, src, dst, host, stream) -> None:
        coords = list(V.coords_of(self.rank, self.grid_shape))
        to, frm = list(coords), list(coords)
        to[step.along] += step.shift
        frm[step.along] -= step.shift
        n_axis = self.grid_shape[step.along]
        nccl = self._world()
        count = int(np.prod(src.shape, dtype=np.int64))
        has_dest = 0 <= to[step.along] < n_axis
        has_source = 0 <= frm[step.along] < n_axis
        if not has_source:
            dst[...] = 0
        with self.device.group():
            if has_dest:
                self.device.nccl(
                    "send",
                    nccl,
                    stream,
                    src=self.xp.ascontiguousarray(src),
                    count=count,
                    dtype=nccl_dtype(host),
                    peer=V.rank_of(to, self.grid_shape),
                )
            if has_source:
                self.device.nccl(
                    "recv",
                    nccl,
                    stream,
                    dst=dst,
                    count=count,
                    dtype=nccl_dtype(host),
                    peer=V.rank_of(frm, self.grid_shape),
                )


@functools.cache
def _comm_type_shared() -> int:
    from mpi4py import MPI

    return MPI.COMM_TYPE_SHARED
