"""The autotuner's report: the cost model's ranking against measurement, and its predictions
for CoCoNet's workloads on CoCoNet's hardware.

    python benchmarks/autotune_report.py                 # both parts (measures: minutes)
    python benchmarks/autotune_report.py --gpu-only      # part 2 only (no measurement)
    python benchmarks/autotune_report.py --examples adam,lamb --iters 40

Part 1, per example (examples/*.mlir) on the cpu backend: the candidates are every named
schedule, the program as written, and the fastest predicted of the enumerated ones whose
predictions differ (schedules the model prices alike -- the same plan up to names -- are one
point: their order is noise by construction). All are measured in one `coco-run --bench` job
(median over --iters steps, slowest rank per step) on this host's measured profile; the
candidates take turns in --rounds rounds, so that other work on the host slows them all alike;
the report prints predicted and measured ranks, Spearman's rho between predicted and measured
times, and whether `--schedule auto`'s pick is the measured best (or within the noise of
it: the measured best's min..median band).

Part 2: the cost model on published GPU node profiles (coconet/tune/cost_model.py) at the
original evaluation's shapes (docs: coconet-reference.md "Workload shapes"): Adam and LAMB
data parallel over 2^20..2^30 f32 parameters on 16 V100s of one DGX-2 and 64 across four;
Megatron's attention/MLP output projections (B = 8, 16; S = 1024; H = 3072; f16) on 16
ranks; the GPT-3 stage boundary (H = 12288, S = 2048, B = 1..6; 2 stages x 16 ranks, one
node per stage). It prints each workload's predicted time per schedule and the predicted
speedup of CoCoNet's best schedule over the baseline schedule (what NCCL + a separate
kernel does: `ar-c`).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coconet.core.program import Program, load, parse_module
from coconet.tools.coco_tune import measure_candidates
from coconet.tune.autotune import (
    Candidate,
    rank_schedules,
    resolve_profile,
    spearman,
)
from coconet.tune.cost_model import published_profile

RANKS = {"pipeline_boundary": 4}  # grid [2, ?]: two stages of two
DISTINCT = 0.03  # predictions closer than this (relative) are one point


def distinct_candidates(ranking, extra: int) -> list[Candidate]:
    from coconet.schedule import NAMED_SCHEDULES

    named = {"as-written", *NAMED_SCHEDULES}
    # auto's pick first: it stands for every schedule the model prices alike
    chosen: list[Candidate] = [ranking.best]
    chosen += [c for c in ranking.ranked if c.name in named and c is not ranking.best]
    times = [c.seconds for c in chosen]
    added = 0
    for c in ranking.ranked:
        if added >= extra:
            break
        if c in chosen:
            continue
        if all(abs(c.seconds - t) > DISTINCT * max(t, c.seconds) for t in times):
            chosen.append(c)
            times.append(c.seconds)
            added += 1
    # one point per distinct prediction: keep the first of any near-equal pair
    out: list[Candidate] = []
    for c in sorted(chosen, key=lambda c: c.seconds):
        if all(abs(c.seconds - o.seconds) > DISTINCT * max(o.seconds, c.seconds) for o in out):
            out.append(c)
    return out


def part_one(args) -> None:
    files = sorted((ROOT / "examples").glob("*.mlir"))
    if args.examples:
        wanted = set(args.examples.split(","))
        files = [f for f in files if f.stem in wanted]
    print("Part 1: predicted vs measured on the cpu backend (this host's measured profile)")
    rhos = []
    picks = []
    for f in files:
        program = load(f)
        ranks = RANKS.get(f.stem, args.np)
        profile = resolve_profile("cpu", "cpu", ranks, log=lambda m: print("  " + m))
        ranking = rank_schedules(program, ranks, profile)
        cands = distinct_candidates(ranking, args.extra)
        t0 = time.perf_counter()
        rows = measure_candidates(
            program, ranks, cands, warmup=3, iters=args.iters, rounds=args.rounds
        )
        elapsed = time.perf_counter() - t0
        rho = spearman([r.predicted_s for r in rows], [r.median_s for r in rows])
        by_measured = sorted(rows, key=lambda r: r.median_s)
        best = by_measured[0]
        pick = ranking.best
        pick_row = next((r for r in rows if r.name == pick.name), None)
        within = pick_row is not None and pick_row.min_s <= best.median_s
        verdict = "the measured best" if pick_row is best else (
            "within the measured best's noise" if within else f"not the measured best ({best.name})"
        )  # fmt: skip
        print(
            f"\n@{program.name}: {ranks} rank(s), {len(ranking.ranked)} candidate(s) ranked, "
            f"{len(rows)} distinct measured ({elapsed:.0f} s); profile {profile.name}"
        )
        print(
            f"  {'pred#':>5} {'meas#':>5}  {'predicted':>11}  {'measured':>11}  {'min':>11}  schedule"
        )
        measured_rank = {id(r): i + 1 for i, r in enumerate(by_measured)}
        for i, r in enumerate(sorted(rows, key=lambda r: r.predicted_s)):
            print(
                f"  {i + 1:>5} {measured_rank[id(r)]:>5}  {r.predicted_s * 1e3:>8.3f} ms  "
                f"{r.median_s * 1e3:>8.3f} ms  {r.min_s * 1e3:>8.3f} ms  {r.name}"
            )
        print(f"  Spearman rho = {rho:.2f}; auto picks {pick.name}: {verdict}")
        rhos.append((program.name, rho))
        picks.append((program.name, verdict))
    print("\nSummary (Spearman's rho of predicted vs measured median step time; target >= 0.8):")
    for (name, rho), (_n, verdict) in zip(rhos, picks, strict=True):
        print(f"  {name:<28} rho = {rho:5.2f}   auto's pick: {verdict}")
    valid = [r for _n, r in rhos if not math.isnan(r)]
    if valid:
        print(f"  mean rho = {sum(valid) / len(valid):.2f} over {len(valid)} example(s)")


# ---------------------------------------------------------------------------------------------
# Part 2: CoCoNet's workloads on CoCoNet's hardware (published profiles)
# ---------------------------------------------------------------------------------------------

MP_TEMPLATE = """
func.func @{name}(%x: !coco.tensor<{b}x{s}x{k}xf16, sliced<2>>, %w: !coco.tensor<{k}x{h}xf16, sliced<0>>,
    %bias: !coco.tensor<{h}xf16>, %r: !coco.tensor<{b}x{s}x{h}xf16>) -> !coco.tensor<{b}x{s}x{h}xf16>
    attributes {{coco.grid = #coco.grid<[?]>}} {{
  %layer = coco.matmul %x, %w : !coco.tensor<{b}x{s}x{k}xf16, sliced<2>>, !coco.tensor<{k}x{h}xf16, sliced<0>> -> !coco.tensor<{b}x{s}x{h}xf16, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<{b}x{s}x{h}xf16, local> -> !coco.tensor<{b}x{s}x{h}xf16>
  %biased = coco.add %total, %bias : !coco.tensor<{b}x{s}x{h}xf16>, !coco.tensor<{h}xf16> -> !coco.tensor<{b}x{s}x{h}xf16>
  %dropped = coco.dropout %biased, 0.1 seed 2 : !coco.tensor<{b}x{s}x{h}xf16>
  %out = coco.add %dropped, %r : !coco.tensor<{b}x{s}x{h}xf16>
  func.return %out : !coco.tensor<{b}x{s}x{h}xf16>
}}
"""

PP_TEMPLATE = """
func.func @pipeline_boundary(%x: !coco.tensor<{b}x{s}x{h}xf16, [local, sliced<2>]>,
    %w: !coco.tensor<{h}x{h}xf16, [local, sliced<0>]>, %bias: !coco.tensor<{h}xf16, [local, replicated]>,
    %r: !coco.tensor<{b}x{s}x{h}xf16, [local, replicated]>) -> !coco.tensor<{b}x{s}x{h}xf16, [local, replicated]>
    attributes {{coco.grid = #coco.grid<[2, ?]>}} {{
  %layer = coco.matmul %x, %w : !coco.tensor<{b}x{s}x{h}xf16, [local, sliced<2>]>, !coco.tensor<{h}x{h}xf16, [local, sliced<0>]> -> !coco.tensor<{b}x{s}x{h}xf16, [local, local]>
  %total = comm.all_reduce sum %layer over [1] : !coco.tensor<{b}x{s}x{h}xf16, [local, local]> -> !coco.tensor<{b}x{s}x{h}xf16, [local, replicated]>
  %biased = coco.add %total, %bias : !coco.tensor<{b}x{s}x{h}xf16, [local, replicated]>, !coco.tensor<{h}xf16, [local, replicated]> -> !coco.tensor<{b}x{s}x{h}xf16, [local, replicated]>
  %dropped = coco.dropout %biased, 0.1 seed 3 : !coco.tensor<{b}x{s}x{h}xf16, [local, replicated]>
  %out = coco.add %dropped, %r : !coco.tensor<{b}x{s}x{h}xf16, [local, replicated]>
  %recv = comm.send %out along 0 shift 1 : !coco.tensor<{b}x{s}x{h}xf16, [local, replicated]>
  func.return %recv : !coco.tensor<{b}x{s}x{h}xf16, [local, replicated]>
}}
"""


def _module(text: str) -> Program:
    return Program(parse_module(text, "<workload>"))


def _py_build(name: str, *args):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(*args)


def workloads():
    """(title, program, ranks, baseline schedule) at the original evaluation's shapes."""
    for ranks in (16, 64):
        for e in (20, 24, 28, 30):
            yield f"Adam 2^{e} f32, {ranks} GPUs", _py_build("adam", 1 << e), ranks, "ar-c"
    for ranks in (16, 64):
        for e in (20, 24, 28, 30):
            yield (
                f"LAMB 2^{e} f32, {ranks} GPUs",
                _lamb(1 << e),
                ranks,
                "ar-c",
            )
    h, s = 3072, 1024
    for b in (8, 16):
        yield (
            f"Megatron attention out, B={b} S={s} H={h}, 16 GPUs",
            _module(MP_TEMPLATE.format(name="attention", b=b, s=s, k=h, h=h)),
            16,
            "ar-c",
        )
        yield (
            f"Megatron MLP out, B={b} S={s} 4H->H, 16 GPUs",
            _module(MP_TEMPLATE.format(name="mlp", b=b, s=s, k=4 * h, h=h)),
            16,
            "ar-c",
        )
    h, s = 12288, 2048
    for b in (1, 2, 4, 6):
        yield (
            f"GPT-3 stage boundary, B={b} S={s} H={h}, 2x16 GPUs",
            _module(PP_TEMPLATE.format(b=b, s=s, h=h)),
            32,
            "ar-c",
        )


