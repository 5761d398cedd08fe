"""A blocking library all_reduce step on the cpu backend is one bound MPI call
(`collectives.blocking_call`, `Transport.all_reduce_call`): made every step without building,
testing and waiting on a request (the microsecond regime: `ar-c` at 1 KiB took 4.5-7 us of
host work over MPI's own call before, 1.7-2 us after), and bound again when the caller's
buffers move. Checked on threaded ranks through a communicator that counts the calls."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from compiled_ranks import compiled_on_threads

from coconet.compiled import CompiledProgram
from coconet.core.program import Program, parse_module
from coconet.lowering.lower_to_plan import lower
from coconet.runtime.cpu import LibraryClock
from coconet.schedule import apply_schedule

PROGRAM = """
func.func @ar(%x: !coco.tensor<{n}x{elt}, local>) -> !coco.tensor<{n}x{elt}>
    attributes {{coco.grid = #coco.grid<[?]>}} {{
  %t = comm.all_reduce sum %x : !coco.tensor<{n}x{elt}, local> -> !coco.tensor<{n}x{elt}>
  func.return %t : !coco.tensor<{n}x{elt}>
}}
"""


class Counting:
    """A communicator that counts the collectives called on it (its Split's too)."""

    def __init__(self, comm: Any, counts: dict[str, int]):
        self._comm, self._counts = comm, counts

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._comm, name)
        if name in ("Allreduce", "Iallreduce", "Iallgather"):

            def counted(*args: Any, **kw: Any) -> Any:
                self._counts[name] = self._counts.get(name, 0) + 1
                return attr(*args, **kw)

            return counted
        if name == "Split":
            return lambda *a, **kw: Counting(attr(*a, **kw), self._counts)
        return attr


@pytest.mark.parametrize(("elt", "dtype"), [("f32", np.float32), ("i32", np.int32)])
@pytest.mark.parametrize("ranks", [2, 3])
def test_each_step_is_one_blocking_call_rebound_when_buffers_move(elt, dtype, ranks):
    n = 7
    plan = lower(apply_schedule(Program(parse_module(PROGRAM.format(n=n, elt=elt))), "ar-c"), ranks)

    counts: list[dict[str, int]] = [{} for _ in range(ranks)]

    def body(rank: int, compiled: CompiledProgram) -> list:
        runner, backend = compiled.runner, compiled.runner.backend
        got = []
        first = np.arange(n, dtype=dtype) * (rank + 1)
        runner.set_inputs({"x": first})  # bound: the caller's array
        for _ in range(3):
            runner.run()
            got.append(backend.read(plan.outputs["t"]))
        moved = np.full(n, rank + 2, dtype=dtype)  # another array: the call is bound again
        runner.set_inputs({"x": moved})
        runner.run()
        got.append(backend.read(plan.outputs["t"]))
        return got

    results = compiled_on_threads(plan, plan, body, backend_comm=_counted(counts))
    scale = sum(r + 1 for r in range(ranks))
    for got, counted in zip(results, counts, strict=True):
        assert counted == {"Allreduce": 4}  # no request built, tested or waited on
        for step in got[:3]:
            np.testing.assert_array_equal(step, np.arange(n, dtype=dtype) * scale)
        np.testing.assert_array_equal(got[3], np.full(n, sum(r + 2 for r in range(ranks))))


def test_an_exact_reduction_keeps_the_rank_order_path():
    """A float sum the library may not reorder (`exact_collectives`) is no library call: the
    generator's gather and rank-order combination, as before."""
    plan = lower(apply_schedule(Program(parse_module(PROGRAM.format(n=5, elt="f32"))), "ar-c"), 2)
    counts: list[dict[str, int]] = [{}, {}]

    def body(rank: int, compiled: CompiledProgram) -> None:
        compiled.runner.set_inputs({"x": np.ones(5, np.float32)})
        compiled.runner.run()

    compiled_on_threads(plan, plan, body, backend_comm=_counted(counts), exact=True)
    assert counts == [{"Iallgather": 1}, {"Iallgather": 1}]


def _counted(counts: list[dict[str, int]]) -> Any:
    """Wraps rank r's communicator to count into counts[r]."""
    return lambda comm: Counting(comm, counts[comm.Get_rank()])


class Slow(Counting):
    """Each Allreduce takes at least 20 ms."""

    def __getattr__(self, name: str) -> Any:
        attr = super().__getattr__(name)
        if name != "Allreduce":
            return attr

        def slow(*args: Any, **kw: Any) -> Any:
            time.sleep(0.02)
            return attr(*args, **kw)

        return slow


def test_the_library_clock_counts_the_bound_call():
    """bench_latency's host overhead is a step's time less the library's: the bound blocking
    call is library time (it was counted as host work, the whole collective at 4 MiB)."""
    plan = lower(apply_schedule(Program(parse_module(PROGRAM.format(n=5, elt="f32"))), "ar-c"), 2)
    counts: list[dict[str, int]] = [{}, {}]

    def body(rank: int, compiled: CompiledProgram) -> float:
        clock = LibraryClock()
        compiled.runner.backend.clock_library(clock)
        compiled.runner.set_inputs({"x": np.ones(5, np.float32)})
        for _ in range(3):
            compiled.runner.run()
        return clock.seconds

    seconds = compiled_on_threads(
        plan, plan, body, backend_comm=lambda c: Slow(c, counts[c.Get_rank()])
    )
    assert counts == [{"Allreduce": 3}, {"Allreduce": 3}]
    assert all(s >= 0.06 for s in seconds), seconds
