"""Compiled programs on ranks that are threads of the test's process: the cpu backend over
the in-process communicator (runtime/inprocess.py), one `CompiledProgram` a rank, as a
script calling `coconet.compile` under mpiexec holds one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from coconet.compiled import CompiledProgram
from coconet.lowering.plan import Plan
from coconet.runtime.cpu import CpuBackend
from coconet.runtime.executor import PlanRunner
from coconet.runtime.inprocess import IN_PROCESS_MPI, InProcessWorld


def compiled_on_threads(
    program: Any,
    plan: Plan,
    body: Callable[[int, CompiledProgram], Any],
    *,
    comm: Callable[[Any], Any] = lambda c: c,
    pieces: bool = False,
    timeout: float = 120,
    backend_comm: Callable[[Any], Any] = lambda c: c,
    exact: bool = False,
) -> list[Any]:
    """`body(rank, compiled)` on `plan.size` threads, each rank's program compiled from
    `plan` (its communicator wrapped by `comm`, its backend's by `backend_comm`; `exact`:
    exact_collectives): what each returned, in rank order. A rank's failure stops the
    others' waits and is raised."""
    world = InProcessWorld(plan.size)
    results: list[Any] = [None] * plan.size
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        inner = world.comm(rank)
        backend = CpuBackend(backend_comm(inner), exact_collectives=exact, mpi=IN_PROCESS_MPI)
        runner = PlanRunner(plan, rank, backend)
        try:
            runner.setup()
            compiled = CompiledProgram(program, plan, runner, "cpu", comm(inner), pieces=pieces)
            results[rank] = body(rank, compiled)
        except BaseException as e:
            errors.append(e)
            world.fail(f"rank {rank}: {e}")  # the other ranks stop waiting
        finally:
            runner.close()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(plan.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    return results


def same_bits(got: Any, want: Any, what: str) -> None:
    """`got` is `want` bit for bit."""
    np.testing.assert_array_equal(
        np.atleast_1d(got).view(np.uint8), np.atleast_1d(want).view(np.uint8), err_msg=what
    )


def runs_as_the_sim_computes(program: Any, schedule: str, ranks: int) -> Plan:
    """`schedule` of `program` on the cpu backend's kernels (threaded ranks), bit for bit what
    the sim computes of the program as written; returns the plan."""
    from coconet.lowering.lower_to_plan import lower
    from coconet.runtime import sim
    from coconet.runtime.threaded import ThreadedExecutor
    from coconet.schedule import apply_schedule

    scheduled = apply_schedule(program, schedule)
    want = sim.run(program, ranks=ranks, seed=ranks)
    plan = lower(scheduled, ranks)
    got = ThreadedExecutor(plan).run(want.inputs)
    for name, value in want.outputs.items():
        same_bits(got[name], value, f"{name} under {schedule} at {ranks} rank(s)")
    return plan