def _lamb(n: int) -> Program:
    text = (ROOT / "examples" / "lamb.mlir").read_text()
    import re

    sizes = set(re.findall(r"tensor<(\d+)xf32", text))
    for size in sizes:
        text = text.replace(f"tensor<{size}xf32", f"tensor<{n}xf32")
    return _module(text)


def part_two(args) -> None:
    print("\nPart 2: predictions on published GPU node profiles (coconet/tune/cost_model.py)")
    for profile_name in args.profiles.split(","):
        profile = published_profile(profile_name)
        print(f"\n{profile.description} [{profile.name}]")
        print(f"  {'workload':<52} {'baseline':>11}  {'best':>11}  {'speedup':>7}  best schedule")
        for title, program, ranks, baseline in workloads():
            ranking = rank_schedules(program, ranks, profile, space="named")
            base = ranking.find(baseline)
            best = ranking.best
            if base is None or base.prediction is None:
                print(f"  {title:<52} (no {baseline})")
                continue
            print(
                f"  {title:<52} {base.seconds * 1e3:>8.3f} ms  {best.seconds * 1e3:>8.3f} ms  "
                f"{base.seconds / best.seconds:>6.2f}x  {best.name}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2, help="ranks of part 1 (default 2)")
    ap.add_argument("--iters", type=int, default=40, help="timed steps per schedule")
    ap.add_argument(
        "--rounds",
        type=int,
        default=8,
        help="rounds the steps are timed in, schedules taking turns",
    )
    ap.add_argument("--extra", type=int, default=4, help="enumerated schedules added per example")
    ap.add_argument("--examples", help="comma-separated example names (default: all)")
    ap.add_argument("--gpu-only", action="store_true", help="part 2 only")
    ap.add_argument("--cpu-only", action="store_true", help="part 1 only")
    ap.add_argument("--profiles", default="dgx2-v100,dgx-a100,dgx-h100", help="part 2's profiles")
    args = ap.parse_args()
    if not args.gpu_only:
        part_one(args)
    if not args.cpu_only:
        part_two(args)


if __name__ == "__main__":
    main()
