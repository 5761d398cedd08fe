"""The fuzzer's driver: cases run in worker processes, each answer awaited with a hang limit.

    python test/fuzz/fuzz_driver.py --inputs 20000 --seed 0 --jobs 2 [--json report.json]

Cases are numbered 0..N-1 and made from (seed, index) alone (fuzz_inputs.make_case), so a
finding is reproduced by `--only INDEX`. Workers are forked after the corpus and coconet are
imported and answer one case at a time; a worker that gives no answer within `--hang`
seconds (default 10) is killed and replaced, and its case is run again alone with a limit six
times longer: a case that passes then was slow under load (listed as `slow`), one that does
not is a `hang`. Exit status 1 when any traceback, hang or silent acceptance was found.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_inputs import make_case, seeds, verifying_seeds

FINDINGS = ("traceback", "hang", "silent")
PRELOAD = (
    "coconet.equivalence",
    "coconet.lowering.lower_to_plan",
    "coconet.runtime.sim",
    "coconet.runtime.threaded",
    "coconet.schedule",
    "coconet.tools.coco_opt",
)
# Per depth, for each distinct accepted program: how many schedules the enumerator makes (None:
# every pipeline it offers, each applied and verified), how many of those are also lowered and
# checked against the sim (spread over the enumeration; None: all), and the fraction of the
# programs also run on the cpu backend against the sim (host-compiling their kernels takes
# seconds). `make fuzz` runs `full`, the CI slice `quick`.
DEPTHS: dict[str, tuple[int | None, int | None, float]] = {
    "quick": (2, None, 0.02),
    "full": (None, 8, 0.05),
}


def _worker(
    conn: Connection,
    seed: int,
    schedule_limit: int | None,
    checked_schedules: int | None,
    cpu_fraction: float,
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:  # die with the driver (Linux): a killed driver leaves no worker running
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    from fuzz_oracle import Oracle

    with tempfile.TemporaryDirectory(prefix="coconet-fuzz-") as tmp:
        oracle = Oracle(
            Path(tmp),
            schedule_limit=schedule_limit,
            cpu_fraction=cpu_fraction,
            checked_schedules=checked_schedules,
        )
        stderr = _StderrWatch(Path(tmp) / "stderr")
        while True:
            index = conn.recv()
            if index is None:
                return
            t0 = time.monotonic()
            case = make_case(seed, index)
            result = oracle.run(case)
            stray = stderr.traceback()
            if stray and result.get("outcome") not in FINDINGS:
                result["outcome"] = "traceback"
                result["message"] = f"a traceback on stderr: {stray}"
            result["seconds"] = round(time.monotonic() - t0, 3)
            conn.send(result)


class _StderrWatch:
    """The worker's stderr (file descriptor 2, which the processes it starts inherit, such as
    multiprocessing's resource tracker) goes to a file; a traceback printed there is a finding
    of the case that was running when it appeared, even though no exception reached the
    oracle."""

    MARK = "Traceback (most recent call last)"

    def __init__(self, path: Path):
        self.file = path.open("w+b")
        os.dup2(self.file.fileno(), 2)
        self.seen = 0

    def traceback(self) -> str | None:
        """The last line of a traceback printed since the previous call, if one was."""
        sys.stderr.flush()
        self.file.seek(self.seen)
        text = self.file.read().decode(errors="replace")
        self.seen = self.file.tell()
        if self.MARK not in text:
            return None
        after = text[text.rindex(self.MARK) :].strip().splitlines()
        return after[-1][:200] if after else self.MARK


class _Slot:
    def __init__(self, ctx, seed: int, depth: str):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, seed, *DEPTHS[depth]), daemon=True)
        self.proc.start()
        child.close()
        self.index: int | None = None
        self.since = 0.0

    def give(self, index: int) -> None:
        self.index, self.since = index, time.monotonic()
        self.conn.send(index)

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def run_fuzz(
    inputs: int,
    seed: int = 0,
    jobs: int = 2,
    depth: str = "quick",
    hang: float = 10.0,
    only: list[int] | None = None,
    progress: bool = False,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Fuzz `inputs` cases (or the cases `only`); the summary and every finding."""
    verifying_seeds()  # the corpus, loaded once before the workers fork
    seeds()
    # Every module a case may reach, imported once before the workers fork.
    for module in PRELOAD:
        importlib.import_module(module)
    from coconet.schedule import get_all_passes

    for factory in get_all_passes().values():
        factory()

    ctx = mp.get_context("fork")
    limit = depth
    todo = list(only) if only is not None else list(range(inputs))
    todo.reverse()
    slots = [_Slot(ctx, seed, limit) for _ in range(max(1, min(jobs, len(todo))))]
    results: list[dict[str, Any]] = []
    suspects: list[int] = []
    start = time.monotonic()
    try:
        for s in slots:
            if todo:
                s.give(todo.pop())
        while any(s.index is not None for s in slots):
            busy = [s for s in slots if s.index is not None]
            ready = wait([s.conn for s in busy], timeout=0.2)
            now = time.monotonic()
            for s in busy:
                if s.conn in ready:
                    try:
                        results.append(s.conn.recv())
                    except EOFError:  # the worker died (a crash in C code): a finding
                        results.append(_died(s, seed))
                        s.stop(kill=True)
                        slots[slots.index(s)] = s = _Slot(ctx, seed, limit)
                    s.index = None
                elif now - s.since > hang:
                    suspects.append(s.index)  # type: ignore[arg-type]
                    s.stop(kill=True)
                    slots[slots.index(s)] = s = _Slot(ctx, seed, limit)
                if s.index is None and todo:
                    s.give(todo.pop())
                    if progress and len(results) % 500 == 0:
                        print(f"  {len(results)} cases, {now - start:.0f} s", file=sys.stderr)
                    if checkpoint is not None and len(results) % 1000 == 0:
                        partial = summarize(results, seed, inputs, now - start, depth)
                        partial["complete"] = False
                        checkpoint.write_text(json.dumps(partial, indent=1))
    finally:
        for s in slots:
            s.stop()
    # A suspect runs again alone with a longer limit: slow under load, or a real hang.
    for index in suspects:
        slot = _Slot(ctx, seed, limit)
        slot.give(index)
        if wait([slot.conn], timeout=hang * 6):
            r = slot.conn.recv()
            r["slow"] = True
            results.append(r)
            slot.stop()
        else:
            case = make_case(seed, index)
            results.append(
                {
                    "index": index,
                    "outcome": "hang",
                    "stage": "?",
                    "message": f"no answer in {hang * 6:g} s (and {hang:g} s before)",
                    "case": case.describe(),
                }
            )
            slot.stop(kill=True)
    return summarize(results, seed, inputs, time.monotonic() - start, depth)


