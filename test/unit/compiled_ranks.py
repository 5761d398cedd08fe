"""Compiled programs on ranks that are threads of the test's process: the cpu backend over
the in-process communicator (runtime/inprocess.py), one `CompiledProgram` a rank, as a
script calling `coconet.compile` under mpiexec holds one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

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
