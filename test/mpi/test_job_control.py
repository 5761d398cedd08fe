"""Ending the front end ends the job: a `coco-run` killed in the middle of a long --bench run
by SIGTERM, SIGHUP or even SIGKILL (which it cannot catch: its ranks notice it is gone) leaves
no mpiexec, proxy or rank running; each case measures how long until every process is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the mpich wheel's mpiexec"),
]


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _is_rank(p: psutil.Process) -> bool:
    """A rank process: mpiexec's own command line names the worker too, and so does the rank's
    supervisor's (runtime/rank_supervisor.py)."""
    try:
        cmdline = " ".join(p.cmdline())
        return (
            p.name().startswith("python")
            and "rank_job" in cmdline
            and "rank_supervisor" not in cmdline
        )
    except psutil.NoSuchProcess:
        return False


BENCH_FOREVER = ("--bench", "--warmup", "1", "--iters", "1000000")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_killing_the_front_end_ends_every_rank(sig):
    _kill_the_front_end(
        ["coconet.tools.coco_run", "examples/adam.mlir", "--np", "2", "--backend", "cpu", "-q"]
        + list(BENCH_FOREVER),
        sig,
    )


@pytest.mark.parametrize("tool", ["coco_tune", "coco_bench"])
def test_killing_coco_tune_or_coco_bench_ends_every_rank(tool):
    """The other tools that launch rank jobs end them the same way (tools/rank_job.py
    tool_main): every process gone, the signal named."""
    if tool == "coco_tune":
        args = ["examples/adam.mlir", "--np", "2", "--top", "1", "--iters", "1000000"]
    else:
        args = ["examples/adam.mlir", "--np", "2", "--backend", "cpu", "-n", "1000000"]
    _kill_the_front_end([f"coconet.tools.{tool}", *args], signal.SIGTERM)


def _kill_the_front_end(command: list[str], sig: signal.Signals) -> None:
    front = subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    everything: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        workers: list[psutil.Process] = []
        while time.monotonic() < deadline:
            workers = [p for p in _descendants(front.pid) if _is_rank(p)]
            if len(workers) == 2:
                break
            time.sleep(0.2)
        assert len(workers) == 2, "the job did not start"
        time.sleep(2)  # inside the bench loop
        everything = _descendants(front.pid)
        os.kill(front.pid, sig)
        start = time.monotonic()
        front.wait(timeout=30)
        while _alive(everything) and time.monotonic() - start < 20:
            time.sleep(0.1)
        left = _alive(everything)
        elapsed = time.monotonic() - start
        assert not left, f"still running {elapsed:.1f} s after {sig.name}: {left}"
        assert front.returncode != 0
        if sig != signal.SIGKILL:
            err = front.stderr.read()
            assert "the job's ranks were ended" in err
            assert "Traceback" not in err
        print(f"{sig.name}: every process gone in {elapsed:.2f} s")
    finally:
        if front.poll() is None:
            front.kill()
        # the ranks outlive a killed front end exactly when this test fails: end them too
        for p in _alive(everything or _descendants(front.pid)):
            p.kill()
        front.wait()
        front.stdout.close()
        front.stderr.close()


def test_ranks_whose_front_end_died_while_they_started_end_the_job(tmp_path):
    """coco-run killed before its ranks reached its monitor socket (a loaded machine, slow
    imports): they cannot hold a lifeline, so each ends the job at once instead of running on
    as orphans nobody collects."""
    from coconet.runtime.failures import MONITOR_ENV

    env = {**os.environ, MONITOR_ENV: str(tmp_path / "gone.sock")}
    started = "from coconet.runtime.failures import FailureGuard; FailureGuard(); print('ran on')"
    start = time.monotonic()
    done = subprocess.run(
        [str(MPIEXEC), "-n", "2", sys.executable, "-c", started],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert "ran on" not in done.stdout
    assert "front end that launched this job is gone" in done.stderr
    assert "Traceback" not in done.stderr
    print(f"orphaned at start: every rank gone in {elapsed:.2f} s")
