"""Ranks as threads of one process: an in-process stand-in for MPI.

`InProcessWorld(size).comm(rank)` gives each thread the part of mpi4py's `Comm` the runtime
uses (ranks, object collectives, splits, the non-blocking buffer collectives of
`MpiTransport`, point-to-point), and `IN_PROCESS_MPI` stands in for the `mpi4py.MPI` module.
So the threaded executor (runtime/threaded.py) is N ordinary plan runners over the cpu
backend, not a second implementation of plans and collectives.

Collective calls rendezvous on a board keyed by (communicator, call number); a rank that
fails marks the world failed, and every rank waiting on it raises instead of hanging.
"""

from __future__ import annotations

import functools
import itertools
import operator
import threading
from collections import defaultdict
from typing import Any

import numpy as np

from coconet.core.program import CocoError
from coconet.dialects.reduction import Reduction

# How long a rank waits for its peers at one rendezvous before the job counts as hung.
RENDEZVOUS_TIMEOUT_S = 120.0

# Python objects (mpi4py's lowercase allreduce): folded in rank order.
_FOLD = {
    Reduction.SUM: operator.add,
    Reduction.PROD: operator.mul,
    Reduction.MAX: max,
    Reduction.MIN: min,
}


def fold(op: Reduction, values: list[Any]) -> Any:
    """The ranks' `values` (Python objects, in rank order) combined by `op`."""
    return functools.reduce(_FOLD[op], values)


_REDUCE = {
    Reduction.SUM: np.add,
    Reduction.PROD: np.multiply,
    Reduction.MAX: np.maximum,
    Reduction.MIN: np.minimum,
}


class PeerFailed(CocoError):
    """Another rank of the in-process job failed: this one stops too."""


class InProcessWorld:
    """What the rank threads of one job share."""

    def __init__(self, size: int):
        self.size = size
        self.cond = threading.Condition()
        self.slots: dict[tuple, dict[int, Any]] = {}
        self.mailbox: dict[tuple, list[np.ndarray]] = defaultdict(list)
        self.failed: str | None = None
        self._ids = itertools.count()

    def comm(self, rank: int) -> InProcessComm:
        return InProcessComm(self, "world", list(range(self.size)), rank)

    def fail(self, message: str) -> None:
        with self.cond:
            if self.failed is None:
                self.failed = message
            self.cond.notify_all()

    def _wait(self, ready, what: str) -> None:
        """Wait (holding self.cond) until `ready()`; a failed peer or a timeout raises."""
        ok = self.cond.wait_for(lambda: ready() or self.failed is not None, RENDEZVOUS_TIMEOUT_S)
        if self.failed is not None:
            raise PeerFailed(f"a peer rank failed: {self.failed}")
        if not ok:
            raise CocoError(f"in-process ranks: {what} timed out after {RENDEZVOUS_TIMEOUT_S} s")

    def exchange(self, key: tuple, index: int, size: int, value: Any) -> list[Any]:
        with self.cond:
            slot = self.slots.setdefault(key, {})
            slot[index] = value
            self.cond.notify_all()
            self._wait(lambda: len(slot) == size, f"collective {key}")
            return [slot[i] for i in range(size)]

    def post(self, key: tuple, data: np.ndarray) -> None:
        with self.cond:
            self.mailbox[key].append(data)
            self.cond.notify_all()

    def take(self, key: tuple) -> np.ndarray:
        with self.cond:
            self._wait(lambda: bool(self.mailbox[key]), f"receive {key}")
            return self.mailbox[key].pop(0)


class InProcessRequest:
    """An mpi4py request: waiting finishes the operation (the rendezvous happens then)."""

    def __init__(self, finish=None):
        self.finish = finish

    def Wait(self) -> None:
        if self.finish is not None:
            finish, self.finish = self.finish, None
            finish()

    def Test(self) -> bool:
        self.Wait()
        return True


class _Request:
    @staticmethod
    def Waitall(requests: list[InProcessRequest]) -> None:
        for r in requests:
            r.Wait()

    @staticmethod
    def Testall(requests: list[InProcessRequest]) -> bool:
        _Request.Waitall(requests)
        return True


class InProcessMPI:
    """What the runtime uses of the `mpi4py.MPI` module, for ranks that are threads."""

    SUM, PROD, MAX, MIN = Reduction.SUM, Reduction.PROD, Reduction.MAX, Reduction.MIN
    COMM_TYPE_SHARED = "shared"
    Request = _Request


IN_PROCESS_MPI = InProcessMPI()


