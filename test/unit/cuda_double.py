"""A strict stand-in for a GPU, for the cuda backend's tests on machines without one.

`StrictDevice` implements runtime/cuda.py's `Device` on host memory and is strict where the
real libraries are:

* Types as CuPy 14 has them: NCCL unique ids are 128 `bytes` and the communicator takes
  `(int, bytes, int)` (a tuple raises TypeError, as Cython's typed signature does); NCCL calls
  take integer addresses, counts, enums and a stream handle; kernels take NumPy scalars of each
  parameter's exact C type; bf16 arrays handed in are `ml_dtypes.bfloat16`.
* Limits as CUDA has them: two ranks on one GPU in one NCCL communicator fail ("Duplicate GPU
  detected"); a cooperative launch larger than what is co-resident fails; peer access between
  GPUs can be switched off.
* Stream semantics: every copy, memset, upload, NCCL call and kernel launch is recorded on its
  stream; vector clocks model stream order, events, stream and device synchronization. Reading
  or overwriting memory last written on a stream that is not ordered before the reader (no event,
  no synchronization) raises `Hazard`. Array work the backend does through NumPy is attributed
  to the stream of the enclosing `on(stream)`, or to CuPy's legacy default stream when there is
  none -- which is not ordered with the backend's non-blocking streams.

* Graph capture as CUDA has it: work issued to a capturing stream (or to a stream that joined
  the capture by waiting on an event recorded in it) is recorded, not run; a replay runs the
  recorded launches and copies with the arguments they had at capture. Synchronizing, allocating,
  copying to or from the host, NCCL calls and NumPy array work while capturing raise
  `CaptureError` (a real capture would fail or record work the backend believes done), as
  do a capture on the legacy stream, a side stream never joined back, and ending a capture
  on another stream than the one that began it.

Kernels run for real: the plan's CUDA source compiled by the host compiler (the cpu backend's
device layer). Ranks are threads of one process over runtime/inprocess.py (the communicator
the threaded executor uses too); `FakeWorld` adds what the GPU libraries share.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from coconet.core.values import bits_dtype
from coconet.runtime.cuda import CudaBackend, as_bit_patterns, call_nccl, dlpack_placement
from coconet.runtime.executor import PlanRunner
from coconet.runtime.inprocess import IN_PROCESS_MPI, InProcessComm, InProcessWorld
from coconet.runtime.transport import NCCL_DTYPES
from coconet.toolchain.host_compiler import compile_host

LEGACY = "legacy"


class Hazard(AssertionError):
    """Memory touched on a stream that is not ordered after its last write."""


class NcclError(RuntimeError):
    pass


class CaptureError(RuntimeError):
    """What the CUDA runtime answers for work a stream capture does not allow."""


@dataclass
class Capture:
    """A stream capture under way: the stream that began it, the streams that joined it,
    the work recorded, and the side streams with work not yet joined back."""

    origin: str
    streams: set[str]
    ops: list[tuple] = field(default_factory=list)
    # side stream -> launches recorded on it; event recorded in the capture -> (its stream,
    # that stream's launches then)
    work: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    joins: dict[str, tuple[str, int]] = field(default_factory=dict)
    joined: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeGraph:
    """cupy.cuda.graph.Graph: the launches and copies of a capture, replayed with their
    arguments."""

    device: StrictDevice
    ops: list[tuple]
    replays: int = 0

    def launch(self, stream=None):
        self.device.replay(self, stream)


# ---------------------------------------------------------------------------------------------
# Threads as ranks: communicators, NCCL rendezvous, IPC handles
# ---------------------------------------------------------------------------------------------


class FakeWorld(InProcessWorld):
    """What the rank threads of one job share: the in-process communicators' rendezvous
    (runtime/inprocess.py, the same one the threaded executor runs on), IPC handles and NCCL
    communicators' members."""

    def __init__(self, size: int = 0):
        super().__init__(size)
        self.ipc: dict[bytes, tuple[int, int]] = {}  # handle -> (address, node)
        self.nccl_members: dict[bytes, dict[int, str]] = defaultdict(dict)
        self.lock = threading.Lock()


