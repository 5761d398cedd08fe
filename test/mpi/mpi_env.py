"""What the MPI tests need: the mpich wheel's `mpiexec` beside this interpreter, and mpi4py;
the marks each MPI test module takes (`pytestmark = MPI_MARKS`)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import psutil
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


def run_job(
    cmd: list[str], *, timeout: float, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd)` capturing text output; a command still running after `timeout`
    fails the test with what each process under it was doing (a hang under CI's load is then
    diagnosable from the log), and every one of them is killed."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = _process_tree(proc.pid)
        for p in [psutil.Process(proc.pid), *tree]:
            with contextlib.suppress(psutil.Error):
                p.kill()
        out, err = proc.communicate()
        rows = "\n".join(_describe(p) for p in tree)
        raise AssertionError(
            f"{' '.join(cmd)} ran past {timeout:g} s; its processes:\n{rows}\n"
            f"stdout: {out[-2000:]}\nstderr: {err[-2000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _process_tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _describe(p: psutil.Process) -> str:
    try:
        with p.oneshot():
            return (
                f"  {p.pid} ppid {p.ppid()} {p.status()} cpu {sum(p.cpu_times()[:2]):.1f}s: "
                + (" ".join(p.cmdline())[:300])
            )
    except psutil.Error:
        return f"  {p.pid} (gone)"
