"""Compile time of a deep tensor-parallel stack: from MLIR text (or the Python front end) to the
plan and its CUDA text, and a warm start of the same program.

    python benchmarks/compile_time.py                       # 400 layers, six schedules
    python benchmarks/compile_time.py --layers 100,200,400  # scaling: time per layer
    python benchmarks/compile_time.py --profile             # cProfile's top entries
    python benchmarks/compile_time.py --shapes all          # and the other program shapes

Each layer is Megatron's output projection with its residual (6 ops): the input sliced on its
last dim, a matmul against a row-sliced weight (partial sums), their all_reduce, the bias,
dropout, and the residual -- so 400 layers are 2,401 ops. Phases: parse + verify, schedule
(the named schedule's passes, each verifying), lower (plan + the CUDA translation unit).
Targets (issue #13): < 2 s from text to CUDA for >= 2,000 ops; < 0.3 s warm start. The warm
start is what `coconet.compile` does for a `.mlir` file it compiled before: the plan cache
(lowering/plan_cache.py) keys the text, schedule, ranks and target and loads the stored plan
(with its CUDA text) instead of parsing, scheduling and lowering; the report prints the cold
compile through the cache (a miss: compile and store) and the warm one (a hit), in a fresh
cache directory, with the compiler digest recomputed as a new process would.

`--shapes` adds programs of other shapes (`shape_text`), each through the pipeline
`coco-split-allreduce,coco-reorder,coco-fuse{mode=all_reduce}` and the named schedules
(`--shape-schedules`), in f16, whose layers are matmul -> all_reduce -> +bias -> dropout -> gelu
-> +residual: `shared` (every layer's matmul reads one sliced input: after the reorder each
layer's chain runs on along the sliced residual stream), `own` (every layer reads an input of
its own), `wide` (independent layers, each returning its own output) and `chain` (one
all_reduce, then the layers' elementwise ops as one long chain); and `clip` (f32), where a
layer is a parameter tensor of an optimizer step with global-norm gradient clipping
(all_reduce of its gradient, sum of squares, then Adam with the gradient scaled by
min(1, max_norm / ||g||)): every tensor's chain is coupled to every other through the norm;
`clip4`, the same over tensors of four shapes in turn, as a model's layers repeat theirs.
A pass that looks at the whole function per layer shows here as time per op growing with
the layers.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

H, B, S = 64, 2, 8


def stack_text(layers: int, h: int = H, b: int = B, s: int = S) -> str:
    """A `layers`-deep tensor-parallel stack as MLIR text (6 ops per layer, one return)."""
    t = f"{b}x{s}x{h}xf32"
    args = [f"%x0: !coco.tensor<{t}>"]
    for i in range(layers):
        args.append(f"%w{i}: !coco.tensor<{h}x{h}xf32, sliced<0>>")
        args.append(f"%b{i}: !coco.tensor<{h}xf32>")
    lines = [
        "func.func @stack(" + ", ".join(args) + f") -> !coco.tensor<{t}> "
        "attributes {coco.grid = #coco.grid<[?]>} {"
    ]
    for i in range(layers):
        x = f"%x{i}"
        lines += [
            f"  %xs{i} = coco.slice {x} : !coco.tensor<{t}> -> !coco.tensor<{t}, sliced<2>>",
            (
                f"  %mm{i} = coco.matmul %xs{i}, %w{i} : !coco.tensor<{t}, sliced<2>>, "
                f"!coco.tensor<{h}x{h}xf32, sliced<0>> -> !coco.tensor<{t}, local>"
            ),
            f"  %ar{i} = comm.all_reduce sum %mm{i} : "
            f"!coco.tensor<{t}, local> -> !coco.tensor<{t}>",
            (
                f"  %bi{i} = coco.add %ar{i}, %b{i} : !coco.tensor<{t}>, !coco.tensor<{h}xf32> -> "
                f"!coco.tensor<{t}>"
            ),
            f"  %dr{i} = coco.dropout %bi{i}, 0.1 seed {i} : !coco.tensor<{t}>",
            f"  %x{i + 1} = coco.add %dr{i}, {x} : !coco.tensor<{t}>",
        ]
    lines += [f"  func.return %x{layers} : !coco.tensor<{t}>", "}"]
    return "\n".join(lines) + "\n"


SHAPES = ("shared", "own", "wide", "chain", "clip", "clip4")

SHAPE_PIPELINE = "coco-split-allreduce,coco-reorder,coco-fuse{mode=all_reduce}"


def clip_text(tensors: int, n: int, kinds: int | None = None) -> str:
    """Global-norm clipping, then Adam, over `tensors` parameter tensors of n, n+1, ...
    elements (f32; adam_clip_global_norm's step, grown); with `kinds`, of n, ..., n+kinds-1
    elements in turn (a model's layers: each shape recurs, and same-shaped tensors' chains
    meet in each other's updates)."""
    sc = "!coco.tensor<f32>"
    args = [f"%{a}: {sc}" for a in ("lr", "beta1", "beta2", "eps", "max_norm")]
    lines = [f"  %one = coco.constant 1.0 : {sc}", f"  %tiny = coco.constant 1.0e-06 : {sc}"]
    size = [n + (i if kinds is None else i % kinds) for i in range(tensors)]
    for i in range(tensors):
        t, tl = f"!coco.tensor<{size[i]}xf32>", f"!coco.tensor<{size[i]}xf32, local>"
        args += [f"%g{i}: {tl}", f"%w{i}: {t}", f"%m{i}: {t}", f"%v{i}: {t}"]
        lines += [
            f"  %gsum{i} = comm.all_reduce sum %g{i} : {tl} -> {t}",
            f"  %gsq{i} = coco.mul %gsum{i}, %gsum{i} : {t}",
            f"  %sumsq{i} = coco.reduce sum %gsq{i} : {t} -> {sc}",
        ]
        if i:
            lines.append(f"  %squares{i} = coco.add %squares{i - 1}, %sumsq{i} : {sc}")
        else:
            lines.append(f"  %squares0 = coco.add %sumsq0, %tiny : {sc}")
    last = f"%squares{tensors - 1}"
    lines += [
        f"  %norm = coco.sqrt {last} : {sc}",
        f"  %ratio = coco.div %max_norm, %norm : {sc}",
        f"  %clip = coco.min %one, %ratio : {sc}",
    ]
    for i in range(tensors):
        t = f"!coco.tensor<{size[i]}xf32>"
        st = f"{sc}, {t} -> {t}"
        lines += [
            f"  %gc{i} = coco.mul %clip, %gsum{i} : {st}",
            f"  %bm{i} = coco.mul %beta1, %m{i} : {st}",
            f"  %m_new{i} = coco.add %bm{i}, %gc{i} : {t}",
            f"  %bv{i} = coco.mul %beta2, %v{i} : {st}",
            f"  %gg{i} = coco.mul %gc{i}, %gc{i} : {t}",
            f"  %v_new{i} = coco.add %bv{i}, %gg{i} : {t}",
            f"  %rt{i} = coco.sqrt %v_new{i} : {t}",
            f"  %den{i} = coco.add %rt{i}, %eps : {t}, {sc} -> {t}",
            f"  %q{i} = coco.div %m_new{i}, %den{i} : {t}",
            f"  %step{i} = coco.mul %lr, %q{i} : {st}",
            f"  %w_new{i} = coco.sub %w{i}, %step{i} : {t}",
            f"  coco.update %m{i}, %m_new{i} : {t}",
            f"  coco.update %v{i}, %v_new{i} : {t}",
            f"  coco.update %w{i}, %w_new{i} : {t}",
        ]
    head = f"func.func @clip({', '.join(args)}) attributes {{coco.grid = #coco.grid<[?]>}} {{"
    return "\n".join([head, *lines, "  func.return", "}"]) + "\n"


def shape_text(shape: str, layers: int, h: int = H, b: int = B, s: int = S) -> str:
    """A `layers`-deep program of one of SHAPES as MLIR text (f16; see the module docstring):
    each layer is matmul -> all_reduce -> +bias -> dropout -> gelu -> +residual (`chain`: one
    matmul and all_reduce, then each layer's +bias, dropout, gelu, +residual)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
    if shape == "clip":
        return clip_text(layers, b * s * h)
    if shape == "clip4":
        return clip_text(layers, b * s * h, kinds=4)
    t = f"!coco.tensor<{b}x{s}x{h}xf16>"
    ts = f"!coco.tensor<{b}x{s}x{h}xf16, sliced<2>>"
    tl = f"!coco.tensor<{b}x{s}x{h}xf16, local>"
    tw = f"!coco.tensor<{h}x{h}xf16, sliced<0>>"
    tb = f"!coco.tensor<{h}xf16>"
    args = [f"%x0: {t}"]
    if shape in ("own", "wide"):
        args += [f"%in{i}: {t}" for i in range(layers)]
    args += [f"%w{i}: {tw}" for i in range(1 if shape == "chain" else layers)]
    args += [f"%b{i}: {tb}" for i in range(layers)]
    lines: list[str] = []
    outputs: list[str] = []

    def tail(i: int, ar: str, residual: str, out: str) -> list[str]:
        return [
            f"  %bi{i} = coco.add {ar}, %b{i} : {t}, {tb} -> {t}",
            f"  %dr{i} = coco.dropout %bi{i}, 0.1 seed {i} : {t}",
            f"  %ge{i} = coco.gelu %dr{i} : {t}",
            f"  {out} = coco.add %ge{i}, {residual} : {t}",
        ]

    def project(i: int, xs: str, w: str, ar: str) -> list[str]:
        return [
            f"  %mm{i} = coco.matmul {xs}, {w} : {ts}, {tw} -> {tl}",
            f"  {ar} = comm.all_reduce sum %mm{i} : {tl} -> {t}",
        ]

    if shape in ("shared", "chain"):
        lines.append(f"  %xs = coco.slice %x0 : {t} -> {ts}")
    if shape == "chain":
        lines += project(0, "%xs", "%w0", "%ar")
        for i in range(layers):
            x = "%ar" if i == 0 else f"%x{i}"
            lines += tail(i, x, x, f"%x{i + 1}")
    for i in range(layers if shape != "chain" else 0):
        xs = "%xs"
        if shape != "shared":
            xs = f"%xs{i}"
            lines.append(f"  {xs} = coco.slice %in{i} : {t} -> {ts}")
        lines += project(i, xs, f"%w{i}", f"%ar{i}")
        if shape == "wide":
            lines += tail(i, f"%ar{i}", "%x0", f"%y{i}")
            outputs.append(f"%y{i}")
        else:
            lines += tail(i, f"%ar{i}", f"%x{i}", f"%x{i + 1}")
    outputs = outputs or [f"%x{layers}"]
    types = ", ".join([t] * len(outputs))
    head = (
        f"func.func @{shape}(" + ", ".join(args) + f") -> ({types}) "
        "attributes {coco.grid = #coco.grid<[?]>} {"
    )
    ret = f"  func.return {', '.join(outputs)} : {types}"
    return "\n".join([head, *lines, ret, "}"]) + "\n"


def stack_program(layers: int, h: int = H, b: int = B, s: int = S):
    """The same stack built with the Python front end (coconet.frontend), as a user writes a
    deep model: a loop over layers, each declaring its weight and bias."""
    from coconet import frontend as F
    from coconet.frontend import F32, Tensor

    def stack(x0: Tensor(F32, [b, s, h])):
        x = x0
        for i in range(layers):
            w = Tensor(F32, [h, h], F.Sliced(0), f"w{i}")
            bias = Tensor(F32, [h], F.Replicated, f"b{i}")
            xs = F.Slice(x, 2)
            mm = F.MatMul(xs, w)
            ar = F.AllReduce("+", mm)
            bi = ar + bias
            dr = F.Dropout(bi, 0.1, seed=i)
            x = dr + x
        return x

    return F.build_program(stack, grid=[None])


def parse_stack(text: str):
    """The stack parsed (and verified) from its MLIR text."""
    from coconet.core.program import Program, parse_module

    return Program(parse_module(text, "<stack>"))


def count_ops(program) -> int:
    return sum(1 for _ in program.func.body.walk())


def phases(build: Callable[[], Any], schedule: str, ranks: int) -> dict[str, float]:
    """CPU seconds per phase: `build()` (parse MLIR text, or build with the Python front end,
    each verifying), the schedule, and the lowering to the plan and its CUDA text."""
    from coconet.compile import apply_schedule
    from coconet.lowering.lower_to_plan import lower

    out = {}
    w0, c0 = time.perf_counter(), time.process_time()
    program = build()
    c1 = time.process_time()
    out["ops"] = count_ops(program)
    scheduled = apply_schedule(program, schedule, in_place=True)  # as coconet.compile does
    c2 = time.process_time()
    plan = lower(scheduled, ranks)
    w3, c3 = time.perf_counter(), time.process_time()
    out["cuda_chars"] = len(plan.cuda_source)
    out |= {"build": c1 - c0, "schedule": c2 - c1, "lower": c3 - c2, "total": c3 - c0}
    out["wall"] = w3 - w0
    return out


def cold_and_warm(text: str, schedule: str, ranks: int) -> tuple[float, float, bool]:
    """Wall seconds of a compile through the plan cache on a miss and then on a hit (fresh
    cache directory), and whether the hit's plan is the miss's."""
    from coconet.compile import apply_schedule
    from coconet.lowering import plan_cache
    from coconet.lowering.lower_to_plan import lower

    def build():
        return lower(apply_schedule(parse_stack(text), schedule, in_place=True), ranks)

    old = os.environ.get("COCONET_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="coconet-bench-cache-") as cache:
        os.environ["COCONET_CACHE_DIR"] = cache
        try:
            times = []
            plans = []
            for _ in range(2):
                plan_cache._compiler_digest = None  # a new process computes it again
                t0 = time.perf_counter()
                key = plan_cache.plan_key(text, None, schedule, ranks, (), "None", "cpu")
                got = plan_cache.cached_plan(key, build)
                times.append(time.perf_counter() - t0)
                plans.append(got)
        finally:
            if old is None:
                os.environ.pop("COCONET_CACHE_DIR", None)
            else:
                os.environ["COCONET_CACHE_DIR"] = old
    same = plans[1].cache_hit and plans[1].value.cuda_source == plans[0].value.cuda_source
    return times[0], times[1], same


SHAPE_SCHEDULES = (SHAPE_PIPELINE, "ar-c", "rs-c-ag", "fuse(rs-c-ag)", "ol(mm,fuse(rs-c-ag))")


def shape_rows(
    shapes: Sequence[str],
    layer_counts: Sequence[int],
    schedules: Sequence[str],
    ranks: int,
    repeat: int,
) -> None:
    """The phases' CPU seconds for the programs of `shapes` (see shape_text), as the main
    table reports them; a named schedule that does not fit a shape says so."""
    from coconet.schedule import ScheduleError

    print(
        "\nprogram shapes (MLIR text, f16; see the module docstring), same phases and "
        f"seconds; pipeline = {SHAPE_PIPELINE}"
    )
    print(
        f"  {'shape':<6} {'layers':>6} {'ops':>6}  {'schedule':<31} {'build':>8} "
        f"{'schedule':>9} {'lower':>8} {'total':>8}  {'per op':>8} {'wall':>9}"
    )
    for shape in shapes:
        for layers in layer_counts:
            build = functools.partial(parse_stack, shape_text(shape, layers))
            for schedule in schedules:
                label = "pipeline" if schedule == SHAPE_PIPELINE else schedule
                try:
                    runs = [phases(build, schedule, ranks) for _ in range(repeat)]
                except ScheduleError as e:
                    rule = f" [{e.rule}]" if e.rule else ""
                    print(f"  {shape:<6} {layers:>6} {'':>6}  {label:<31} does not fit{rule}")
                    continue
                best = min(runs, key=lambda r: r["total"])
                print(
                    f"  {shape:<6} {layers:>6} {best['ops']:>6}  {label:<31} "
                    f"{best['build']:>6.3f} s {best['schedule']:>7.3f} s {best['lower']:>6.3f} s "
                    f"{best['total']:>6.3f} s  {best['total'] / best['ops'] * 1e6:>6.0f} us "
                    f"{best['wall']:>7.3f} s"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="400", help="comma-separated layer counts")
    ap.add_argument(
        "--schedules",
        default="none;ar-c;coco-split-allreduce;coco-split-allreduce,coco-fuse;rs-c-ag;"
        "fuse(rs-c-ag)",
        help="schedules (named, pipelines, 'none'), separated by ';' (default: as written, "
        "ar-c, split, split + fuse, rs-c-ag, fuse(rs-c-ag))",
    )
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument(
        "--source",
        choices=("mlir", "python", "both"),
        default="both",
        help="build the program from MLIR text, with the Python front end, or both (default)",
    )
    ap.add_argument(
        "--shapes",
        default="",
        help="also the programs of these shapes ("
        + ", ".join(SHAPES)
        + ", comma-separated, or 'all'), from MLIR text, at the same layer counts",
    )
    ap.add_argument(
        "--shape-schedules",
        default=";".join(SHAPE_SCHEDULES),
        help="the shapes' schedules, separated by ';' (default: the split, reorder and "
        "all_reduce fusion pipeline, ar-c, rs-c-ag, fuse(rs-c-ag), ol(mm,fuse(rs-c-ag)); a "
        "named schedule that does not fit a shape is reported as such)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    ap.add_argument("--profile", action="store_true", help="cProfile the largest run")
    args = ap.parse_args()
    import coconet.schedule  # noqa: F401 - imports out of the timed region

    layer_counts = [int(x) for x in args.layers.split(",")]
    sources = ("mlir", "python") if args.source == "both" else (args.source,)
    print(
        f"compile time, {args.ranks} rank(s), best of {args.repeat}: MLIR text -> parse + verify "
        "(or the Python front end -> build + verify) -> schedule -> plan + CUDA text; CPU "
        "seconds of this process per phase (a shared box's wall clock moves with its "
        "neighbours' load), and the wall clock of the whole"
    )
    print(
        f"  {'from':<6} {'layers':>6} {'ops':>6}  {'schedule':<31} {'build':>8} "
        f"{'schedule':>9} {'lower':>8} {'total':>8}  {'per op':>8} {'wall':>9}"
    )
    for source in sources:
        for layers in layer_counts:
            if source == "python":
                build = functools.partial(stack_program, layers)
            else:
                build = functools.partial(parse_stack, stack_text(layers))
            for schedule in args.schedules.split(";"):
                runs = [phases(build, schedule, args.ranks) for _ in range(args.repeat)]
                best = min(runs, key=lambda r: r["total"])
                print(
                    f"  {source:<6} {layers:>6} {best['ops']:>6}  {schedule:<31} "
                    f"{best['build']:>6.3f} s {best['schedule']:>7.3f} s {best['lower']:>6.3f} s "
                    f"{best['total']:>6.3f} s  {best['total'] / best['ops'] * 1e6:>6.0f} us "
                    f"{best['wall']:>7.3f} s"
                )
    shapes = SHAPES if args.shapes == "all" else [x for x in args.shapes.split(",") if x]
    if shapes:
        shape_rows(shapes, layer_counts, args.shape_schedules.split(";"), args.ranks, args.repeat)
    print(
        "\nwarm start (coconet.compile of a .mlir file compiled before): text -> plan + CUDA "
        "text through the plan cache, wall seconds, median of the runs"
    )
    print(f"  {'layers':>6}  {'schedule':<28} {'cold':>8} {'warm':>8}")
    for layers in layer_counts:
        text = stack_text(layers)
        for schedule in args.schedules.split(";"):
            runs = [cold_and_warm(text, schedule, args.ranks) for _ in range(args.repeat)]
            cold = sorted(r[0] for r in runs)[len(runs) // 2]
            warm = sorted(r[1] for r in runs)[len(runs) // 2]
            same = "" if all(r[2] for r in runs) else "  (the warm plan differs!)"
            print(f"  {layers:>6}  {schedule:<28} {cold:>6.3f} s {warm:>6.3f} s{same}")
    if args.profile:
        text = stack_text(layer_counts[-1])
        schedule = args.schedules.split(";")[-1]
        prof = cProfile.Profile()
        prof.enable()
        phases(functools.partial(parse_stack, text), schedule, args.ranks)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
