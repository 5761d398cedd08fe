"""Symmetric host memory for the cpu backend's fused collective kernels: each rank of a node
allocates a segment and learns the address of every peer's, so kernels load and store peers'
buffers directly.

* `MpiWindows`: MPI-3 shared-memory windows (`MPI.Win.Allocate_shared` + `Shared_query`), for
  jobs launched by mpiexec.
* `PosixSegments`: POSIX shared memory (`multiprocessing.shared_memory`), names exchanged over
  the node communicator, for jobs without MPI (torchrun).
Both return this rank's segment as a byte array and the node's addresses in node-rank order.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from coconet.core import values as V
from coconet.core.program import CocoError


class MpiWindows:
    def __init__(self, mpi: Any):
        self.MPI = mpi
        self.windows: list[Any] = []

    def allocate(self, node: Any, nbytes: int) -> tuple[np.ndarray, list[int]]:
        MPI = self.MPI
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")
        try:
            win = MPI.Win.Allocate_shared(max(nbytes, 64), 1, info, comm=node)
        finally:
            info.Free()
        self.windows.append(win)
        mine = np.frombuffer(win.tomemory(), dtype=np.uint8, count=nbytes)
        peers = []
        for q in range(node.Get_size()):
            peer_mem, _ = win.Shared_query(q)
            peers.append(MPI.buffer(peer_mem).address)
        return mine, peers

    def close(self) -> None:
        for win in self.windows:
            win.Free()
        self.windows.clear()


def _address(segment: shared_memory.SharedMemory) -> int:
    buf = segment.buf
    assert buf is not None  # an open segment
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


# The names of the segments this process made (several ranks share a process as threads).
_CREATED_HERE: set[str] = set()


class PosixSegments:
    def __init__(self) -> None:
        self.own: list[shared_memory.SharedMemory] = []
        self.attached: list[shared_memory.SharedMemory] = []

    def allocate(self, node: Any, nbytes: int) -> tuple[np.ndarray, list[int]]:
        segment = shared_memory.SharedMemory(
            create=True, size=max(nbytes, 64), name=f"coconet-{uuid.uuid4().hex[:20]}"
        )
        self.own.append(segment)
        _CREATED_HERE.add(segment.name)
        names = node.allgather(segment.name)
        me = node.Get_rank()
        peers = []
        for q, name in enumerate(names):
            if q == me:
                peers.append(_address(segment))
                continue
            peer = shared_memory.SharedMemory(name=name)
            # Python < 3.13 registers attached segments with this process's resource tracker,
            # which would unlink the owner's segment when this process exits. A segment made
            # in this process (ranks as threads) is the owner's own registration: leave it,
            # or the owner's unlink finds the tracker without it (a KeyError it prints).
            if name not in _CREATED_HERE:
                _untrack(peer)
            self.attached.append(peer)
            peers.append(_address(peer))
        # Every peer has mapped it: remove the name now, so nothing is left behind in /dev/shm
        # however the job ends (the memory lives until the last process unmaps it).
        node.Barrier()
        segment.unlink()
        buf = segment.buf
        assert buf is not None  # an open segment
        mine = np.frombuffer(buf, dtype=np.uint8, count=nbytes)
        return mine, peers

    def close(self) -> None:
        """After a node barrier: every peer is done with this rank's segments."""
        for peer in self.attached:
            _close(peer)
        for segment in self.own:
            _CREATED_HERE.discard(segment.name)
            _close(segment)
        self.attached.clear()
        self.own.clear()


# Segments a caller still holds arrays of (CompiledProgram.input_buffer) at close: unmapped
# when the process ends. Their names are unlinked already, so nothing stays in /dev/shm.
_STILL_MAPPED: list[shared_memory.SharedMemory] = []


def _close(segment: shared_memory.SharedMemory) -> None:
    try:
        segment.close()
    except BufferError:  # exported: a caller's array still views it
        _STILL_MAPPED.append(segment)


def _untrack(segment: shared_memory.SharedMemory) -> None:
    from multiprocessing import resource_tracker

    # tracking only cleans up after crashes: never let it fail an allocation
    with contextlib.suppress(Exception):
        resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# Nodes: which ranks share memory
# ---------------------------------------------------------------------------------------------

RANKS_PER_NODE_ENV = "COCONET_RANKS_PER_NODE"


def declared_ranks_per_node() -> int | None:
    """COCONET_RANKS_PER_NODE: consecutive ranks grouped into nodes of this many, in place of
    the machine's own split (so one machine can run a job as several "nodes"); None unset."""
    text = os.environ.get(RANKS_PER_NODE_ENV, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise CocoError(
            f"[ranks-per-node] {RANKS_PER_NODE_ENV} must be a positive integer, got '{text}'"
        )
    return value


def declared_nodes(size: int) -> tuple[int, ...]:
    """The node of every rank of a job of `size` ranks on one machine, or as
    COCONET_RANKS_PER_NODE declares it: what `job_nodes` finds there, known before launch."""
    per_node = declared_ranks_per_node()
    nodes = V.nodes_of(size, per_node) if per_node is not None else ()
    return nodes if len(set(nodes)) > 1 else ()


def job_nodes(comm: Any, mpi: Any) -> tuple[int, ...]:
    """The node of every rank of the job (collective): the declared split, else the ranks that
    share memory (MPI's COMM_TYPE_SHARED), nodes numbered in the order of their first rank;
    () when one node holds every rank."""
    if declared_ranks_per_node() is not None:
        return declared_nodes(comm.Get_size())
    node = comm.Split_type(mpi.COMM_TYPE_SHARED, key=comm.Get_rank())
    leader = min(node.allgather(comm.Get_rank()))
    node.Free()
    leaders = comm.allgather(leader)
    numbering = {lead: k for k, lead in enumerate(dict.fromkeys(leaders))}
    nodes = tuple(numbering[lead] for lead in leaders)
    return nodes if len(set(nodes)) > 1 else ()


def node_communicator(comm: Any, mpi: Any, nodes: tuple[int, ...]) -> Any:
    """The communicator of this rank's node as the plan declares it (`nodes`), else the ranks
    that share memory (collective)."""
    rank = comm.Get_rank()
    if nodes:
        return comm.Split(nodes[rank], rank)
    return comm.Split_type(mpi.COMM_TYPE_SHARED, key=rank)
