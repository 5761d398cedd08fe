"""`coco-run`: run a coconet program on N ranks and summarize what every rank holds.

    coco-run examples/adam.mlir --np 4 --backend sim
    coco-run examples/adam.py --np 4 --inputs in.npz --output out.npz

Inputs are seeded random logical values (runtime/values.py) unless `--inputs` names an .npz
with one array per argument. Every user-facing problem ends in one `coco-run: error:` line and
exit status 1 (2 for bad command-line usage), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from coconet.program import CocoError, Program, load

BACKENDS = ("sim", "cpu", "cuda")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coco-run",
        description="Run a coconet program (.mlir or .py) on N ranks.",
    )
    p.add_argument("program", help="a .mlir file, or a .py file defining `program` or `build()`")
    p.add_argument("--np", dest="ranks", type=int, default=1, help="number of ranks (default 1)")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="sim",
        help="sim: the reference interpreter (default)",
    )
    p.add_argument("--entry", help="the function to run (default: the module's first)")
    p.add_argument("--inputs", help=".npz file with one logical array per argument")
    p.add_argument("--output", help="save every output's logical value to this .npz")
    p.add_argument("--seed", type=int, default=0, help="seed of generated inputs (default 0)")
    p.add_argument("-p", "--passes", default="", help="pass pipeline to apply before running")
    return p


def read_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise CocoError(f"no such inputs file: {path}") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise CocoError(f"cannot read inputs from {path}: {e}") from None


def apply_pipeline(program: Program, pipeline: str) -> Program:
    if not pipeline:
        return program
    from xdsl.passes import PassPipeline
    from xdsl.utils.exceptions import DiagnosticException

    from coconet.passes import get_all_passes
    from coconet.program import make_context

    try:
        passes = PassPipeline.parse_spec(get_all_passes(), pipeline)
    except Exception as e:  # xDSL reports unknown passes and bad options as plain exceptions
        raise CocoError(f"bad pass pipeline '{pipeline}': {e}") from None
    program = program.clone()
    try:
        passes.apply(make_context(), program.module)
        program.module.verify()
    except DiagnosticException as e:
        raise CocoError(f"pipeline '{pipeline}' refused the program: {e}") from None
    return program


def summarize(name: str, piece: np.ndarray) -> str:
    if piece.size == 0:
        return f"{name:>12}  {str(list(piece.shape)):>16}  {piece.dtype.name:>8}  (empty)"
    x = piece.astype(np.float64)
    return (
        f"{name:>12}  {str(list(piece.shape)):>16}  {piece.dtype.name:>8}  "
        f"min {x.min():>11.4g}  max {x.max():>11.4g}  mean {x.mean():>11.4g}  sum {x.sum():>13.6g}"
    )


def print_summary(program: Program, per_rank: Sequence[dict[str, np.ndarray]], backend: str) -> None:
    print(f"@{program.name} on {len(per_rank)} rank(s), backend {backend}")
    for rank, outputs in enumerate(per_rank):
        print(f"rank {rank}:")
        for name, piece in outputs.items():
            print("  " + summarize(name, piece))


def run(args: argparse.Namespace) -> int:
    if args.ranks < 1:
        raise CocoError(f"--np must be at least 1, got {args.ranks}")
    program = load(args.program, args.entry)
    program = apply_pipeline(program, args.passes)
    inputs = read_inputs(args.inputs) if args.inputs else None
    if args.backend != "sim":
        raise CocoError(
            f"backend '{args.backend}' is not available in this build: use --backend sim"
        )
    from coconet.runtime.sim import run as sim_run

    result = sim_run(program, inputs, ranks=args.ranks, seed=args.seed, inplace=False)
    print_summary(program, result.per_rank, args.backend)
    if args.output:
        try:
            np.savez(args.output, **result.outputs)
        except OSError as e:
            raise CocoError(f"cannot write {args.output}: {e}") from None
        print(f"saved {len(result.outputs)} output(s) to {args.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        sys.exit(run(args))
    except CocoError as e:
        print(f"coco-run: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("coco-run: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
