"""The microsecond regime (issue #29): all_reduce and all_reduce + residual + RMSNorm from 1 KiB
to 4 MiB on the cpu backend, one-shot `fuse(ar-c)` against two-shot `fuse(rs-c-ag)` and `ar-c`,
beside mpi4py `Allreduce` (+ NumPy) and torch.distributed gloo (+ torch ops), p50 and p99 in
microseconds, in ONE run; with the form the cost model picks at each size (the host's
machine profile, `coconet/tune/machine_probe.py`) against the form measured fastest.

    .venv/bin/python benchmarks/bench_latency.py                 # 2 ranks
    .venv/bin/python benchmarks/bench_latency.py --np 4 --iters 300

Programs (f32): `all_reduce` of N elements (1 KiB to 4 MiB by 8x), and the decode-time block
of inference engines, [T, 1024] partial sums all_reduced, plus a residual (an output), then
RMSNorm over the hidden dim (4 KiB to 4 MiB: T = 1 to 1024 tokens). Each step's time is the
slowest rank's, after a barrier (benchmarks/bench_suite.py `timed`); the rows run in rounds so
a change in the load of a shared machine falls on every row alike. `-` marks a schedule the
program is not offered at that size (a split needs a row per rank).

The host path (issue #29 item 3) gets a table of its own per program: for each coconet form,
`call` is the user-facing `compiled(**inputs)` (the same arrays every step: the per-call
input check, its agreement over the job, the step, the returned values), and `host` the
step's host overhead -- its time less the time spent inside the libraries it calls, the
kernels' foreign calls and every MPI call (starting a collective, waiting for it), timed by
the cpu backend's opt-in `LibraryClock` on every rank; the slowest rank's overhead per step.
What stays in `host` is coconet's Python around them: walking the plan, the epochs, the
collectives' bookkeeping. `host/call` is the same for the call (its one-int agreement
counts as host work: the library call it wraps has none).

`auto` is the cheapest of the three coconet forms by the cost model's prediction of each lowered
plan on this host's profile (measured once per rank count and cached: the first run probes);
`auto/best` is the measured p50 of that choice over the best coconet form's p50 (1.00: the
model picked the fastest). The last lines give the crossover -- the largest size at which
one-shot beats two-shot -- predicted and measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

FORMS = ("ar-c", "fuse(rs-c-ag)", "fuse(ar-c)")
HIDDEN = 1024
EPS = 1e-6

AR_PROGRAM = """
func.func @all_reduce(%x: !coco.tensor<{n}xf32, local>) -> !coco.tensor<{n}xf32>
    attributes {{coco.grid = #coco.grid<[?]>}} {{
  %total = comm.all_reduce sum %x : !coco.tensor<{n}xf32, local> -> !coco.tensor<{n}xf32>
  func.return %total : !coco.tensor<{n}xf32>
}}
"""

NORM_PROGRAM = """
func.func @allreduce_rmsnorm(%x: !coco.tensor<{t}x{h}xf32, local>,
    %residual: !coco.tensor<{t}x{h}xf32>, %weight: !coco.tensor<{h}xf32>)
    -> (!coco.tensor<{t}x{h}xf32>, !coco.tensor<{t}x{h}xf32>)
    attributes {{coco.grid = #coco.grid<[?]>}} {{
  %total = comm.all_reduce sum %x
      : !coco.tensor<{t}x{h}xf32, local> -> !coco.tensor<{t}x{h}xf32>
  %hidden = coco.add %total, %residual : !coco.tensor<{t}x{h}xf32>
  %0 = coco.mul %hidden, %hidden : !coco.tensor<{t}x{h}xf32>
  %1 = coco.reduce_dims mean %0 dims [1] keepdims
      : !coco.tensor<{t}x{h}xf32> -> !coco.tensor<{t}x1xf32>
  %2 = coco.constant {eps} : !coco.tensor<f32>
  %3 = coco.add %1, %2 : !coco.tensor<{t}x1xf32>, !coco.tensor<f32> -> !coco.tensor<{t}x1xf32>
  %4 = coco.rsqrt %3 : !coco.tensor<{t}x1xf32>
  %5 = coco.mul %hidden, %4
      : !coco.tensor<{t}x{h}xf32>, !coco.tensor<{t}x1xf32> -> !coco.tensor<{t}x{h}xf32>
  %normed = coco.mul %5, %weight
      : !coco.tensor<{t}x{h}xf32>, !coco.tensor<{h}xf32> -> !coco.tensor<{t}x{h}xf32>
  func.return %hidden, %normed : !coco.tensor<{t}x{h}xf32>, !coco.tensor<{t}x{h}xf32>
}}
"""


def cases() -> list[tuple[str, int, str]]:
    """(table, bytes of the all_reduce, program text) for every size of both tables."""
    out = []
    for kib in (1, 8, 64, 512, 4096):
        out.append(("all_reduce", kib * 1024, AR_PROGRAM.format(n=kib * 256)))
    for t in (1, 8, 64, 256, 1024):
        out.append(
            ("all_reduce + residual + RMSNorm", t * HIDDEN * 4, norm_text(t)),
        )
    return out


def norm_text(t: int) -> str:
    return NORM_PROGRAM.format(t=t, h=HIDDEN, eps=f"{EPS:e}")


def predictions(ranks: int) -> dict[str, str]:
    """The form the cost model prices cheapest for each case, on this host's profile."""
    from coconet.core.program import CocoError, Program, parse_module
    from coconet.lowering.lower_to_plan import lower
    from coconet.schedule import apply_schedule
    from coconet.tune.cost_model import predict
    from coconet.tune.machine_probe import cpu_profile

    profile = cpu_profile(ranks=ranks)
    chosen = {}
    for table, nbytes, text in cases():
        priced = {}
        for form in FORMS:
            try:
                plan = lower(apply_schedule(Program(parse_module(text)), form), ranks)
            except CocoError:
                continue
            priced[form] = predict(plan, profile).seconds
        chosen[f"{table}/{nbytes}"] = min(priced, key=priced.__getitem__)
    return chosen


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    from bench_suite import _torch_group, timed
    from mpi4py import MPI

    from coconet.compile import compile as coco_compile
    from coconet.core.program import CocoError, Program, parse_module

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    torch_up = _torch_group(comm)
    rng = np.random.default_rng(rank)
    rows: dict[tuple[str, int], dict[str, object]] = {}
    compiled = []
    calls: dict[tuple[str, int, str], tuple[object, dict]] = {}
    for table, nbytes, text in cases():
        row: dict[str, object] = {}
        n = nbytes // 4
        x = rng.standard_normal(n).astype(np.float32)
        norm = table != "all_reduce"
        shape = (n // HIDDEN, HIDDEN) if norm else (n,)
        x = x.reshape(shape)
        same = np.random.default_rng(0)  # replicated inputs: the same on every rank
        residual = same.standard_normal(shape).astype(np.float32)
        weight = same.standard_normal(HIDDEN).astype(np.float32)
        inputs = {"x": x, "residual": residual, "weight": weight} if norm else {"x": x}
        for form in FORMS:
            try:
                c = coco_compile(Program(parse_module(text)), schedule=form, backend="cpu")
            except CocoError:
                continue  # not offered at this size: `-`
            c(**inputs)  # binds the arrays; later steps reuse them
            compiled.append(c)
            row[f"coconet {form}"] = c.step
            calls[(table, nbytes, form)] = (c, inputs)
        out = np.empty_like(x)

        def mpi_step(x=x, out=out, residual=residual, weight=weight, norm=norm) -> None:
            comm.Allreduce(x, out, op=MPI.SUM)
            if norm:
                h = out + residual
                scale = 1.0 / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + EPS)
                h *= scale
                h *= weight

        row["mpi4py" + (" + NumPy" if norm else "")] = mpi_step
        if torch_up:
            import torch
            import torch.distributed as dist

            tx, tr, tw = (
                torch.from_numpy(x.copy()),
                torch.from_numpy(residual),
                torch.from_numpy(weight),
            )

            def torch_step(tx=tx, tr=tr, tw=tw, norm=norm) -> None:
                dist.all_reduce(tx)
                if norm:
                    h = tx + tr
                    (h * torch.rsqrt(h.pow(2).mean(dim=1, keepdim=True) + EPS) * tw).sum()

            row["torch gloo" + (" + ops" if norm else "")] = torch_step
        rows[(table, nbytes)] = row
    times: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(args.rounds):
        for (table, nbytes), row in rows.items():
            iters = args.iters if nbytes <= 64 * 1024 else max(10, args.iters // 8)
            for label, step in row.items():
                # torch's steps between torch barriers: MPI's barrier spins, and gloo's
                # threads would wait for a core behind it (3 ms a step on 2 cores)
                clock = timed_torch if label.startswith("torch") else timed
                times.setdefault((table, nbytes, label), []).extend(
                    clock(comm, step, args.warmup, iters)
                )
            for form in FORMS:
                if (table, nbytes, form) not in calls:
                    continue
                c, inputs = calls[(table, nbytes, form)]
                for what, ts in zip(
                    ("call", "host", "host/call"),
                    host_path(comm, c, inputs, args.warmup, iters),
                    strict=True,
                ):
                    times.setdefault((table, nbytes, f"{form} {what}"), []).extend(ts)
    for c in compiled:
        c.close()
    if rank != 0:
        return
    chosen = json.loads(Path(args.predicted).read_text()) if args.predicted else {}
    report(comm.Get_size(), rows, times, chosen, args)
    report_host(rows, times)


def host_path(comm, c, inputs, warmup: int, iters: int) -> tuple[list[float], ...]:
    """The slowest rank's times of `c(**inputs)`, and of the host overhead of a step and
    of a call: their time less what the cpu backend's LibraryClock saw inside the kernels'
    foreign calls and MPI's calls."""
    import time

    from bench_suite import timed
    from mpi4py import MPI

    from coconet.runtime.cpu import LibraryClock

    call = timed(comm, lambda: c(**inputs), warmup, iters)
    clock = LibraryClock()
    backend = c.runner.backend
    backend.clock_library(clock)
    try:
        overheads: list[list[float]] = []
        for fn in (c.step, lambda: c(**inputs)):
            for _ in range(warmup):
                fn()
            out = []
            for _ in range(iters):
                comm.Barrier()
                inside = clock.seconds
                t0 = time.perf_counter()
                fn()
                t = time.perf_counter() - t0 - (clock.seconds - inside)
                out.append(comm.allreduce(t, op=MPI.MAX))
            overheads.append(out)
    finally:
        backend.clock_library(None)
    return call, *overheads


def report_host(rows, times) -> None:
    """The host path's table per program: each form's call, and its step's and call's host
    overhead, beside the step of the library it wraps."""
    print(
        "\n  the host path: p50 in us of the slowest rank -- `call` compiled(**inputs), `host` "
        "a step's time outside kernels and MPI calls, `host/call` a call's"
    )
    for table in dict.fromkeys(t for t, _ in rows):
        print(f"\n  {table}")
        labels = [f"{f} {w}" for f in FORMS for w in ("call", "host", "host/call")]
        lib = next(lab for (t, _), row in rows.items() if t == table for lab in row if "mpi" in lab)
        head = f"    {'size':>9}" + "".join(f"{lab:>{max(16, len(lab) + 2)}}" for lab in labels)
        print(head + f"{lib + ' step':>{len(lib) + 7}}")
        for t, nbytes in rows:
            if t != table:
                continue
            line = f"    {_size(nbytes):>9}"
            for lab in [*labels, lib]:
                w = max(16, len(lab) + 2) if lab != lib else len(lib) + 7
                ts = times.get((t, nbytes, lab))
                line += f"{statistics.median(ts) * 1e6:>{w}.1f}" if ts else f"{'-':>{w}}"
            print(line)


def timed_torch(comm, fn, warmup: int, iters: int) -> list[float]:
    """bench_suite's `timed` with torch.distributed's barrier and max."""
    import time

    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t.item()))
    return times