# ---------------------------------------------------------------------------------------------
# NCCL, typed as CuPy 14's cupy.cuda.nccl
# ---------------------------------------------------------------------------------------------


def _require(value: Any, kind: type, what: str) -> None:
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not ok:
        raise TypeError(f"{what}: expected {kind.__name__}, got {type(value).__name__}")


class FakeNcclCommunicator:
    """cupy.cuda.nccl.NcclCommunicator(int ndev, bytes commId, int rank): typed as in CuPy 14;
    calls take integer addresses, resolved on the owning device."""

    def __init__(self, ndev, comm_id, rank, *, device: StrictDevice):
        _require(ndev, int, "ndev")
        _require(comm_id, bytes, "commId")
        _require(rank, int, "rank")
        if len(comm_id) != 128:
            raise NcclError("invalid unique id")
        members = device.world.nccl_members[comm_id]
        with device.world.lock:
            if device.bus in members.values():
                raise NcclError("Duplicate GPU detected: two ranks of one communicator share a GPU")
            members[int(rank)] = device.bus
        self.device, self.size, self.rank, self.uid, self.seq = device, ndev, rank, comm_id, 0

    def _exchange(self, value):
        self.seq += 1
        return self.device.world.exchange((self.uid, self.seq), self.rank, self.size, value)

    def _check(self, ints: dict[str, Any]) -> None:
        for name, v in ints.items():
            _require(v, int, name)

    def _reduce(self, call, sendbuf, recvbuf, count, datatype, op, stream, root=None):
        self._check(
            {
                "sendbuf": sendbuf,
                "recvbuf": recvbuf,
                "count": count,
                "datatype": datatype,
                "op": op,
                "stream": stream,
            }
        )
        d = self.device
        s = d.stream_of(stream)
        n_in = count * self.size if call == "reduce_scatter" else count
        src = d.read_bytes(sendbuf, n_in, datatype, s)
        parts = self._exchange(src)
        fn = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum}[op]
        acc = _decode(parts[0], datatype)
        for p in parts[1:]:
            acc = fn(acc, _decode(p, datatype))
        if call == "reduce_scatter":
            acc = acc[self.rank * count : (self.rank + 1) * count]
        total = _encode(acc, datatype)
        if call != "reduce" or self.rank == root:
            d.write_bytes(recvbuf, total, s)

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        self._reduce("all_reduce", sendbuf, recvbuf, count, datatype, op, stream)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        self._reduce("reduce_scatter", sendbuf, recvbuf, recvcount, datatype, op, stream)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        _require(root, int, "root")
        self._reduce("reduce", sendbuf, recvbuf, count, datatype, op, stream, root=root)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        self._check(
            {
                "sendbuf": sendbuf,
                "recvbuf": recvbuf,
                "count": count,
                "datatype": datatype,
                "stream": stream,
            }
        )
        d = self.device
        s = d.stream_of(stream)
        parts = self._exchange(d.read_bytes(sendbuf, count, datatype, s))
        d.write_bytes(recvbuf, np.concatenate(parts), s)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        self._check(
            {
                "sendbuff": sendbuff,
                "recvbuff": recvbuff,
                "count": count,
                "datatype": datatype,
                "root": root,
                "stream": stream,
            }
        )
        d = self.device
        s = d.stream_of(stream)
        mine = d.read_bytes(sendbuff, count, datatype, s) if self.rank == root else None
        d.write_bytes(recvbuff, self._exchange(mine)[root], s)

    def send(self, sendbuf, count, datatype, peer, stream):
        self._check(
            {
                "sendbuf": sendbuf,
                "count": count,
                "datatype": datatype,
                "peer": peer,
                "stream": stream,
            }
        )
        d = self.device
        if d.group_ops is None:
            raise NcclError("point-to-point call outside ncclGroupStart/End in this test world")
        d.group_comm = self
        d.group_ops.append(
            ("send", peer, d.read_bytes(sendbuf, count, datatype, d.stream_of(stream)))
        )

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._check(
            {
                "recvbuf": recvbuf,
                "count": count,
                "datatype": datatype,
                "peer": peer,
                "stream": stream,
            }
        )
        d = self.device
        if d.group_ops is None:
            raise NcclError("point-to-point call outside ncclGroupStart/End in this test world")
        d.group_comm = self
        nbytes = count * np.dtype(_NCCL_NUMPY[datatype]).itemsize
        d.group_ops.append(("recv", peer, (recvbuf, d.stream_of(stream), nbytes)))


