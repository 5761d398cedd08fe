"""Run one MPI rank and record how it ended: its exit status, or the signal that killed it.

    mpiexec -n N python -S rank_supervisor.py python -m WORKER JOB.json

mpiexec (hydra) starts every process it launches as a session leader, reaps it itself, and
ends a failed job by SIGKILLing each of those process groups: nothing outside hydra could learn
a rank's own exit status. The launcher (runtime/launcher.py) therefore starts each rank through
this script, three processes deep:

    hydra's proxy -> P  this script as hydra started it (leader of session and group G)
                    -> S  a fork of P that moves to a group of its own in the same session
                      -> R  the rank: a fork of S that joins G again, then execs the worker

R is in G with P, so hydra's group kill ends R (and P) exactly as it ends an unsupervised rank.
S is outside G: it survives that kill, reaps R and writes `rank<N>.exit` to the launcher's
status directory (`{"rank", "pid", "group", "code" | "signal", "time"}`), then ends the way R
ended. P waits for S and ends the same way again (the exit code, or the same signal sent to
itself), so hydra sees what it would have seen from R: a rank killed by a signal still makes
it end the job.

Signals sent to P alone are passed on to R. The script uses only the standard library and runs
by path with `-S` (no site-packages): it starts in a few milliseconds per rank.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

STATUS_DIR_ENV = "COCONET_STATUS_DIR"  # as runtime/failures.py (imported from no package here)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def record_exit(
    status_dir: str | None, rank: str | None, pid: int, wait_status: int, group: int
) -> None:
    """Write the rank's end to `<status_dir>/rank<rank>.exit` (atomically); a status directory
    that is gone (the front end was killed and cleaned up) is no error."""
    if not status_dir or rank is None:
        return
    entry: dict[str, object] = {"rank": int(rank), "pid": pid, "group": group, "time": time.time()}
    if os.WIFSIGNALED(wait_status):
        entry["signal"] = os.WTERMSIG(wait_status)
    else:
        entry["code"] = os.waitstatus_to_exitcode(wait_status)
    tmp = os.path.join(status_dir, f".rank{rank}.exit.{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, os.path.join(status_dir, f"rank{rank}.exit"))
    except OSError:
        pass


def end_like(wait_status: int) -> None:
    """Exit with the child's exit code, or die of the signal that killed it."""
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)  # a signal whose default is not to terminate (none kills a rank so)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(wait_status))


def _wait(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue


def main(argv: list[str]) -> None:
    if not argv:
        print("usage: rank_supervisor.py PROGRAM [ARG...]", file=sys.stderr)
        os._exit(2)
    group = os.getpgrp()
    rank_pid_r, rank_pid_w = os.pipe()
    supervisor = os.fork()
    if supervisor == 0:  # S
        os.close(rank_pid_r)
        os.setpgid(0, 0)
        rank = os.fork()
        if rank == 0:  # R
            os.close(rank_pid_w)
            os.setpgid(0, group)
            try:
                os.execvp(argv[0], argv)
            except OSError as e:
                print(f"rank_supervisor: cannot run {argv[0]}: {e}", file=sys.stderr)
                os._exit(127)
        os.write(rank_pid_w, str(rank).encode())
        os.close(rank_pid_w)
        wait_status = _wait(rank)
        record_exit(
            os.environ.get(STATUS_DIR_ENV), os.environ.get("PMI_RANK"), rank, wait_status, group
        )
        end_like(wait_status)
    # P: pass signals sent to it alone on to the rank; then end as S (and so R) ended.
    os.close(rank_pid_w)
    with os.fdopen(rank_pid_r) as f:
        text = f.read()
    rank_pid = int(text) if text.strip() else None

    def forward(signum: int, _frame: object) -> None:
        if rank_pid is not None:
            try:
                os.kill(rank_pid, signum)
            except ProcessLookupError:
                pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    end_like(_wait(supervisor))


if __name__ == "__main__":
    main(sys.argv[1:])
