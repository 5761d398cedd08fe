"""How the bytes of a library collective move between the members of one group.

A `Transport` is the small interface every library collective is written against once
(runtime/collectives.py): all_reduce, reduce_scatter, all_gather, all_to_all, broadcast,
reduce, gather and a point-to-point exchange over the contiguous arrays of one communicator.
Three implementations:

* `MpiTransport` -- host arrays, mpi4py's non-blocking calls (the cpu backend). Returns the MPI
  requests to wait on, so communication overlaps the compute steps that follow it.
* `NcclTransport` -- device arrays, NCCL on a stream (the cuda backend when every rank has a
  GPU of its own). Stream-ordered: nothing to wait on.
* `HostStagedTransport` -- device arrays moved through host copies and MPI (the cuda backend
  when ranks share a GPU: NCCL refuses two ranks on one device, "Duplicate GPU detected").
  The stream is synchronized before the copy out and the result copied back on it.

Reductions: a transport says which (dtype, kind) its library may combine itself
(`reduces`); the collectives fall back to moving the pieces and combining them in rank order
for the rest, and for everything when the user asked for exact collectives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from coconet.core.program import CocoError
from coconet.core.values import NUMPY_DTYPES
from coconet.dialects.reduction import Reduction

# What a transport call returns: MPI requests to wait on (a list), or None when the call is
# already ordered (a stream) or complete.
Request = list[Any] | None

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
NCCL_OPS = {Reduction.SUM: 0, Reduction.PROD: 1, Reduction.MAX: 2, Reduction.MIN: 3}


def is_bf16(dtype: np.dtype) -> bool:
    return np.dtype(dtype) == NUMPY_DTYPES["bf16"]


def nccl_dtype(dtype: np.dtype) -> int:
    """NCCL's datatype for elements of (logical) `dtype`; i1 travels as 0/1 bytes."""
    dtype = np.dtype(dtype)
    if is_bf16(dtype):
        return NCCL_DTYPES["bfloat16"]
    if dtype == np.bool_:
        return NCCL_DTYPES["uint8"]
    if dtype.name not in NCCL_DTYPES:
        raise CocoError(f"NCCL cannot move elements of dtype {dtype.name}")
    return NCCL_DTYPES[dtype.name]


def nccl_op(kind: Reduction, dtype: np.dtype) -> int:
    if np.dtype(dtype) == np.bool_:  # i1: sum is or, prod is and (the sim's semantics) on 0/1
        return NCCL_OPS[
            {Reduction.SUM: Reduction.MAX, Reduction.PROD: Reduction.MIN}.get(kind, kind)
        ]
    return NCCL_OPS[kind]


def count_of(array: Any) -> int:
    return int(np.prod(array.shape, dtype=np.int64))


class Transport(Protocol):
    """One group's library collectives (see the module docstring). Arrays are C-contiguous;
    `dtype` is the logical element type (bf16 may be stored as its uint16 bit pattern);
    ranks are this group's member indices."""

    xp: Any

    def size(self) -> int: ...

    def rank(self) -> int: ...

    def reduces(self, dtype: np.dtype, kind: Reduction) -> bool:
        """Whether the library itself may combine elements of `dtype` with `kind`."""
        ...

    def all_reduce(self, src: Any, dst: Any, kind: Reduction, dtype: np.dtype) -> Request: ...

    def all_reduce_call(self, src: Any, dst: Any, kind: Reduction) -> Callable[[], None] | None:
        """The all_reduce of `src` into `dst` as one blocking call, bound once and made every
        step (the microsecond regime: no request to build, test and wait on); None where the
        library has no blocking form."""
        ...

    def reduce_scatter(self, packed: Any, dst: Any, kind: Reduction, dtype: np.dtype) -> Request:
        """`packed` is (size, n): row m is member m's block; `dst` gets n reduced elements."""
        ...

    def all_gather(self, piece: Any, out: Any) -> Request:
        """`out` holds size pieces, in member order."""
        ...

    def all_to_all(self, packed: Any, out: Any) -> Request:
        """Row m of `packed` goes to member m; row m of `out` comes from member m."""
        ...

    def all_to_all_v(
        self, send: Any, send_counts: list[int], recv: Any, recv_counts: list[int]
    ) -> Request:
        """Uneven all_to_all (MPI_Alltoallv) of 1-D arrays holding one run per member in
        member order: the next `send_counts[m]` elements of `send` go to member m, the next
        `recv_counts[m]` of `recv` come from it."""
        ...

    def broadcast(self, buf: Any, root: int) -> Request: ...

    def reduce(
        self, src: Any, dst: Any | None, kind: Reduction, dtype: np.dtype, root: int
    ) -> Request:
        """`dst` is read only on the root (None elsewhere)."""
        ...

    def gather(self, piece: Any, out: Any | None, root: int) -> Request:
        """`out` (size pieces) only on the root (None elsewhere)."""
        ...

    def exchange(
        self, send: Any | None, dest: int | None, recv: Any | None, source: int | None
    ) -> Request:
        """Send `send` to member `dest` and receive `recv` from member `source`, at once."""
        ...