_NCCL_NUMPY = {
    NCCL_DTYPES["int8"]: np.int8,
    NCCL_DTYPES["uint8"]: np.uint8,
    NCCL_DTYPES["int32"]: np.int32,
    NCCL_DTYPES["uint32"]: np.uint32,
    NCCL_DTYPES["int64"]: np.int64,
    NCCL_DTYPES["uint64"]: np.uint64,
    NCCL_DTYPES["float16"]: np.float16,
    NCCL_DTYPES["float32"]: np.float32,
    NCCL_DTYPES["float64"]: np.float64,
    NCCL_DTYPES["bfloat16"]: ml_dtypes.bfloat16,
}


def _decode(a: np.ndarray, code: int) -> np.ndarray:
    x = a.view(_NCCL_NUMPY[code])
    return x.astype(np.float64) if x.dtype.kind in "fV" or code == 9 else x.astype(np.int64)


def _encode(x: np.ndarray, code: int) -> np.ndarray:
    return x.astype(_NCCL_NUMPY[code]).view(np.uint8)


# ---------------------------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------------------------


class FakeDeviceArray(np.ndarray):
    """Device memory (a cupy.ndarray stand-in): a NumPy array that is not host memory."""


class FakeStream:
    """cupy.cuda.Stream: `ptr` is its handle; `with stream:` makes it current."""

    _handles = itertools.count(0x1000, 0x10)

    def __init__(self, device: StrictDevice, name: str):
        self.device, self.name, self.ptr = device, name, next(self._handles)

    def __enter__(self):
        self.device._enter(self)
        return self

    def __exit__(self, *exc):
        self.device._exit()

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


@dataclass
class Allocation:
    name: str
    array: np.ndarray
    symmetric: bool = False
    last_write: tuple[str, int] | None = None
    snapshot: bytes = b""
    start: int = 0
    nbytes: int = 0