def _died(slot: _Slot, seed: int) -> dict[str, Any]:
    slot.proc.join(timeout=5)
    return {
        "index": slot.index,
        "outcome": "traceback",
        "stage": "?",
        "error": "process died",
        "where": f"exit status {slot.proc.exitcode}",
        "message": f"the worker process died (exit status {slot.proc.exitcode})",
    }


def signature(r: dict[str, Any]) -> str:
    if r["outcome"] == "silent":
        msg = r.get("message", "")
        return f"silent: {msg.split(':')[0][:80]}"
    if r["outcome"] == "hang":
        return f"hang: {r.get('case', '')[:60]}"
    return (
        f"{r['outcome']}: {r.get('error')} at {r.get('where')} ({r.get('stage', '').split('@')[0]})"
    )


def summarize(
    results: list[dict[str, Any]], seed: int, inputs: int, seconds: float, depth: str
) -> dict[str, Any]:
    outcomes = Counter(r["outcome"] for r in results)
    findings: dict[str, dict[str, Any]] = {}
    for r in sorted(results, key=lambda r: r["index"]):
        if r["outcome"] in FINDINGS:
            sig = signature(r)
            if sig not in findings:
                r = dict(r)
                r.setdefault("case", make_case(seed, r["index"]).describe())
                r["count"] = 0
                findings[sig] = r
            findings[sig]["count"] += 1
    rejected_by = Counter(r.get("error") for r in results if r["outcome"] == "rejected")
    stage_seconds: Counter[str] = Counter()
    for r in results:
        stage_seconds.update(r.get("stage_seconds", {}))
    return {
        "seed": seed,
        "inputs": len(results),
        "depth": depth,
        "seconds": round(seconds, 1),
        "outcomes": {k: outcomes.get(k, 0) for k in ("accepted", "rejected", *FINDINGS)},
        "distinct_accepted_programs": sum(
            1 for r in results if r["outcome"] == "accepted" and r.get("stage") != "duplicate"
        ),
        "rejected_by": dict(rejected_by.most_common()),
        "slow": sum(1 for r in results if r.get("slow")),
        "max_case_seconds": max((r.get("seconds", 0) for r in results), default=0),
        # the profile: worker seconds per kind of stage, summed over every case
        "stage_seconds": {k: round(v, 1) for k, v in stage_seconds.most_common()},
        "findings": findings,
    }