def report(size, rows, times, chosen, args) -> None:
    print(
        f"\nthe microsecond regime: {size} rank(s) of the cpu backend, {os.cpu_count()} core(s); "
        f"p50 / p99 of the slowest rank's step in us ({args.rounds} round(s) of {args.iters} "
        f"steps, an eighth of them above 64 KiB, after {args.warmup} warm-up)"
    )
    crossover: dict[str, dict[str, int]] = {}  # sizes, and which are still growing
    for table in dict.fromkeys(t for t, _ in rows):
        labels = list(
            dict.fromkeys(lab for (t, _), row in rows.items() if t == table for lab in row)
        )
        labels = [f"coconet {f}" for f in FORMS] + [lab for lab in labels if "coconet" not in lab]
        print(f"\n  {table}")
        head = f"    {'size':>9}" + "".join(f"{lab:>{max(18, len(lab) + 2)}}" for lab in labels)
        print(head + f"{'auto':>16}{'auto/best':>11}")
        for (t, nbytes), row in rows.items():
            if t != table:
                continue
            line = f"    {_size(nbytes):>9}"
            p50s = {}
            for lab in labels:
                w = max(18, len(lab) + 2)
                ts = times.get((t, nbytes, lab))
                if not ts:
                    line += f"{'-':>{w}}"
                    continue
                p50 = statistics.median(ts)
                p99 = sorted(ts)[min(len(ts) - 1, int(0.99 * len(ts)))]
                p50s[lab] = p50
                line += f"{f'{p50 * 1e6:.1f} / {p99 * 1e6:.0f}':>{w}}"
            pick = chosen.get(f"{t}/{nbytes}")
            ours = {k: v for k, v in p50s.items() if k.startswith("coconet")}
            if pick and f"coconet {pick}" in ours:
                ratio = ours[f"coconet {pick}"] / min(ours.values())
                line += f"{pick:>16}{ratio:>10.2f}x"
            print(line)
            # the crossover: one-shot wins at every size up to it
            one, two = ours.get("coconet fuse(ar-c)"), ours.get("coconet fuse(rs-c-ag)")
            found = crossover.setdefault(table, {"measured": 0, "predicted": 0, "open": 3})
            if found["open"] & 1 and one is not None and (two is None or one <= two):
                found["measured"] = nbytes
            else:
                found["open"] &= ~1
            if found["open"] & 2 and pick == "fuse(ar-c)":
                found["predicted"] = nbytes
            else:
                found["open"] &= ~2
    print(
        "\n  auto: the form the cost model prices cheapest; auto/best: its measured p50 over the "
        "best coconet form's"
    )
    for table, found in crossover.items():
        parts = [f"{_up_to(found['measured'])} measured"]
        if chosen:
            parts.append(f"{_up_to(found['predicted'])} predicted")
        print(f"  {table}: one-shot beats two-shot " + ", ".join(parts))


