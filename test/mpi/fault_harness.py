"""Fault injection on real `coco-run` jobs, measured from outside (test_faults.py and
benchmarks/reliability.py use it).

`run_fault(kind, ranks)` launches `coco-run examples/sgd.mlir --np RANKS --backend cpu` with a
long `--bench` loop, makes one rank (the last) fail in the way `kind` names, and follows every
process of the job (the front end, mpiexec, hydra's proxy, the ranks) with psutil every 20 ms
until all are gone:

* `sigkill`   -- the test sends SIGKILL to the rank 3 s after every rank installed its
  failure guard (into the bench loop: the kernels of the example are in the cache);
* `exception` -- the rank raises in plan step 1 of its third run (`COCONET_FAULT=R:raise:1:3`);
* `compile`   -- the rank's kernels do not compile (`R:compile`);
* `absent`    -- the rank stops before its third run and never arrives at the barrier that
  starts the next bench iteration (`R:absent:0:3`, with `--step-timeout 3`);
* `fork-exit` -- the rank forks a child that lives on with the rank's descriptors (a forked
  data-loader worker) and exits with status 3 in plan step 1 of its third run
  (`R:fork-exit:1:3`): mpiexec never sees the rank's sockets close, the launcher must act.

Measured: the front end's exit status and its first stderr line (what the user sees), when each
rank process went away, the time from the fault (the SIGKILL; else the first rank gone) until
every process of the job was gone, and the processes still alive at the end (orphans).
A rank's own exit status is not observable from here (hydra's proxy is its parent and reaps
it), so what is checked for the ranks is that every one is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
FAULTS = ("sigkill", "exception", "compile", "absent", "fork-exit")
BENCH = ("--bench", "--warmup", "0", "--iters", "1000000", "-q")


@dataclass
class FaultRun:
    kind: str
    ranks: int
    victim: int
    returncode: int | None = None
    message: str = ""
    stderr: str = ""
    rank_pids: dict[int, int] = field(default_factory=dict)  # rank -> pid
    gone_at: dict[int, float] = field(default_factory=dict)  # rank -> seconds after launch
    fault_at: float | None = None  # seconds after launch
    all_gone_at: float | None = None  # every process of the job, front end included
    orphans: list[str] = field(default_factory=list)
    # when mpiexec and the front end exited (seconds after launch): where the time goes
    mpiexec_gone_at: float | None = None
    front_end_gone_at: float | None = None
    launched_wall: float = 0.0  # time.time() at the launch
    # rank -> {"pid", "code", "signal", "at"}: its own end, `at` in seconds after launch
    rank_exits: dict[int, dict] = field(default_factory=dict)

    def rank_end(self, rank: int) -> str:
        """How `rank` ended: `SIGKILL`, `exit 1`, or `?` when nobody recorded it."""
        e = self.rank_exits.get(rank)
        if e is None:
            return "?"
        if e["signal"] is not None:
            return signal.Signals(e["signal"]).name
        return f"exit {e['code']}"

    @property
    def every_rank_failed(self) -> bool:
        """Every rank has a recorded end, and none of them is a clean exit."""
        return sorted(self.rank_exits) == list(range(self.ranks)) and all(
            e["signal"] is not None or e["code"] != 0 for e in self.rank_exits.values()
        )

    @property
    def fault_to_last_rank_exit(self) -> float | None:
        """From the fault until the last rank's recorded end."""
        if self.fault_at is None or not self.rank_exits:
            return None
        return max(e["at"] for e in self.rank_exits.values()) - self.fault_at

    @property
    def fault_to_all_gone(self) -> float | None:
        if self.fault_at is None or self.all_gone_at is None:
            return None
        return self.all_gone_at - self.fault_at


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_NAMES: dict[int, str] = {}


def _name(p: psutil.Process) -> str:
    """A process's name, remembered (a process that is gone has none to ask for)."""
    if p.pid not in _NAMES:
        try:
            _NAMES[p.pid] = p.name()
        except psutil.NoSuchProcess:
            return ""
    return _NAMES[p.pid]


def _rank_of(p: psutil.Process) -> int | None:
    try:
        cmdline = " ".join(p.cmdline())
        # the rank itself, not its supervisor (whose command line holds the rank's)
        if "coconet.tools.rank_job" not in cmdline or "rank_supervisor" in cmdline:
            return None
        if "mpiexec" in p.name() or "hydra" in p.name():
            return None
        rank = p.environ().get("PMI_RANK")
        return int(rank) if rank is not None else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def _guarded(seen: dict[int, psutil.Process], run: FaultRun) -> bool:
    """Every rank has installed its failure guard (its pid is in the status directory)."""
    try:
        for rank, pid in run.rank_pids.items():
            status = seen[pid].environ().get("COCONET_STATUS_DIR")
            if status is None or not (Path(status) / f"rank{rank}.pid").exists():
                return False
    except psutil.NoSuchProcess:
        return False
    return True