# ---------------------------------------------------------------------------------------------
# MPI on host arrays
# ---------------------------------------------------------------------------------------------

_MPI_TAG = 77


def as_bytes(a: np.ndarray) -> np.ndarray:
    """A byte view of a C-contiguous array (MPI has no bf16 datatype; bytes move any dtype)."""
    return a.reshape(-1).view(np.uint8)


class MpiTransport:
    """`Transport` over an mpi4py communicator and host (NumPy) arrays."""

    xp = np

    def __init__(self, comm: Any, mpi: Any = None):
        if mpi is None:
            from mpi4py import MPI as mpi
        self.MPI = mpi
        self.comm = comm
        self._reduces: dict[tuple[Any, str], bool] = {}
        self._ops: dict[str, Any] | None = None

    def size(self) -> int:
        return self.comm.Get_size()

    def rank(self) -> int:
        return self.comm.Get_rank()

    def reduces(self, dtype: np.dtype, kind: Reduction) -> bool:
        # MPI reduces in the data's precision in its own order: integers are exact whatever the
        # order; f32/f64 sums and products are within tolerance. f16/bf16 have no MPI type,
        # i1's or/and are the sim's, and max/min of floats must propagate NaN as the sim does.
        # (Answered once per (dtype, kind): every collective step asks.)
        key = (dtype, kind)
        known = self._reduces.get(key)
        if known is None:
            dtype = np.dtype(dtype)
            known = dtype in (np.dtype(np.int32), np.dtype(np.int64)) or (
                dtype in (np.dtype(np.float32), np.dtype(np.float64))
                and kind in (Reduction.SUM, Reduction.PROD)
            )
            self._reduces[key] = known
        return known

    def _op(self, kind: Reduction) -> Any:
        if self._ops is None:
            MPI = self.MPI
            self._ops = {
                Reduction.SUM: MPI.SUM,
                Reduction.PROD: MPI.PROD,
                Reduction.MAX: MPI.MAX,
                Reduction.MIN: MPI.MIN,
            }
        return self._ops[kind]

    def all_reduce(self, src, dst, kind, dtype) -> Request:
        return [self.comm.Iallreduce(src, dst, self._op(kind))]

    def all_reduce_call(self, src, dst, kind) -> Callable[[], None]:
        return functools.partial(self.comm.Allreduce, src, dst, self._op(kind))

    def reduce_scatter(self, packed, dst, kind, dtype) -> Request:
        return [self.comm.Ireduce_scatter_block(packed, dst, self._op(kind))]

    def all_gather(self, piece, out) -> Request:
        return [self.comm.Iallgather(as_bytes(piece), as_bytes(out))]

    def all_to_all(self, packed, out) -> Request:
        return [self.comm.Ialltoall(as_bytes(packed), as_bytes(out))]

    def all_to_all_v(self, send, send_counts, recv, recv_counts) -> Request:
        size = send.dtype.itemsize  # in bytes: MPI has no bf16 datatype
        return [
            self.comm.Ialltoallv(
                [as_bytes(send), _counts_displs(send_counts, size)],
                [as_bytes(recv), _counts_displs(recv_counts, size)],
            )
        ]

    def broadcast(self, buf, root) -> Request:
        return [self.comm.Ibcast(as_bytes(buf), root=root)]

    def reduce(self, src, dst, kind, dtype, root) -> Request:
        return [self.comm.Ireduce(src, dst, self._op(kind), root=root)]

    def gather(self, piece, out, root) -> Request:
        return [
            self.comm.Igather(as_bytes(piece), as_bytes(out) if out is not None else None, root)
        ]

    def exchange(self, send, dest, recv, source) -> Request:
        reqs = []
        if recv is not None:
            reqs.append(self.comm.Irecv(as_bytes(recv), source=source, tag=_MPI_TAG))
        if send is not None:
            reqs.append(self.comm.Isend(as_bytes(send), dest=dest, tag=_MPI_TAG))
        return reqs


