"""A job launched by `torchrun`: the process group of `torch.distributed` as the communicator.

The runtime is written against the part of mpi4py's `Comm` it needs (ranks, object
collectives, splits, the non-blocking buffer collectives of `MpiTransport`, point-to-point).
`TorchComm` provides that part over a `torch.distributed` group (gloo for host memory), and
`TORCH_MPI` stands in for the `mpi4py.MPI` module (reduction ops, `Request.Waitall`), so the
same transport and backends run under `torchrun` with no MPI installed:

    torchrun --nproc-per-node 2 train.py      # coconet.compile(...) inside

Groups: `Split` creates one `torch.distributed.new_group` per color, called by every rank of
the parent in the same order (torch requires it). Symmetric memory for fused kernels comes from
POSIX shared memory between the ranks of a node (runtime/symmetric.py), not MPI windows.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import signal
import socket
from typing import Any

import numpy as np

from coconet.core import env
from coconet.core.program import CocoError
from coconet.dialects.reduction import Reduction
from coconet.runtime.inprocess import fold

# torchrun's environment (torch.distributed.run): every process gets these.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


# Set by torchrun's agent (torch.distributed.elastic) in every worker it starts, and by no
# one else: RANK and WORLD_SIZE without it were set by hand or leaked from another job.
TORCHRUN_AGENT_VAR = "TORCHELASTIC_RUN_ID"
# Where a launcher other than torchrun sets torchrun's variables on purpose (env:// rendezvous
# from a script of one's own), "1" accepts them.
ENV_LAUNCH_VAR = "COCONET_ENV_LAUNCH"


def torchrun_world() -> tuple[int, int] | None:
    """(rank, world size) when this process was started by torchrun, else None. Variables that
    cannot describe a job (WORLD_SIZE < 1, RANK outside it), or torchrun's variables in a
    process torchrun did not start, are refused at once: such a process would wait for peers
    that never come."""
    if not all(v in os.environ for v in ("RANK", "WORLD_SIZE")):
        return None  # one of them alone describes no job (another tool's RANK, say)
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise CocoError(
            f"RANK={os.environ['RANK']!r} WORLD_SIZE={os.environ['WORLD_SIZE']!r}: torchrun's "
            "variables must be integers"
        ) from None
    if size < 1:
        raise CocoError(f"WORLD_SIZE={size}: a job has at least one process")
    if not 0 <= rank < size:
        raise CocoError(f"RANK={rank} with WORLD_SIZE={size}: RANK must be in 0..{size - 1}")
    if size > 1 and TORCHRUN_AGENT_VAR not in os.environ and os.environ.get(ENV_LAUNCH_VAR) != "1":
        raise CocoError(
            f"RANK={rank} and WORLD_SIZE={size} are set, but torchrun did not start this "
            f"process ({TORCHRUN_AGENT_VAR} is unset): it would wait for {size - 1} peer(s) "
            f"that no launcher started. Launch with torchrun (or mpiexec), unset RANK and "
            f"WORLD_SIZE, or set {ENV_LAUNCH_VAR}=1 where a launcher of your own starts every rank"
        )
    return rank, size


class _Ops:
    """The reduction ops of `TORCH_MPI`, as torch names them."""

    SUM, PROD, MAX, MIN = Reduction.SUM, Reduction.PROD, Reduction.MAX, Reduction.MIN


class _Work:
    """A request: torch's async work, and what to do once it is done (copy results back)."""

    def __init__(self, work: Any = None, then: Any = None):
        self.work, self.then = work, then

    def Wait(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = None
        if self.then is not None:
            then, self.then = self.then, None
            then()

    def Test(self) -> bool:
        if self.work is not None and not self.work.is_completed():
            return False
        self.Wait()
        return True


class _Request:
    @staticmethod
    def Waitall(requests: list[_Work]) -> None:
        for r in requests:
            r.Wait()

    @staticmethod
    def Testall(requests: list[_Work]) -> bool:
        return all(r.Test() for r in requests)


class TorchMPI(_Ops):
    """What the runtime uses of the `mpi4py.MPI` module, for a torch.distributed job."""

    Request = _Request
    COMM_TYPE_SHARED = "shared"


TORCH_MPI = TorchMPI()


def _tensor(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(a)


def _reduce_op(op: Reduction) -> Any:
    import torch.distributed as dist

    return {
        Reduction.SUM: dist.ReduceOp.SUM,
        Reduction.PROD: dist.ReduceOp.PRODUCT,
        Reduction.MAX: dist.ReduceOp.MAX,
        Reduction.MIN: dist.ReduceOp.MIN,
    }[op]


class TorchComm:
    """mpi4py's `Comm`, as far as coconet uses it, over a torch.distributed process group.
    `members` are the group's global ranks in group-rank order (None: the whole world)."""

    def __init__(self, group: Any = None, members: list[int] | None = None):
        import torch.distributed as dist

        self.dist = dist
        self.group = group
        self.members = members if members is not None else list(range(dist.get_world_size()))
        self.me = dist.get_rank()
        self._flag: tuple[np.ndarray, Any] | None = None  # allreduce_flag's buffer, made once

    @classmethod
    def world(cls) -> TorchComm:
        """Every rank of the job, initialized from torchrun's environment when it is not yet.
        The runtime's own traffic is host memory (object collectives, and on the cpu backend
        the library collectives), which gloo carries: when the program's default group cannot
        (a GPU job's `init_process_group("nccl")`), coconet uses a gloo group of its own over
        the same ranks, made once."""
        global _HOST_GROUP
        import torch.distributed as dist

        if not dist.is_available():
            raise CocoError("this PyTorch has no torch.distributed")
        if not dist.is_initialized():
            # bounded like every other wait for peers: a rank that never joins ends the job
            seconds = env.step_timeout()
            if seconds:
                dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds))
            else:
                dist.init_process_group(backend="gloo")
            # The group is ours: tear it down before the interpreter exits, or gloo's threads
            # may be killed mid-flight ("terminate called without an active exception").
            atexit.register(_destroy_group)
        if TORCHRUN_AGENT_VAR in os.environ:
            _watch_the_agent()
        if carries_host_tensors(str(dist.get_backend())):
            comm = cls()
        else:
            if _HOST_GROUP is None:
                _HOST_GROUP = dist.new_group(backend="gloo")  # collective: every rank is here
            comm = cls(_HOST_GROUP)
        _learn_local_peers(comm)
        return comm

    # -- identity ------------------------------------------------------------------------------

    def Get_rank(self) -> int:
        return self.members.index(self.me)

    def Get_size(self) -> int:
        return len(self.members)

    def _global(self, rank: int) -> int:
        return self.members[rank]

    # -- object collectives --------------------------------------------------------------------

    def allgather(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * self.Get_size()
        self.dist.all_gather_object(out, value, group=self.group)
        return out

    def allreduce_flag(self, flag: int) -> int:
        """The largest of every rank's small integer `flag`, through one preallocated int32
        tensor: a compiled program's per-call input verdict without pickling (gloo's
        all_gather_object is a size exchange and two collectives of pickled bytes)."""
        if self._flag is None:
            import torch

            array = np.zeros(1, np.int32)
            self._flag = (array, torch.from_numpy(array))
        array, tensor = self._flag
        array[0] = flag
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX, group=self.group)
        return int(array[0])

    def bcast(self, value: Any, root: int = 0) -> Any:
        box = [value]
        self.dist.broadcast_object_list(box, src=self._global(root), group=self.group)
        return box[0]

    def gather(self, value: Any, root: int = 0) -> list[Any] | None:
        everything = self.allgather(value)
        return everything if self.Get_rank() == root else None

    def allreduce(self, value: Any, op: Reduction = Reduction.SUM) -> Any:
        return fold(op, self.allgather(value))

    def Barrier(self) -> None:
        self.dist.barrier(group=self.group)

    def Split(self, color: int, key: int = 0) -> TorchComm:
        infos = self.allgather((color, key, self.me))
        mine = None
        # new_group is collective over the whole world: every rank creates every group, in
        # one order (sorted colors), and keeps its own.
        for c in sorted({i[0] for i in infos}):
            members = [g for _c, _k, g in sorted((i for i in infos if i[0] == c), key=_by_key)]
            group = self.dist.new_group(ranks=members)
            if c == color:
                mine = TorchComm(group, members)
        assert mine is not None
        return mine

    def Split_type(self, split_type: Any, key: int = 0) -> TorchComm:
        """The ranks of this group on this machine (split_type is ignored: only shared)."""
        hosts = self.allgather(socket.gethostname())
        names = sorted(set(hosts))
        return self.Split(names.index(hosts[self.Get_rank()]), key)

    def Free(self) -> None:
        pass

    def Abort(self, code: int = 1) -> None:
        """As MPI_Abort: every rank of the job ends now. torchrun's agent ends the others when
        one exits non-zero, but with SIGTERM and a 30 s grace before SIGKILL, which a rank
        stopped or stuck in native code outlasts: the ranks on this machine are killed here,
        the agent ends the rest."""
        for pid in _LOCAL_PEERS or ():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os._exit(code)

    # -- point-to-point (blocking) ------------------------------------------------------------

    def Send(self, buf: np.ndarray, dest: int, tag: int = 0) -> None:
        self.dist.send(_tensor(buf), dst=self._global(dest), group=self.group, tag=tag)

    def Recv(self, buf: np.ndarray, source: int, tag: int = 0) -> None:
        self.dist.recv(_tensor(buf), src=self._global(source), group=self.group, tag=tag)

    # -- non-blocking buffer collectives (MpiTransport) ----------------------------------------

    def _async(self, call: Any, *args: Any, **kw: Any) -> _Work:
        return call(*args, group=self.group, async_op=True, **kw)

    def Iallreduce(self, src: np.ndarray, dst: np.ndarray, op: Reduction) -> _Work:
        if dst is not src:
            np.copyto(dst, src)
        return _Work(self._async(self.dist.all_reduce, _tensor(dst), op=_reduce_op(op)))

    def Allreduce(self, src: np.ndarray, dst: np.ndarray, op: Reduction) -> None:
        self.Iallreduce(src, dst, op).Wait()

    def Ireduce_scatter_block(self, packed: np.ndarray, dst: np.ndarray, op: Reduction) -> _Work:
        # gloo has no reduce_scatter: reduce everything, keep this rank's block
        total = np.array(packed, copy=True)
        work = self._async(self.dist.all_reduce, _tensor(total), op=_reduce_op(op))
        me = self.Get_rank()
        return _Work(work, lambda: np.copyto(dst.reshape(-1), total[me].reshape(-1)))

    def Iallgather(self, piece: np.ndarray, out: np.ndarray) -> _Work:
        parts = list(_tensor(out).view(self.Get_size(), -1).unbind(0))
        return _Work(self._async(self.dist.all_gather, parts, _tensor(piece)))

    def Ialltoall(self, packed: np.ndarray, out: np.ndarray) -> _Work:
        return _Work(self._async(self.dist.all_to_all_single, _tensor(out), _tensor(packed)))

    def Ialltoallv(self, send_spec: list[Any], recv_spec: list[Any]) -> _Work:
        # all_to_all_single takes split sizes: runs packed in member order, as MpiTransport
        # packs them (displacements are the counts' prefix sums)
        send, (send_counts, _) = send_spec
        recv, (recv_counts, _) = recv_spec
        return _Work(
            self._async(
                self.dist.all_to_all_single,
                _tensor(recv),
                _tensor(send),
                output_split_sizes=list(recv_counts),
                input_split_sizes=list(send_counts),
            )
        )

    def Ibcast(self, buf: np.ndarray, root: int = 0) -> _Work:
        return _Work(self._async(self.dist.broadcast, _tensor(buf), src=self._global(root)))

    def Ireduce(
        self, src: np.ndarray, dst: np.ndarray | None, op: Reduction, root: int = 0
    ) -> _Work:
        scratch = np.array(src, copy=True)  # torch reduces in place
        work = self._async(
            self.dist.reduce, _tensor(scratch), dst=self._global(root), op=_reduce_op(op)
        )
        if dst is None:
            return _Work(work)
        return _Work(work, lambda: np.copyto(dst, scratch.reshape(dst.shape)))

    def Igather(self, piece: np.ndarray, out: np.ndarray | None, root: int = 0) -> _Work:
        parts = None if out is None else list(_tensor(out).view(self.Get_size(), -1).unbind(0))
        return _Work(
            self._async(self.dist.gather, _tensor(piece), gather_list=parts, dst=self._global(root))
        )

    def Isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> _Work:
        return _Work(
            self.dist.isend(_tensor(buf), dst=self._global(dest), group=self.group, tag=tag)
        )

    def Irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> _Work:
        return _Work(
            self.dist.irecv(_tensor(buf), src=self._global(source), group=self.group, tag=tag)
        )


