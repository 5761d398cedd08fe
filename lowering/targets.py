"""`coco-opt -t cuda`, `coco-opt -t plan`, `coco-opt -t sass-report` and `coco-opt -t traffic`:
print the CUDA translation unit, the execution plan, the machine-code report
(lowering/machine_code.py: registers, spills, loads first) or the traffic report
(lowering/traffic.py: bytes per step against the program's floor) of every function of a
module (after the pass pipeline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from coconet.core.program import Program


def _plans(
    module: ModuleOp,
    ranks: int | None,
    block: int,
    max_blocks: int,
    ranks_per_node: int = 0,
    batch: bool = True,
):
    from coconet.core.values import nodes_of
    from coconet.lowering.lower_to_plan import LaunchConfig, default_ranks, lower

    config = LaunchConfig(block=block, max_blocks=max_blocks, batch=batch)
    for f in module.ops:
        if isinstance(f, func.FuncOp):
            program = Program(module, f.sym_name.data)
            nodes: tuple[int, ...] = ()
            if ranks_per_node:
                nodes = nodes_of(
                    ranks if ranks is not None else default_ranks(program), ranks_per_node
                )
            yield lower(program, ranks, config, nodes)


@dataclass(frozen=True)
class CudaTarget(Target):
    """The CUDA C of each function (rank-independent text; `ranks` only binds a `?` grid)."""

    name = "cuda"
    ranks: int | None = None
    block: int = 256
    max_blocks: int = 1024
    # Consecutive ranks per node (0: one node): fused collectives spanning nodes lower
    # hierarchically, as under COCONET_RANKS_PER_NODE at run time.
    ranks_per_node: int = 0

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        plans = _plans(module, self.ranks, self.block, self.max_blocks, self.ranks_per_node)
        for plan in plans:
            output.write(f"// ===== @{plan.program} =====\n")
            output.write(plan.cuda_source)


@dataclass(frozen=True)
class PlanTarget(Target):
    """The execution plan of each function on `ranks` ranks (default: the grid's own size,
    or 1 for a grid sized at launch); `batch=false`: before table batching (batching.py),
    every launch its own."""

    name = "plan"
    ranks: int | None = None
    block: int = 256
    max_blocks: int = 1024
    # Consecutive ranks per node (0: one node): fused collectives spanning nodes lower
    # hierarchically, as under COCONET_RANKS_PER_NODE at run time.
    ranks_per_node: int = 0
    batch: bool = True

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        plans = _plans(
            module, self.ranks, self.block, self.max_blocks, self.ranks_per_node, self.batch
        )
        for plan in plans:
            output.write(plan.format())


@dataclass(frozen=True)
class SassReportTarget(Target):
    """Each function's kernels compiled by NVRTC for `arch` as a GPU build of its plan on
    `ranks` ranks compiles them (Plan.device_source), disassembled: per kernel its registers,
    stack and spills, and whether each vector loop issues every global load before it
    computes on loaded data ("loads first") and before its first division or square root."""

    name = "sass-report"
    ranks: int | None = None
    arch: str = "sm_90"
    block: int = 256
    max_blocks: int = 1024
    ranks_per_node: int = 0

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        from coconet.core.program import CocoError
        from coconet.lowering.machine_code import MachineCodeError, format_report, kernel_reports
        from coconet.toolchain.nvrtc import NvrtcError

        if not self.arch.startswith("sm_"):
            raise CocoError(f"sass-report needs a real architecture (sm_XX), not {self.arch!r}")
        plans = _plans(module, self.ranks, self.block, self.max_blocks, self.ranks_per_node)
        for plan in plans:
            title = f"@{plan.program} on {plan.size} rank(s), {self.arch}"
            if plan.peers_max():
                title += f", COCO_PEERS_MAX {plan.peers_max()}"
            try:
                reports = kernel_reports(plan.device_source(), self.arch)
            except (MachineCodeError, NvrtcError) as e:
                raise CocoError(f"sass-report: {e}") from None
            output.write(format_report(title, reports))


@dataclass(frozen=True)
class TrafficTarget(PlanTarget):
    """Each function's plan on `ranks` ranks as the bytes rank `rank` reads and writes per
    step, own memory and peers', against the floor the scheduled function sets
    (lowering/traffic.py): the last line is `total: T bytes/rank, floor: F bytes/rank (T/F =
    R)`."""

    name = "traffic"
    # the plan's options, and the rank reported
    rank: int = 0

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        from coconet.core.program import CocoError
        from coconet.lowering.traffic import format_report

        plans = _plans(module, self.ranks, self.block, self.max_blocks, self.ranks_per_node)
        for plan in plans:
            if not 0 <= self.rank < plan.size:
                raise CocoError(f"traffic: rank {self.rank} of a plan on {plan.size} rank(s)")
            f = Program(module, plan.program).func
            output.write(format_report(plan, f, self.rank))
