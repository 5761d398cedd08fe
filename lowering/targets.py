"""`coco-opt -t cuda` and `coco-opt -t plan`: print the CUDA translation unit or the execution
plan of every function of a module (after the pass pipeline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from coconet.program import Program


def _plans(module: ModuleOp, ranks: int, block: int, max_blocks: int):
    from coconet.lowering.lower_to_plan import LaunchConfig, lower

    config = LaunchConfig(block=block, max_blocks=max_blocks)
    for f in module.ops:
        if isinstance(f, func.FuncOp):
            yield lower(Program(module, f.sym_name.data), ranks or None, config)


@dataclass(frozen=True)
class CudaTarget(Target):
    """The CUDA C of each function (rank-independent text; `ranks` only binds a `?` grid)."""

    name = "cuda"
    ranks: int = 0
    block: int = 256
    max_blocks: int = 1024

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        for plan in _plans(module, self.ranks, self.block, self.max_blocks):
            output.write(f"// ===== @{plan.program} =====\n")
            output.write(plan.cuda_source)


@dataclass(frozen=True)
class PlanTarget(Target):
    """The execution plan of each function on `ranks` ranks (default: the grid's own size,
    or 1 for a grid sized at launch)."""

    name = "plan"
    ranks: int = 0
    block: int = 256
    max_blocks: int = 1024

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        for plan in _plans(module, self.ranks, self.block, self.max_blocks):
            output.write(plan.format())
