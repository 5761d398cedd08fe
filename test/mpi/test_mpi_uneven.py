"""Uneven slices on real MPI ranks (the mpich wheel's mpiexec): the optimizers at sizes that no
rank count above 1 divides (SGD over 35, Adam over 4097, LAMB over 1001, LAMB over seven
tensors of 1000, 33, 4097, 12345, 7, 65537 and 999 elements) under every named schedule,
checked against the sim oracle by `coco-run --check` (bit-exact with exact collectives), and a
rank count the program cannot take refused before launch with one message. The sweep over
1-4 ranks runs with COCONET_FULL=1. And comm.all_to_all at 3 and 4 ranks: MPI_Ialltoallv
with byte counts and displacements from the uneven cuts, a 3-D tensor re-cut between every
pair of dims (the innermost included: strided runs), four dtypes, and the dispatch form."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_env import MPI_MARKS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FULL = os.environ.get("COCONET_FULL") == "1"
ODD = {"sgd": 35, "adam": 4097, "lamb": 1001}
SCHEDULES = ("ar-c", "rs-c-ag", "fuse(rs-c-ag)")

pytestmark = MPI_MARKS


def coco_run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coconet.tools.coco_run", *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def every_schedule(program: Path, ranks: int) -> None:
    args = ["--np", str(ranks), "--backend", "cpu", "--check", "--exact-collectives", "-q"]
    for s in SCHEDULES:
        args += ["--schedule", s]
    r = coco_run(str(program), *args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    checks = [ln for ln in r.stdout.splitlines() if ln.startswith("check [")]
    assert len(checks) == len(SCHEDULES), r.stdout
    assert all("match the sim oracle (bit-exact)" in ln for ln in checks), r.stdout


def odd_example(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}{ODD[name]}.mlir"
    path.write_text((EXAMPLES / f"{name}.mlir").read_text().replace("4096", str(ODD[name])))
    return path


def test_seven_odd_lamb_tensors_on_three_ranks():
    every_schedule(EXAMPLES / "lamb_odd_sizes.py", 3)


def test_global_norm_clipping_then_adam_fused_across_tensors():
    """Clipping by the global norm of three tensors' gradients (1000, 33, 4097), then Adam:
    the coupled chains fused as one region, on real MPI ranks (test_clip_global_norm.py)."""
    args = ["--np", "2", "--backend", "cpu", "--check", "--exact-collectives", "-q"]
    r = coco_run(str(EXAMPLES / "adam_clip_global_norm.py"), *args, "--schedule", "fuse(rs-c-ag)")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "check [fuse(rs-c-ag)]: every rank's outputs match the sim oracle (bit-exact)" in (
        r.stdout
    ), r.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_seven_odd_lamb_tensors_in_two_fused_table_launches(ranks: int):
    """fuse(rs-c-ag) of the seven tensors: two launches per step, each a table of fused
    collective kernels over all seven (test/unit/test_fused_table.py), on real MPI ranks."""
    args = ["--np", str(ranks), "--backend", "cpu", "--check", "--exact-collectives", "-q"]
    r = coco_run(str(EXAMPLES / "lamb_odd_sizes.py"), *args, "--schedule", "fuse(rs-c-ag)")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "check [fuse(rs-c-ag)]: every rank's outputs match the sim oracle (bit-exact)" in (
        r.stdout
    ), r.stdout


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="heavier sweep: set COCONET_FULL=1")
@pytest.mark.parametrize("name", list(ODD))
def test_odd_optimizer_on_three_ranks(tmp_path, name):
    every_schedule(odd_example(tmp_path, name), 3)


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="heavier sweep: set COCONET_FULL=1")
@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("name", [*ODD, "lamb_odd_sizes"])
def test_odd_optimizers_at_every_rank_count(tmp_path, name, ranks):
    program = EXAMPLES / "lamb_odd_sizes.py" if name not in ODD else odd_example(tmp_path, name)
    every_schedule(program, ranks)


def test_more_ranks_than_the_smallest_tensor_is_refused_before_launch():
    r = coco_run(
        str(EXAMPLES / "lamb_odd_sizes.py"), "--np", "8", "--backend", "cpu",
        "--schedule", "fuse(rs-c-ag)",
    )  # fmt: skip
    assert r.returncode != 0
    assert r.stderr.startswith("coco-run: error: "), r.stderr
    assert "[empty-slice]" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert "size 7" in r.stderr


@pytest.mark.parametrize("ranks", [3, 4])
def test_row_ops_over_uneven_cuts_on_mpi_ranks(ranks):
    """Softmax, RMSNorm, LayerNorm and a vocab-parallel log-sum-exp over 23 rows and 45
    columns (no rank count divides either; test_uneven_rows.py) under every schedule,
    against the sim: a row kernel handed the largest piece's extents read past smaller
    ranks' pieces, silently."""
    every_schedule(ROOT / "test" / "unit" / "programs" / "uneven_row_block.mlir", ranks)


def all_to_all_program(elt: str, ranks: int) -> str:
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
    path.write_text(all_to_all_program(elt, ranks))
    r = subprocess.run(
        [sys.executable, "-m", "coconet.tools.coco_run", str(path), "--np", str(ranks),
         "--backend", "cpu", "--check", "--exact-collectives", "-q"],
        capture_output=True, check=False, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "match the sim oracle (bit-exact)" in r.stdout, r.stdout


@pytest.mark.parametrize("elt", ["f8E4M3FN", "f8E5M2"])
def test_fp8_gradients_over_mpi_under_every_schedule(tmp_path, elt):
    """Adam with fp8 gradients over 4097 elements on 3 MPI ranks: MPI has no fp8 type, so the
    all_reduce gathers the pieces as bytes and combines them in rank order in f64, rounding
    once -- the sim's semantics, bit for bit, under every named schedule."""
    path = tmp_path / f"adam_{elt}.mlir"
    text = (EXAMPLES / "adam_bf16_grads.mlir").read_text()
    path.write_text(text.replace("bf16", elt).replace("4096", "4097"))
    every_schedule(path, 3)
