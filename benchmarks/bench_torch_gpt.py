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
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "runs.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", str(args.np), str(ROOT / "examples" / "torch_gpt.py")]
        for o in RUNS:
            cmd += ["--optimizer", o]
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


if __name__ == "__main__":
    sys.exit(main())