def format_summary(s: dict[str, Any]) -> str:
    o = s["outcomes"]
    head = (
        f"fuzz: {s['inputs']} inputs (seed {s['seed']}, depth {s['depth']}) in {s['seconds']} s: "
        f"{o['accepted']} accepted ({s['distinct_accepted_programs']} distinct programs run "
        f"through every stage), {o['rejected']} clean diagnostics, {o['traceback']} tracebacks, "
        f"{o['hang']} hangs, {o['silent']} silent acceptances; {s['slow']} slow (> hang "
        f"limit once), slowest case {s['max_case_seconds']} s"
    )
    lines = [head]
    if s.get("stage_seconds"):
        total = sum(s["stage_seconds"].values()) or 1.0
        lines.append(
            "  worker seconds by stage: "
            + ", ".join(f"{k} {v:.0f} ({v / total:.0%})" for k, v in s["stage_seconds"].items())
        )
    for sig, r in s["findings"].items():
        lines.append(f"  [{r['count']}x] {sig}")
        lines.append(f"      {r.get('case')}")
        lines.append(f"      {r.get('message', '')[:300]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--depth", choices=sorted(DEPTHS), default="full")
    ap.add_argument("--hang", type=float, default=10.0, help="seconds before a case is a hang")
    ap.add_argument("--only", type=int, nargs="*", help="run just these case indices")
    ap.add_argument("--show", type=int, help="print case INDEX's input and stop")
    ap.add_argument(
        "--json", type=Path, help="write the summary here (every 1000 cases, then at the end)"
    )
    ap.add_argument("--traceback", action="store_true", help="print each finding's traceback")
    args = ap.parse_args(argv)
    if args.inputs < 1 or args.jobs < 1 or args.hang <= 0:
        ap.error("--inputs, --jobs and --hang must be positive")
    if args.show is not None:
        case = make_case(args.seed, args.show)
        print(case.describe())
        sys.stdout.buffer.write(case.data)
        return 0
    s = run_fuzz(
        args.inputs,
        args.seed,
        args.jobs,
        args.depth,
        args.hang,
        args.only,
        progress=True,
        checkpoint=args.json,
    )
    s["complete"] = True
    print(format_summary(s))
    if args.traceback:
        for r in s["findings"].values():
            if r.get("traceback"):
                print(f"\n--- case {r['index']}\n{r['traceback']}")
    if args.json:
        args.json.write_text(json.dumps(s, indent=1))
    return 1 if any(s["outcomes"][k] for k in FINDINGS) else 0


if __name__ == "__main__":
    sys.exit(main())
