"""Running a script as a 2-rank torchrun job from a test: one environment cleaned of a
launcher's variables (an MPI or torchrun job around the test suite must not leak into it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "OMPI_", "MPI_", "HYDRA_", "RANK", "WORLD_SIZE"))
    }
    env["OMP_NUM_THREADS"] = "1"
    return env


def torchrun_two(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node 2 ARGS...` from the repository's root."""
    return torchrun(2, *args, timeout=timeout)


def torchrun(ranks: int, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node RANKS ARGS...` from the repository's root."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        + ["--nproc-per-node", str(ranks), *args],
        check=False,
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
