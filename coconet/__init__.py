"""coconet: distributed ML kernels as one program of computation and collectives.

import coconet
program = coconet.load("examples/adam.mlir")
result = coconet.run(program, inputs, ranks=4)      # the sim oracle
"""

from coconet.compile import compile
from coconet.core.program import CocoError, Program, load, parse_module

__all__ = ["CocoError", "Program", "compile", "load", "parse_module", "run"]


def run(program, inputs=None, ranks: int = 1, **kwargs):
    """Run `program` on `ranks` ranks in the sim oracle (see coconet.runtime.sim.run)."""
    from coconet.runtime.sim import run as sim_run

    return sim_run(program, inputs, ranks=ranks, **kwargs)
