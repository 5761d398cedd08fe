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
import uuid
from multiprocessing import shared_memory
from typing import Any

import numpy as np


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
    return int(np.frombuffer(segment.buf, dtype=np.uint8).ctypes.data)


class PosixSegments:
    def __init__(self) -> None:
        self.own: list[shared_memory.SharedMemory] = []
        self.attached: list[shared_memory.SharedMemory] = []

    def allocate(self, node: Any, nbytes: int) -> tuple[np.ndarray, list[int]]:
        segment = shared_memory.SharedMemory(
            create=True, size=max(nbytes, 64), name=f"coconet-{uuid.uuid4().hex[:20]}"
        )
        self.own.append(segment)
        names = node.allgather(segment.name)
        me = node.Get_rank()
        peers = []
        for q, name in enumerate(names):
            if q == me:
                peers.append(_address(segment))
                continue
            peer = shared_memory.SharedMemory(name=name)
            # Python < 3.13 registers attached segments with this process's resource tracker,
            # which would unlink the owner's segment when this process exits.
            _untrack(peer)
            self.attached.append(peer)
            peers.append(_address(peer))
        # Every peer has mapped it: remove the name now, so nothing is left behind in /dev/shm
        # however the job ends (the memory lives until the last process unmaps it).
        node.Barrier()
        segment.unlink()
        mine = np.frombuffer(segment.buf, dtype=np.uint8, count=nbytes)
        return mine, peers

    def close(self) -> None:
        """After a node barrier: every peer is done with this rank's segments."""
        for peer in self.attached:
            peer.close()
        for segment in self.own:
            segment.close()
        self.attached.clear()
        self.own.clear()


def _untrack(segment: shared_memory.SharedMemory) -> None:
    from multiprocessing import resource_tracker

    # tracking only cleans up after crashes: never let it fail an allocation
    with contextlib.suppress(Exception):
        resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
