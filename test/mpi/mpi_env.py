"""What the MPI tests need: the mpich wheel's `mpiexec` beside this interpreter, and mpi4py;
the marks each MPI test module takes (`pytestmark = MPI_MARKS`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).parent / "mpiexec"

try:
    import mpi4py  # noqa: F401

    HAVE_MPI = MPIEXEC.exists()
except ImportError:
    HAVE_MPI = False

MPI_MARKS = [
    pytest.mark.mpi,
    pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and the mpich wheel's mpiexec"),
]
