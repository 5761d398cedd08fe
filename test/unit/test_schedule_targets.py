"""Schedules that must not depend on how a program is written (issue #11, item 5): named
schedules on multi-axis grids split a dim no grid axis already slices; the enumeration and the
named schedules of a program with unnamed matmuls and all_reduces are those of the same program
with names; coco-opt reads .py programs as coco-run does; seeded inputs are signed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import coconet
from coconet.core.program import Program, parse_module
from coconet.runtime import sim
from coconet.schedule import apply_schedule, enumerate_schedules, named_schedules

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent

# Dim 0 is sliced by grid axis 1, inner to the all_reduce's axis 0: a reduce_scatter over
# axis 0 cannot cut it further, but it can cut dim 1.
INNER_SLICED = """
func.func @f(%g: !coco.tensor<8x64xf32, [local, sliced<0>]>, %w: !coco.tensor<8x64xf32, [replicated, sliced<0>]>) attributes {coco.grid = #coco.grid<[GRID]>} {
  %g1 = comm.all_reduce sum %g over [0] : !coco.tensor<8x64xf32, [local, sliced<0>]> -> !coco.tensor<8x64xf32, [replicated, sliced<0>]>
  %w1 = coco.sub %w, %g1 : !coco.tensor<8x64xf32, [replicated, sliced<0>]>
  coco.update %w, %w1 : !coco.tensor<8x64xf32, [replicated, sliced<0>]>
  func.return
}
"""


@pytest.mark.parametrize("grid", ["2, ?", "?, 2", "2, 2"])
def test_named_schedules_on_a_multi_axis_grid_split_a_free_dim(grid: str):
    program = Program(parse_module(INNER_SLICED.replace("GRID", grid)))
    names = named_schedules(program)
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)"} <= set(names), names
    assert "dim=1" in names["rs-c-ag"]
    want = sim.run(program, None, ranks=4, seed=2, inplace=False).outputs
    for name in ("rs-c-ag", "fuse(rs-c-ag)"):
        got = sim.run(apply_schedule(program, name), None, ranks=4, seed=2, inplace=False)
        for k, v in want.items():
            assert np.array_equal(got.outputs[k], v), f"{name}: {k}"


def unnamed(example: str, *names: str) -> Program:
    text = (EXAMPLES / f"{example}.mlir").read_text()
    for i, name in enumerate(names):
        text = text.replace(f"%{name} ", f"%{100 + i} ").replace(f"%{name},", f"%{100 + i},")
        text = text.replace(f"%{name}\n", f"%{100 + i}\n").replace(f"%{name} :", f"%{100 + i} :")
    program = Program(parse_module(text))
    hints = {r.name_hint for op in program.func.walk() for r in op.results}
    assert not set(names) & hints
    return program


def test_enumeration_does_not_depend_on_value_names():
    """model_parallel_mlp with its matmul and all_reduce unnamed enumerates the same schedules
    (the ops get the names mm0 and ar0), overlap variants included."""
    named = enumerate_schedules(coconet.load(EXAMPLES / "model_parallel_mlp.mlir"))
    anonymous = enumerate_schedules(unnamed("model_parallel_mlp", "layer", "total"))
    assert any("overlap(" in n for n, _ in named)
    renamed = [(n.replace("mm0", "layer").replace("ar0", "total"), p) for n, p in anonymous]
    assert [n for n, _ in renamed] == [n for n, _ in named]
    assert len(anonymous) == len(named)


def test_named_schedules_do_not_depend_on_value_names():
    program = unnamed("model_parallel_mlp", "layer", "total")
    assert list(named_schedules(program)) == list(
        named_schedules(coconet.load(EXAMPLES / "model_parallel_mlp.mlir"))
    )
    scheduled = apply_schedule(program, "ol(mm,fuse(rs-c-ag))")
    assert "comm.overlap" in scheduled.print()


def coco_opt(*args: str) -> subprocess.CompletedProcess:
    exe = BIN / "coco-opt"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "coconet.tools.coco_opt"]
    return subprocess.run(
        [*cmd, *args], capture_output=True, check=False, text=True, timeout=120,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
    )  # fmt: skip


def test_coco_opt_reads_python_programs():
    for pipeline in ([], ["-p", "coco-schedule{name=rs-c-ag}"]):
        py = coco_opt(str(EXAMPLES / "adam.py"), *pipeline)
        mlir = coco_opt(str(EXAMPLES / "adam.mlir"), *pipeline)
        assert py.returncode == 0, py.stderr + mlir.stderr
        assert mlir.returncode == 0, py.stderr + mlir.stderr
        assert py.stdout == mlir.stdout
    bad = coco_opt(str(EXAMPLES / "lamb_odd_sizes.py").replace("lamb_odd_sizes", "nothing"))
    assert bad.returncode != 0
    assert bad.stderr.startswith("coco-opt: error: ")
    assert "Traceback" not in bad.stderr


def test_seeded_inputs_are_signed_except_what_a_square_root_reads():
    """--check's seeded inputs hold negative values (gradients, weights, moments), except the
    arguments a square root, logarithm, power's base or divisor reads (Adam's v, the decay rates,
    epsilon and the step of the bias correction); deterministic in the seed."""
    program = coconet.load(EXAMPLES / "adam.mlir")
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)
    for name in ("g", "w", "m"):
        assert (inputs[name] < 0).any(), name
        assert (inputs[name] > 0).any(), name
        assert (np.abs(inputs[name]) >= 0.1).all(), name
    for name in ("v", "beta1", "beta2", "eps", "step"):
        assert (inputs[name] > 0).all(), name
    again = sim.prepare_inputs(program, None, (2,), seed=0)
    assert all(np.array_equal(inputs[k], again[k]) for k in inputs)
    result = sim.run(program, None, ranks=2, seed=0, inplace=False)
    assert all(np.isfinite(v).all() for v in result.outputs.values())
