"""runtime/rank_supervisor.py: every rank's own end is recorded -- its exit status, or the signal
that killed it, even when hydra SIGKILLs the rank's whole process group -- and the process
hydra started ends the same way. Real processes, started as hydra starts a rank (a session
leader), without MPI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coconet.runtime.launcher import SUPERVISOR, RankExit, diagnose, read_rank_exits

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process groups as on Linux")


def _start(tmp_path: Path, code: str, rank: int = 3) -> subprocess.Popen:
    env = {**os.environ, "COCONET_STATUS_DIR": str(tmp_path), "PMI_RANK": str(rank)}
    return subprocess.Popen(
        [sys.executable, "-S", str(SUPERVISOR), sys.executable, "-c", code],
        env=env,
        start_new_session=True,  # as hydra starts each rank
    )


def _record(tmp_path: Path, rank: int = 3, wait: float = 5.0) -> dict:
    deadline = time.monotonic() + wait
    path = tmp_path / f"rank{rank}.exit"
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return json.loads(path.read_text())


def _rank_pid(tmp_path: Path, wait: float = 5.0) -> int:
    deadline = time.monotonic() + wait
    path = tmp_path / "pid"
    while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return int(path.read_text())


WRITE_PID = "import os, pathlib, time; pathlib.Path({p!r}).write_text(str(os.getpid())); "


def test_an_exit_status_is_recorded_and_passed_on(tmp_path):
    proc = _start(tmp_path, "import sys; sys.exit(3)")
    assert proc.wait(timeout=30) == 3
    record = _record(tmp_path)
    assert record["rank"] == 3
    assert record["code"] == 3
    assert "signal" not in record
    # the group hydra kills (the supervisor's session): the launcher's to kill if hydra
    # does not end the job (a child the rank forked holds its sockets open)
    assert record["group"] == proc.pid


def test_a_clean_exit_is_recorded_as_status_0(tmp_path):
    proc = _start(tmp_path, "pass", rank=0)
    assert proc.wait(timeout=30) == 0
    assert _record(tmp_path, rank=0)["code"] == 0


def test_a_rank_killed_by_a_signal_is_recorded_and_its_supervisor_dies_of_it(tmp_path):
    code = WRITE_PID.format(p=str(tmp_path / "pid")) + "time.sleep(60)"
    proc = _start(tmp_path, code)
    rank_pid = _rank_pid(tmp_path)
    assert rank_pid != proc.pid  # the rank is the supervisor's grandchild
    os.kill(rank_pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL  # what hydra sees: a rank killed
    record = _record(tmp_path)
    assert record["signal"] == signal.SIGKILL
    assert record["pid"] == rank_pid


def test_hydras_group_kill_ends_the_rank_and_is_still_recorded(tmp_path):
    """hydra ends a job with SIGKILL to each rank's process group: the rank (in that group)
    dies with the process hydra started, and the supervisor (outside it) records how."""
    code = WRITE_PID.format(p=str(tmp_path / "pid")) + "time.sleep(60)"
    proc = _start(tmp_path, code)
    rank_pid = _rank_pid(tmp_path)
    assert os.getpgid(rank_pid) == proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    record = _record(tmp_path)
    assert record["signal"] == signal.SIGKILL
    assert record["pid"] == rank_pid
    with pytest.raises(ProcessLookupError):
        os.kill(rank_pid, 0)  # reaped: no zombie, no orphan


def test_a_signal_sent_to_the_process_hydra_started_reaches_the_rank(tmp_path):
    code = WRITE_PID.format(p=str(tmp_path / "pid")) + "time.sleep(60)"
    proc = _start(tmp_path, code)
    _rank_pid(tmp_path)
    time.sleep(0.2)  # the supervisor's handlers are installed once it knows the rank's pid
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert _record(tmp_path)["signal"] == signal.SIGTERM


def test_the_launcher_reads_the_records_and_names_the_killed_rank(tmp_path):
    (tmp_path / "rank0.exit").write_text(
        json.dumps({"rank": 0, "pid": 100, "signal": 9, "time": 2.0})
    )
    (tmp_path / "rank1.exit").write_text(json.dumps({"rank": 1, "pid": 101, "code": 1, "time": 1}))
    exits = read_rank_exits(tmp_path, 2)
    assert exits == {
        0: RankExit(0, 100, None, 9, 2.0),
        1: RankExit(1, 101, 1, None, 1.0),
    }
    assert exits[0].describe() == "killed by SIGKILL"
    assert exits[1].describe() == "exit status 1"
    assert exits[0].failed
    assert exits[1].failed
    # The monitor saw rank 0 vanish first; its record says which signal (hydra's banner
    # names the pid it started, the supervisor's, not the rank's).
    message = diagnose(tmp_path, 2, 9, "", [(0, 100)], exits)
    assert message.startswith("rank 0 (pid 100) was killed by SIGKILL (Killed)"), message
    assert diagnose(tmp_path, 2, 1, "", [(1, 101)], exits).startswith(
        "rank 1 (pid 101) exited with status 1 without reporting an error"
    )


def test_the_rank_that_ended_first_is_named_not_the_first_socket_closed(tmp_path):
    """A victim SIGKILLed and the peers hydra killed a few ms later end within one poll of
    the ranks' sockets, which then close in descriptor order (rank 0 first): the line names
    the rank whose supervisor recorded the earliest end (a CI run under load named rank 0)."""
    for rank, t in ((0, 10.0020), (1, 10.0130), (2, 10.0170), (3, 10.0001)):
        record = {"rank": rank, "pid": 100 + rank, "signal": 9, "time": t}
        (tmp_path / f"rank{rank}.exit").write_text(json.dumps(record))
    exits = read_rank_exits(tmp_path, 4)
    deaths = [(0, 100), (1, 101), (2, 102), (3, 103)]  # the order the sockets closed
    message = diagnose(tmp_path, 4, 9, "", deaths, exits)
    assert message.startswith("rank 3 (pid 103) was killed by SIGKILL (Killed)"), message
    # without a record (or for another pid) the order seen stands
    del exits[3]
    assert diagnose(tmp_path, 4, 9, "", deaths, exits).startswith("rank 0 (pid 100)")