@dataclass
class FakeTensor:
    """A PyTorch-like tensor: DLPack device, requires_grad, and a pending write on its
    producer's stream (the backward pass)."""

    data: FakeDeviceArray
    device_type: int = 2
    device_index: int = 0
    requires_grad: bool = False
    producer: str = "torch"
    shape: tuple = field(default=())
    dtype: Any = None

    def __post_init__(self):
        self.shape, self.dtype = self.data.shape, self.data.dtype

    def __dlpack_device__(self):
        return (self.device_type, self.device_index)

    # torch.Tensor's identity (compile()'s fast path reuses a tensor passed again by these)
    def data_ptr(self) -> int:
        return int(self.data.ctypes.data)

    def stride(self) -> tuple[int, ...]:
        return tuple(st // self.data.itemsize for st in self.data.strides)

    @property
    def device(self) -> str:  # (torch.device; its string form)
        return f"cuda:{self.device_index}" if self.device_type == 2 else "cpu"

    def __dlpack__(self, stream=None):
        raise AssertionError("StrictDevice.adopt models from_dlpack itself")


class StrictDevice:
    """`Device` (runtime/cuda.py) on host memory, strict about types and streams."""

    xp = np

    def __init__(
        self,
        world: FakeWorld,
        *,
        bus: str = "0000:01:00.0",
        device_id: int = 0,
        coresident_blocks: int = 6,
        peer_access: bool = True,
        check_streams: bool = True,
        node: int = 0,
    ):
        self.world, self.bus, self.id = world, bus, device_id
        # The machine this GPU is in: IPC handles open only on the machine that made them.
        self.node = node
        self.coresident = coresident_blocks
        self.peer_access = peer_access
        self.check_streams = check_streams
        self.calls: list[tuple] = []
        self.allocations: list[Allocation] = []
        self.streams = {0: FakeStream(self, "s0"), 1: FakeStream(self, "s1")}
        self.legacy = FakeStream(self, LEGACY)
        self.by_ptr = {s.ptr: s for s in (*self.streams.values(), self.legacy)}
        self.clock: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.host: dict[str, int] = defaultdict(int)
        self.events: dict[str, dict[str, int]] = {}
        self.current: list[FakeStream] = []
        self.group_ops: list[tuple] | None = None
        self.group_comm: FakeNcclCommunicator | None = None
        self.opened: list[int] = []
        self.closed = False
        self.hazards: list[str] = []
        self.capture: Capture | None = None

    # -- the stream model ----------------------------------------------------------------------

    def _name(self, stream: FakeStream) -> str:
        if not isinstance(stream, FakeStream) or stream.device is not self:
            raise TypeError(f"expected a stream of this device, got {stream!r}")
        return stream.name

    def stream_of(self, handle: int) -> str:
        _require(handle, int, "stream")
        if int(handle) not in self.by_ptr:
            raise NcclError(f"unknown stream handle {handle:#x}")
        return self.by_ptr[int(handle)].name

    def _absorb_host(self, s: str) -> None:
        clock = self.clock[s]
        for k, v in self.host.items():
            clock[k] = max(clock[k], v)

    def _tick(self, s: str) -> tuple[str, int]:
        self._absorb_host(s)
        self.clock[s][s] += 1
        return (s, self.clock[s][s])

    def _ordered(self, s: str, stamp: tuple[str, int] | None) -> bool:
        if stamp is None:
            return True
        self._absorb_host(s)
        return self.clock[s][stamp[0]] >= stamp[1]

    def _hazard(self, message: str) -> None:
        self.hazards.append(message)
        if self.check_streams:
            raise Hazard(message)

    def _read(self, alloc: Allocation | None, s: str, what: str) -> None:
        if alloc is not None and not self._ordered(s, alloc.last_write):
            self._hazard(
                f"{what} reads {alloc.name} on stream {s}, but it was last written on stream "
                f"{alloc.last_write[0]} with nothing ordering that write first"
            )

    def _write(self, alloc: Allocation | None, s: str, what: str) -> None:
        if alloc is None:
            return
        if not self._ordered(s, alloc.last_write):
            self._hazard(
                f"{what} writes {alloc.name} on stream {s}, but its last write on stream "
                f"{alloc.last_write[0]} is not ordered before"
            )
        alloc.last_write = self._tick(s)
        alloc.snapshot = alloc.array.tobytes()

    def _settle(self) -> None:
        """Attribute NumPy work since the last device call to the current stream (CuPy's
        current stream: the legacy default stream outside any `with stream`)."""
        s = self.current[-1].name if self.current else LEGACY
        for a in self.allocations:
            if a.symmetric:
                continue  # peers' kernels write it; ordered by in-kernel flags, not streams
            if a.array.tobytes() != a.snapshot:
                if self.capture is not None:
                    # CUDA would have recorded the work into the graph, not run it
                    raise CaptureError(f"array work on {a.name} while stream capture is on")
                self._write(a, s, "array work")

    def _not_capturing(self, what: str) -> None:
        """Work a stream capture does not allow (cudaErrorStreamCaptureUnsupported), or that
        would run at once where the capture records it: refused while one is on."""
        self._settle()
        if self.capture is not None:
            raise CaptureError(f"{what} while stream {self.capture.origin} is capturing")

    def _captured(self, s: str) -> Capture | None:
        return self.capture if self.capture is not None and s in self.capture.streams else None

    def _enter(self, stream: FakeStream) -> None:
        self._settle()
        self.current.append(stream)

    def _exit(self) -> None:
        self._settle()
        self.current.pop()

    def _alloc(self, name: str, array: np.ndarray, *, symmetric: bool = False) -> FakeDeviceArray:
        array = np.asarray(array, order="C").view(FakeDeviceArray)
        a = Allocation(
            name, array, symmetric, None, array.tobytes(), array.ctypes.data, max(array.nbytes, 1)
        )
        self.allocations.append(a)
        return array

    def find(self, address: int) -> Allocation | None:
        for a in self.allocations:
            if a.start <= address < a.start + a.nbytes:
                return a
        return None

    def read_bytes(self, address: int, count: int, datatype: int, s: str) -> np.ndarray:
        self._settle()
        a = self.find(int(address))
        if a is None:
            raise NcclError(f"address {int(address):#x} is not device memory of this rank")
        self._read(a, s, "an NCCL call")
        n = count * np.dtype(_NCCL_NUMPY[datatype]).itemsize
        off = int(address) - a.start
        return a.array.reshape(-1).view(np.uint8)[off : off + n].copy()

    def write_bytes(self, address: int, data: np.ndarray, s: str) -> None:
        a = self.find(int(address))
        if a is None:
            raise NcclError(f"address {int(address):#x} is not device memory of this rank")
        off = int(address) - a.start
        a.array.reshape(-1).view(np.uint8)[off : off + data.nbytes] = data.view(np.uint8)
        self._write(a, s, "an NCCL call")

    # -- Device --------------------------------------------------------------------------------

    def arch(self) -> str:
        return "sm_90"

    def device_id(self) -> int:
        return self.id

    def bus_id(self) -> str:
        return self.bus

    def can_access_peer(self, other: int) -> bool:
        _require(other, int, "peerDevice")
        return self.peer_access

    def is_device_array(self, value) -> bool:
        return isinstance(value, FakeDeviceArray)

    def empty(self, shape, dtype):
        self._not_capturing("an allocation")
        return self._alloc("scratch", np.empty(shape, dtype))

    def zeros(self, shape, dtype, stream):
        self._not_capturing("an allocation")
        array = self._alloc("buffer", np.zeros(shape, dtype))
        self._write(self.find(array.ctypes.data), self._name(stream), "cudaMemsetAsync")
        return array

    def address(self, array) -> int:
        return array.ctypes.data

    def upload(self, host, stream):
        self._not_capturing("a host-to-device copy")
        host = np.ascontiguousarray(host)
        bits = bits_dtype(host.dtype)  # bf16 and fp8 as their bit patterns, as CupyDevice does
        if bits is not None:
            host = host.view(bits)
        array = self._alloc("upload", host.copy())
        self._write(self.find(array.ctypes.data), self._name(stream), "an upload")
        self.calls.append(("upload", self._name(stream)))
        return array

    def copy_from_host(self, dst, host, stream):
        self._not_capturing("a host-to-device copy")
        host = np.ascontiguousarray(host)
        bits = bits_dtype(host.dtype)  # bf16 and fp8 as their bit patterns, as CupyDevice does
        if bits is not None:
            host = host.view(bits)
        dst[...] = host.reshape(dst.shape)
        self._write(self.find(dst.ctypes.data), self._name(stream), "a host-to-device copy")

    def download(self, array, stream) -> np.ndarray:
        self._not_capturing("a device-to-host copy")
        s = self._name(stream)
        self._read(self.find(array.ctypes.data), s, "a device-to-host copy")
        self._absorb_host(s)
        for k, v in self.clock[s].items():  # blocking: the host has seen the stream's work
            self.host[k] = max(self.host[k], v)
        return np.array(array, copy=True).view(np.ndarray)

    def user_array(self, host: np.ndarray, *, producer: str = "torch") -> FakeDeviceArray:
        """A caller's device array, written on the caller's stream (not yet synchronized)."""
        array = self._alloc(f"{producer} array", np.array(host, copy=True))
        alloc = self.find(array.ctypes.data)
        alloc.last_write = self._tick(producer)
        return array

    def adopt(self, value, stream):
        if isinstance(value, FakeDeviceArray):  # a CuPy array: ordered after its stream
            self.order_after(value, stream)
            return as_bit_patterns(value, np)
        if dlpack_placement(value, self.id) != "device":
            return None
        # cupy.from_dlpack under `with stream`: __dlpack__(stream=...) orders the producer's
        # pending work before `stream`.
        self.order_after(value, stream)
        return as_bit_patterns(value.data, np)

    def order_after(self, value, stream) -> bool:
        s = self._name(stream)
        if isinstance(value, FakeDeviceArray):
            alloc = self.find(value.ctypes.data)
            producer = alloc.last_write[0] if alloc and alloc.last_write else LEGACY
            self._merge(s, dict(self.clock[producer]))
            return True
        if dlpack_placement(value, self.id) == "device":
            self._merge(s, dict(self.clock[value.producer]))
            return True
        return False  # host memory (NumPy, a CPU tensor): nothing to order

    def produce(self, array: FakeDeviceArray, host: np.ndarray, *, producer: str = "torch"):
        """The caller writes `host` into its device array on its own stream (a backward
        pass), not yet ordered before anything of the backend's."""
        array[...] = host
        alloc = self.find(array.ctypes.data)
        assert alloc is not None
        alloc.last_write = self._tick(producer)
        alloc.snapshot = alloc.array.tobytes()

    def _merge(self, s: str, other: dict[str, int]) -> None:
        clock = self.clock[s]
        for k, v in other.items():
            clock[k] = max(clock[k], v)

    def alloc_ipc(self, shape, dtype, stream):
        self._not_capturing("an allocation")
        array = self._alloc("symmetric", np.zeros(shape, dtype), symmetric=True)
        self._write(self.find(array.ctypes.data), self._name(stream), "cudaMemsetAsync")
        handle = os.urandom(64)  # cudaIpcMemHandle_t is 64 opaque bytes
        self.world.ipc[handle] = (array.ctypes.data, self.node)
        return array, handle

    def open_ipc(self, handle: bytes) -> int:
        _require(handle, bytes, "handle")
        self.calls.append(("open_ipc",))
        ptr, node = self.world.ipc[handle]
        if node != self.node:
            # cudaIpcOpenMemHandle on another machine: the handle names no memory there.
            raise RuntimeError("cudaErrorInvalidValue: the IPC handle is from another node")
        self.opened.append(ptr)
        return ptr

    def load_module(self, cubin_path: str, source: str):
        self.calls.append(("load_module", os.path.splitext(cubin_path)[1]))
        return compile_host(source)

    def max_coresident_blocks(self, module, kernel, block, shared) -> int:
        return self.coresident

    _CTYPES: ClassVar[dict[type, Any]] = {
        np.uint64: ctypes.c_uint64,
        np.int64: ctypes.c_int64,
        np.int32: ctypes.c_int32,
        np.uint32: ctypes.c_uint32,
        np.float32: ctypes.c_float,
        np.float64: ctypes.c_double,
        np.bool_: ctypes.c_bool,
    }

    def launch(self, module, kernel, grid, block, args, shared_bytes, stream, *, cooperative=False):
        self._settle()
        s = self._name(stream)
        for a in args:
            if type(a) not in self._CTYPES:
                raise TypeError(f"{kernel}: a kernel argument of type {type(a).__name__}")
        if cooperative and grid > self.coresident:
            raise RuntimeError(
                "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: "
                f"{grid} blocks, {self.coresident} co-resident"
            )
        self.calls.append(
            (
                "launch",
                kernel,
                s,
                tuple(type(a).__name__ for a in args),
                tuple(args),
                grid,
                cooperative,
            )
        )
        if not self._recorded(
            s, ("launch", module, kernel, grid, block, tuple(args), shared_bytes)
        ):
            self._run(module, kernel, grid, block, args, shared_bytes, s)

    def _recorded(self, s: str, op: tuple) -> bool:
        """Whether `op`, issued on stream `s`, went into a capture (with its arguments as
        they are now) instead of running."""
        capture = self._captured(s)
        if capture is None:
            return False
        capture.ops.append(op)
        if s != capture.origin:
            capture.work[s] += 1
        return True

    def copy(self, dst, src, stream) -> None:
        self._settle()
        s = self._name(stream)
        self.calls.append(("copy", s))
        if not self._recorded(s, ("copy", dst, src)):
            self._copy(dst, src, s)

    def _copy(self, dst, src, s: str) -> None:
        self._read(self.find(src.ctypes.data), s, "a device-to-device copy")
        np.copyto(dst, src.reshape(dst.shape))
        self._write(self.find(dst.ctypes.data), s, "a device-to-device copy")

    def _run(self, module, kernel, grid, block, args, shared_bytes, s: str) -> None:
        for a in args:
            if type(a) is np.uint64:
                self._read(self.find(int(a)), s, f"kernel {kernel}")
        fn = module.kernel(kernel, *(self._CTYPES[type(a)] for a in args))
        fn(grid, block, *(a.item() for a in args), shared_bytes=shared_bytes)
        for alloc in self.allocations:
            if not alloc.symmetric and alloc.array.tobytes() != alloc.snapshot:
                self._write(alloc, s, f"kernel {kernel}")

    # -- graphs (cupy.cuda.Stream.begin_capture / end_capture, Graph.launch) ---------------

    def begin_capture(self, stream) -> None:
        self._not_capturing("a second capture")
        s = self._name(stream)
        if s == LEGACY:
            raise CaptureError("the legacy default stream cannot capture")
        self.calls.append(("begin_capture", s))
        self.capture = Capture(s, {s})

    def end_capture(self, stream) -> FakeGraph:
        self._settle()
        s = self._name(stream)
        capture = self.capture
        if capture is None or capture.origin != s:
            raise CaptureError(f"stream {s} is not the stream that began the capture")
        self.capture = None
        unjoined = [side for side, n in capture.work.items() if capture.joined.get(side, 0) != n]
        if unjoined:
            raise CaptureError(
                f"cudaErrorStreamCaptureUnjoined: stream(s) {unjoined} forked from the capture "
                "have work the capturing stream never waited for"
            )
        self.calls.append(("end_capture", s, len(capture.ops)))
        return FakeGraph(self, capture.ops)

    def replay(self, graph: FakeGraph, stream) -> None:
        """The graph's work in capture order (an order its dependencies allow), on
        `stream`, with the arguments they had at capture."""
        self._not_capturing("a graph launch")
        s = self._name(stream)
        if graph.device is not self:
            raise CaptureError("a graph of another device")
        self.calls.append(("replay", s, len(graph.ops)))
        graph.replays += 1
        for kind, *op in graph.ops:
            if kind == "launch":
                self._run(*op, s)
            else:
                self._copy(*op, s)

    def stream(self, index: int):
        return self.streams[index]

    def on(self, stream):
        self._name(stream)
        return stream

    def record(self, event: str, stream) -> None:
        self._settle()
        s = self._name(stream)
        self.calls.append(("record", event, s))
        capture = self._captured(s)
        if capture is not None:  # a node of the graph: what waits on it joins the capture
            capture.joins[event] = (s, capture.work[s])
            return
        if self.capture is not None:
            self.capture.joins.pop(event, None)  # recorded again, outside the capture
        self._absorb_host(s)
        self.events[event] = dict(self.clock[s])

    def wait(self, event: str, stream) -> None:
        self._settle()
        s = self._name(stream)
        self.calls.append(("wait", event, s))
        capture = self.capture
        if capture is not None and event in capture.joins:
            capture.streams.add(s)
            side, work = capture.joins[event]
            if s == capture.origin and side != s:
                capture.joined[side] = work
            return
        if capture is not None and s in capture.streams:
            raise CaptureError(
                f"stream {s} is capturing and waits on event {event}, recorded outside the capture"
            )
        if event not in self.events:
            raise KeyError(f"event {event} waited on before it was recorded")
        self._merge(s, self.events[event])

    def sync_streams(self) -> None:
        """The rank's streams (s0, s1) synchronized: work on the legacy stream is not."""
        self._not_capturing("a stream synchronization")
        self.calls.append(("sync_streams",))
        for s in ("s0", "s1"):
            for k, v in list(self.clock[s].items()):
                self.host[k] = max(self.host[k], v)

    def synchronize(self) -> None:
        self._not_capturing("cudaDeviceSynchronize")
        self.calls.append(("synchronize",))
        for clock in list(self.clock.values()):
            for k, v in clock.items():
                self.host[k] = max(self.host[k], v)

    def nccl_unique_id(self) -> bytes:
        return os.urandom(128)

    def nccl_comm(self, unique_id, size, rank):
        return FakeNcclCommunicator(size, unique_id, rank, device=self)

    def nccl(self, call: str, comm, stream, **kw) -> None:
        """What CupyDevice.nccl does (the same code): arrays become addresses, the stream
        its handle."""
        self._not_capturing("an NCCL call (not modelled in a capture)")
        self.calls.append(("nccl", call, self._name(stream), kw.get("count"), kw.get("dtype")))
        call_nccl(comm, call, self.address, stream.ptr, **kw)

    @contextlib.contextmanager
    def group(self):
        self.group_ops = []
        yield
        ops, self.group_ops = self.group_ops, None
        comm, self.group_comm = self.group_comm, None
        if comm is None:
            return
        # every member of the communicator joins the group and posts what it sends
        sends = {int(peer): data for kind, peer, data in ops if kind == "send"}
        posted = comm._exchange(sends)
        for kind, peer, x in ops:
            if kind == "recv":
                address, s, nbytes = x
                data = posted[int(peer)].get(comm.rank)
                # NCCL pairs a recv with the peer's send of as many bytes, or hangs
                if data is None or data.nbytes != nbytes:
                    got = "nothing" if data is None else f"{data.nbytes} bytes"
                    raise NcclError(
                        f"recv of {nbytes} bytes from rank {int(peer)}, which sent {got}"
                    )
                self.write_bytes(address, data, s)

    def close_peers(self) -> None:
        self.synchronize()
        self.opened.clear()

    def close(self) -> None:
        self.synchronize()
        self.closed = True


# ---------------------------------------------------------------------------------------------
# Ranks as threads, each on its own strict GPU
# ---------------------------------------------------------------------------------------------


def on_fake_gpus(
    plan: Any,
    ranks: int,
    body: Callable[[int, PlanRunner, CudaBackend], Any],
    *,
    gpus: int | None = None,
    nodes: tuple[int, ...] = (),
    device_options: dict | None = None,
    backend_class: type[CudaBackend] = CudaBackend,
    exact: bool = False,
    close: bool = True,
    timeout: float = 300,
) -> list[Any]:
    """`body(rank, runner, backend)` on `ranks` threads, each a runner set up on `plan` over a
    CudaBackend on its own StrictDevice (`gpus` GPUs in all, shared round-robin as
    CupyDevice.for_rank assigns them; rank r's GPU in machine `nodes[r]`): what each returned,
    in rank order. A rank's failure is raised; a rank still running at `timeout` fails."""
    gpus = ranks if gpus is None else gpus
    world, cid = FakeWorld(), uuid.uuid4().hex
    results: list[Any] = [None] * ranks
    errors: list[BaseException] = []

    def main(r: int) -> None:
        try:
            device = StrictDevice(
                world,
                bus=f"0000:{r % gpus + 1:02x}:00.0",
                device_id=r % gpus,
                node=nodes[r] if nodes else 0,
                **(device_options or {}),
            )
            comm = InProcessComm(world, cid, list(range(ranks)), r)
            backend = backend_class(device, comm, exact_collectives=exact, mpi=IN_PROCESS_MPI)
            runner = PlanRunner(plan, r, backend)
            runner.setup()
            results[r] = body(r, runner, backend)
            if close:
                runner.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), f"a rank still ran after {timeout} s"
    return results
