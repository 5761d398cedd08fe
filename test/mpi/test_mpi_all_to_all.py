"""comm.all_to_all on real MPI ranks (the mpich wheel's mpiexec): MPI_Ialltoallv with byte
counts and displacements from the uneven cuts, on a 3-D tensor re-cut between every pair of
dims (the innermost included, so the runs are strided), each element type, and the dispatch
form; `coco-run --check` compares every rank's outputs with the sim oracle (bit-exact)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"

try:
    import mpi4py  # noqa: F401

    HAVE_MPI = MPIEXEC.exists()
except ImportError:
    HAVE_MPI = False

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and the mpich wheel's mpiexec"),
]


def program(elt: str, ranks: int) -> str:
    """Every ordered pair of the dims of a 7x10x9 tensor (no dim divides by 3 or 4 but 9 by 3),
    chained, each result returned; then the dispatch form."""
    shape = "7x10x9x" + elt
    pairs = list(itertools.permutations(range(3), 2))
    args, lines, results = [], [], []
    for i, (a, b) in enumerate(pairs):
        src, dst = f"!coco.tensor<{shape}, sliced<{a}>>", f"!coco.tensor<{shape}, sliced<{b}>>"
        args.append(f"%x{i}: {src}")
        lines.append(f"  %y{i} = comm.all_to_all %x{i} : {src} -> {dst}")
        results.append((f"%y{i}", dst))
    local = f"!coco.tensor<{2 * ranks}x5x{elt}, local>"
    args.append(f"%d: {local}")
    lines.append(f"  %e = comm.all_to_all %d : {local}")
    results.append(("%e", local))
    names = ", ".join(n for n, _ in results)
    types = ", ".join(t for _, t in results)
    return (
        f"func.func @a2a({', '.join(args)}) -> ({types}) "
        "attributes {coco.grid = #coco.grid<[?]>} {\n"
        + "\n".join(lines)
        + f"\n  func.return {names} : {types}\n}}\n"
    )


@pytest.mark.parametrize("ranks", [3, 4])
@pytest.mark.parametrize("elt", ["f32", "bf16", "i32", "f64"])
def test_all_to_all_on_mpi_ranks(tmp_path, ranks, elt):
    path = tmp_path / f"a2a_{elt}.mlir"
    path.write_text(program(elt, ranks))
    r = subprocess.run(
        [sys.executable, "-m", "coconet.tools.coco_run", str(path), "--np", str(ranks),
         "--backend", "cpu", "--check", "--exact-collectives", "-q"],
        capture_output=True, check=False, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "match the sim oracle (bit-exact)" in r.stdout, r.stdout