# coconet's own gloo group when the default group cannot carry host tensors (made once).
_HOST_GROUP: Any = None
# The pids of this job's other ranks on this machine (TorchComm.Abort kills them).
_LOCAL_PEERS: list[int] | None = None


def _learn_local_peers(comm: TorchComm) -> None:
    """Once per process (every rank makes its first communicator at the same point)."""
    global _LOCAL_PEERS
    if _LOCAL_PEERS is not None:
        return
    me = (socket.gethostname(), os.getpid())
    _LOCAL_PEERS = [pid for host, pid in comm.allgather(me) if host == me[0] and pid != me[1]]


def carries_host_tensors(backend: str) -> bool:
    """Whether a process group of this backend ("gloo", "nccl", "mpi", or torch's per-device
    form "cpu:gloo,cuda:nccl") runs collectives on CPU tensors."""
    if ":" in backend:
        return any(part.split(":")[0] == "cpu" for part in backend.split(","))
    return backend in ("gloo", "mpi")


def mpi_module_for(comm: Any) -> Any:
    """The `mpi4py.MPI` module, or its stand-in when `comm` is a torch.distributed group."""
    if isinstance(comm, TorchComm):
        return TORCH_MPI
    from mpi4py import MPI

    return MPI


# How launchers tell a process the size of its job: MPICH/hydra (PMI), Open MPI, MVAPICH, Slurm.
MPI_LAUNCH_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE")


