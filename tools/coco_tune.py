"""`coco-tune`: rank a program's schedules with the cost model, measure the top ones, and
report predicted beside measured.

    coco-tune examples/adam.mlir --np 2                     # this host's profile (cpu backend)
    coco-tune examples/adam.mlir --np 2 --top 8 --iters 30 --json tune.json
    coco-tune examples/model_parallel_mlp.mlir --np 16 --profile dgx2-v100 --predict-only

The candidates (coconet/tune/autotune.py): the named schedules that fit and every enumerated one,
one per distinct IR, lowered for --np ranks and priced on --profile (default `cpu`: this host,
measured once per rank count and cached). The `--top` fastest predicted, plus every named
schedule, run as one `coco-run --bench` job on the cpu backend; the report gives both ranks,
the times, Spearman's rho between predicted and measured medians, and whether the predicted
best is the measured best. `--predict-only` prints the ranking without running anything (the
only choice for a GPU profile on a machine without GPUs). Errors: one `coco-tune: error:` line,
exit 1.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coconet.core import env
from coconet.core.program import CocoError, Program, load
from coconet.tools.rank_job import job_description, seconds, tool_main
from coconet.tune.autotune import Candidate


@dataclass
class Measured:
    name: str
    predicted_s: float
    median_s: float
    min_s: float


def measure_candidates(
    program: Program,
    ranks: int,
    candidates: list[Candidate],
    *,
    backend: str = "cpu",
    warmup: int = 3,
    iters: int = 20,
    rounds: int = 5,
    timeout: float | None = None,
    check: bool = False,
) -> list[Measured]:
    """Run every candidate as one `coco-run --bench` job (mpiexec, `ranks` processes) and return
    its measured step time (median and min over about `iters` steps, slowest rank per step)
    beside its predicted time, in the candidates' order. The steps are timed in `rounds`
    rounds, the candidates taking turns, so that a burst of other work on the host slows them
    all rather than the one that happened to be running."""
    import tempfile

    from coconet.runtime.launcher import launch
    from coconet.tools.rank_job import RANK_WORKER

    with tempfile.TemporaryDirectory(prefix="coconet-tune-") as tmp:
        source = Path(tmp) / f"{program.name}.mlir"
        source.write_text(str(program.module) + "\n")
        rows_path = Path(tmp) / "rows.json"
        job = job_description(
            backend,
            [(c.name, c.spec) for c in candidates],
            program=str(source),
            entry=program.name,
            check=check,
            bench=True,
            json_path=str(rows_path),
            warmup=warmup,
            iters=max(1, -(-iters // max(1, rounds))),
            rounds=max(1, rounds),
            quiet=True,
            step_timeout=env.step_timeout(),
        )
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            result = launch(job, ranks, worker=RANK_WORKER, timeout=timeout)
        if result.returncode != 0:
            raise CocoError(result.message or f"the measuring job failed ({result.returncode})")
        rows = json.loads(rows_path.read_text())["rows"]
    by_label = {r["schedule"]: r for r in rows}
    out = []
    for c in candidates:
        r = by_label[c.name]
        out.append(Measured(c.name, c.seconds, float(r["time_s"]), float(r["min_time_s"])))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coco-tune",
        description="Rank a program's schedules with the cost model; measure the top ones.",
    )
    p.add_argument("program", help="a .mlir file, or a .py file defining `program` or `build()`")
    p.add_argument("--np", dest="ranks", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument("--entry", help="the function to tune (default: the module's first)")
    p.add_argument(
        "--profile",
        default=None,
        metavar="NAME|FILE.json",
        help="machine profile: 'cpu' (this host, measured and cached; default), dgx2-v100, "
        "dgx-a100, dgx-h100, dgx-h200, or a profile's JSON",
    )
    p.add_argument(
        "--top", type=int, default=5, help="measure this many of the fastest predicted (default 5)"
    )
    p.add_argument(
        "--space",
        choices=("all", "named"),
        default="all",
        help="rank every enumerated schedule (all, default) or the named ones only",
    )
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps per schedule (default 3)")
    p.add_argument("--iters", type=int, default=20, help="timed steps per schedule (default 20)")
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="time the steps in this many rounds, the schedules taking turns (default 5)",
    )
    p.add_argument("--timeout", type=seconds, default=None, help="stop the job after SECONDS")
    p.add_argument("--predict-only", action="store_true", help="print the ranking; measure nothing")
    p.add_argument("--json", metavar="FILE", help="also write the report's rows as JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from coconet.tune.autotune import rank_schedules, resolve_profile, spearman

    if args.ranks < 1:
        raise CocoError(f"--np must be at least 1, got {args.ranks}")
    if args.top < 1:
        raise CocoError(f"--top must be at least 1, got {args.top}")
    if args.iters < 1 or args.warmup < 0 or args.rounds < 1:
        raise CocoError("--iters and --rounds must be at least 1 and --warmup at least 0")
    program = load(args.program, args.entry)
    profile = resolve_profile(
        args.profile, "cpu", args.ranks, log=lambda m: print(f"coco-tune: {m}", flush=True)
    )
    ranking = rank_schedules(program, args.ranks, profile, space=args.space)
    print(ranking.explain(top=max(args.top, 8)))
    if args.predict_only:
        return 0
    if profile.source != "measured":
        raise CocoError(
            f"the profile {profile.name} describes another machine: measuring here (cpu "
            "backend) would not test it; use --predict-only, or --profile cpu"
        )
    from coconet.schedule import NAMED_SCHEDULES

    named = {"as-written", *NAMED_SCHEDULES}
    chosen = ranking.ranked[: args.top] + [c for c in ranking.ranked[args.top :] if c.name in named]
    print(f"\nmeasuring {len(chosen)} schedule(s) on {args.ranks} rank(s) of the cpu backend ...")
    rows = measure_candidates(
        program,
        args.ranks,
        chosen,
        warmup=args.warmup,
        iters=args.iters,
        rounds=args.rounds,
        timeout=args.timeout,
    )
    by_measured = sorted(range(len(rows)), key=lambda i: rows[i].median_s)
    measured_rank = {i: r + 1 for r, i in enumerate(by_measured)}
    print(
        f"  {'pred#':>5} {'meas#':>5}  {'predicted':>11}  {'measured':>11}  {'min':>11}  schedule"
    )
    for i, r in enumerate(rows):
        print(
            f"  {i + 1:>5} {measured_rank[i]:>5}  {r.predicted_s * 1e3:>8.3f} ms  "
            f"{r.median_s * 1e3:>8.3f} ms  {r.min_s * 1e3:>8.3f} ms  {r.name}"
        )
    rho = spearman([r.predicted_s for r in rows], [r.median_s for r in rows])
    best = rows[by_measured[0]]
    print(
        f"Spearman rho (predicted vs measured median) = {rho:.2f} over {len(rows)} schedule(s); "
        f"predicted best {rows[0].name} ({'is' if best is rows[0] else 'is not'} the measured "
        f"best{'' if best is rows[0] else ', ' + best.name})"
    )
    if args.json:
        doc = {
            "program": program.name,
            "ranks": args.ranks,
            "profile": profile.name,
            "spearman": rho,
            "rows": [r.__dict__ for r in rows],
        }
        try:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
        except OSError as e:
            raise CocoError(f"cannot write {args.json}: {e.strerror or e}") from None
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    tool_main("coco-tune", build_parser(), run, argv)


if __name__ == "__main__":
    main()
