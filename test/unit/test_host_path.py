"""The per-call host path of a compiled program (issue #29 item 3), on 2 in-process ranks of
the cpu backend: steady-state calls agree on their inputs through one integer (no object
allgather), reuse the checked pieces of unchanged inputs, and launch with arguments packed
once per placement -- and still refuse a wrong input, rebind a moved array, and compute
what the program says. (No timings here: benchmarks/bench_latency.py reports them.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from compiled_ranks import compiled_on_threads

import coconet
from coconet.compiled import CompiledProgram, _identity
from coconet.core.program import CocoError
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Launch
from coconet.schedule import apply_schedule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
N = 4096


class CountingComm:
    """The communicator a compiled program agrees through, counting what it is asked."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.allgathers = 0
        self.flags = 0

    def Get_rank(self) -> int:
        return self.comm.Get_rank()

    def Get_size(self) -> int:
        return self.comm.Get_size()

    def allgather(self, value: Any) -> list[Any]:
        self.allgathers += 1
        return self.comm.allgather(value)

    def allreduce_flag(self, flag: int) -> int:
        self.flags += 1
        return self.comm.allreduce_flag(flag)


def on_two_ranks(schedule: str, body: Callable[[int, CompiledProgram, CountingComm], Any]):
    """`body(rank, compiled, comm)` on 2 threads, each a rank of SGD under `schedule`."""
    plan = lower(apply_schedule(coconet.load(EXAMPLES / "sgd.mlir"), schedule), 2)
    comms: dict[int, CountingComm] = {}

    def counted(comm: Any) -> CountingComm:
        comms[comm.Get_rank()] = CountingComm(comm)
        return comms[comm.Get_rank()]

    return compiled_on_threads(
        plan.program, plan, lambda r, c: body(r, c, comms[r]), comm=counted, timeout=60
    )


@pytest.mark.parametrize("schedule", ["ar-c", "fuse(rs-c-ag)"])
def test_steady_calls_agree_on_one_int_and_pack_once(schedule):
    def body(rank: int, c: CompiledProgram, comm: CountingComm):
        launches = sum(isinstance(s, Launch) for s in c.plan.steps)
        g, w = np.zeros(N, np.float32), np.ones(N, np.float32)
        c(g=g, w=w, lr=0.5)  # the first call: replica checksums, an object allgather
        assert (comm.allgathers, comm.flags) == (1, 0)
        packs = c.runner.packs
        assert packs == launches
        for k in range(1, 5):
            g[...] = rank + k  # new values in the same array: read when the plan runs
            before = w.copy()
            out = c(g=g, w=w, lr=0.5)
            np.testing.assert_array_equal(w, before - 0.5 * (1 + 2 * k))
            assert "w" not in out or out["w"] is w
        assert (comm.allgathers, comm.flags) == (1, 4), "steady calls exchange no objects"
        assert c.runner.packs == packs, "the same arrays: launches keep their packed arguments"

        # a wrong input on rank 1 only, after the fast path: refused on both ranks, naming it
        bad = np.zeros(3, np.float32) if rank == 1 else g
        before = w.copy()
        with pytest.raises(CocoError) as refused:
            c(g=bad, w=w, lr=0.5)
        np.testing.assert_array_equal(w, before)  # nothing ran
        assert comm.allgathers == 2, "the messages of a refusal are exchanged as objects"

        # the same arrays again run, without repacking
        c(g=g, w=w, lr=0.5)
        assert c.runner.packs == packs

        # another array for w: rebound (the launches that take it repacked), updated
        w2 = np.full(N, 3.0, np.float32)
        c(g=g, w=w2, lr=0.5)
        assert "w" not in c.runner.bound or c.runner.packs > packs
        np.testing.assert_array_equal(w2, 3.0 - 0.5 * 9)
        np.testing.assert_array_equal(w, before - 0.5 * 9)  # the old one left alone

        # the same array moved by ndarray.resize: seen at its new address
        w2.resize(8 * N, refcheck=False)
        w2.resize(N, refcheck=False)
        moved = w2.copy()
        c(g=g, w=w2, lr=0.5)
        np.testing.assert_array_equal(w2, moved - 0.5 * 9)
        if "w" in c.runner.bound:
            assert c.runner.backend.address("w") == w2.ctypes.data

        # the same array, then one of another shape: refused
        with pytest.raises(CocoError, match="input 'w'.*got \\[5\\]"):
            c(g=g, w=np.ones(5, np.float32), lr=0.5)
        return str(refused.value)

    said = on_two_ranks(schedule, body)
    assert "rank 1 refused its inputs" in said[0], said
    assert "rank 1 must pass its piece of shape [4096], got [3]" in said[1], said
    assert said[1] in said[0]


def test_the_identity_of_an_input_sees_what_the_fast_path_must_not_reuse():
    a = np.zeros(N, np.float32)
    key = _identity(a)
    assert key == _identity(a)
    a.flags.writeable = False
    assert _identity(a) != key  # read-only now: an updated argument must be refused
    a.flags.writeable = True
    a.resize(8 * N, refcheck=False)
    assert _identity(a) != key
    assert _identity(a)[0] == a.ctypes.data
    assert _identity(a[::2]) != _identity(a[: len(a) // 2])  # strides count
    assert _identity(0.5) is None  # numbers are taken afresh every call
