"""Two rows of what issue 12 adds, on the cpu backend (real MPI ranks through coco-run --bench):

1. Fused Adam on 4 ranks declared as 2 "nodes" of 2 (COCONET_RANKS_PER_NODE=2): the
   hierarchical fused collective (node kernels over shared memory around MPI collectives
   between nodes) beside the same job on one node (the single fused kernel) and beside the
   split schedule rs-c-ag between the same "nodes" (every collective through MPI).
2. The pipeline boundary (examples/pipeline_boundary.mlir scaled up) on 4 ranks (2 stages x 2):
   fuse(sliced-send) -- the computation and the send in one kernel that stores the slice
   straight into the next stage's buffer -- beside sliced-send (a computation kernel, then an
   MPI send of its result), ol(mm,rs)+fuse(sliced-send) (the matmul overlapped with its
   reduce_scatter only) and ol(mm,rs,fuse(sliced-send),ag) (CoCoNet's ol_RS_fuse_P2P_C_AG:
   matmul, reduce_scatter, fused send and the next stage's all_gather chunk by chunk); on one
   node, and with the stages on two "nodes" (the send an MPI send per chunk).

    .venv/bin/python benchmarks/bench_nodes_and_send.py [--log2n 22] [--tokens 4096]
        [--only adam|pipeline]

Prints each configuration's median step time (slowest rank, coco-run's convention) and the
ratios. Timings on a shared machine are noisy: repeat, compare rows of one run.
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


def adam_program(n: int, directory: Path) -> Path:
    text = (ROOT / "examples" / "adam.mlir").read_text().replace("4096x", f"{n}x")
    path = directory / "adam_big.mlir"
    path.write_text(text)
    return path


def pipeline_program(tokens: int, hidden: int, directory: Path) -> Path:
    """pipeline_boundary.mlir with B x S = 1 x tokens and H = hidden."""
    text = (ROOT / "examples" / "pipeline_boundary.mlir").read_text()
    text = text.replace("2x16x64x", f"1x{tokens}x{hidden}x").replace(
        "64x64x", f"{hidden}x{hidden}x"
    )
    text = text.replace("<64xf16", f"<{hidden}xf16")
    path = directory / "pipeline_big.mlir"
    path.write_text(text)
    return path


def bench(path: Path, schedules: list[str], env: dict[str, str], iters: int) -> dict[str, float]:
    """Median step time (s) of each schedule, from coco-run --bench --json."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        args = [sys.executable, "-m", "coconet.tools.coco_run", str(path), "--np", "4"]
        args += ["--backend", "cpu", "--bench", "--iters", str(iters), "-q", "--json", out.name]
        for s in schedules:
            args += ["--schedule", s]
        r = subprocess.run(
            args, capture_output=True, text=True, env={**os.environ, **env}, cwd=ROOT, check=False
        )
        if r.returncode != 0:
            raise SystemExit(f"coco-run failed:\n{r.stdout}{r.stderr}")
        rows = json.loads(Path(out.name).read_text())["rows"]
    return {row["schedule"]: row["time_s"] for row in rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--log2n", type=int, default=22, help="Adam parameters: 2^N (default 22)")
    p.add_argument("--tokens", type=int, default=4096, help="pipeline tokens (default 4096)")
    p.add_argument("--hidden", type=int, default=1024, help="pipeline hidden size (default 1024)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--only", choices=["adam", "pipeline"], help="run one part")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only != "pipeline":
            bench_adam(args, Path(tmp))
        if args.only != "adam":
            bench_pipeline(args, Path(tmp))


PIPELINE_SCHEDULES = [
    "sliced-send",
    "fuse(sliced-send)",
    "ol(mm,rs)+fuse(sliced-send)",
    "ol(mm,rs,fuse(sliced-send),ag)",
]


def bench_pipeline(args: argparse.Namespace, tmp: Path) -> None:
    pipe = pipeline_program(args.tokens, args.hidden, tmp)
    for where, env in [("one node", {}), ("stages on 2 nodes", {"COCONET_RANKS_PER_NODE": "2"})]:
        rows = bench(pipe, PIPELINE_SCHEDULES, env, args.iters)
        base = rows["sliced-send"]
        print(f"pipeline boundary, 1x{args.tokens}x{args.hidden} f16, 2 stages x 2 ranks, {where}")
        print(f"  {'schedule':34s} {'median':>10s}  sliced-send takes")
        for s in PIPELINE_SCHEDULES:
            print(f"  {s:34s} {rows[s] * 1e3:7.2f} ms  {base / rows[s]:5.2f}x")


def bench_adam(args: argparse.Namespace, tmp: Path) -> None:
    adam = adam_program(1 << args.log2n, tmp)
    two_nodes = bench(
        adam, ["fuse(rs-c-ag)", "rs-c-ag"], {"COCONET_RANKS_PER_NODE": "2"}, args.iters
    )
    one_node = bench(adam, ["fuse(rs-c-ag)"], {"COCONET_RANKS_PER_NODE": "4"}, args.iters)
    print(f"Adam, 2^{args.log2n} f32 parameters, 4 ranks (cpu backend)")
    hier, split, single = (
        two_nodes["fuse(rs-c-ag)"],
        two_nodes["rs-c-ag"],
        one_node["fuse(rs-c-ag)"],
    )
    print(f"  fuse(rs-c-ag), 2 nodes x 2 (hierarchical) {hier * 1e3:9.2f} ms")
    print(
        f"  rs-c-ag,       2 nodes x 2 (all MPI)      {split * 1e3:9.2f} ms  "
        f"{split / hier:5.2f}x the hierarchical"
    )
    print(
        f"  fuse(rs-c-ag), 1 node x 4 (one kernel)    {single * 1e3:9.2f} ms  "
        f"{single / hier:5.2f}x the hierarchical"
    )


if __name__ == "__main__":
    main()