def _counts_displs(counts: list[int], itemsize: int) -> tuple[list[int], list[int]]:
    """Byte counts and displacements of runs packed one after another."""
    displs, offset = [], 0
    for c in counts:
        displs.append(offset * itemsize)
        offset += c
    return [c * itemsize for c in counts], displs


# ---------------------------------------------------------------------------------------------
# NCCL on a stream
# ---------------------------------------------------------------------------------------------


def _byte_view(xp: Any, a: Any) -> Any:
    return a.reshape(-1).view(xp.uint8)


class NcclTransport:
    """`Transport` over an NCCL communicator: every call is enqueued on `stream` through the
    device (runtime/cuda.py `Device.nccl`), so it is ordered like the rest of the stream."""

    def __init__(self, device: Any, comm: Any, size: int, rank: int, stream: Any):
        self.device = device
        self.xp = device.xp
        self.comm = comm
        self._size = size
        self._rank = rank
        self.stream = stream

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def reduces(self, dtype: np.dtype, kind: Reduction) -> bool:
        dtype = np.dtype(dtype)
        return is_bf16(dtype) or dtype == np.bool_ or dtype.name in NCCL_DTYPES

    def _call(self, call: str, **kw: Any) -> Request:
        self.device.nccl(call, self.comm, self.stream, **kw)
        return None

    def _reduction(self, call: str, src, dst, kind, dtype, count, **kw) -> Request:
        return self._call(
            call,
            src=src,
            dst=dst,
            count=count,
            dtype=nccl_dtype(dtype),
            op=nccl_op(kind, dtype),
            **kw,
        )

    def all_reduce(self, src, dst, kind, dtype) -> Request:
        return self._reduction("all_reduce", src, dst, kind, dtype, count_of(src))

    def all_reduce_call(self, src, dst, kind) -> None:
        return None  # (enqueued on a stream: no blocking form)

    def reduce_scatter(self, packed, dst, kind, dtype) -> Request:
        return self._reduction("reduce_scatter", packed, dst, kind, dtype, count_of(dst))

    def all_gather(self, piece, out) -> Request:
        src = _byte_view(self.xp, piece)
        return self._call(
            "all_gather",
            src=src,
            dst=_byte_view(self.xp, out),
            count=count_of(src),
            dtype=NCCL_DTYPES["uint8"],
        )

    def broadcast(self, buf, root) -> Request:
        b = _byte_view(self.xp, buf)
        return self._call(
            "broadcast", src=b, dst=b, count=count_of(b), dtype=NCCL_DTYPES["uint8"], root=root
        )

    def reduce(self, src, dst, kind, dtype, root) -> Request:
        # NCCL reads the receive buffer only on the root; elsewhere it may be the send buffer.
        return self._reduction(
            "reduce", src, src if dst is None else dst, kind, dtype, count_of(src), root=root
        )

    def _point_to_point(self, pairs: list[tuple[str, Any, int]]) -> Request:
        with self.device.group():
            for call, array, peer in pairs:
                b = _byte_view(self.xp, array)
                key = "src" if call == "send" else "dst"
                self.device.nccl(
                    call,
                    self.comm,
                    self.stream,
                    **{key: b},
                    count=count_of(b),
                    dtype=NCCL_DTYPES["uint8"],
                    peer=peer,
                )
        return None

    def all_to_all(self, packed, out) -> Request:
        pairs: list[tuple[str, Any, int]] = []
        for m in range(self._size):
            pairs.append(("send", packed[m], m))
            pairs.append(("recv", out[m], m))
        return self._point_to_point(pairs)

    def all_to_all_v(self, send, send_counts, recv, recv_counts) -> Request:
        pairs: list[tuple[str, Any, int]] = []
        sent = received = 0
        for m in range(self._size):
            # an empty run on one side is empty on the other: neither posts a call
            if send_counts[m]:
                pairs.append(("send", send[sent : sent + send_counts[m]], m))
            if recv_counts[m]:
                pairs.append(("recv", recv[received : received + recv_counts[m]], m))
            sent += send_counts[m]
            received += recv_counts[m]
        return self._point_to_point(pairs) if pairs else None

    def gather(self, piece, out, root) -> Request:
        pairs: list[tuple[str, Any, int]] = [("send", piece, root)]
        if out is not None:
            pairs += [("recv", out[m], m) for m in range(self._size)]
        return self._point_to_point(pairs)

    def exchange(self, send, dest, recv, source) -> Request:
        pairs: list[tuple[str, Any, int]] = []
        if send is not None:
            pairs.append(("send", send, dest))
        if recv is not None:
            pairs.append(("recv", recv, source))
        return self._point_to_point(pairs) if pairs else None