class InProcessComm:
    """mpi4py's `Comm`, as far as coconet uses it, between the threads of one world.
    `members` are the world ranks of this communicator in its rank order."""

    def __init__(self, world: InProcessWorld, cid: str, members: list[int], rank: int):
        self.world, self.cid, self.members, self.world_rank = world, cid, members, rank
        self.seq = 0

    def Get_rank(self) -> int:
        return self.members.index(self.world_rank)

    def Get_size(self) -> int:
        return len(self.members)

    # -- object collectives --------------------------------------------------------------------

    def allgather(self, value: Any) -> list[Any]:
        self.seq += 1
        return self.world.exchange((self.cid, self.seq), self.Get_rank(), self.Get_size(), value)

    def allreduce_flag(self, flag: int) -> int:
        """The largest of every rank's small integer `flag` (TorchComm's numeric agreement;
        here the threads' exchange itself, not an object allgather)."""
        self.seq += 1
        key, me, size = (self.cid, self.seq), self.Get_rank(), self.Get_size()
        return max(self.world.exchange(key, me, size, int(flag)))

    def bcast(self, value: Any, root: int = 0) -> Any:
        return self.allgather(value)[root]

    def gather(self, value: Any, root: int = 0) -> list[Any] | None:
        everything = self.allgather(value)
        return everything if self.Get_rank() == root else None

    def allreduce(self, value: Any, op: Reduction = Reduction.SUM) -> Any:
        return fold(op, self.allgather(value))

    def Barrier(self) -> None:
        self.allgather(None)

    def Split(self, color: int, key: int = 0) -> InProcessComm:
        infos = self.allgather((color, key, self.world_rank))
        members = [
            r for c, k, r in sorted((i for i in infos if i[0] == color), key=lambda i: i[1:])
        ]
        return InProcessComm(self.world, f"{self.cid}/{self.seq}/{color}", members, self.world_rank)

    def Split_type(self, split_type: Any, key: int = 0) -> InProcessComm:
        return self.Split(0, key)  # one process: one node

    def Free(self) -> None:
        pass

    def Abort(self, code: int = 1) -> None:
        self.world.fail(f"rank {self.world_rank} aborted with status {code}")
        raise PeerFailed(f"rank {self.world_rank} aborted the job (status {code})")

    # -- non-blocking collectives on host arrays (what MpiTransport calls) ---------------------

    def _collective(self, send: np.ndarray | None, finish) -> InProcessRequest:
        self.seq += 1
        key, me, n = (self.cid, self.seq), self.Get_rank(), self.Get_size()
        payload = None if send is None else np.array(send, copy=True)
        return InProcessRequest(lambda: finish(self.world.exchange(key, me, n, payload)))

    def Iallreduce(self, src: np.ndarray, dst: np.ndarray, op: Reduction) -> InProcessRequest:
        def finish(parts):
            acc = parts[0]
            for p in parts[1:]:
                acc = _REDUCE[op](acc, p)
            dst[...] = acc

        return self._collective(src, finish)

    def Allreduce(self, src: np.ndarray, dst: np.ndarray, op: Reduction) -> None:
        self.Iallreduce(src, dst, op).Wait()

    def Ireduce_scatter_block(self, packed, dst, op) -> InProcessRequest:
        me = self.Get_rank()

        def finish(parts):
            acc = parts[0][me]
            for p in parts[1:]:
                acc = _REDUCE[op](acc, p[me])
            dst.reshape(-1)[...] = acc.reshape(-1)

        return self._collective(packed, finish)

    def Iallgather(self, piece, out) -> InProcessRequest:
        return self._collective(piece, lambda parts: out.__setitem__(..., np.concatenate(parts)))

    def Ialltoall(self, packed, out) -> InProcessRequest:
        me, n = self.Get_rank(), self.Get_size()

        def finish(parts):
            out.reshape(n, -1)[...] = np.stack([p.reshape(n, -1)[me] for p in parts])

        return self._collective(packed, finish)

    def Ialltoallv(self, send_spec, recv_spec) -> InProcessRequest:
        """mpi4py's `[buffer, (counts, displacements)]` specs, in elements of the buffers."""
        send, (send_counts, send_displs) = send_spec
        recv, (recv_counts, recv_displs) = recv_spec
        me = self.Get_rank()

        def finish(parts):
            for j, (data, counts, displs) in enumerate(parts):
                assert counts[me] == recv_counts[j], "alltoallv counts disagree"
                run = data.reshape(-1)[displs[me] : displs[me] + counts[me]]
                recv.reshape(-1)[recv_displs[j] : recv_displs[j] + recv_counts[j]] = run

        self.seq += 1
        key, n = (self.cid, self.seq), self.Get_size()
        payload = (np.array(send, copy=True), list(send_counts), list(send_displs))
        return InProcessRequest(lambda: finish(self.world.exchange(key, me, n, payload)))

    def Ibcast(self, buf, root: int = 0) -> InProcessRequest:
        return self._collective(buf, lambda parts: buf.__setitem__(..., parts[root]))

    def Ireduce(self, src, dst, op, root: int = 0) -> InProcessRequest:
        def finish(parts):
            if dst is not None:
                acc = parts[0]
                for p in parts[1:]:
                    acc = _REDUCE[op](acc, p)
                dst[...] = acc

        return self._collective(src, finish)

    def Igather(self, piece, out, root: int = 0) -> InProcessRequest:
        def finish(parts):
            if out is not None:
                out[...] = np.concatenate(parts)

        return self._collective(piece, finish)

    def Isend(self, buf, dest: int, tag: int = 0) -> InProcessRequest:
        key = (self.cid, self.world_rank, self.members[dest], tag)
        self.world.post(key, np.array(buf, copy=True))
        return InProcessRequest()

    def Irecv(self, buf, source: int, tag: int = 0) -> InProcessRequest:
        key = (self.cid, self.members[source], self.world_rank, tag)

        def finish():
            buf[...] = self.world.take(key)

        return InProcessRequest(finish)