def mpi_launch_size() -> int | None:
    """The job size an MPI launcher announced to this process, if any."""
    for var in MPI_LAUNCH_SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def job_communicator(backend: str) -> Any:
    """The communicator of the job this process belongs to: torch.distributed's when torchrun
    started it (or the program initialized a process group), MPI's when mpiexec did; a launch of
    several processes that this process cannot join is refused, never run as 1 rank."""
    torch_world = torchrun_world()
    mpi_size = mpi_launch_size()
    if mpi_size is None and (
        (torch_world is not None and torch_world[1] > 1) or _torch_initialized()
    ):
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            assert torch_world is not None
            raise CocoError(
                f"this process is rank {torch_world[0]} of {torch_world[1]} started by torchrun "
                "(RANK and WORLD_SIZE are set), but PyTorch cannot be imported: install torch, "
                "or launch the job with mpiexec"
            ) from None
        return TorchComm.world()
    try:
        from mpi4py import MPI
    except ImportError:
        if mpi_size and mpi_size > 1:
            raise CocoError(
                f"this process is one of {mpi_size} started by an MPI launcher, but mpi4py cannot "
                "be imported (pip install 'coconet[mpi]')"
            ) from None
        raise CocoError(
            f"backend '{backend}' needs mpi4py (pip install 'coconet[mpi]') or a torchrun launch; "
            "use backend='sim' to run without either"
        ) from None
    world = MPI.COMM_WORLD
    launched = mpi_size or (torch_world[1] if torch_world else 1)
    if world.Get_size() != launched:
        how = (
            f"{MPI_LAUNCH_SIZE_VARS[0]}-style launcher variables say {mpi_size}"
            if mpi_size
            else f"torchrun's WORLD_SIZE is {launched}"
        )
        raise CocoError(
            f"this process was launched as one of {launched} ({how}), but MPI sees a world of "
            f"{world.Get_size()}: mpi4py is not connected to the launcher that started it (a "
            "different MPI library?); refusing to run a job of the wrong size"
        )
    return world


