"""When one rank fails, every rank exits promptly and the message names the rank and why.

Every MPI rank of a coconet job (a `coco-run` worker, or a user script that called
`coconet.compile` under `mpiexec`) installs a `FailureGuard`:

* an uncaught exception on any rank prints ONE line to stderr (`PREFIX: error: rank R: ...`),
  records it in the launcher's status directory (when there is one) and calls
  `MPI_Abort(COMM_WORLD)`, which makes mpiexec kill every other rank: nobody waits forever in a
  collective or a fused kernel's flag wait for a rank that is gone;
* a rank killed by a signal cannot report; mpiexec (hydra) notices the exit and kills the rest.
  Each rank holds a socket to the launcher's monitor (runtime/launcher.py) and says goodbye
  when it exits normally: the first connection that closes without a goodbye is the rank that
  died, which the launcher names with the signal from hydra's report;
* a watchdog thread aborts the job when this rank makes no progress inside one plan step for
  `step_timeout` seconds (a peer stuck or dead in a way MPI cannot see);
* `COCONET_FAULT` injects failures for the tests of all this, and only where a test enables the
  hook explicitly (`COCONET_FAULT_INJECTION=1`: a production job never honours it):
  `RANK:KIND[:STEP[:CALL]]` with KIND raise | kill | segv | exit | fork-exit | hang | compile |
  corrupt | absent, at plan step STEP (default 0) of the CALL-th run (default 1) on rank RANK
  (`compile`: that rank's kernels do not compile; `corrupt`: coco-run's worker perturbs that
  rank's first output so that --check must fail; `absent`: the rank stops before its CALL-th
  run and never arrives at the waits for every rank that come next; `fork-exit`: the rank
  forks a child that lives on holding every descriptor it inherited -- as a forked data-loader
  worker does -- and exits with status 3, so mpiexec never sees the rank's sockets close).

A wait for every rank outside any plan step (coco-run's barriers and reductions around runs,
`FailureGuard.waiting`) is watched as a plan step is: when it lasts `step_timeout`, the waiting
ranks mark themselves in the status directory, and the ranks that did not are named as the
ones that never arrived.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from coconet.core.program import CocoError

FAULT_ENV = "COCONET_FAULT"
FAULT_INJECTION_ENV = "COCONET_FAULT_INJECTION"  # "1": tests enable the hook
FORKED_CHILD_LIFE = 120.0  # seconds the `fork-exit` fault's child outlives its rank
STATUS_DIR_ENV = "COCONET_STATUS_DIR"
MONITOR_ENV = "COCONET_MONITOR"
FAULT_KINDS = (
    "raise",
    "kill",
    "segv",
    "exit",
    "fork-exit",
    "hang",
    "compile",
    "corrupt",
    "absent",
)


class InjectedFault(RuntimeError):
    """The failure a test asked for with COCONET_FAULT."""


def injected_fault() -> tuple[int, str, int, int] | None:
    """The failure a test asked for, when the test enabled fault injection; else None."""
    if os.environ.get(FAULT_INJECTION_ENV) != "1":
        return None
    return parse_fault(os.environ.get(FAULT_ENV))


def parse_fault(spec: str | None) -> tuple[int, str, int, int] | None:
    if not spec:
        return None
    parts = spec.split(":")
    try:
        rank, kind = int(parts[0]), parts[1]
        step = int(parts[2]) if len(parts) > 2 and parts[2] else 0
        call = int(parts[3]) if len(parts) > 3 and parts[3] else 1
    except (IndexError, ValueError):
        raise CocoError(f"{FAULT_ENV}={spec!r}: expected RANK:KIND[:STEP[:CALL]]") from None
    if kind not in FAULT_KINDS:
        raise CocoError(f"{FAULT_ENV}={spec!r}: KIND is one of {', '.join(FAULT_KINDS)}")
    return rank, kind, step, call


def describe(exc: BaseException) -> str:
    """One line (or a CocoError's own message) for an exception, with where it was raised for
    anything that is not a user-facing CocoError."""
    if isinstance(exc, CocoError):
        return str(exc)
    where = ""
    tb = traceback.extract_tb(exc.__traceback__)
    if tb:
        frame = tb[-1]
        where = f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}{where}"


class FailureGuard:
    """Failure handling for one rank (see the module docstring)."""

    def __init__(
        self, comm: Any = None, *, prefix: str = "coconet", step_timeout: float | None = None
    ):
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.prefix = prefix
        self.step_timeout = step_timeout
        self.status_dir = (
            Path(os.environ[STATUS_DIR_ENV]) if os.environ.get(STATUS_DIR_ENV) else None
        )
        bad_fault = None
        try:
            self.fault = injected_fault()
        except CocoError as e:  # reported once the guard can fail the job cleanly
            self.fault, bad_fault = None, e
        self.runners: list[Any] = []
        self.calls = 0
        self._failed = threading.Lock()
        self._fault_file = None
        if self.status_dir is not None:
            self.status_dir.mkdir(parents=True, exist_ok=True)
            (self.status_dir / f"rank{self.rank}.pid").write_text(str(os.getpid()))
            # Stays open for the process's life: faulthandler writes to it when a signal hits.
            self._fault_file = open(self.status_dir / f"rank{self.rank}.fault", "w")
            faulthandler.enable(file=self._fault_file)
        self._monitor = None
        front_end_gone = False
        if os.environ.get(MONITOR_ENV):
            import socket

            try:
                self._monitor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._monitor.connect(os.environ[MONITOR_ENV])
                self._monitor.sendall(f"hello {self.rank} {os.getpid()}\n".encode())
            except OSError:
                # The launcher listens before it starts mpiexec: nobody listening means the
                # front end died while this rank was starting (killed before it connected).
                self._monitor = None
                front_end_gone = True
        self._closing = False
        if self._monitor is not None:
            threading.Thread(target=self._lifeline, name="coconet-lifeline", daemon=True).start()
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        threading.excepthook = self._thread_excepthook
        self._watchdog: threading.Thread | None = None
        # (what, since) while in `waiting`; `what` a text or what makes it
        self._wait: tuple[str | Callable[[], str], float] | None = None
        if bad_fault is not None:
            self.fail(bad_fault, kind="environment")
        if front_end_gone:
            self.fail(
                "the coco-run front end that launched this job is gone (its monitor socket "
                "refuses connections); ending every rank",
                kind="orphaned",
            )

    # -- reporting -------------------------------------------------------------------------

    def record(
        self, kind: str, message: str, step: int | None = None, culprit: int | None = None
    ) -> None:
        """`culprit`: the rank the message is about, when it is not this one."""
        if self.status_dir is None:
            return
        data = {
            "rank": self.rank,
            "kind": kind,
            "message": message,
            "step": step,
            "time": time.time(),
            "culprit": culprit,
        }
        tmp = self.status_dir / f".rank{self.rank}.{kind}.tmp"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.status_dir / f"rank{self.rank}.{kind}")

    def fail(
        self,
        exc_or_message: BaseException | str,
        *,
        kind: str = "error",
        step: int | None = None,
        code: int = 1,
        culprit: int | None = None,
    ) -> None:
        """Report this rank's failure in one line and abort the whole job. Never returns."""
        if not self._failed.acquire(blocking=False):
            time.sleep(3600)  # another thread is already aborting
        message = exc_or_message if isinstance(exc_or_message, str) else describe(exc_or_message)
        try:
            self._say("failing")
            self.record(kind, message, step, culprit)
            who = "" if culprit is not None else f"rank {self.rank}: "
            print(f"{self.prefix}: error: {who}{message}", file=sys.stderr, flush=True)
            # mpiexec forwards a rank's stderr asynchronously and MPI_Abort kills at once:
            # give the line a moment to reach the user before the job goes down.
            time.sleep(0.5)
        finally:
            try:
                self.comm.Abort(code)
            finally:
                os._exit(code)

    def _excepthook(self, exc_type, exc, tb) -> None:
        if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            self._previous_hook(exc_type, exc, tb)
            return
        if self.size == 1 and self.status_dir is None:
            self._previous_hook(
                exc_type, exc, tb
            )  # a plain one-process script: Python's own report
            return
        self.fail(exc)

    def _thread_excepthook(self, args) -> None:
        if args.exc_type is SystemExit:
            return
        self.fail(args.exc_value if args.exc_value is not None else str(args.exc_type))

    # -- faults (tests only) ---------------------------------------------------------------

    def before_run(self) -> None:
        self.calls += 1
        if self.fault is not None:
            rank, kind, _, at_call = self.fault
            if kind == "absent" and rank == self.rank and self.calls == at_call:
                sys.stdout.flush()
                while True:  # never arrives: the others wait for it in their next wait
                    time.sleep(1)

    @contextlib.contextmanager
    def waiting(self, what: str | Callable[[], str]) -> Iterator[None]:
        """A wait for every rank outside any plan step (`what` says where, for the message):
        watched like a plan step (see the module docstring)."""
        self.begin_wait(what)
        try:
            yield
        finally:
            self._wait = None

    def begin_wait(self, what: str | Callable[[], str]) -> None:
        """`waiting` without a context manager, for the per-call waits of a compiled program
        (the generator costs a microsecond or two): `end_wait()` ends it. `what` may be a
        callable making the text, called only when a message needs it."""
        self._wait = (what, time.monotonic())
        if self._watchdog is None:
            self._start_watchdog()

    def end_wait(self) -> None:
        self._wait = None

    def fault_hook(self, index: int, step: Any) -> None:
        if self.fault is None:
            return
        rank, kind, at_step, at_call = self.fault
        if (
            rank != self.rank
            or index != at_step
            or self.calls != at_call
            or kind in ("compile", "corrupt", "absent")
        ):
            return
        sys.stdout.flush()
        if kind == "raise":
            raise InjectedFault(f"injected fault at step {index} ({step})")
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if kind == "exit":
            os._exit(3)
        if kind == "fork-exit":
            if os.fork() == 0:
                time.sleep(FORKED_CHILD_LIFE)
                os._exit(0)
            time.sleep(0.5)  # as a rank does some work after starting its workers
            os._exit(3)
        if kind == "hang":
            while True:
                time.sleep(1)

    def corrupt_source(self, source: str) -> str:
        """The `compile` fault: this rank's kernels do not compile."""
        if self.fault and self.fault[0] == self.rank and self.fault[1] == "compile":
            return source + '\n#error "injected compile fault"\n'
        return source

    def corrupts_outputs(self) -> bool:
        return bool(self.fault and self.fault[0] == self.rank and self.fault[1] == "corrupt")

    # -- watchdog ----------------------------------------------------------------------------

    def watch(self, runner: Any) -> None:
        """Watch `runner.progress`; abort when one step makes no progress for step_timeout."""
        self.runners.append(runner)
        self._start_watchdog()

    def _start_watchdog(self) -> None:
        if not self.step_timeout or self._watchdog is not None:
            return
        self._watchdog = threading.Thread(
            target=self._watch_loop, name="coconet-watchdog", daemon=True
        )
        self._watchdog.start()

    def _watch_loop(self) -> None:
        period = max(0.05, min(1.0, self.step_timeout / 10))  # type: ignore[operator]
        while True:
            time.sleep(period)
            for runner in list(self.runners):
                p = runner.progress
                if p.index >= 0 and time.monotonic() - p.since > self.step_timeout:  # type: ignore[operator]
                    self.fail(
                        f"no progress for {self.step_timeout:g} s in plan step {p.index} "
                        f"({p.text}): a peer rank is stuck or gone",
                        kind="watchdog",
                        step=p.index,
                    )
            wait = self._wait
            if wait is not None and time.monotonic() - wait[1] > self.step_timeout:  # type: ignore[operator]
                what = wait[0]
                self._fail_waiting(what if isinstance(what, str) else what())

    def _fail_waiting(self, what: str) -> None:
        """This rank waited `step_timeout` at `what`: name the ranks that never arrived."""
        absent: list[int] = []
        if self.status_dir is not None:
            (self.status_dir / f"rank{self.rank}.waiting").write_text(what)
            # The other waiters check on the same period: give their marks time to appear.
            time.sleep(min(1.0, self.step_timeout / 2))  # type: ignore[operator]
            marked = {int(f.name[4:].split(".")[0]) for f in self.status_dir.glob("rank*.waiting")}
            absent = [r for r in range(self.size) if r not in marked]
        if absent:
            who = ", ".join(map(str, absent))
            self.fail(
                f"rank{'s' if len(absent) > 1 else ''} {who} never arrived at {what}: the other "
                f"ranks waited {self.step_timeout:g} s for {'them' if len(absent) > 1 else 'it'}",
                kind="watchdog",
                culprit=absent[0],
            )
        self.fail(
            f"no progress for {self.step_timeout:g} s waiting for every rank at {what}: "
            "a peer rank is stuck or gone",
            kind="watchdog",
        )

    def _say(self, word: str) -> None:
        if self._monitor is not None:
            try:
                self._monitor.sendall(f"{word}\n".encode())
            except OSError:
                pass

    def _lifeline(self) -> None:
        """The front end (coco-run) never writes to the monitor socket: the read returns only
        when it is gone -- killed, even by SIGKILL -- and then nobody is left to collect this
        job, so it ends rather than run on as orphans."""
        assert self._monitor is not None
        try:
            data = self._monitor.recv(1)
        except OSError:
            data = b""
        if not data and not self._closing:
            self.fail(
                "the coco-run front end that launched this job is gone; ending every rank",
                kind="orphaned",
            )

    def close(self) -> None:
        """This rank is done (a normal exit, whatever its status)."""
        self._closing = True
        self._say("done")
        sys.excepthook = self._previous_hook
        if self._fault_file is not None:
            faulthandler.disable()
            self._fault_file.close()
            self._fault_file = None
