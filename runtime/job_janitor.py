"""Remove what an MPI job leaves behind, however it ends: MPICH's shared-memory segments and
the job's directory.

    python -S job_janitor.py JOB_DIR BEFORE_FILE MPIEXEC_PID  (stdin: a pipe from the launcher)

MPICH maps its intra-node segments from /dev/shm (`mpich_shm_*`) and unlinks them only when
its ranks finalize: a rank killed, a job aborted or timed out leaves them (2-4 MB each) with
nothing to reclaim them. Which names a job made is not announced, so the sweep takes what is
new since the launch (`BEFORE_FILE`, the names /dev/shm held then), owned by this user and
mapped by no live process: another job's segment is mapped by its ranks, and a leaked one by
nobody.

The launcher (runtime/launcher.py) sweeps itself once mpiexec has exited. This script covers
the case where the launcher cannot: it is started in a session of its own beside mpiexec and
reads its stdin, a pipe whose write end only the launcher holds. `done` on it means the
launcher cleaned up; end of file without it means the launcher died (SIGKILL), and the script
waits for mpiexec to go (the ranks end when their front end does: runtime/failures.py), sweeps,
removes the job directory and exits. Standard library only, run by path with `-S`, as
runtime/rank_supervisor.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

SHM = Path("/dev/shm")
PREFIXES = ("mpich_shm_",)  # MPICH's; coconet's own segments are unlinked once mapped
WAIT = 60.0  # seconds mpiexec may take to end once its front end is gone
SETTLE = 10.0  # seconds the job's ranks may take to end after mpiexec


def shm_names() -> set[str]:
    """The names in /dev/shm owned by this user (none where there is no /dev/shm)."""
    try:
        entries = list(os.scandir(SHM))
    except OSError:
        return set()
    uid = os.getuid()
    names = set()
    for e in entries:
        try:
            if e.stat(follow_symlinks=False).st_uid == uid:
                names.add(e.name)
        except OSError:
            continue
    return names


def mapped_names() -> set[str]:
    """The /dev/shm names some live process maps (from every readable /proc/PID/maps)."""
    mapped: set[str] = set()
    prefix = f"{SHM}/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    at = line.find(prefix)
                    if at >= 0:
                        name = line[at + len(prefix) :].strip()
                        mapped.add(name.removesuffix(" (deleted)"))
        except OSError:
            continue
    return mapped


def sweep(before: set[str]) -> list[str]:
    """Unlink the segments new since `before` that no live process maps (call it once the
    job's processes are gone: theirs are then mapped by nobody). Returns the removed."""
    new = {n for n in shm_names() - before if n.startswith(PREFIXES)}
    if not new:
        return []
    removed: list[str] = []
    for name in sorted(new - mapped_names()):
        try:
            (SHM / name).unlink()
            removed.append(name)
        except OSError:
            continue
    return removed


def rank_pids(status: Path) -> list[int]:
    """The pids the job's ranks recorded (runtime/failures.py writes `rank<N>.pid`)."""
    pids = []
    for f in status.glob("rank*.pid"):
        try:
            pids.append(int(f.read_text()))
        except (OSError, ValueError):
            continue
    return pids


def wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped by its dead parent's successor) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv: list[str]) -> int:
    job_dir, before_file, mpiexec = Path(argv[1]), Path(argv[2]), int(argv[3])
    before = set(json.loads(before_file.read_text()))
    said = sys.stdin.read()  # blocks until the launcher writes `done` or is gone
    if "done" in said:
        return 0
    wait_gone([mpiexec], WAIT)  # the ranks end when their front end does
    wait_gone(rank_pids(job_dir / "status"), SETTLE)
    sweep(before)
    shutil.rmtree(job_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
