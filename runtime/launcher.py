"""Start a coconet job on N MPI ranks and turn however it ends into one clear outcome.

`launch(job, ranks, worker=MODULE)` runs `mpiexec -n N python -m MODULE JOB.json` (coco-run's
worker is coconet.tools.rank_job) with the `mpiexec` of the mpich wheel installed next to this
Python (no system MPI needed), each rank under runtime/rank_supervisor.py, which records how
the rank ended (its exit status, or the signal that killed it: `LaunchResult.rank_exits`), and
streams the ranks' standard output through (minus mpiexec's own banners). On failure it finds
the rank that failed and why:

1. a rank that caught its failure wrote `rankR.error` (runtime/failures.py) and aborted the job;
2. a failed `--check` wrote `rank0.check` and every rank exited 1;
3. a watchdog fired (`rankR.watchdog`: no progress in a plan step);
4. a rank died without a word (a signal, a hard exit): every rank holds a connection to the
   launcher's monitor socket and says goodbye on a normal exit; the first connection to close
   without one is the rank that died (mpiexec kills the others only after it noticed), the
   signal comes from its supervisor's record (else mpiexec's report), and the rank's
   faulthandler file shows where a crash happened;
5. the whole job ran past `timeout` seconds: every process of the job is killed.

mpiexec ends a job when a rank's PMI socket and output pipes close, which a process the rank
forked (a data-loader worker) keeps open for as long as it lives: the launcher does not rely
on it. Once any rank has failed (its connection closed without a goodbye, it reported a
failure, or its supervisor recorded a failed end), the job has `FAILURE_GRACE` seconds to end;
then the launcher kills every rank's process group itself (hydra's own unit) and mpiexec.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from coconet.core.program import CocoError
from coconet.runtime import job_janitor as janitor
from coconet.runtime.failures import MONITOR_ENV, STATUS_DIR_ENV

# Where coco-run (and any tool that launches) also writes the ranks' ends as JSON, when set:
# for the tests and reports that follow a job from outside.
RANK_EXITS_ENV = "COCONET_RANK_EXITS"
SUPERVISOR = Path(__file__).with_name("rank_supervisor.py")
JANITOR = Path(__file__).with_name("job_janitor.py")
# How long after mpiexec has exited the launcher waits for the supervisors' records (a
# supervisor outlives hydra's kill of its rank by the moment it takes to reap and write).
EXIT_RECORD_WAIT = 3.0
# How long a job may take to end after one of its ranks failed before the launcher stops it
# (hydra's own clean-up takes well under a second; a reporting rank waits 0.5 s to abort).
FAILURE_GRACE = 5.0

_NOISE = re.compile(
    r"^(=+|=\s.*|\s*BAD TERMINATION.*|.*RUNNING AT .*|\s*EXIT CODE:.*|.*CLEANING UP REMAINING.*|"
    r".*YOU CAN IGNORE THE BELOW.*|YOUR APPLICATION TERMINATED WITH THE EXIT STRING.*|"
    r"This typically refers to a problem.*|Please see the FAQ page.*|Abort\(\d+\) on node.*|"
    r"\[proxy:.*|\[mpiexec@.*)\s*$"
)


@dataclass(frozen=True)
class RankExit:
    """How one rank process ended, as its supervisor saw it."""

    rank: int
    pid: int
    code: int | None  # its exit status, when it exited
    signal: int | None  # the signal that killed it, when one did
    time: float  # when (time.time())
    group: int | None = None  # its process group: the one hydra started its supervisor in

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {_signal_name(self.signal)}"
        return f"exit status {self.code}"

    @property
    def failed(self) -> bool:
        return self.signal is not None or self.code != 0


@dataclass
class LaunchResult:
    returncode: int
    message: str | None  # why the job failed, naming the rank; None when it succeeded
    stderr: str = ""
    elapsed: float = 0.0
    # rank -> how it ended; a rank missing never started (or its supervisor was killed)
    rank_exits: dict[int, RankExit] = field(default_factory=dict)


def find_mpiexec() -> str:
    """The mpich wheel's mpiexec next to this interpreter, else one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise CocoError(
        "cannot find mpiexec: install the MPI extra (pip install 'coconet[mpi]', which brings "
        "mpi4py and the mpich wheel), or use --backend sim"
    )