def run_fault(kind: str, ranks: int, timeout: float = 120.0) -> FaultRun:
    if kind not in FAULTS:
        raise ValueError(f"kind is one of {FAULTS}")
    victim = ranks - 1
    args: tuple[str, ...] = BENCH
    env = dict(os.environ)
    env.pop("COCONET_FAULT", None)
    env["COCONET_FAULT_INJECTION"] = "1"  # the hook is off unless a test enables it
    if kind == "exception":
        env["COCONET_FAULT"] = f"{victim}:raise:1:3"
    elif kind == "compile":
        env["COCONET_FAULT"] = f"{victim}:compile"
    elif kind == "fork-exit":
        env["COCONET_FAULT"] = f"{victim}:fork-exit:1:3"
    elif kind == "absent":
        env["COCONET_FAULT"] = f"{victim}:absent:0:3"
        args += ("--step-timeout", "3")
    run = FaultRun(kind, ranks, victim)
    with (
        tempfile.TemporaryFile(mode="w+") as err,
        tempfile.TemporaryDirectory(prefix="coconet-fault-cache-") as cache,
    ):
        if kind == "compile":  # a fresh cache: the fault is in this rank's compilation
            env["COCONET_CACHE_DIR"] = cache
        exits = Path(cache) / "rank-exits.json"
        env["COCONET_RANK_EXITS"] = str(exits)
        _follow(run, args, env, err, timeout)
        if exits.exists():
            for rank, e in json.loads(exits.read_text()).items():
                run.rank_exits[int(rank)] = {**e, "at": e["time"] - run.launched_wall}
    return run


def _follow(run: FaultRun, args: tuple[str, ...], env: dict[str, str], err, timeout: float):
    """Launch the job and follow its processes until all are gone (see the module docstring)."""
    kind, ranks, victim = run.kind, run.ranks, run.victim
    start = time.monotonic()
    run.launched_wall = time.time()  # the supervisors' records are in wall-clock time
    front = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coconet.tools.coco_run",
            "examples/sgd.mlir",
            "--np",
            str(ranks),
            "--backend",
            "cpu",
            *args,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
    )
    seen: dict[int, psutil.Process] = {front.pid: psutil.Process(front.pid)}
    all_ranks_since: float | None = None
    try:
        while time.monotonic() - start < timeout:
            now = time.monotonic() - start
            if front.poll() is None:
                try:
                    for p in seen[front.pid].children(recursive=True):
                        seen.setdefault(p.pid, p)
                        _name(p)
                except psutil.NoSuchProcess:
                    pass
            # A process just forked may not show its final command line yet: look again.
            for pid, p in seen.items():
                if pid != front.pid and pid not in run.rank_pids.values():
                    rank = _rank_of(p)
                    if rank is not None and rank not in run.rank_pids:  # not a child it forked
                        run.rank_pids[rank] = pid
            for rank, pid in run.rank_pids.items():
                if rank not in run.gone_at and not _alive(seen[pid]):
                    run.gone_at[rank] = now
            if len(run.rank_pids) == ranks and all_ranks_since is None and _guarded(seen, run):
                all_ranks_since = now
            if (
                kind == "sigkill"
                and run.fault_at is None
                and all_ranks_since is not None
                and now - all_ranks_since > 3.0
            ):
                os.kill(run.rank_pids[victim], signal.SIGKILL)
                run.fault_at = time.monotonic() - start
            if run.mpiexec_gone_at is None and any(
                "mpiexec" in _name(p) and not _alive(p) for p in seen.values()
            ):
                run.mpiexec_gone_at = now
            if run.front_end_gone_at is None and front.poll() is not None:
                run.front_end_gone_at = now
            if front.poll() is not None and not any(_alive(p) for p in seen.values()):
                run.all_gone_at = time.monotonic() - start
                break
            time.sleep(0.02)
    finally:
        if front.poll() is None:
            front.kill()
        front.wait()
        run.orphans = [f"{p.pid} {p.name()}" for p in seen.values() if _alive(p)]
        for p in seen.values():
            if _alive(p):
                p.kill()
    if kind != "sigkill" and run.gone_at:
        run.fault_at = min(run.gone_at.values())
    run.returncode = front.returncode
    err.seek(0)
    run.stderr = err.read()
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    run.message = lines[0] if lines else ""
