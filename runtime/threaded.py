"""Run a lowered plan with every rank a thread of this process: the host-compiled kernels of
the plan's CUDA source, library collectives with the sim's exact semantics, BLAS matmuls.

This is the in-process equivalent of the `cpu` backend's MPI shared-memory windows: all
ranks' buffers live in one address space, so symmetric buffers are just arrays every rank can
reach. It is how tests run every generated kernel on 1-4 ranks and compare it with the oracle.
Ranks advance step by step together; a kernel launch runs on all ranks concurrently (fused
collective kernels wait on their peers' flags, so they must).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from coconet.lowering.host_compiler import HostLibrary, compile_host
from coconet.lowering.plan import (
    ArgTable,
    Buffer,
    Collective,
    Copy,
    Epoch,
    Launch,
    Matmul,
    PeerTable,
    Plan,
    RankValue,
    RecordEvent,
    WaitEvent,
)
from coconet.runtime import sim
from coconet.runtime import values as V

from coconet.program import CocoError, Program

HOST_DTYPES = dict(V.NUMPY_DTYPES, f64acc=np.dtype(np.float64))


def buffer_dtype(buf: Buffer) -> np.dtype:
    if buf.elt == "i64":
        return np.dtype(np.int64)
    if buf.elt == "f64":
        return np.dtype(np.float64)
    if buf.elt == "u32":
        return np.dtype(np.uint32)
    return V.numpy_dtype(buf.type)


class ThreadedExecutor:
    def __init__(self, plan: Plan, library: HostLibrary | None = None):
        self.plan = plan
        self.size = plan.size
        self.library = library or compile_host(plan.cuda_source)
        self.sim = sim.Interpreter.__new__(sim.Interpreter)
        self.sim.grid_shape = plan.grid_shape
        self.sim.size = self.size
        self.sim.coords = [V.coords_of(r, plan.grid_shape) for r in range(self.size)]
        self.memory: list[dict[str, np.ndarray]] = [
            {b.name: np.zeros(b.shape, dtype=buffer_dtype(b)) for b in plan.buffers}
            for _ in range(self.size)
        ]
        self.peer_tables: dict[tuple[str, tuple[int, ...], int], np.ndarray] = {}
        self.epochs: dict[str, int] = {}
        self.arg_tables: dict[tuple[int, int], np.ndarray] = {}
        self.kernels: dict[str, object] = {}
        self.pool = ThreadPoolExecutor(max_workers=self.size) if self.size > 1 else None

    def kernel(self, launch: Launch):
        if launch.kernel not in self.kernels:
            types = []
            for a in launch.args:
                if isinstance(a, (Buffer, PeerTable, ArgTable)):
                    types.append(ctypes.c_void_p)
                elif isinstance(a, float):
                    types.append(ctypes.c_double)
                else:
                    types.append(ctypes.c_longlong)
            self.kernels[launch.kernel] = self.library.kernel(launch.kernel, *types)
        return self.kernels[launch.kernel]

    def argument(self, a, rank: int):
        if isinstance(a, Buffer):
            return self.memory[rank][a.name]
        if isinstance(a, PeerTable):
            key = (a.buffer.name, a.span, rank)
            if key not in self.peer_tables:
                group = V.group_of(self.plan.grid_shape, a.span, rank)
                self.peer_tables[key] = np.array(
                    [self.memory[m][a.buffer.name].ctypes.data for m in group], dtype=np.uint64
                )
            return self.peer_tables[key]
        if isinstance(a, Epoch):
            return self.epochs[a.site]
        if isinstance(a, ArgTable):
            key = (id(a), rank)
            if key not in self.arg_tables:
                values = [self.argument(x, rank) for x in a.items]
                self.arg_tables[key] = np.array(
                    [v.ctypes.data if isinstance(v, np.ndarray) else v for v in values],
                    dtype=np.uint64 if isinstance(values[0], np.ndarray) else np.int64,
                )
            return self.arg_tables[key]
        if isinstance(a, RankValue):
            return a.table[rank]
        return a

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, buf in self.plan.arguments.items():
            for r, piece in enumerate(V.distribute(inputs[name], buf.type, self.plan.grid_shape)):
                self.memory[r][buf.name][...] = piece
        try:
            for step in self.plan.steps:
                self.execute(step)
        finally:
            if self.pool is not None:
                self.pool.shutdown()
        outputs = {}
        for name, buf in self.plan.outputs.items():
            pieces = [self.memory[r][buf.name] for r in range(self.size)]
            outputs[name] = V.assemble(pieces, buf.type, self.plan.grid_shape)
        return outputs

    def execute(self, step) -> None:
        match step:
            case Launch():
                kernel = self.kernel(step)
                for a in step.args:
                    if isinstance(a, Epoch):
                        self.epochs[a.site] = self.epochs.get(a.site, 0) + 1

                def launch(rank: int) -> None:
                    args = [self.argument(a, rank) for a in step.args]
                    kernel(step.grid, step.block, *args, shared_bytes=step.shared_bytes)

                if self.pool is None:
                    launch(0)
                else:
                    for f in [self.pool.submit(launch, r) for r in range(self.size)]:
                        f.result()
            case Matmul():
                for mem in self.memory:
                    a, b, c = mem[step.a.name], mem[step.b.name], mem[step.c.name]
                    cdt = V.compute_dtype(step.c.type)
                    if step.rows is None:
                        c[...] = np.matmul(a.astype(cdt), b.astype(cdt)).astype(c.dtype)
                    else:
                        a2 = a.reshape(-1, a.shape[-1])
                        c2 = c.reshape(-1, c.shape[-1])
                        for lo, hi in step.rows:
                            c2[lo:hi] = np.matmul(a2[lo:hi].astype(cdt), b.astype(cdt)).astype(
                                c.dtype
                            )
            case Copy():
                for mem in self.memory:
                    np.copyto(mem[step.dst.name], mem[step.src.name])
            case Collective():
                self.collective(step)
            case RecordEvent() | WaitEvent():
                pass  # ranks run their steps in order: stream overlap changes only timing
            case _:
                raise CocoError(f"the threaded executor cannot run {step}")

    def collective(self, step: Collective) -> None:
        pieces = [mem[step.src.name] for mem in self.memory]
        src, dst = step.src.type, step.dst.type
        rows = step.rows
        if rows is not None:
            # One chunk of an overlapped pipeline: the collective of rows [lo, hi).
            lo, hi = rows
            pieces = [p.reshape(-1, p.shape[-1])[lo:hi] for p in pieces]
        it = self.sim
        match step.op:
            case "all_reduce":
                out = sim.all_reduce(it, pieces, step.kind, src, dst, step.axes)
            case "reduce_scatter":
                out = sim.reduce_scatter(it, pieces, step.kind, src, dst, step.axes)
            case "all_gather":
                out = sim.all_gather(it, pieces, src, dst, step.axes)
            case "broadcast":
                out = sim.broadcast(it, pieces, step.root, step.axes)
            case "reduce":
                out = sim.reduce(it, pieces, step.kind, step.root, src, dst, step.axes)
            case "send":
                out = sim.send(it, pieces, step.along, step.shift)
            case _:
                raise CocoError(f"unknown collective {step.op}")
        for mem, piece in zip(self.memory, out):
            target = mem[step.dst.name]
            if rows is not None:
                target = target.reshape(-1, target.shape[-1])[rows[0] : rows[1]]
            target[...] = piece


def run_plan(
    program: Program,
    inputs: Mapping[str, np.ndarray] | None,
    ranks: int,
    *,
    seed: int = 0,
    config=None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Plan]:
    """Lower `program` for `ranks` ranks and run it with host kernels; returns (outputs,
    inputs used, plan)."""
    from coconet.lowering.lower_to_plan import lower

    plan = lower(program, ranks, config)
    given = sim.prepare_inputs(program, inputs, plan.grid_shape, seed)
    return ThreadedExecutor(plan).run(given), given, plan
