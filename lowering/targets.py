"""`coco-opt -t cuda` and `coco-opt -t plan`: print the CUDA translation unit or the execution
plan of every function of a module (after the pass pipeline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from coconet.core.program import Program


def _plans(
    module: ModuleOp, ranks: int | None, block: int, max_blocks: int, ranks_per_node: int = 0
):
    from coconet.core.values import nodes_of
    from coconet.lowering.lower_to_plan import LaunchConfig, default_ranks, lower

    config = LaunchConfig(block=block, max_blocks=max_blocks)
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
    or 1 for a grid sized at launch)."""

    name = "plan"
    ranks: int | None = None
    block: int = 256
    max_blocks: int = 1024
    # Consecutive ranks per node (0: one node): fused collectives spanning nodes lower
    # hierarchically, as under COCONET_RANKS_PER_NODE at run time.
    ranks_per_node: int = 0

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        plans = _plans(module, self.ranks, self.block, self.max_blocks, self.ranks_per_node)
        for plan in plans:
            output.write(plan.format())