_AGENT_WATCHED = False


def _watch_the_agent() -> None:
    """End this rank when the torchrun agent that started it is gone: nobody would stop it
    otherwise (the agent's own failure handling died with it), and its peers may wait for it.
    The agent is this process's parent; an orphan is re-parented, so the parent pid changes."""
    global _AGENT_WATCHED
    if _AGENT_WATCHED:
        return
    _AGENT_WATCHED = True
    agent = os.getppid()

    def watch() -> None:
        import sys
        import time

        while os.getppid() == agent:
            time.sleep(0.25)
        print(
            f"coconet: error: rank {os.environ.get('RANK', '?')}: the torchrun agent (pid "
            f"{agent}) that started this rank is gone; ending this rank",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    import threading

    threading.Thread(target=watch, name="coconet-torchrun-agent", daemon=True).start()


def _torch_initialized() -> bool:
    import sys

    if "torch.distributed" not in sys.modules:
        return False
    dist = sys.modules["torch.distributed"]
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        with contextlib.suppress(Exception):  # at exit: nothing left to report it to
            # Destroying is local: a rank that closes its connections while a peer's gloo
            # thread still uses them makes that peer abort. Leave together.
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
            dist.destroy_process_group()


def _by_key(info: tuple[int, int, int]) -> tuple[int, int]:
    return (info[1], info[2])