# ---------------------------------------------------------------------------------------------
# MPI through host copies, for ranks that share a GPU
# ---------------------------------------------------------------------------------------------


class HostStagedTransport:
    """`Transport` for device arrays over MPI: each call waits for `stream` (the data is
    final), copies its inputs to the host, runs the MPI call to completion and copies the
    results back on `stream`. Slow, but it needs no NCCL: ranks that share one GPU work."""

    def __init__(self, device: Any, mpi: MpiTransport, stream: Any):
        self.device = device
        self.xp = device.xp
        self.mpi = mpi
        self.stream = stream

    def size(self) -> int:
        return self.mpi.size()

    def rank(self) -> int:
        return self.mpi.rank()

    def reduces(self, dtype: np.dtype, kind: Reduction) -> bool:
        return self.mpi.reduces(dtype, kind)

    def _host(self, array: Any | None) -> np.ndarray | None:
        return None if array is None else self.device.download(array, self.stream)

    @staticmethod
    def _scratch(array: Any | None) -> np.ndarray | None:
        return None if array is None else np.empty(array.shape, np.dtype(array.dtype))

    def _finish(self, reqs: Request, outs: list[tuple[Any, np.ndarray | None]]) -> Request:
        if reqs:
            self.mpi.MPI.Request.Waitall(reqs)
        for device_array, host in outs:
            if device_array is not None and host is not None:
                self.device.copy_from_host(device_array, host, self.stream)
        return None

    def _in_out(self, src: Any, dst: Any | None, call) -> Request:
        host_src, host_dst = self._host(src), self._scratch(dst)
        return self._finish(call(host_src, host_dst), [(dst, host_dst)])

    def all_reduce(self, src, dst, kind, dtype) -> Request:
        return self._in_out(src, dst, lambda s, d: self.mpi.all_reduce(s, d, kind, dtype))

    def all_reduce_call(self, src, dst, kind) -> None:
        return None  # (enqueued on a stream: no blocking form)

    def reduce_scatter(self, packed, dst, kind, dtype) -> Request:
        return self._in_out(packed, dst, lambda s, d: self.mpi.reduce_scatter(s, d, kind, dtype))

    def all_gather(self, piece, out) -> Request:
        return self._in_out(piece, out, self.mpi.all_gather)

    def all_to_all(self, packed, out) -> Request:
        return self._in_out(packed, out, self.mpi.all_to_all)

    def all_to_all_v(self, send, send_counts, recv, recv_counts) -> Request:
        return self._in_out(
            send, recv, lambda s, d: self.mpi.all_to_all_v(s, send_counts, d, recv_counts)
        )

    def broadcast(self, buf, root) -> Request:
        host = self._host(buf)
        assert host is not None
        return self._finish(self.mpi.broadcast(host, root), [(buf, host)])

    def reduce(self, src, dst, kind, dtype, root) -> Request:
        return self._in_out(src, dst, lambda s, d: self.mpi.reduce(s, d, kind, dtype, root))

    def gather(self, piece, out, root) -> Request:
        return self._in_out(piece, out, lambda s, d: self.mpi.gather(s, d, root))

    def exchange(self, send, dest, recv, source) -> Request:
        host_send, host_recv = self._host(send), self._scratch(recv)
        return self._finish(
            self.mpi.exchange(host_send, dest, host_recv, source), [(recv, host_recv)]
        )
