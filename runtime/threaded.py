"""Run a lowered plan with every rank a thread of this process: N ordinary plan runners
(runtime/executor.py) over the cpu backend, their communicator the in-process stand-in for MPI
(runtime/inprocess.py), symmetric buffers in shared memory every thread can reach.

It is how tests run every generated kernel on 1-4 ranks and compare it with the oracle without
launching processes: the same plan walker, kernels, collectives and shared-memory protocol as
the cpu backend under mpiexec. Collectives reduce in rank order in f64 (exact collectives), so
results are bit-exact against the sim oracle.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from coconet.core import values as V
from coconet.core.program import CocoError
from coconet.lowering.plan import Plan
from coconet.runtime.cpu import CpuBackend
from coconet.runtime.executor import PlanRunner
from coconet.runtime.inprocess import IN_PROCESS_MPI, InProcessWorld, PeerFailed


class ThreadedExecutor:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.size = plan.size

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Logical inputs in, logical outputs out (core/values.py)."""
        plan = self.plan
        world = InProcessWorld(self.size)
        results: list[dict[str, np.ndarray] | None] = [None] * self.size
        errors: list[BaseException] = []

        def rank_main(rank: int) -> None:
            runner = None
            try:
                backend = CpuBackend(world.comm(rank), exact_collectives=True, mpi=IN_PROCESS_MPI)
                runner = PlanRunner(plan, rank, backend)
                runner.setup()
                coords = V.coords_of(rank, plan.grid_shape)
                runner.set_inputs(
                    {
                        name: V.piece_of(inputs[name], buf.type, coords, plan.grid_shape)
                        for name, buf in plan.arguments.items()
                    },
                    zero_copy=False,
                )
                runner.run()
                results[rank] = {n: backend.read(b) for n, b in plan.outputs.items()}
                runner.close()
            except BaseException as e:
                if not isinstance(e, PeerFailed):
                    errors.append(e)
                world.fail(f"rank {rank}: {type(e).__name__}: {e}")

        if self.size == 1:
            rank_main(0)
        else:
            threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(self.size)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        if any(r is None for r in results):
            raise CocoError(f"the threaded run of @{plan.program} failed: {world.failed}")
        outputs: dict[str, Any] = {}
        for name, buf in plan.outputs.items():
            pieces = [results[r][name] for r in range(self.size)]  # type: ignore[index]
            outputs[name] = V.assemble(pieces, buf.type, plan.grid_shape)
        return outputs
