"""Table batching: the plan builder's last step, from the plan's launches to the plan it runs.

Launches of one kernel text (the same computation over tensors of other sizes: an optimizer
over a model's parameter tensors) fold into ONE launch of the kernel's table form
(kernels/table.py): each parameter becomes a per-tensor table, block b of the launch serves
one tensor's block. Steps are list-scheduled on their buffer dependencies: every ready step
that cannot be batched goes first (in program order), so that collectives and reductions
unlock the launches waiting for them; when only batchable launches are ready, the largest
group of one kernel goes out as one launch. Events are barriers: streams keep their order.

A step over the plan alone, so it prints both ways: `coco-opt -t 'plan{batch=false}'` is the
plan before it (every launch its own; a plan that runs as well, a launch per tensor), `-t
plan` after (test/filecheck/lowering/batching.mlir).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from coconet.lowering.kernel_ir import Kernel, KernelKey
from coconet.lowering.kernels.table import table_form
from coconet.lowering.plan import (
    PLAN_COLLECTIVE_BLOCKS,
    ArgTable,
    Buffer,
    Collective,
    Copy,
    Epoch,
    KernelArg,
    Launch,
    Matmul,
    PeerTable,
    RecordEvent,
    Step,
    WaitEvent,
    shrink_grids,
)


def step_buffers(step: Step) -> tuple[set[str], set[str]]:
    """Names of the buffers a step reads and writes (symmetric peers count as both)."""
    match step:
        case Launch():
            reads = {a.name for a in step.args if isinstance(a, Buffer)}
            peers: set[str] = set()
            for a in step.args:
                if isinstance(a, PeerTable):
                    peers.add(a.buffer.name)
                elif isinstance(a, ArgTable):
                    reads |= {x.name for x in a.items if isinstance(x, Buffer)}
                    peers |= {x.buffer.name for x in a.items if isinstance(x, PeerTable)}
            writes = set(step.writes) | peers
            return reads - writes, writes
        case Collective() | Copy():
            return {step.src.name}, {step.dst.name}
        case Matmul():
            into = step.acc if step.acc is not None else step.c
            summed: set[str] = {into.name} if step.accumulate else set()
            return {step.a.name, step.b.name} | summed, {step.c.name, into.name}
        case _:
            return set(), set()


@dataclass
class TableBatcher:
    """Batching over the kernels the builder made: those that run in table form
    (`batchable`: elementwise kernels by name; `collective`: fused collective kernels by name,
    with their text up to names), and where a table form goes (`add_kernel`, `fresh`)."""

    batchable: Mapping[str, Kernel]
    collective: Mapping[str, tuple[KernelKey, Kernel]]
    fresh: Callable[[str], str]
    kernels: list[Kernel]  # the unit's kernels, where a table form joins them
    kernel_names: set[str]
    tables: dict[KernelKey, str] = field(default_factory=dict)
    epoch_uses: dict[str, int] = field(default_factory=dict)
    # Buffers and edges the schedulers looked at, over all batchers (a test checks it grows
    # linearly with the program).
    dependence_checks: ClassVar[int] = 0

    def batch(self, steps: list[Step]) -> list[Step]:
        out: list[Step] = []
        segment: list[Step] = []
        for step in steps:
            for site in [a.site for a in getattr(step, "args", ()) if isinstance(a, Epoch)]:
                self.epoch_uses[site] = self.epoch_uses.get(site, 0) + 1
        for step in steps:
            if isinstance(step, RecordEvent | WaitEvent):
                out += self.schedule(segment)
                out.append(step)
                segment = []
            else:
                segment.append(step)
        return out + self.schedule(segment)

    def schedule(self, steps: list[Step]) -> list[Step]:
        n = len(steps)
        # Edges to the last writer of each buffer a step touches and, for a write, to the
        # readers since that write: the same order as an edge to every earlier conflicting
        # step (those are reached through these), found in one pass instead of all pairs.
        succs: list[list[int]] = [[] for _ in range(n)]
        waiting = [0] * n
        last_writer: dict[str, int] = {}
        readers: dict[str, list[int]] = {}
        for j, step in enumerate(steps):
            reads_j, writes_j = step_buffers(step)
            preds: set[int] = set()
            for b in reads_j | writes_j:
                if (w := last_writer.get(b)) is not None:
                    preds.add(w)
            for b in writes_j:
                preds.update(readers.pop(b, ()))
                last_writer[b] = j
            for b in reads_j:
                readers.setdefault(b, []).append(j)
            for i in preds:
                succs[i].append(j)
            waiting[j] = len(preds)
            TableBatcher.dependence_checks += len(reads_j) + len(writes_j) + len(preds)
        # Ready steps: plain ones, and batchable ones grouped by (kernel, stream), each kept
        # in step order; every round takes the first ready plain step, else the largest
        # group. Plain steps keep their order wherever their dependences allow (a GEMM the
        # program runs before an overlap stays before its first chunk, whose event the
        # communication stream waits for).
        plain: list[int] = []  # a heap
        groups: dict[tuple[KernelKey | str, int], list[int]] = {}

        def make_ready(j: int) -> None:
            step = steps[j]
            if isinstance(step, Launch) and self.batchable_launch(step):
                groups.setdefault((self.table_key(step), step.stream), []).append(j)
            else:
                heapq.heappush(plain, j)

        for j in range(n):
            if not waiting[j]:
                make_ready(j)
        out: list[Step] = []
        while plain or groups:
            if plain:
                taken = [heapq.heappop(plain)]
                out.append(steps[taken[0]])
            else:
                key = max(groups, key=lambda k: (len(groups[k]), -min(groups[k])))
                taken = sorted(groups.pop(key))
                run = [step for j in taken if isinstance(step := steps[j], Launch)]
                if len(run) == 1:
                    out.append(run[0])
                elif run[0].kernel in self.collective:
                    out += self.collective_table_launches(run)
                else:
                    out.append(self.table_launch(run))
            for i in taken:
                for j in succs[i]:
                    waiting[j] -= 1
                    if not waiting[j]:
                        make_ready(j)
        return out

    def batchable_launch(self, step: Launch) -> bool:
        return step.kernel in self.batchable or step.kernel in self.collective

    def table_key(self, step: Launch) -> KernelKey | str:
        if step.kernel in self.collective:
            return self.collective[step.kernel][0]
        return step.kernel

    def collective_table_launches(self, run: list[Launch]) -> list[Launch]:
        """Fused collective kernels of one text over many tensors (one fused region per
        tensor: an optimizer over a model's parameter tensors) as ONE launch of the table
        form: block b serves one tensor's block, and meets the same block of the same tensor
        on every peer, through that tensor's own flags (the protocol is per tensor).

        All blocks of a collective launch must be resident at once, so a table holds at most
        PLAN_COLLECTIVE_BLOCKS blocks: each tensor's grid shrinks in proportion (at least one
        block each; a kernel covers its slice at any grid), and more tensors than blocks
        take several launches."""

        sites = [a.site for s in run for a in s.args if isinstance(a, Epoch)]
        if not sites:
            # kernels of groups of one member: no flags, no peers, no residency to keep
            return [self.table_launch(run)]
        if len(sites) != len(run) or any(self.epoch_uses[site] != 1 for site in sites):
            # A kernel launched more than once on its flags (overlap chunks) keeps its own
            # launch count: not folded.
            return run
        launches: list[Launch] = []
        for start in range(0, len(run), PLAN_COLLECTIVE_BLOCKS):
            part = run[start : start + PLAN_COLLECTIVE_BLOCKS]
            grids = shrink_grids([s.grid for s in part], PLAN_COLLECTIVE_BLOCKS)
            resized = [dataclasses.replace(s, grid=g) for s, g in zip(part, grids)]
            launches.append(self.table_launch(resized) if len(resized) > 1 else resized[0])
        return launches

    def table_launch(self, run: list[Launch]) -> Launch:
        if run[0].kernel in self.collective:
            key, kernel = self.collective[run[0].kernel]
            if key not in self.tables:
                self.tables[key] = self.fresh(f"{run[0].kernel}_table")
            name = self.tables[key]
        else:
            name, kernel = f"{run[0].kernel}_table", self.batchable[run[0].kernel]
        if name not in self.kernel_names:
            self.kernel_names.add(name)
            # Each tensor's blocks take their epochs from its own flags' counter (a ticket
            # per tensor's grid), so every parameter is per tensor.
            self.kernels.append(table_form(kernel, name))
        blocks = [0]
        for launch in run:
            blocks.append(blocks[-1] + launch.grid)
        args: list[KernelArg] = [
            ArgTable(tuple(launch.args[k] for launch in run)) for k in range(len(kernel.params))
        ]
        args += [ArgTable(tuple(blocks)), len(run)]
        writes = tuple(w for launch in run for w in launch.writes)
        step = Launch(name, blocks[-1], run[0].block, args, run[0].shared_bytes, writes)
        step.stream = run[0].stream
        return step