def job_environment(
    ranks: int, status_dir: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    from coconet.runtime.cpu import apply_rank_env_defaults

    env = dict(os.environ)
    apply_rank_env_defaults(env)
    cores = os.cpu_count() or 1
    if ranks > cores:
        # More ranks than cores: MPICH's busy polling would starve the rank it waits for.
        env.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
    env[STATUS_DIR_ENV] = status_dir
    env.update(extra or {})
    return env


def _pump(stream: IO[str], sink: IO[str] | None, keep: list[str], noise: list[str]) -> None:
    """Forward a stream line by line, holding blank lines back until it is clear whether they
    open one of mpiexec's banners (which are kept for diagnosis, not shown)."""
    blanks: list[str] = []
    for line in iter(stream.readline, ""):
        if not line.strip():
            blanks.append(line)
            continue
        if _NOISE.match(line.rstrip("\n")):
            noise.extend(blanks)
            noise.append(line)
            blanks = []
            continue
        for out in [*blanks, line]:
            keep.append(out)
            if sink is not None:
                sink.write(out)
        blanks = []
        if sink is not None:
            sink.flush()
    stream.close()


class Monitor(threading.Thread):
    """Accepts one connection per rank and records, in order, the ranks whose connection
    closed without a goodbye (`done` for a normal exit, `failing` for a reported failure)."""

    def __init__(self, path: Path):
        super().__init__(daemon=True, name="coconet-monitor")
        import socket

        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(64)
        self.server.setblocking(False)
        self.deaths: list[tuple[int, int]] = []  # (rank, pid) in the order they were seen
        self.spoke: set[int] = set()  # the ranks that said goodbye or reported a failure
        # When the first death and the first reported failure were seen (select rounds): a
        # peer whose MPI call fails because a rank was killed reports an error of its own,
        # after the death -- the death is the cause then (`death_came_first`).
        self.rounds = 0
        self.first_death: int | None = None
        self.first_failing: int | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        import selectors
        import socket

        sel = selectors.DefaultSelector()
        sel.register(self.server, selectors.EVENT_READ, None)
        state: dict[Any, dict[str, Any]] = {}
        while not self.stopping.is_set():
            self.rounds += 1
            for key, _ in sel.select(timeout=0.05):
                if key.data is None:
                    try:
                        conn, _ = self.server.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    state[conn] = {"buf": b"", "rank": None, "pid": None, "said": None}
                    sel.register(conn, selectors.EVENT_READ, "conn")
                    continue
                conn = key.fileobj
                assert isinstance(conn, socket.socket)  # registered above: a rank's connection
                st = state[conn]
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
                if data:
                    st["buf"] += data
                    *lines, st["buf"] = st["buf"].split(b"\n")
                    for ln in lines:
                        words = ln.decode(errors="replace").split()
                        if words[:1] == ["hello"] and len(words) == 3:
                            st["rank"], st["pid"] = int(words[1]), int(words[2])
                        elif words:
                            st["said"] = words[0]
                            if st["rank"] is not None:
                                self.spoke.add(st["rank"])
                            if words[0] == "failing" and self.first_failing is None:
                                self.first_failing = self.rounds
                    continue
                sel.unregister(conn)
                conn.close()
                if st["said"] is None and st["rank"] is not None:
                    self.deaths.append((st["rank"], st["pid"]))
                    if self.first_death is None:
                        self.first_death = self.rounds
        sel.close()
        self.server.close()

    def failure_seen(self) -> bool:
        """Whether a rank has vanished or reported a failure."""
        return bool(self.deaths) or self.first_failing is not None

    def death_came_first(self) -> bool:
        """Whether a rank vanished before (or as) any rank reported a failure: the same round
        counts as first, since a rank reporting an error sleeps half a second before it
        aborts the job (failures.py `fail`), so the deaths its abort causes come rounds
        later."""
        if self.first_death is None:
            return False
        return self.first_failing is None or self.first_death <= self.first_failing

    def stop(self) -> None:
        time.sleep(0.1)  # let the last closes arrive
        self.stopping.set()
        self.join(timeout=2)


class Terminated(KeyboardInterrupt):
    """The front end got SIGTERM or SIGHUP: the job was ended with it (as Ctrl-C does)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue


def _start_janitor(job_dir: Path, mpiexec: int) -> subprocess.Popen:
    """runtime/job_janitor.py beside the job, in a session of its own: if this process is
    killed, it cleans up after the job (MPICH's segments, the job directory)."""
    return subprocess.Popen(
        [sys.executable, "-S", str(JANITOR), str(job_dir), str(job_dir / "shm-before.json")]
        + [str(mpiexec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _clean_up(job_dir: Path, before: set[str], watcher: subprocess.Popen) -> None:
    """After mpiexec: what an abnormal end left in /dev/shm (MPICH unlinks its segments only
    when its ranks finalize), once the job's ranks are gone; then the janitor is told that
    nothing is left for it."""
    janitor.wait_gone(janitor.rank_pids(job_dir / "status"), janitor.SETTLE)
    janitor.sweep(before)
    try:
        assert watcher.stdin is not None
        watcher.stdin.write("done\n")
        watcher.stdin.close()
        watcher.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        watcher.kill()


def launch(
    job: dict[str, Any],
    ranks: int,
    *,
    worker: str,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    stdout: IO[str] | None = None,
) -> LaunchResult:
    """Run `job` on `ranks` MPI processes, each `python -m worker JOB.json`; never hangs past
    `timeout` seconds."""
    mpiexec = find_mpiexec()
    stdout = sys.stdout if stdout is None else stdout
    with tempfile.TemporaryDirectory(prefix="coconet-job-") as tmp:
        status = Path(tmp) / "status"
        status.mkdir()
        job_file = Path(tmp) / "job.json"
        job_file.write_text(json.dumps(job))
        cmd = [
            mpiexec,
            "-n",
            str(ranks),
            sys.executable,
            "-S",  # the supervisor needs only the standard library: no site-packages scan
            str(SUPERVISOR),
            sys.executable,
            "-m",
            worker,
            str(job_file),
        ]
        monitor = Monitor(Path(tmp) / "monitor.sock")
        monitor.start()
        before = janitor.shm_names()
        (Path(tmp) / "shm-before.json").write_text(json.dumps(sorted(before)))
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=job_environment(
                ranks, str(status), {MONITOR_ENV: str(monitor.path), **(env or {})}
            ),
            start_new_session=True,  # one process group: a timeout kills every rank
        )
        watcher = _start_janitor(Path(tmp), proc.pid)
        out_lines: list[str] = []
        err_lines: list[str] = []
        noise: list[str] = []
        pumps = [
            threading.Thread(
                target=_pump, args=(proc.stdout, stdout, out_lines, noise), daemon=True
            ),
            threading.Thread(target=_pump, args=(proc.stderr, None, err_lines, noise), daemon=True),
        ]
        for t in pumps:
            t.start()
        timed_out = False
        # SIGTERM/SIGHUP end the job with the front end (signal handlers: main thread only).
        # SIGKILL cannot be caught: the ranks notice the front end is gone (failures.py).
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {
                sig: signal.signal(sig, _raise_terminated)
                for sig in (signal.SIGTERM, signal.SIGHUP)
            }
        try:
            timed_out = not _wait_for_job(proc, monitor, status, timeout)
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
        finally:
            for sig, previous in handlers.items():
                signal.signal(sig, previous)
            _clean_up(Path(tmp), before, watcher)
        for t in pumps:
            t.join(timeout=5)
        monitor.stop()
        exits = read_rank_exits(status, ranks, wait=EXIT_RECORD_WAIT)
        elapsed = time.monotonic() - start
        stderr = "".join(err_lines)
        _publish_rank_exits(exits)
        if timed_out:
            message = timeout_message(status, timeout, ranks)
            return LaunchResult(124, message, stderr, elapsed, exits)
        if proc.returncode == 0:
            return LaunchResult(0, None, stderr, elapsed, exits)
        message = diagnose(
            status,
            ranks,
            proc.returncode,
            "".join(noise) + stderr,
            _deaths(monitor.deaths, exits, monitor.spoke),
            exits,
            death_first=monitor.death_came_first(),
        )
        return LaunchResult(proc.returncode or 1, message, stderr, elapsed, exits)


def _wait_for_job(
    proc: subprocess.Popen, monitor: Monitor, status: Path, timeout: float | None
) -> bool:
    """Wait for mpiexec; False when the job ran past `timeout` (then it is killed). A job
    still running `FAILURE_GRACE` seconds after a rank failed is stopped (module docstring)."""
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    failed_at: float | None = None
    while True:
        try:
            proc.wait(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
            return True
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now >= deadline:
            _kill_group(proc)
            return False
        if failed_at is None:
            if monitor.failure_seen() or any(e.failed for e in read_rank_exits(status, 0).values()):
                failed_at = now
        elif now - failed_at > FAILURE_GRACE:
            _stop_ranks(status)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
            return True


def _stop_ranks(status: Path) -> None:
    """SIGKILL the process group of every rank (with whatever the rank forked): a live rank's
    from its pid, an ended one's from its supervisor's record. A live rank's pid cannot have
    been reused (its supervisor has not reaped it); an ended rank's group number is seconds
    old (Linux hands out pids in sequence)."""
    exits = read_rank_exits(status, 0).values()
    groups = {e.group for e in exits if e.group is not None}
    ended = {e.pid for e in exits}
    for pid in _pids(status):
        if pid not in ended:
            try:
                groups.add(os.getpgid(pid))
            except OSError:
                continue
    own = os.getpgrp()
    for group in groups - {own, 0, 1}:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            continue


def _deaths(
    seen: list[tuple[int, int]], exits: dict[int, RankExit], spoke: set[int]
) -> list[tuple[int, int]]:
    """The ranks that vanished: those the monitor saw go without a goodbye, then the ranks
    that never spoke to it whose supervisors recorded a failed end the monitor did not see (a
    child the rank forked still held its connection), by the time they ended."""
    more = sorted((e for e in exits.values() if e.failed), key=lambda e: e.time)
    unseen = [e for e in more if (e.rank, e.pid) not in seen and e.rank not in spoke]
    return seen + [(e.rank, e.pid) for e in unseen]


def read_rank_exits(status: Path, ranks: int, wait: float = 0.0) -> dict[int, RankExit]:
    """The supervisors' `rank<N>.exit` records, waiting up to `wait` seconds for all `ranks`
    of them (each is written the moment its rank is reaped, which can be just after mpiexec
    itself has exited)."""
    deadline = time.monotonic() + wait
    while True:
        exits: dict[int, RankExit] = {}
        for f in status.glob("rank*.exit"):
            try:
                d = json.loads(f.read_text())
                exits[int(d["rank"])] = RankExit(
                    int(d["rank"]),
                    int(d["pid"]),
                    d.get("code"),
                    d.get("signal"),
                    d["time"],
                    d.get("group"),
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
        if len(exits) >= ranks or time.monotonic() >= deadline:
            return exits
        time.sleep(0.02)


def _publish_rank_exits(exits: dict[int, RankExit]) -> None:
    path = os.environ.get(RANK_EXITS_ENV)
    if not path:
        return
    table = {
        str(r): {"pid": e.pid, "code": e.code, "signal": e.signal, "time": e.time}
        for r, e in sorted(exits.items())
    }
    try:
        Path(path).write_text(json.dumps(table))
    except OSError:
        pass


def _read_reports(status: Path, kind: str) -> list[dict[str, Any]]:
    reports = []
    for f in sorted(status.glob(f"rank*.{kind}")):
        try:
            reports.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(reports, key=lambda r: (r.get("time", 0), r.get("rank", 0)))


def _pids(status: Path) -> dict[int, int]:
    out = {}
    for f in status.glob("rank*.pid"):
        try:
            out[int(f.read_text().strip())] = int(f.stem[4:])
        except ValueError:
            continue
    return out


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _signal_text(n: int) -> str:
    """The signal's description (`Killed`, `Segmentation fault`), as hydra's report gives it."""
    return signal.strsignal(n) or _signal_name(n)


def _crash_location(status: Path, rank: int) -> str:
    """Where a crashed rank was, from its faulthandler report (the crashing thread's frame)."""
    f = status / f"rank{rank}.fault"
    try:
        text = [ln.strip() for ln in f.read_text().strip().splitlines()]
    except OSError:
        return ""
    if not text:
        return ""
    current = next((i for i, ln in enumerate(text) if ln.startswith("Current thread")), -1)
    frames = [ln for ln in text[current + 1 :] if ln.startswith("File ")]
    return f" ({text[0]}{'; ' + frames[0] if frames else ''})"


def _reported_failure(status: Path) -> str | None:
    """The failure a rank reported itself, in one line: an error, else a failed check, else
    the watchdog report of the earliest step (None: no rank reported one)."""
    # a rank's own error, or the environment it refused (a bad COCONET_FAULT), earliest first
    errors = sorted(
        _read_reports(status, "error") + _read_reports(status, "environment"),
        key=lambda r: (r.get("time", 0), r.get("rank", 0)),
    )
    if errors:
        first = errors[0]
        return f"rank {first['rank']}: {first['message']}"
    checks = _read_reports(status, "check")
    if checks:
        return f"check failed: {checks[0]['message']}"
    watchdogs = _read_reports(status, "watchdog")
    if watchdogs:
        w = min(
            watchdogs,
            key=lambda r: (r.get("step") if r.get("step") is not None else 1 << 30, r["time"]),
        )
        if w.get("culprit") is not None:  # the message names the rank it is about
            return w["message"]
        return f"rank {w['rank']}: {w['message']}"
    return None


def _first_death(deaths: list[tuple[int, int]], exits: dict[int, RankExit]) -> tuple[int, int]:
    """The rank that vanished first: by the time its supervisor recorded its end, else in the
    order the sockets closed. Ranks ending within one poll of the sockets are seen in
    descriptor order, so under load a rank hydra killed after the victim (rank 0, a few ms
    later) was named in its place."""

    def when(item: tuple[int, tuple[int, int]]) -> tuple[float, int]:
        seen, (rank, pid) = item
        own = exits.get(rank)
        return (own.time if own is not None and own.pid == pid else math.inf, seen)

    return min(enumerate(deaths), key=when)[1]


def diagnose(
    status: Path,
    ranks: int,
    returncode: int,
    output: str,
    deaths: list[tuple[int, int]] | None = None,
    exits: dict[int, RankExit] | None = None,
    *,
    death_first: bool = False,
) -> str:
    """The job's failure in one line: a rank's own report (an error, a failed check, a
    watchdog's), else the first rank that vanished, else mpiexec's banner. `death_first`: a
    rank vanished before any reported a failure, so the reports are its peers' reactions
    (an MPI call failing on the dead rank) and the death is what the line names."""
    if not (death_first and deaths) and (reported := _reported_failure(status)) is not None:
        return reported
    pids = _pids(status)
    m = re.search(r"PID (\d+) RUNNING AT .*?EXIT CODE: (\d+)", output, re.DOTALL)
    sig = re.search(r"EXIT STRING: ([^\n]*?) \(signal (\d+)\)", output)
    if deaths:
        # The first rank to vanish. hydra's banner names the first exit IT noticed, which can
        # be a rank it killed itself afterwards: trust its signal only for the same pid.
        rank, pid = _first_death(deaths, exits or {})
        who = f"rank {rank} (pid {pid})"
        stopped = "; the other ranks were stopped"
        own = (exits or {}).get(rank)
        if own is not None and own.pid == pid and own.signal is not None:
            crash = _crash_location(status, rank)
            n = own.signal
            return f"{who} was killed by {_signal_name(n)} ({_signal_text(n)}){crash}{stopped}"
        if own is not None and own.pid == pid and own.code not in (None, 0):
            silent = f"{who} exited with status {own.code} without reporting an error"
            return f"{silent}{stopped}"
        if m and sig and int(m.group(1)) == pid:
            n = int(sig.group(2))
            crash = _crash_location(status, rank)
            return f"{who} was killed by {_signal_name(n)} ({sig.group(1)}){crash}{stopped}"
        crash = _crash_location(status, rank)
        if crash:
            return f"{who} crashed{crash}{stopped}"
        if sig:
            ended = _signal_name(int(sig.group(2)))
            return f"{who} died without reporting an error (the job ended with {ended}){stopped}"
        return f"{who} exited with status {returncode} without reporting an error{stopped}"
    if m:
        pid, code = int(m.group(1)), int(m.group(2))
        rank = pids.get(pid)
        who = f"rank {rank} (pid {pid})" if rank is not None else f"an MPI process (pid {pid})"
        if sig:
            n = int(sig.group(2))
            where = _crash_location(status, rank) if rank is not None else ""
            killed = f"{who} was killed by {_signal_name(n)} ({sig.group(1)}){where}"
            return f"{killed}; the other ranks were stopped"
        silent = f"{who} exited with status {code} without reporting an error"
        return f"{silent}; the other ranks were stopped"
    if returncode < 0:
        return f"mpiexec was killed by {_signal_name(-returncode)}"
    tail = [ln for ln in output.strip().splitlines() if ln.strip()][-5:]
    detail = ("; last output: " + " | ".join(tail)) if tail else ""
    return f"an MPI rank exited with status {returncode} without reporting an error{detail}"


def timeout_message(status: Path, timeout: float | None, ranks: int) -> str:
    return (
        f"the job ran past --timeout {timeout:g} s on {ranks} rank(s) and was stopped "
        "(a rank is stuck; --step-timeout names the step)"
    )
