"""coconet.compile's calling convention on real MPI ranks (the mpich wheel's mpiexec): an Adam
loop written once against `ar-c` (w, m, v whole on every rank, as the program declares them)
runs unchanged under `rs-c-ag`, `fuse(rs-c-ag)` and `fuse(ar-c)`, whose schedules keep m and v
sliced, at 2 and 3 ranks over 1001 parameters (uneven pieces), bit-exact with the sim's loop;
`pieces=True` takes and returns the pieces; wrong shapes are refused under both conventions
(calling_convention_job.py holds the ranks' side)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_env import MPI_MARKS, MPIEXEC

JOB = Path(__file__).with_name("calling_convention_job.py")
SCHEDULES = ("ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)")

pytestmark = MPI_MARKS


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_loop_written_against_ar_c_runs_unchanged_under_sliced_schedules(ranks):
    r = subprocess.run(
        [str(MPIEXEC), "-n", str(ranks), sys.executable, str(JOB), "1001", *SCHEDULES],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "CONVENTION OK" in r.stdout
