"""Nothing left behind (issue #30, item 2): after a job ends abnormally -- a rank SIGKILLed,
a rank that never arrives (the step timeout), the front end SIGKILLed -- no MPICH segment of
it stays in /dev/shm (they leaked 2-4 MB per job, 16 of 16 cases), its job directory is gone
from the temporary directory, and no process of it runs, within 10 s of the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from coconet.runtime import job_janitor as janitor

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the mpich wheel's mpiexec"),
    pytest.mark.skipif(not janitor.SHM.is_dir(), reason="no /dev/shm on this machine"),
]

BENCH = ("examples/adam.mlir", "--np", "2", "--backend", "cpu", "-q")
BENCH_FOREVER = ("--bench", "--warmup", "1", "--iters", "1000000")


def _leaked(before: set[str]) -> set[str]:
    """MPICH segments new since `before` that no live process maps: a job running beside
    this test (another xdist worker's) maps its own."""
    new = {n for n in janitor.shm_names() - before if n.startswith(janitor.PREFIXES)}
    return new - janitor.mapped_names()


def _ranks_of(front: subprocess.Popen) -> list[psutil.Process]:
    try:
        procs = psutil.Process(front.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [
        p
        for p in procs
        if "rank_job" in " ".join(p.cmdline()) and "supervisor" not in " ".join(p.cmdline())
    ]


def _wait_clean(before: set[str], tmp: Path, everything: list[psutil.Process]) -> float:
    start = time.monotonic()
    while time.monotonic() - start < 10:
        alive = [p for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive and not _leaked(before) and not list(tmp.glob("coconet-job-*")):
            return time.monotonic() - start
        time.sleep(0.1)
    alive = [p for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    raise AssertionError(
        f"10 s after the end: segments {sorted(_leaked(before))}, job directories "
        f"{[p.name for p in tmp.glob('coconet-job-*')]}, processes {alive}"
    )


@pytest.mark.parametrize("fault", ["rank-sigkill", "front-end-sigkill", "absent-rank"])
def test_an_abnormal_end_leaves_nothing_behind(tmp_path, fault):
    before = janitor.shm_names()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    args: tuple[str, ...] = BENCH_FOREVER
    if fault == "absent-rank":
        env |= {"COCONET_FAULT": "1:absent:0:3", "COCONET_FAULT_INJECTION": "1"}
        args = ("--bench", "--warmup", "1", "--iters", "5", "--step-timeout", "3")
    front = subprocess.Popen(
        [sys.executable, "-m", "coconet.tools.coco_run", *BENCH, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    everything: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_ranks_of(front)) < 2:
            time.sleep(0.2)
        ranks = _ranks_of(front)
        assert len(ranks) == 2, "the job did not start"
        time.sleep(2)  # inside the bench loop: MPICH's segments are made and mapped
        assert {n for n in janitor.shm_names() - before if n.startswith(janitor.PREFIXES)}, (
            "MPICH made no segment in /dev/shm: this test would prove nothing"
        )
        everything = psutil.Process(front.pid).children(recursive=True)
        if fault == "rank-sigkill":
            ranks[-1].send_signal(signal.SIGKILL)
        elif fault == "front-end-sigkill":
            front.send_signal(signal.SIGKILL)
        front.wait(timeout=60)
        assert front.returncode != 0
        took = _wait_clean(before, tmp_path, everything)
        print(f"{fault}: clean {took:.2f} s after the front end ended")
    finally:
        if front.poll() is None:
            front.kill()
        for p in everything:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        front.wait()
        assert front.stderr is not None
        front.stderr.close()


def test_a_normal_end_removes_nothing_it_did_not_make(tmp_path):
    """The sweep takes only new, unmapped MPICH segments: a segment that was there before
    the job, or one that a live process maps, stays."""
    old = janitor.SHM / f"mpich_shm_coconet_test_{os.getpid()}_old"
    old.write_bytes(b"x")
    try:
        before = janitor.shm_names()
        new = janitor.SHM / f"mpich_shm_coconet_test_{os.getpid()}_new"
        held = janitor.SHM / f"mpich_shm_coconet_test_{os.getpid()}_held"
        new.write_bytes(b"x" * 4096)
        held.write_bytes(b"x" * 4096)
        import mmap

        with open(held, "r+b") as f, mmap.mmap(f.fileno(), 4096):
            assert janitor.sweep(before) == [new.name]
            assert held.exists()
        assert old.exists()
        assert janitor.sweep(before) == [held.name]
    finally:
        for p in janitor.SHM.glob(f"mpich_shm_coconet_test_{os.getpid()}_*"):
            p.unlink()
