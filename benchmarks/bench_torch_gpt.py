"""Step times of examples/torch_gpt.py (the GPT recipe) on 2 torchrun ranks of the CPU: DDP +
torch.optim.AdamW (default, foreach, fused) against coconet's AdamW under each schedule, one
job, the runs one after another.

    python benchmarks/bench_torch_gpt.py                      # 2 ranks, the sizes below
    python benchmarks/bench_torch_gpt.py --dim 64 --vocab 2049 --steps 12

`step` is the median of the whole training step (both micro-batches' forward and backward,
clipping, `opt.step()`, `zero_grad()`) on rank 0, after the first --warmup-steps (compiling);
`opt` is its clip + step + zero_grad part. DDP all-reduces the gradients inside the last
backward (in `step`, not in `opt`); coconet's `opt` holds the all-reduce (local_gradients_hook
leaves backward local). `vs foreach` = torch foreach's median / the row's (> 1: faster).

    python benchmarks/bench_torch_gpt.py --overlap --schedule 'fuse(rs-c-ag)'

`--overlap` compares coconet's AdamW without and with `overlap=True` (each bucket of
`--bucket-cap-mb` launched from backward, coconet.torch's "Overlap with backward"), both
without DDP (micro-batches under `opt.no_sync()`) and clipped at `--clip` (the recipe's 1.0;
0: no clipping): `step` is then forward + backward + step, `opt` what `opt.step()` still
waits for after backward. Clipped, a bucket's program in backward is its reduction only, and
`opt.step()` runs the norm, the clipping and the update of every parameter ("Overlap with
clipping"); unclipped, a bucket is reduced and updated in backward. It then predicts the same
for `--predict-ranks` GPUs of a published profile (`--profile`,
coconet/tune/cost_model.py): each bucket's program, the step after them (clipped) and the one
program of the step without overlap priced by the cost model, against a backward estimated
from the model's FLOPs (2x the forward's matmuls and attention, at the profile's f32 peak:
a lower bound, so the time overlap hides is underestimated). The buckets become ready in
reverse parameter order, as fast as backward reaches them, and run one at a time. Not
modelled: the host overhead of a launch (argument checks, one host all-gather per program
call), which the CPU numbers above do include.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ["torch", "torch-foreach", "torch-fused", "coconet"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--vocab", type=int, default=8191)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--schedule", action="append", help="coconet schedule(s) (default: all)")
    p.add_argument("--overlap", action="store_true", help="coconet with and without overlap")
    p.add_argument("--bucket-cap-mb", type=float, default=1.0, help="--overlap's buckets")
    p.add_argument("--clip", type=float, default=1.0, help="--overlap's max norm (0: none)")
    p.add_argument("--profile", default="dgx-h100", help="--overlap's GPU prediction")
    p.add_argument("--predict-ranks", type=int, default=8)
    args = p.parse_args(argv)
    runs = ["coconet", "coconet-overlap"] if args.overlap else RUNS
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "runs.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", str(args.np), str(ROOT / "examples" / "torch_gpt.py")]
        for o in runs:
            cmd += ["--optimizer", o]
        if args.overlap:
            cmd += [
                "--no-ddp",
                "--clip",
                str(args.clip),
                "--bucket-cap-mb",
                str(args.bucket_cap_mb),
            ]
        for s in args.schedule or []:
            cmd += ["--schedule", s]
        for k in ("steps", "warmup_steps", "vocab", "dim", "layers", "seq", "batch"):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        cmd += ["--drop-every", "0", "--heads", "4", "--json", str(out)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
        env["OMP_NUM_THREADS"] = "1"
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            return proc.returncode
        records = json.loads(out.read_text())
    d, v, n = args.dim, args.vocab, args.layers
    params = 2 * v * d + n * (12 * d * d + 13 * d) + 2 * d  # tok_emb, head; blocks; ln_f
    print(
        f"torch_gpt on {args.np} rank(s), cpu/gloo: vocab {v}, dim {d}, {n} blocks, seq "
        f"{args.seq}, global batch {args.batch} in 2 micro-batches, {params / 1e6:.2f}M "
        f"trainable f32 parameters; median of {args.steps - args.warmup_steps} steps (rank 0)"
    )
    if args.overlap:
        _overlap_table(records, args.bucket_cap_mb, args.clip)
        for schedule in args.schedule or ["fuse(rs-c-ag)"]:
            _predict_overlap(args, schedule)
        return 0
    base = next(r for r in records if r["name"] == "torch foreach")
    print(f"  {'':<24}{'step (ms)':>17}{'opt (ms)':>17}{'vs torch foreach':>20}")
    print(
        f"  {'optimizer':<24}{'median':>9}{'min':>8}{'median':>9}{'min':>8}{'step':>10}{'opt':>10}"
    )
    for r in records:
        print(
            f"  {r['name']:<24}{r['step_ms']:>9.2f}{r['step_min_ms']:>8.2f}"
            f"{r['opt_ms']:>9.2f}{r['opt_min_ms']:>8.2f}"
            f"{base['step_ms'] / r['step_ms']:>9.2f}x{base['opt_ms'] / r['opt_ms']:>9.2f}x"
        )
    print("  (vs torch foreach: its median / the row's median; > 1 is faster)")
    return 0


def _predict_overlap(args: argparse.Namespace, schedule: str) -> None:
    """The GPU prediction of --overlap (see the module docstring)."""

    sys.path.insert(0, str(ROOT / "examples"))
    import torch_gpt

    import coconet.torch as ct
    from coconet.compiled import apply_schedule
    from coconet.lowering.lower_to_plan import lower
    from coconet.tune.cost_model import predict, published_profile

    profile, ranks = published_profile(args.profile), args.predict_ranks
    d, v, n, t = args.dim, args.vocab, args.layers, args.seq
    model = torch_gpt.GPT(v, t, d, 4, n)
    named = list(model.named_parameters())
    decay = [p for m, p in named if p.dim() >= 2 and "emb" not in m]
    other = [p for m, p in named if not (p.dim() >= 2 and "emb" not in m)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    clip = args.clip > 0
    opt = ct.AdamW(
        groups,
        schedule=schedule,
        overlap=True,
        bucket_cap_mb=args.bucket_cap_mb,
        max_grad_norm=args.clip if clip else None,
    )
    keys = tuple(opt.group_key(g) for g in opt.param_groups)

    def priced(program: object, schedule: str | None) -> float:
        return predict(lower(apply_schedule(program, schedule), ranks), profile).seconds

    buckets = opt._bucket_ranges  # pyright: ignore[reportPrivateUsage]

    def seconds(b: int | None) -> float:
        """Bucket b's program in backward (None: the step without overlap), as coconet.torch
        compiles it."""
        if b is not None and clip:  # the reduction of its ranges
            return priced(opt.build_reduction(buckets[b]), schedule)
        chosen = None if b is None else sorted({i for i, _b, _e in buckets[b]})
        return priced(opt.build_program(False, clip, keys, chosen), schedule)

    after = 0.0  # clipped: the norm, clipping and update after the reductions
    if clip:
        sliced = opt._sliced_step  # pyright: ignore[reportPrivateUsage]
        program = opt.build_program(False, True, keys, None, True, sliced)
        after = priced(program, ct.FUSE_ELEMENTWISE)

    # a GPU's backward: per token of its share of the batch, 2x the forward's 2 FLOPs per
    # matmul weight plus attention's 2 x 2 x seq x dim per block
    tokens = args.batch * t / ranks
    matmul_weights = sum(p.numel() for m, p in named if p.dim() >= 2 and "emb" not in m)
    flops = 2 * tokens * (2 * matmul_weights + n * 4 * t * d)
    backward = flops / profile.matmul_rate("f32")
    position = {id(p): k for k, (_m, p) in enumerate(named)}
    total = len(named)
    ready = []  # when backward has reached a bucket's first parameter
    slots = opt._bucket_slots  # pyright: ignore[reportPrivateUsage]
    params = opt._params  # pyright: ignore[reportPrivateUsage]
    for b in range(len(buckets)):
        first = min(position[id(params[j])] for j in slots[b])
        ready.append((backward * (total - first) / total, b))
    end = 0.0
    for at, b in sorted(ready):
        end = max(at, end) + seconds(b)
    whole = seconds(None)
    busy = sum(seconds(b) for b in range(len(buckets)))
    exposed = max(0.0, end - backward) + after
    what = f"reductions, then a {after * 1e6:.1f} us step" if clip else "programs"
    print(
        f"  predicted on {ranks} GPUs of {args.profile} ({schedule}"
        f"{', clipped' if clip else ''}): backward >= {backward * 1e6:.1f} us; the step "
        f"without overlap {whole * 1e6:.1f} us after it; with overlap ({len(buckets)} "
        f"buckets, {busy * 1e6:.1f} us of {what}) {exposed * 1e6:.1f} us after it"
    )


def _overlap_table(records: list[dict], cap: float, clip: float) -> None:
    clipping = f"clipped at {clip:g}" if clip > 0 else "no clipping"
    print(f"  no DDP, {clipping}; overlap=True in buckets of {cap:g} MiB")
    print(f"  {'':<34}{'step (ms)':>17}{'opt (ms)':>17}")
    print(f"  {'optimizer':<34}{'median':>9}{'min':>8}{'median':>9}{'min':>8}")
    for r in records:
        print(
            f"  {r['name']:<34}{r['step_ms']:>9.2f}{r['step_min_ms']:>8.2f}"
            f"{r['opt_ms']:>9.2f}{r['opt_min_ms']:>8.2f}"
        )
    by_schedule: dict[str, dict[str, dict]] = {}
    for r in records:
        on = r["name"].startswith("coconet overlap ")
        schedule = r["name"].removeprefix("coconet overlap ").removeprefix("coconet ")
        by_schedule.setdefault(schedule, {})["on" if on else "off"] = r
    for schedule, pair in by_schedule.items():
        if len(pair) == 2:
            off, on = pair["off"]["step_ms"], pair["on"]["step_ms"]
            print(f"  {schedule}: overlap changes the step by {on - off:+.2f} ms ({on / off:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
