"""`coconet.compile`: a program, scheduled and lowered, ready to call on this rank's data.

    # run with:  mpiexec -n 4 python train.py
    import coconet
    step = coconet.compile("examples/adam.mlir", schedule="coco-split-allreduce", backend="cpu")
    out = step(g=my_grad, w=w, m=m, v=v, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, step=1.0)

The contract:

* `compile` is COLLECTIVE on the cpu and cuda backends: every rank of the job calls it. The job
  is `MPI.COMM_WORLD` under mpiexec, or torch.distributed's process group under torchrun (gloo
  for library collectives, POSIX shared memory for fused kernels; runtime/torch_comm.py); a
  process launched as one of several that cannot join its job refuses instead of running
  alone. Every rank calls it with the same program and schedule (it allocates symmetric
  buffers and communicators). The rank and the number of ranks come from the job; `ranks`,
  when given, must equal the number of processes.
* cpu / cuda: each rank passes ITS OWN PIECE of every argument (core/values.py `piece_of`):
  a replicated tensor's full value, its part of a sliced tensor, its own value of a local
  tensor (a data-parallel rank's local gradient) — for a tensor of global shape S that is
  `!coco.tensor<S, local>`, the rank passes an array of shape S, not the stacked logical
  value. `compiled.input_shapes()` says what this rank must pass. Rank-0 tensors (scalars) may
  be Python numbers. Arrays must have the exact dtype (bf16: ml_dtypes.bfloat16).
  cpu: NumPy arrays. cuda: CuPy arrays or anything with `__dlpack__` (PyTorch tensors, ...);
  NumPy arrays are copied to the GPU.
* Every call returns a dict with this rank's piece of every output (returned values and
  updated arguments by name). An updated argument is written in place into the caller's
  array (as `coco.update` means) and that same array is returned; a returned value is a new
  array each call.
* Inputs are checked on every rank before anything runs, and the ranks agree on the verdict:
  a wrong shape, dtype or name on any rank raises the same CocoError on every rank.
* An uncaught exception on any rank of a multi-rank job aborts the whole job with one line
  naming the rank (runtime/failures.py), so no rank hangs waiting for it
  (`abort_on_error=False` leaves Python's own handling). With COCONET_STEP_TIMEOUT=SECONDS in
  the environment, a rank that makes no progress in one plan step for that long aborts the
  job too.
* sim: the reference interpreter; all ranks run in this process. It takes and returns LOGICAL
  values (core/values.py: a local tensor's value is the stack of every rank's value) and
  needs no MPI.

`schedule` is a named schedule (coconet.schedule, when present) or a pass pipeline
("coco-split-allreduce,coco-reorder,..."); None runs the program as written.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from coconet.core.program import CocoError, Program

BACKENDS = ("sim", "cpu", "cuda")

__all__ = [
    "BACKENDS",
    "CompiledProgram",
    "apply_pipeline",
    "apply_schedule",
    "compile",
    "default_backend",
    "gpu_available",
]


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------


def apply_pipeline(program: Program, pipeline: str) -> Program:
    """A copy of `program` with the pass pipeline applied and verified."""
    if not pipeline:
        return program
    from xdsl.passes import PassPipeline
    from xdsl.utils.exceptions import DiagnosticException

    from coconet.core.program import make_context
    from coconet.passes import get_all_passes

    try:
        passes = PassPipeline.parse_spec(get_all_passes(), pipeline)
    except Exception as e:
        raise CocoError(f"bad pass pipeline '{pipeline}': {e}") from None
    program = program.clone()
    try:
        passes.apply(make_context(), program.module)
        program.module.verify()
    except DiagnosticException as e:
        raise CocoError(f"pipeline '{pipeline}' refused the program: {e}") from None
    return program


def is_pipeline(spec: str) -> bool:
    """Whether `spec` reads as a pass pipeline (its first element names a registered pass)."""
    from coconet.passes import get_all_passes

    head = spec.split(",", 1)[0].split("{", 1)[0].strip()
    return head in get_all_passes()


def apply_schedule(program: Program, schedule: str | None) -> Program:
    """`program` under a named schedule (coconet.schedule) or a pass pipeline."""
    if not schedule or schedule in ("none", "as-written"):
        return program
    if is_pipeline(schedule):
        return apply_pipeline(program, schedule)
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
            result = fn(program, schedule)
            if hasattr(result, "program") and not isinstance(result, Program):
                result = result.program
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


def _as_program(program: Any, entry: str | None) -> Program:
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
    ):
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
        self._lock = threading.Lock()

    @property
    def program(self) -> Program:
        """The scheduled program."""
        if not isinstance(self._program, Program):
            self._program = self._program()
        return self._program

    def input_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What this rank passes for each argument: (shape of its piece, dtype)."""
        return {n: (s, d) for n, (s, d, _t) in self.runner.expected_inputs().items()}

    @property
    def bytes_per_rank(self) -> int:
        from coconet.runtime.executor import plan_traffic

        return plan_traffic(self.plan, self.rank)

    def _agree(self, error: str | None) -> None:
        """Every rank learns whether any rank's inputs were refused, before anything runs."""
        if self.size == 1:
            if error:
                raise CocoError(error)
            return
        if self.guard is not None:  # a rank that stops calling is named, not waited for
            with self.guard.waiting(f"the input check of call {self.guard.calls + 1}"):
                errors = self.comm.allgather(error)
        else:
            errors = self.comm.allgather(error)
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad:
            r, e = bad[0]
            raise CocoError(e if r == self.rank else f"rank {r} refused its inputs: {e}")

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        with self._lock:
            return self._call(inputs)

    def _call(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        backend = self.runner.backend
        error = None
        pieces: dict[str, Any] = {}
        try:
            pieces = {
                name: backend.coerce_input(name, value, buf)
                for name, value, buf in self._pairs(inputs)
            }
            self.runner.check_inputs(pieces, backend.shape_of, backend.dtype_of)
            self._check_aliasing(pieces)
        except CocoError as e:
            error = str(e)
        self._agree(error)
        if self.guard is not None:
            self.guard.before_run()
        self.runner.set_inputs(pieces)
        self.runner.run()
        out: dict[str, Any] = {}
        for name, buf in self.plan.outputs.items():
            arg = self.plan.arguments.get(name)
            if arg is buf:
                out[name] = backend.write_back(buf, inputs[name], bound=name in self.runner.bound)
            else:
                out[name] = backend.output(buf)
        return out

    def _check_aliasing(self, pieces: Mapping[str, Any]) -> None:
        """An argument the program updates in place must not share memory with another
        argument: the update would change that input while the program reads it."""
        updated = [n for n, b in self.plan.outputs.items() if self.plan.arguments.get(n) is b]
        for name in updated:
            for other, value in pieces.items():
                mine = pieces[name]
                if (
                    other != name
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

    def _pairs(self, inputs: Mapping[str, Any]):
        args = self.plan.arguments
        unknown = sorted(set(inputs) - set(args))
        if unknown:
            raise CocoError(
                f"@{self.plan.program} has no argument(s) {', '.join(unknown)}; its arguments are "
                + ", ".join(args)
            )
        missing = [n for n in args if n not in inputs]
        if missing:
            raise CocoError(f"@{self.plan.program}: missing input(s) {', '.join(missing)}")
        for name, buf in args.items():
            yield name, inputs[name], buf

    def step(self) -> None:
        """Run the plan once on the data already in its buffers (benchmarks: no copies)."""
        self.runner.run()

    def barrier(self) -> None:
        self.runner.backend.barrier()

    def close(self) -> None:
        """Free buffers and communicators (collective)."""
        self.runner.close()


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


# One failure guard per process (compile() may be called for several programs).
_GUARD = None


def compile(
    program: Any,
    schedule: str | None = None,
    backend: str | None = None,
    ranks: int | None = None,
    *,
    entry: str | None = None,
    comm: Any = None,
    exact_collectives: bool = False,
    launch_config: Any = None,
    abort_on_error: bool = True,
    profile: Any = None,
    schedule_space: str = "all",
    cache: bool = True,
) -> CompiledProgram | SimCompiled:
    """Schedule and lower `program` (a Program, a path, or a front-end function) for this job
    and prepare it on this rank; see the module docstring for the calling contract.

    `schedule="auto"` picks the schedule the cost model ranks fastest for this job's ranks
    (coconet/autotune.py) on `profile` (a MachineProfile, a published profile's name, a JSON
    file, or None: this host, measured once and cached; the cuda backend needs one named).
    `schedule_space` is what it ranks: "all" (named and enumerated schedules) or "named".
    The choice is logged (logger `coconet.autotune`) and kept as `compiled.autotune`.

    A `.mlir` file compiled for the cpu or cuda backend under a given schedule is kept in the
    plan cache (lowering/plan_cache.py; `cache=False` bypasses it): compiling the same text,
    schedule, ranks and target again loads its plan instead of parsing, scheduling and
    lowering (`compiled.plan_cache_hit`)."""
    from coconet.autotune import is_auto

    auto = is_auto(schedule)
    source = _mlir_text(program) if cache and not auto else None
    unscheduled = program
    if source is None:
        program = _as_program(program, entry)
        if not auto:
            program = apply_schedule(program, schedule)
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise CocoError(f"unknown backend '{backend}': use one of {', '.join(BACKENDS)}")
    if backend == "sim":
        if source is not None:
            program = apply_schedule(_as_program(unscheduled, entry), schedule)
        if ranks is None:
            grid = program.grid
            ranks = int(np.prod(grid.shape)) if grid.is_static() else 1
        choice = None
        if auto:
            program, choice = _autotuned(program, backend, ranks, profile, None, schedule_space)
        compiled = SimCompiled(program, ranks)
        compiled.autotune = choice
        return compiled
    if backend == "cuda":
        require_gpu()
    from coconet.runtime.cpu import apply_rank_env_defaults

    apply_rank_env_defaults()
    from coconet.runtime.torch_comm import job_communicator

    comm = comm if comm is not None else job_communicator(backend)
    size = comm.Get_size()
    if ranks is not None and ranks != size:
        raise CocoError(
            f"compile(ranks={ranks}) but this job has {size} process(es): run it with "
            f"mpiexec -n {ranks} or torchrun --nproc-per-node {ranks}"
        )
    choice = None
    if auto:
        program, choice = _autotuned(program, backend, size, profile, comm, schedule_space)
    from coconet.lowering.lower_to_plan import lower
    from coconet.runtime.executor import PlanRunner
    from coconet.runtime.failures import FailureGuard
    from coconet.runtime.symmetric import job_nodes
    from coconet.runtime.torch_comm import mpi_module_for

    global _GUARD
    guard = None
    if abort_on_error and size > 1:
        if _GUARD is None:
            timeout = os.environ.get("COCONET_STEP_TIMEOUT")
            _GUARD = FailureGuard(
                comm, prefix="coconet", step_timeout=float(timeout) if timeout else None
            )
        guard = _GUARD
    nodes = job_nodes(comm, mpi_module_for(comm))
    cache_hit = False
    if source is not None:
        from coconet.lowering.plan_cache import cached_plan, plan_key

        def scheduled() -> Program:
            return apply_schedule(_as_program(unscheduled, entry), schedule)

        key = plan_key(source, entry, schedule or "", size, nodes, repr(launch_config), backend)
        cached = cached_plan(key, lambda: lower(scheduled(), size, launch_config, nodes))
        plan, cache_hit, program = cached.value, cached.cache_hit, scheduled
    else:
        plan = lower(program, size, launch_config, nodes)
    runner = PlanRunner(
        plan,
        comm.Get_rank(),
        make_backend(backend, comm, exact_collectives=exact_collectives),
        fault=guard.fault_hook if guard else None,
    )
    runner.setup()
    if guard is not None:
        guard.watch(runner)
    compiled = CompiledProgram(program, plan, runner, backend, comm, guard)
    compiled.autotune = choice
    compiled.plan_cache_hit = cache_hit
    return compiled


def _mlir_text(program: Any) -> str | None:
    """The text of `program` when it names a `.mlir` file (what the plan cache keys on)."""
    if not isinstance(program, str | Path):
        return None
    path = Path(program)
    if path.suffix != ".mlir" or not path.is_file():
        return None
    from coconet.core.program import read_text

    try:
        return read_text(path)
    except CocoError:
        return None  # the uncached path reports it


def _autotuned(
    program: Program, backend: str, ranks: int, profile: Any, comm: Any, space: str = "all"
) -> tuple[Program, dict[str, Any]]:
    """`program` under the schedule the cost model ranks fastest, and what was chosen (name,
    pipeline, predicted seconds, profile, the ranking's headline). In a job (`comm`), rank 0
    ranks and every rank applies its choice (collective: the profile may be measured on the
    job)."""
    import logging

    from coconet.autotune import rank_schedules, resolve_profile
    from coconet.cost_model import MachineProfile

    rank = comm.Get_rank() if comm is not None else 0
    if not isinstance(profile, MachineProfile):
        profile = resolve_profile(profile, backend, ranks, comm)
    choice = None
    error = None
    if rank == 0:
        try:
            ranking = rank_schedules(program, ranks, profile, space=space)
            best = ranking.best
            choice = {
                "name": best.name,
                "pipeline": best.pipeline,
                "predicted_s": best.seconds,
                "profile": profile.name,
                "headline": ranking.headline(),
            }
            logging.getLogger("coconet.autotune").info(ranking.headline())
        except CocoError as e:
            error = str(e)
    if comm is not None and comm.Get_size() > 1:
        choice, error = comm.bcast((choice, error), root=0)
    if error is not None:
        raise CocoError(error)
    assert choice is not None
    return apply_schedule(program, choice["pipeline"] or None), choice
