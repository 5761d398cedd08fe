"""`coconet.compile`: a program, scheduled and lowered, ready to call on this rank's data.

    # run with:  mpiexec -n 4 python train.py
    import coconet
    step = coconet.compile("examples/adam.mlir", schedule="fuse(rs-c-ag)", backend="cpu")
    # w, m, v whole on every rank, as adam.mlir declares them (replicated), under any schedule
    out = step(g=my_grad, w=w, m=m, v=v, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, step=1.0)

The contract:

* `compile` is COLLECTIVE on the cpu and cuda backends: every rank of the job calls it. The job
  is `MPI.COMM_WORLD` under mpiexec, or torch.distributed's process group under torchrun (gloo
  for library collectives, POSIX shared memory for fused kernels; runtime/torch_comm.py); a
  process launched as one of several that cannot join its job refuses instead of running
  alone. Every rank calls it with the same program and schedule (it allocates symmetric
  buffers and communicators). The rank and the number of ranks come from the job; `ranks`,
  when given, must equal the number of processes.
* cpu / cuda, the default calling convention: each rank passes, for every argument, its value
  under the type the PROGRAM AS WRITTEN declares, whatever the schedule (core/values.py
  `piece_of` of the logical value under that type): a replicated tensor whole, its own value
  of a local tensor (a data-parallel rank's local gradient: for `!coco.tensor<S, local>` an
  array of shape S, not the stacked logical value), and its part of a tensor the program
  itself declares sliced (ZeRO-3's state: the program chose pieces). So a loop written against
  `ar-c` runs unchanged under `rs-c-ag` and `fuse(rs-c-ag)`, whose schedules keep replicated
  state (Adam's m and v) sliced: the runtime hands the plan this rank's piece of the caller's
  array (a view, zero copy where it is contiguous: dim-0 pieces of a C-contiguous array) and,
  after each call, all-gathers the updated pieces back into the caller's array, in place
  (the backend's collectives: on the device on cuda; uneven pieces as core/values.py
  `split_range` cuts them). "As written" is the program handed to compile: one scheduled
  beforehand declares its own types. coconet/convention.py has the details.
* `pieces=True`, the zero-copy opt-in: each rank passes its piece of every argument under the
  SCHEDULED program's types (its part of the state the schedule slices; `compiled.plan.
  arguments[name].type`), bound as it is, nothing gathered: what coconet.torch and the
  benchmarks use. The sim refuses it.
* `compiled.input_shapes()` says what this rank passes under the chosen convention. Rank-0
  tensors (scalars) may be Python numbers. Arrays must have the exact dtype (bf16:
  ml_dtypes.bfloat16). cpu: NumPy arrays (or host tensors with `__dlpack__`). cuda: CuPy
  arrays or anything with `__dlpack__` (PyTorch tensors, ...); NumPy arrays are copied to the
  GPU.
* Every call returns a dict with this rank's value of every output (returned values and
  updated arguments by name) under the same convention. An updated argument is written in
  place into the caller's array (as `coco.update` means) and that same array is returned; a
  returned value is a new array each call. `compiled.step()` reruns the plan on the pieces
  its buffers hold, without the gather (benchmarks; with `pieces=True`).
* Inputs are checked on every rank before anything runs, and the ranks agree on the verdict:
  a wrong shape, dtype or name on any rank raises the same CocoError on every rank, naming
  the argument and the shape expected under the convention.
* An uncaught exception on any rank of a multi-rank job aborts the whole job with one line
  naming the rank (runtime/failures.py), so no rank hangs waiting for it
  (`abort_on_error=False` leaves Python's own handling). A rank that makes no progress in
  one plan step, or never arrives where its peers wait, for `step_timeout` seconds (default
  COCONET_STEP_TIMEOUT, else 600 s; 0 = off) aborts the job too, naming it.
* Every rank compiles the same program under the same schedule (checked: a hash), and passes
  the same value of each argument replicated as the caller passes it (checked at the first
  call; `check_replicas`).
* sim: the reference interpreter; all ranks run in this process. It takes and returns LOGICAL
  values (core/values.py: a local tensor's value is the stack of every rank's value) and
  needs no MPI.

`schedule` is a named schedule (coconet.schedule, when present) or a pass pipeline
("coco-split-allreduce,coco-reorder,..."); None runs the program as written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from coconet.compiled import (
    BACKENDS,
    CompiledProgram,
    SimCompiled,
    apply_pipeline,
    apply_schedule,
    default_backend,
    gpu_available,
    is_pipeline,
    make_backend,
    prepare,
    program_of,
    require_gpu,
)
from coconet.core import env
from coconet.core.program import CocoError, Program

__all__ = [
    "BACKENDS",
    "CompiledProgram",
    "SimCompiled",
    "apply_pipeline",
    "apply_schedule",
    "compile",
    "default_backend",
    "gpu_available",
    "is_pipeline",
    "make_backend",
    "require_gpu",
]


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
    step_timeout: float | None = None,
    check_replicas: bool = True,
    pieces: bool = False,
) -> CompiledProgram | SimCompiled:
    """Schedule and lower `program` (a Program, a path, or a front-end function) for this job
    and prepare it on this rank; see the module docstring for the calling contract.

    `schedule="auto"` picks the schedule the cost model ranks fastest for this job's ranks
    (coconet/tune/autotune.py) on `profile` (a MachineProfile, a published profile's name, a JSON
    file, or None: this host, measured once and cached; the cuda backend needs one named).
    `schedule_space` is what it ranks: "all" (named and enumerated schedules) or "named".
    The choice is logged (logger `coconet.autotune`) and kept as `compiled.autotune`.

    A `.mlir` file compiled for the cpu or cuda backend under a given schedule is kept in the
    plan cache (lowering/plan_cache.py; `cache=False` bypasses it): compiling the same text,
    schedule, ranks and target again loads its plan instead of parsing, scheduling and
    lowering (`compiled.plan_cache_hit`).

    On several ranks, `compile` checks that every rank compiles the same program under the
    same schedule (a hash of both), and the first call checks that the ranks replicating an
    argument passed the same value (`check_replicas=False` skips it), refusing on every rank
    otherwise. A rank that makes no progress in one plan step, or does not arrive at a call
    its peers wait in, for `step_timeout` seconds (default: COCONET_STEP_TIMEOUT, else
    core/env.py DEFAULT_STEP_TIMEOUT, 600 s; 0 = no limit) ends the job with a message
    naming it.

    `pieces=True` opts into the zero-copy calling convention (each rank's pieces under the
    scheduled program's types); the default takes and returns the program as written's values
    under every schedule (see the module docstring)."""
    from coconet.tune.autotune import is_auto

    auto = is_auto(schedule)
    source = _mlir_text(program) if cache and not auto else None
    unscheduled = program
    written: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    if source is None:
        program = program_of(program, entry)
        written = _written(program)
        if not auto:
            program = apply_schedule(program, schedule)
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise CocoError(f"unknown backend '{backend}': use one of {', '.join(BACKENDS)}")
    if backend == "sim":
        if pieces:
            raise CocoError(
                "compile(..., pieces=True) is the cpu and cuda backends' convention: the sim "
                "takes and returns logical values"
            )
        if source is not None:  # parsed here, for this call: scheduled in place
            program = apply_schedule(program_of(unscheduled, entry), schedule, in_place=True)
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
    from coconet.convention import written_changes
    from coconet.lowering.lower_to_plan import lower
    from coconet.runtime.failures import FailureGuard
    from coconet.runtime.symmetric import job_nodes
    from coconet.runtime.torch_comm import mpi_module_for

    global _GUARD
    guard = None
    timeout = env.step_timeout(step_timeout)
    if abort_on_error and size > 1:
        if _GUARD is None:
            _GUARD = FailureGuard(comm, prefix="coconet", step_timeout=timeout)
        elif step_timeout is not None:
            _GUARD.step_timeout = timeout
        guard = _GUARD
    nodes = job_nodes(comm, mpi_module_for(comm))
    cache_hit = False
    if source is not None:
        from coconet.lowering.plan_cache import cached_plan, plan_key

        def scheduled() -> Program:
            return apply_schedule(program_of(unscheduled, entry), schedule, in_place=True)

        def build() -> Any:
            parsed = program_of(unscheduled, entry)
            as_written = _written(parsed)  # before the schedule rewrites it in place
            ready = apply_schedule(parsed, schedule, in_place=True)
            # parsed for this build alone: the lowering's decisions go on it, not on a copy
            plan = lower(ready, size, launch_config, nodes, in_place=True)
            plan.written_types = written_changes(plan, *as_written)
            return plan

        key = plan_key(source, entry, schedule or "", size, nodes, repr(launch_config), backend)
        _agree_on_program(comm, guard, key, entry or Path(unscheduled).name, schedule)
        cached = cached_plan(key, build)
        plan, cache_hit, program = cached.value, cached.cache_hit, scheduled
    else:
        if size > 1:  # printing a deep program costs: only where there are ranks to agree
            from coconet.toolchain.kernel_cache import content_key

            digest = content_key(
                program.print(), backend, str(exact_collectives), repr(launch_config)
            )
            _agree_on_program(comm, guard, digest, program.name, schedule)
        plan = lower(program, size, launch_config, nodes)
        plan.written_types = written_changes(plan, *written)
    compiled = prepare(
        program,
        backend,
        comm,
        plan=plan,
        exact_collectives=exact_collectives,
        guard=guard,
        pieces=pieces,
    )
    compiled.autotune = choice
    compiled.plan_cache_hit = cache_hit
    compiled.check_replicas = check_replicas
    return compiled


def _written(program: Program) -> tuple[dict[str, Any], dict[str, Any]]:
    """The program as written's argument types and returned values' types, by name (what the
    default calling convention takes and returns, coconet/convention.py)."""
    return (
        {a.name: a.type for a in program.arguments},
        {o.name: o.type for o in program.outputs if not o.updated_argument},
    )


def _agree_on_program(comm: Any, guard: Any, digest: str, name: str, schedule: str | None) -> None:
    """Every rank compiled the same program under the same schedule (`digest` covers both,
    and the backend): ranks running different plans would wait in each other's collectives
    and flag waits until a timeout, or compute garbage. Refused on every rank, naming one
    that differs from rank 0."""
    if comm.Get_size() == 1:
        return
    mine = (digest, name, schedule or "as written")
    if guard is not None:  # a rank that never calls compile() is named, not waited for
        with guard.waiting("compile()'s program check"):
            every = comm.allgather(mine)
    else:
        every = comm.allgather(mine)
    for r, theirs in enumerate(every):
        if theirs[0] != every[0][0]:
            raise CocoError(
                f"rank {r} compiled another program or schedule than rank 0 (rank 0: "
                f"@{every[0][1]} under {every[0][2]!r}; rank {r}: @{theirs[1]} under "
                f"{theirs[2]!r}, or another text, backend or launch configuration): every rank "
                "must compile the same program and schedule"
            )


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

    from coconet.tune.autotune import rank_schedules, resolve_profile
    from coconet.tune.cost_model import MachineProfile

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
