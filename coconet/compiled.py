"""Programs made ready on this rank: the backends, schedules applied, and the compiled program
that `coconet.compile` returns (see coconet/compile.py for the calling contract).

This module is what compile() builds on without its choices (the autotuner, the plan cache, the
job's failure guard): `prepare` lowers a scheduled program for a communicator and sets its plan
up on this rank. The machine probe measures through it, so the probe, the autotuner and
compile() form a chain, not a cycle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from coconet.core import values as V
from coconet.core.gc_pause import without_gc
from coconet.core.program import CocoError, Program

BACKENDS = ("sim", "cpu", "cuda")


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------


@without_gc
def apply_pipeline(program: Program, pipeline: str, *, in_place: bool = False) -> Program:
    """A copy of `program` (`program` itself when `in_place`) with the pass pipeline applied
    and verified."""
    if not pipeline:
        return program
    from xdsl.passes import PassPipeline
    from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException

    from coconet.core.program import make_context
    from coconet.schedule import get_all_passes

    try:
        passes = PassPipeline.parse_spec(get_all_passes(), pipeline)
    except (Exception, ArgSpecParseError) as e:  # xDSL's spec error is a BaseException
        raise CocoError(f"bad pass pipeline '{pipeline}': {e}") from None
    if not in_place:
        program = program.clone()
    try:
        passes.apply(make_context(), program.module)
        program.module.verify()
    except DiagnosticException as e:
        raise CocoError(f"pipeline '{pipeline}' refused the program: {e}") from None
    return program


def is_pipeline(spec: str) -> bool:
    """Whether `spec` reads as a pass pipeline (its first element names a registered pass)."""
    from coconet.schedule import get_all_passes

    head = spec.split(",", 1)[0].split("{", 1)[0].strip()
    return head in get_all_passes()


def apply_schedule(program: Program, schedule: str | None, *, in_place: bool = False) -> Program:
    """`program` under a named schedule (coconet.schedule) or a pass pipeline. `in_place`:
    `program` was made for this call (parsed from a file, say) and is used only through the
    result, so it is scheduled itself instead of a clone."""
    if not schedule or schedule in ("none", "as-written"):
        return program
    if is_pipeline(schedule):
        return apply_pipeline(program, schedule, in_place=in_place)
    try:
        from coconet import schedule as schedules  # written alongside; optional here
    except ImportError:
        raise CocoError(
            f"unknown schedule '{schedule}': it is not a pass pipeline, and named schedules "
            "need coconet.schedule, which this installation lacks"
        ) from None
    for attr in ("apply_schedule", "apply"):
        fn = getattr(schedules, attr, None)
        if callable(fn):
            try:
                result = (
                    fn(program, schedule, in_place=in_place) if in_place else fn(program, schedule)
                )
            except schedules.ScheduleError as e:
                if e.step is None:  # an unknown name, a structure it lacks: the message says
                    raise
                # a step of the schedule refused: the schedule is not offered for this program
                name = schedules.resolve_schedule_name(schedule)
                raise schedules.ScheduleError(
                    f"the schedule '{name}' does not apply to @{program.name} (named_schedules "
                    f"does not offer it): {e}",
                    e.rule,
                    e.step,
                ) from None
            if hasattr(result, "program") and not isinstance(result, Program):
                result = getattr(result, "program")  # a Scheduled result
            if not isinstance(result, Program):
                raise CocoError(f"schedule '{schedule}' did not produce a program")
            return result
    raise CocoError(f"unknown schedule '{schedule}': coconet.schedule has no apply_schedule()")


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------


def gpu_available() -> bool:
    """A CUDA device is visible to CuPy."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def default_backend() -> str:
    return "cuda" if gpu_available() else "cpu"