def _up_to(nbytes: int) -> str:
    """Where one-shot stops winning: `nbytes` is the largest size of the sweep's leading run
    of sizes it wins (0: it loses at the smallest)."""
    return f"at every size up to {_size(nbytes)}" if nbytes else "at no size"


def _size(nbytes: int) -> str:
    return f"{nbytes // 1024 // 1024} MiB" if nbytes >= 1024 * 1024 else f"{nbytes // 1024} KiB"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--np", type=int, default=2, help="MPI ranks (default 2)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps per row and round")
    p.add_argument("--iters", type=int, default=200, help="timed steps per row and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the rows (default 3)")
    p.add_argument("--no-predict", action="store_true", help="skip the cost model's column")
    p.add_argument("--predicted", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    from bench_suite import run_workers

    with tempfile.TemporaryDirectory() as tmp:
        predicted = Path(tmp) / "predicted.json"
        extra = []
        if not args.no_predict:
            predicted.write_text(json.dumps(predictions(args.np)))
            extra = ["--predicted", str(predicted)]
        argv = ["--worker", "--warmup", str(args.warmup), "--iters", str(args.iters)]
        argv += ["--rounds", str(args.rounds), *extra]
        sys.exit(run_workers(args.np, __file__, *argv))


if __name__ == "__main__":
    main()
