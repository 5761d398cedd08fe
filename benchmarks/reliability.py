"""The reliability report: the fuzzer's counts and the fault-injection timings, as the README
quotes them.

    python benchmarks/reliability.py [--inputs 20000] [--seed 0] [--depth quick|full]
                                     [--fuzz-json FILE] [--faults-only] [--markdown FILE]

1. Fuzzing (test/fuzz): `--inputs` seeded mutations of every example and lit input through
   load, coco-opt, the round trip, the lowering (`-t plan`, `-t cuda`) and the sim at 1-4
   ranks, the enumerated schedules (equivalence-checked) and sampled cpu-backend runs; the
   outcomes counted: accepted, clean diagnostics, tracebacks, hangs, silent acceptances.
   `--fuzz-json` reads the summary of an earlier `fuzz_driver.py --json` run instead.
2. Faults (test/mpi/fault_harness.py): SIGKILL of a rank in the `--bench` loop, an exception
   on a rank, a compile failure on a rank, a rank that never arrives -- on 2 and 4 ranks; per
   case the front end's exit status, every rank's own end (exit status or signal, as its
   supervisor recorded it) and the time from the fault until the last of them, the time until
   every rank process was gone and until every process of the job (front end included) was
   gone, orphans, and the user's line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test" / "fuzz"))
sys.path.insert(0, str(ROOT / "test" / "mpi"))


def fuzz_section(summary: dict) -> list[str]:
    o = summary["outcomes"]
    complete = "" if summary.get("complete", True) else " (a partial run: its last checkpoint)"
    lines = [
        (
            f"## Fuzzing ({summary['inputs']} inputs, seed {summary['seed']}, depth "
            f"{summary['depth']}, {summary['seconds']:.0f} s){complete}"
        ),
        "",
        (
            "| inputs | accepted (distinct programs run through every stage) | clean diagnostics "
            "| tracebacks | hangs | silent acceptances |"
        ),
        "|---:|---:|---:|---:|---:|---:|",
        (
            f"| {summary['inputs']} | {o['accepted']} ({summary['distinct_accepted_programs']}) "
            f"| {o['rejected']} | {o['traceback']} | {o['hang']} | {o['silent']} |"
        ),
        "",
        "Clean diagnostics by kind: "
        + ", ".join(f"{k} {v}" for k, v in summary.get("rejected_by", {}).items()),
        (
            f"Slowest case {summary['max_case_seconds']} s; cases over the hang limit once "
            f"(then finished alone): {summary['slow']}."
        ),
    ]
    for sig, r in summary["findings"].items():
        lines.append(f"- [{r['count']}x] {sig}: {r.get('case')}: {r.get('message', '')[:200]}")
    return lines


def fault_section(runs: list) -> list[str]:
    lines = [
        "## Faults on real `coco-run` jobs (cpu backend, examples/sgd.mlir, failing rank = last)",
        "",
        (
            "| fault | ranks | exit status | each rank's end (rank: status) "
            "| fault -> last rank's end | -> every rank gone | -> mpiexec gone "
            "| -> front end gone | -> every process gone | orphans | what the user sees |"
        ),
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        ranks_gone = (
            f"{max(r.gone_at.values()) - r.fault_at:.2f} s"
            if r.gone_at and r.fault_at is not None
            else "-"
        )
        everything = f"{r.fault_to_all_gone:.2f} s" if r.fault_to_all_gone is not None else "-"

        def since_fault(t: float | None, r=r) -> str:
            return f"{t - r.fault_at:.2f} s" if t is not None and r.fault_at is not None else "-"

        ends = ", ".join(f"{rank}: {r.rank_end(rank)}" for rank in range(r.ranks))
        last_end = r.fault_to_last_rank_exit
        last = f"{last_end:.2f} s" if last_end is not None else "-"
        lines.append(
            f"| {r.kind} | {r.ranks} | {r.returncode} | {ends} | {last} | {ranks_gone} | "
            f"{since_fault(r.mpiexec_gone_at)} | {since_fault(r.front_end_gone_at)} | "
            f"{everything} | "
            f"{len(r.orphans)} | `{r.message.replace('|', '/')[:150]}` |"
        )
    lines += [
        "",
        (
            "The fault's time: the SIGKILL for `sigkill`; else the moment the first rank "
            "process was gone (a raising or non-compiling rank reports and aborts the job; "
            "for `absent` the waiting ranks name it after `--step-timeout 3`)."
        ),
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", choices=("quick", "full"), default="quick")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--fuzz-json", type=Path, help="report this fuzz_driver.py --json summary")
    ap.add_argument("--faults-only", action="store_true")
    ap.add_argument("--fuzz-only", action="store_true")
    ap.add_argument("--markdown", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    lines = ["# coconet reliability report", ""]
    bad = False
    if not args.faults_only:
        if args.fuzz_json:
            summary = json.loads(args.fuzz_json.read_text())
        else:
            from fuzz_driver import run_fuzz

            summary = run_fuzz(args.inputs, args.seed, args.jobs, args.depth, progress=True)
        lines += [*fuzz_section(summary), ""]
        bad |= any(summary["outcomes"][k] for k in ("traceback", "hang", "silent"))
    if not args.fuzz_only:
        from fault_harness import FAULTS, run_fault

        runs = [run_fault(kind, ranks) for kind in FAULTS for ranks in (2, 4)]
        lines += fault_section(runs)
        bad |= any(
            r.returncode != 1
            or not r.every_rank_failed
            or r.fault_to_last_rank_exit is None
            or r.fault_to_last_rank_exit >= 10
            or r.orphans
            or r.fault_to_all_gone is None
            or r.fault_to_all_gone >= 10
            for r in runs
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
