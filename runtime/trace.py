"""A timeline of plan steps as Chrome / Perfetto trace events (`coco-run --trace FILE.json`).

`StepTracer` is what `PlanRunner.trace()` (runtime/executor.py) times every step through: one
complete event ("ph": "X") per step with host wall-clock begin and duration, on the track of
its rank and stream (pid = rank, tid = stream: 0 compute, 1 communication). Events carry
the step's index and text and whatever `context` holds when they are recorded (the schedule and
the timed iteration, set by the bench loop in tools/rank_job.py).

Timestamps are host-side `time.perf_counter_ns()` (CLOCK_MONOTONIC on Linux) from one origin:
when every rank runs on one host they share that clock, so the tracks line up exactly; across
hosts each rank takes its origin right after a barrier (aligned to within the barrier's skew). On
the cpu backend compute-stream steps run synchronously, so a slice is the step's run time; a
collective on the communication stream is a non-blocking MPI call, so its slice is the time to
start it, and the `wait` event on the compute stream shows where the compute stream waits for
it. On cuda a slice is the time to enqueue the step; each step is also an NVTX range (when
CuPy's `cupy.cuda.nvtx` loads) so that Nsight Systems shows the device side under the same names.

Rank 0 gathers every rank's events and writes one file (`trace_document`, `write_trace`);
open it in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from coconet.core.program import CocoError
from coconet.lowering.plan import (
    COMM_STREAM,
    COMPUTE_STREAM,
    Collective,
    Copy,
    Launch,
    Matmul,
    RecordEvent,
    Step,
    WaitEvent,
)

STREAM_NAMES = {COMPUTE_STREAM: "compute", COMM_STREAM: "comm"}


def step_name(step: Step) -> tuple[str, str]:
    """(event name, category) of a plan step: what a timeline row should say at a glance."""
    match step:
        case Launch():
            return step.kernel, "kernel"
        case Collective():
            return (f"{step.op} {step.kind}" if step.kind else step.op), "collective"
        case Matmul():
            return f"matmul %{step.c.name}", "matmul"
        case Copy():
            return f"copy %{step.dst.name}", "copy"
        case RecordEvent():
            return f"record {step.event}", "event"
        case WaitEvent():
            return f"wait {step.event}", "event"
    return type(step).__name__, "step"


def load_nvtx() -> Any:
    """CuPy's NVTX module, or None where CuPy or the NVTX library is missing (no GPU build):
    tracing must work the same without it."""
    try:
        from cupy.cuda import nvtx as nvtx_module  # type: ignore[import-not-found]

        # a compiled module (or a placeholder where CuPy lacks it) without type information
        nvtx: Any = nvtx_module
        nvtx.RangePush("coconet")  # loading the library happens here, not at import
        nvtx.RangePop()
        return nvtx
    except Exception:
        return None


def common_origin(comm: Any) -> int:
    """A `perf_counter_ns()` origin for this rank's events (collective). The ranks of one host
    read one monotonic clock, so they agree on the earliest of their readings and their events
    are comparable as they are; ranks on several hosts each use the end of a common barrier
    (the ends of one barrier differ by a few microseconds up to a time slice)."""
    import socket

    comm.Barrier()
    now = time.perf_counter_ns()
    seen = comm.allgather((socket.gethostname(), now))
    if len({host for host, _ in seen}) == 1:
        return min(t for _, t in seen)
    return now


class StepTracer:
    """One rank's trace events, timed from `origin_ns` (`common_origin`; default: now)."""

    def __init__(self, rank: int, *, origin_ns: int | None = None, nvtx: Any = None):
        self.rank = rank
        self.origin_ns = time.perf_counter_ns() if origin_ns is None else origin_ns
        self.events: list[dict[str, Any]] = []
        self.context: dict[str, Any] = {}
        self.nvtx = nvtx
        self.streams: set[int] = set()

    def _us(self, t_ns: int) -> float:
        return (t_ns - self.origin_ns) / 1e3

    def record(self, name: str, cat: str, stream: int, t0_ns: int, t1_ns: int, **args: Any) -> None:
        self.streams.add(stream)
        self.events.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "ts": self._us(t0_ns),
                "dur": (t1_ns - t0_ns) / 1e3,
                "pid": self.rank,
                "tid": stream,
                "args": {**self.context, **args},
            }
        )

    def timed(self, run: Callable[[int, Step], None]) -> Callable[[int, Step], None]:
        """`run(index, step)` (the plain step executor), timed: the traced executor."""
        nvtx = self.nvtx

        def traced(index: int, step: Step) -> None:
            name, cat = step_name(step)
            if nvtx is not None:
                nvtx.RangePush(name)
            t0 = time.perf_counter_ns()
            try:
                run(index, step)
            finally:
                t1 = time.perf_counter_ns()
                if nvtx is not None:
                    nvtx.RangePop()
                self.record(name, cat, step.stream, t0, t1, step=index, text=str(step))

        return traced

    def span(self, name: str, cat: str, stream: int, run: Callable[[], None]) -> None:
        """Time `run()` as one event (the end-of-run synchronize)."""
        if self.nvtx is not None:
            self.nvtx.RangePush(name)
        t0 = time.perf_counter_ns()
        try:
            run()
        finally:
            t1 = time.perf_counter_ns()
            if self.nvtx is not None:
                self.nvtx.RangePop()
            self.record(name, cat, stream, t0, t1)


def trace_document(
    per_rank: Sequence[Sequence[dict[str, Any]]], metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The trace-event JSON object of every rank's events: names for each rank (a process) and
    each of its streams (a thread) first, then the events in time order."""
    meta: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for rank, evs in enumerate(per_rank):
        meta.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": rank,
                "tid": 0,
                "args": {"name": f"rank {rank}"},
            }
        )
        meta.append(
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": rank,
                "tid": 0,
                "args": {"sort_index": rank},
            }
        )
        for stream in sorted({e["tid"] for e in evs}):
            label = STREAM_NAMES.get(stream, "stream")
            meta.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": rank,
                    "tid": stream,
                    "args": {"name": f"stream {stream} ({label})"},
                }
            )
        events.extend(dict(e) for e in evs)
    # The timeline starts at the first traced step rather than at the origin (before setup).
    start = min((e["ts"] for e in events), default=0.0)
    for e in events:
        e["ts"] = round(e["ts"] - start, 3)
        e["dur"] = round(e["dur"], 3)
    events.sort(key=lambda e: (e["ts"], e["pid"], e["tid"]))
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "clock": "host perf_counter (monotonic); one origin for the ranks of a host, the "
            "end of a common barrier across hosts",
            **(metadata or {}),
        },
    }


def write_trace(path: str | Path, document: dict[str, Any]) -> None:
    try:
        Path(path).write_text(json.dumps(document))
    except OSError as e:
        raise CocoError(f"cannot write the trace {path}: {e.strerror or e}") from None
