"""The numerics policy's cost (docs/architecture.md §3.4.2): programs whose time goes into
transcendentals, on the cpu backend, under `exact` and `fast`, through coco-run's `--bench`.

    python benchmarks/bench_numerics.py --np 2 [--rows 512 --vocab 32000] [--iters 10]

Programs: a vocab-parallel cross-entropy's softmax statistics (logits [rows, vocab] sliced on
the vocab: the row max and the row sum of exp(x - max) all_reduced, the log-sum-exp and the
probabilities), examples/softmax_rows.py and examples/ulysses_attention.py at a larger size.
Each is written to a temporary .mlir and run with `coco-run --numerics exact|fast`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from coconet import frontend
from coconet.frontend import F32, AllReduce, AMax, Exp, Log, Sliced, Sum, Tensor


def cross_entropy(rows: int, vocab: int):
    @frontend.program(grid=[None])
    def vocab_parallel_softmax(logits: Tensor(F32, [rows, vocab], Sliced(1))):
        row_max = AllReduce("max", AMax(logits, -1, keepdims=True))
        e = Exp(logits - row_max)
        total = AllReduce("+", Sum(e, -1, keepdims=True))
        lse = Log(total) + row_max  # the loss is lse minus the target's logit
        return lse, e / total  # and the probabilities, the backward's softmax

    return vocab_parallel_softmax


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    import softmax_rows
    import ulysses_attention

    programs = {
        f"cross_entropy_{args.rows}x{args.vocab}": cross_entropy(args.rows, args.vocab),
        "softmax_rows": softmax_rows.build(),
        "ulysses_attention_h8_s512_d64": ulysses_attention.build(h=8, s=512, d=64, e=64),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, program in programs.items():
            path = Path(tmp) / f"{name}.mlir"
            path.write_text(str(program.module))
            for policy in ("exact", "fast"):
                print(f"== {name} --numerics {policy}", flush=True)
                cmd = [str(Path(sys.executable).parent / "coco-run"), str(path), "--quiet"]
                cmd += ["--np", str(args.np), "--backend", "cpu", "--bench", "--check"]
                cmd += ["--iters", str(args.iters), "--numerics", policy]
                subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