def require_gpu() -> None:
    try:
        import cupy
    except Exception as e:
        raise CocoError(
            f"backend 'cuda' needs CuPy with a CUDA GPU, but CuPy cannot be imported ({e}); "
            "use --backend cpu, or install coconet[cuda] on a machine with a GPU"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise CocoError(
            f"backend 'cuda' needs a CUDA GPU, but none is usable: {e}; use --backend cpu"
        ) from None
    if count < 1:
        raise CocoError("backend 'cuda' needs a CUDA GPU, but none is visible; use --backend cpu")


def make_backend(name: str, comm: Any, *, exact_collectives: bool = False):
    if name == "cpu":
        from coconet.runtime.cpu import CpuBackend

        return CpuBackend(comm, exact_collectives=exact_collectives)
    if name == "cuda":
        require_gpu()
        from coconet.runtime.cuda import CudaBackend, CupyDevice

        return CudaBackend(CupyDevice.for_rank(comm), comm, exact_collectives=exact_collectives)
    raise CocoError(f"unknown backend '{name}': use one of {', '.join(BACKENDS)}")


def program_of(program: Any, entry: str | None) -> Program:
    from coconet.runtime.sim import as_program

    return as_program(program, entry)


# ---------------------------------------------------------------------------------------------
# Compiled programs
# ---------------------------------------------------------------------------------------------


class CompiledProgram:
    """A program lowered for this job's ranks, with its buffers allocated on this rank."""

    def __init__(
        self,
        program: Program | Callable[[], Program],
        plan,
        runner,
        backend_name: str,
        comm,
        guard=None,
        *,
        pieces: bool = False,
    ):
        from coconet.convention import resliced_arguments

        # A warm start (the plan from the plan cache) passes how to get the scheduled
        # program, parsed only if someone asks for it.
        self._program = program
        self.autotune: dict[str, Any] | None = None  # what schedule="auto" chose, and why
        self.plan_cache_hit = False  # whether the plan came from the plan cache
        self.plan = plan
        self.runner = runner
        self.backend = backend_name
        self.comm = comm
        self.rank = runner.rank
        self.size = plan.size
        self.guard = guard
        # whether the first call compares every replicated argument's value across the ranks
        # that replicate it (compile(check_replicas=...)): replicas passed different values
        # would diverge silently
        self.check_replicas = True
        # the calling convention (coconet/convention.py): with `pieces`, the plan's own pieces;
        # else the program as written's values, the arguments a schedule sliced converted
        self.pieces = pieces
        self.resliced = {} if pieces else resliced_arguments(plan, self.rank)
        self._calls = 0
        self._lock = threading.Lock()
        self._names = frozenset(plan.arguments)
        self._arguments = list(plan.arguments.items())
        # The last placed call's inputs, by name: (value, its identity, piece, whole), and
        # the runner's `inputs_set` they were placed at. A call passing the same objects
        # at the same addresses (a training loop's parameters) reuses their pieces unchecked.
        self._taken: dict[str, tuple[Any, Any, Any, Any]] = {}
        self._taken_at = -1
        # the per-call verdict agreement: one int over the job (the first call's replica
        # checksums, and the messages of a refused call, take the object allgather)
        self._flag = VerdictFlag(comm) if self.size > 1 else None
        self._check_text = lambda: f"the input check of call {guard.calls + 1 if guard else 0}"

    @property
    def program(self) -> Program:
        """The scheduled program."""
        if not isinstance(self._program, Program):
            self._program = self._program()
        return self._program

    def input_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What this rank passes for each argument under the chosen calling convention:
        (shape, dtype) of its value under the program as written's type, or of its piece of
        the scheduled program's (`pieces=True`)."""
        return {
            n: (self.resliced[n].shape if n in self.resliced else s, d)
            for n, (s, d, _t) in self.runner.expected_inputs().items()
        }

    @property
    def bytes_per_rank(self) -> int:
        from coconet.runtime.executor import plan_traffic

        return plan_traffic(self.plan, self.rank)

    def _agree(
        self, error: str | None, sums: dict[str, int] | None = None, *, objects: bool = True
    ) -> None:
        """Every rank learns whether any rank's inputs were refused, before anything runs;
        with `sums` (this rank's checksum of each replicated argument), whether the ranks
        that replicate an argument passed the same value. `objects` (the same on every rank):
        exchange the verdicts and sums as objects; else agree on one integer, the largest
        rank's flag, and exchange the messages only when some rank refused (every rank saw
        the flag, so every rank enters that exchange)."""
        if self.size == 1:
            if error:
                raise CocoError(error)
            return
        guard = self.guard
        if guard is not None:  # a rank that stops calling is named, not waited for
            guard.begin_wait(self._check_text)
        try:
            if objects:
                verdicts = self.comm.allgather((error, sums))
            else:
                assert self._flag is not None
                refused = self._flag.agree(1 if error else 0)
                verdicts = self.comm.allgather((error, None)) if refused else None
        finally:
            if guard is not None:
                guard.end_wait()
        if verdicts is None:
            return
        bad = [(r, e) for r, (e, _) in enumerate(verdicts) if e]
        if bad:
            r, e = bad[0]
            raise CocoError(e if r == self.rank else f"rank {r} refused its inputs: {e}")
        if sums is not None:
            _check_replicas(self.plan, [s or {} for _, s in verdicts], self._caller_types())

    def _caller_types(self) -> dict[str, Any]:
        from coconet.convention import caller_types

        return caller_types(self.plan, self.resliced)

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        with self._lock:
            return self._call(inputs)

    def _call(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        error = None
        pieces: dict[str, Any] = {}
        wholes: dict[str, Any] = {}  # the caller's values of resliced arguments, as taken
        fresh: list[str] = []
        taken: dict[str, tuple[Any, Any, Any, Any]] = {}
        try:
            pieces, wholes, fresh, taken = self._take(inputs)
        except CocoError as e:
            error = str(e)
        self._calls += 1
        # the first call compares the replicas' checksums: an object exchange on every rank
        first = self.check_replicas and self._calls == 1 and self.size > 1
        sums = None
        if first and error is None:  # each value as the caller passed it: a resliced whole
            sums = replica_sums(self.plan, pieces | wholes, self._caller_types())
        self._agree(error, sums, objects=first)
        if self.guard is not None:
            self.guard.before_run()
        self._taken = {}  # until the placement below is done
        self.runner.set_inputs(pieces, fresh=fresh)
        self._taken, self._taken_at = taken, self.runner.inputs_set
        self.runner.run()
        backend = self.runner.backend
        out: dict[str, Any] = {}
        for name, buf in self.plan.outputs.items():
            arg = self.plan.arguments.get(name)
            r = self.resliced.get(name)
            if arg is buf and r is not None and r.gather is not None:
                # every rank's updated piece back into the caller's whole value
                self._gather(r.gather, wholes[name])
                out[name] = r.returned(inputs[name], wholes[name])
            elif arg is buf:
                # bound, or the caller's value is the buffer itself (input_buffer)
                held = name in self.runner.bound or name in self.runner.held
                out[name] = backend.write_back(buf, inputs[name], bound=held)
            else:
                out[name] = backend.output(buf)
        return out

    def _gather(self, step: Any, whole: Any) -> None:
        """The all_gather of a resliced argument, outside the plan: watched as its steps are
        (a rank that never arrives is named, not waited for)."""
        if self.guard is None:
            self.runner.backend.gather_into(step, whole)
            return
        guard = self.guard
        guard.begin_wait(lambda: f"the gather of '{step.src.name}' after call {guard.calls}")
        try:
            self.runner.backend.gather_into(step, whole)
        finally:
            guard.end_wait()

    def _take(self, inputs: Mapping[str, Any]):
        """This rank's pieces of the caller's values, checked: (pieces, wholes of resliced
        arguments, the names taken afresh, what to remember of each). A value that is the
        same object as at the last placed call, at the same address with the same shape,
        strides, dtype and flags (`_identity`), reuses that call's piece unchecked: it
        passed then, and what it holds is read when the plan runs."""
        if inputs.keys() != self._names:
            V.check_input_names(self.plan.program, inputs, list(self.plan.arguments))
        backend = self.runner.backend
        last = self._taken if self._taken_at == self.runner.inputs_set else {}
        pieces: dict[str, Any] = {}
        wholes: dict[str, Any] = {}
        fresh: list[str] = []
        taken: dict[str, tuple[Any, Any, Any, Any]] = {}
        again: list[Any] = []  # the same objects as at the last call
        for name, buf in self._arguments:
            value = inputs[name]
            key = _identity(value)
            prev = last.get(name)
            if key is not None and prev is not None and prev[0] is value and prev[1] == key:
                taken[name] = prev
                pieces[name] = prev[2]
                if prev[3] is not None:
                    wholes[name] = prev[3]
                again.append(value)
                continue
            r = self.resliced.get(name)
            if r is not None and not hasattr(value, "shape"):
                raise CocoError(
                    f"input '{name}' of type {r.written}: expected an array of shape "
                    f"{list(r.shape)}, got a {type(value).__name__}"
                )
            piece = whole = backend.coerce_input(name, value, buf)
            if r is not None:
                piece = r.piece(self.rank, whole, backend.shape_of, backend.dtype_of)
                wholes[name] = whole
            else:
                whole = None
            pieces[name] = piece
            fresh.append(name)
            taken[name] = (value, key, piece, whole)
        if again:
            # (a device value written since, e.g. by a backward pass, on another stream)
            backend.order_inputs(again)
        if fresh:
            self.runner.check_inputs(pieces, backend.shape_of, backend.dtype_of, only=fresh)
            # a Python number became a new array: it shares memory with nothing
            arrays = [n for n in fresh if not isinstance(inputs[n], _SCALARS)]
            if arrays:
                self._check_aliasing(pieces, arrays)
        return pieces, wholes, fresh, taken

    def _check_aliasing(self, pieces: Mapping[str, Any], fresh: list[str] | None = None) -> None:
        """An argument the program updates in place must not share memory with another
        argument: the update would change that input while the program reads it. `fresh`:
        the pairs holding one of these names (the others were checked at an earlier call)."""
        updated = [n for n, b in self.plan.outputs.items() if self.plan.arguments.get(n) is b]
        for name in updated:
            for other, value in pieces.items():
                mine = pieces[name]
                if (
                    other != name
                    and (fresh is None or name in fresh or other in fresh)
                    and isinstance(mine, np.ndarray)
                    and isinstance(value, np.ndarray)
                    and mine.size
                    and value.size
                    and np.may_share_memory(mine, value)
                ):
                    raise CocoError(
                        f"input '{name}' is updated in place, but it shares memory with input "
                        f"'{other}': pass separate arrays"
                    )

    def input_buffer(self, name: str) -> Any:
        """This rank's piece of argument `name` in the memory the plan reads it from, as an
        array of the backend's kind (NumPy; CuPy on the cuda backend, bf16 as its uint16 bit
        pattern). An argument a fused kernel's peers read (a reduce_scatter's input, such as
        a gradient) lives in symmetric memory, so each call copies the caller's value into
        it; a caller that writes its values into this array instead and passes the array
        itself saves that copy (`runner.copies_in` counts the copies made). The array stays
        valid until close()."""
        buf = self.plan.arguments.get(name)
        if buf is None:
            raise CocoError(
                f"input_buffer('{name}'): @{self.plan.program} has no argument '{name}' "
                f"(its arguments: {', '.join(self.plan.arguments)})"
            )
        if name in self.resliced:
            raise CocoError(
                f"input_buffer('{name}'): the schedule reslices '{name}', so a call takes the "
                "value as written, not this rank's piece: pass arrays, or compile with "
                "pieces=True"
            )
        return self.runner.backend.array(name)

    def step(self) -> None:
        """Run the plan once on the data already in its buffers (benchmarks: no copies).
        Under the default convention the caller's whole arrays of the state a schedule
        slices are not gathered: they change at the next call."""
        self.runner.run()

    def barrier(self) -> None:
        self.runner.backend.barrier()

    def close(self) -> None:
        """Free buffers and communicators (collective)."""
        self.runner.close()


_SCALARS = (int, float, bool, np.generic)


def _array_address() -> Callable[[np.ndarray], int]:
    """The data pointer of a NumPy array, read from the array object's C struct (the
    `data` field after the object header: NumPy's public PyArrayObject_fields layout) --
    a fifth of `a.ctypes.data`'s cost, which every call pays per argument; `ctypes.data`
    where the struct read does not agree with it (another Python implementation)."""
    import ctypes

    read = ctypes.c_void_p.from_address
    offset = 2 * ctypes.sizeof(ctypes.c_void_p)  # ob_refcnt, ob_type
    probe = np.zeros(3)
    try:
        if read(id(probe) + offset).value == probe.ctypes.data:
            return lambda a: read(id(a) + offset).value or 0
    except (ValueError, OverflowError):
        pass
    return lambda a: a.ctypes.data


_address = _array_address()


def _identity(value: Any) -> tuple | None:
    """What makes the caller's value the same input as at the last call for the fast path:
    a NumPy array's address (ndarray.resize moves it), shape, strides, dtype and
    writeability; a tensor's (PyTorch) data pointer, shape, strides, dtype and requires_grad.
    None: anything else (a Python number), which is taken afresh every call."""
    if isinstance(value, np.ndarray):
        return (_address(value), value.shape, value.strides, value.dtype, value.flags.writeable)
    data_ptr = getattr(value, "data_ptr", None)
    if data_ptr is not None and hasattr(value, "__dlpack__"):
        return (
            data_ptr(),
            tuple(value.shape),
            value.stride(),
            value.dtype,
            value.requires_grad,
            value.device,
        )
    return None


class VerdictFlag:
    """The largest of every rank's small integer over the job, by a fixed-size numeric
    collective (a compiled program's per-call input verdict): the communicator's own
    `allreduce_flag` (TorchComm, InProcessComm), mpi4py's buffer `Allreduce` on a
    preallocated int32 pair, or (another mpi4py-like communicator) its object allgather."""

    def __init__(self, comm: Any):
        own = getattr(comm, "allreduce_flag", None)
        if own is not None:
            self.agree: Callable[[int], int] = own
        elif hasattr(comm, "Allreduce"):
            from mpi4py import MPI

            send, recv = np.zeros(1, np.int32), np.zeros(1, np.int32)
            spec_send, spec_recv, op = [send, MPI.INT], [recv, MPI.INT], MPI.MAX

            def agree(flag: int) -> int:
                send[0] = flag
                comm.Allreduce(spec_send, spec_recv, op=op)
                return int(recv[0])

            self.agree = agree
        else:
            self.agree = lambda flag: max(comm.allgather(flag))


def _replicated_axes(t: Any, grid_rank: int) -> list[int]:
    from coconet.dialects.coco import ReplicatedAttr

    lays = t.layout_list(grid_rank)
    return [a for a in range(grid_rank) if isinstance(lays[a], ReplicatedAttr)]


def _host_bytes(value: Any) -> np.ndarray:
    """A piece's bytes: host arrays as they are, device arrays (CuPy) copied once. (As
    uint8: a memoryview of f16 or bf16 cannot be cast to bytes.)"""
    if not isinstance(value, np.ndarray):
        value = value.get() if hasattr(value, "get") else np.asarray(value)
    return np.ascontiguousarray(value).reshape(-1).view(np.uint8)


def replica_sums(
    plan: Any, pieces: Mapping[str, Any], types: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """A CRC-32 of this rank's value of every argument replicated on some grid axis (the
    bits: a NaN's payload or a signed zero counts). `types`: the type of each value as
    passed (default: the plan's)."""
    import zlib

    grid_rank = len(plan.grid_shape)
    return {
        name: zlib.crc32(_host_bytes(pieces[name]).data)
        for name, buf in plan.arguments.items()
        if name in pieces and _replicated_axes((types or {}).get(name, buf.type), grid_rank)
    }


def _check_replicas(
    plan: Any, sums: list[dict[str, int]], types: Mapping[str, Any] | None = None
) -> None:
    """Ranks that replicate an argument (one group per replicated grid axis) hold its same
    value; else every rank raises the same CocoError naming the argument and two ranks."""
    grid_rank = len(plan.grid_shape)
    for name, buf in plan.arguments.items():
        for axis in _replicated_axes((types or {}).get(name, buf.type), grid_rank):
            for group in V.groups_of(plan.grid_shape, [axis]):
                first = group[0]
                for r in group[1:]:
                    if sums[r].get(name) != sums[first].get(name):
                        raise CocoError(
                            f"input '{name}' is replicated, but rank {r} passed another value "
                            f"than rank {first} (their checksums differ): every rank must pass "
                            "the same value of a replicated tensor, or the replicas diverge "
                            "(compile(..., check_replicas=False) skips this first-call check)"
                        )


class SimCompiled:
    """The sim oracle behind the same call interface (logical values in and out)."""

    backend = "sim"
    rank = 0
    autotune: dict[str, Any] | None = None

    def __init__(self, program: Program, ranks: int, seed: int = 0):
        self.program = program
        self.size = ranks
        self.seed = seed
        try:
            self.grid_shape = program.grid.bind(ranks)
        except ValueError as e:
            raise CocoError(f"@{program.name}: {e}") from None

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        from coconet.runtime.sim import run

        return run(self.program, inputs, ranks=self.size, seed=self.seed, inplace=True).outputs

    def step(self) -> None:
        raise CocoError("the sim backend has no resident buffers to step on; call it with inputs")

    def close(self) -> None:
        pass


def prepare(
    program: Program,
    backend: str,
    comm: Any,
    *,
    plan: Any = None,
    launch_config: Any = None,
    exact_collectives: bool = False,
    guard: Any = None,
    pieces: bool = False,
) -> CompiledProgram:
    """`program` (already scheduled) lowered for `comm`'s ranks, or `plan` when one is given,
    with its buffers allocated on this rank (collective over `comm`). `guard`, a
    runtime.failures.FailureGuard, watches the runner. `pieces`: the calling convention
    (coconet/convention.py)."""
    from coconet.lowering.lower_to_plan import lower
    from coconet.runtime.executor import PlanRunner
    from coconet.runtime.symmetric import job_nodes
    from coconet.runtime.torch_comm import mpi_module_for

    if plan is None:
        nodes = job_nodes(comm, mpi_module_for(comm))
        plan = lower(program, comm.Get_size(), launch_config, nodes)
    runner = PlanRunner(
        plan,
        comm.Get_rank(),
        make_backend(backend, comm, exact_collectives=exact_collectives),
        # a hook per step only where a test injects a fault: every step would call it
        fault=guard.fault_hook if guard is not None and guard.fault is not None else None,
    )
    runner.setup()
    if guard is not None:
        guard.watch(runner)
    return CompiledProgram(program, plan, runner, backend, comm, guard, pieces=pieces)
