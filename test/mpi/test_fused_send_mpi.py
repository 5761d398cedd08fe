"""fuse(sliced-send) and the RS/send/AG overlap on real MPI ranks (the mpich wheel's
mpiexec): the send kernel stores the computed slice into the next stage's MPI shared-memory
window (chunk by chunk under the overlap); with the stages declared on different nodes
(COCONET_RANKS_PER_NODE) the send is an MPI send. Both against the oracle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_env import MPI_MARKS

ROOT = Path(__file__).resolve().parents[2]

pytestmark = MPI_MARKS

SCHEDULES = [
    "fuse(sliced-send)",
    "ol(mm,rs)+fuse(sliced-send)",
    "ol(mm,rs,fuse(sliced-send),ag)",  # RS/send/AG overlapped chunk by chunk
]


def coco_run(ranks: int, env: dict[str, str]) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "coconet.tools.coco_run", "examples/pipeline_boundary.mlir"]
    args += ["--np", str(ranks), "--backend", "cpu", "--check", "-q"]
    for s in SCHEDULES:
        args += ["--schedule", s]
    return subprocess.run(
        args,
        capture_output=True,
        check=False,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(
    ("ranks", "per_node"), [(2, None), (4, None), (4, "2")], ids=["2", "4", "4-stages-on-two-nodes"]
)
def test_fused_send_matches_the_oracle(ranks, per_node):
    r = coco_run(ranks, {"COCONET_RANKS_PER_NODE": per_node} if per_node else {})
    assert r.returncode == 0, r.stdout + r.stderr
    for s in SCHEDULES:
        assert f"check [{s}]: every rank's outputs match the sim oracle (bit-exact)" in r.stdout
