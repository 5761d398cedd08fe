"""core/elementwise.py states what each elementwise op computes once; the sim oracle and the
kernel generator both read it. These tests hold the two to that one statement: every op has a
row, every device function of a row exists in the device layer, and the sim and a host kernel
agree bit for bit on the values where implementations usually part ways (NaN, infinities,
signed zeros, negative integers, integer division by zero)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coconet.core.elementwise import COMPARISONS, ELEMENTWISE
from coconet.core.program import Program, parse_module
from coconet.dialects import coco
from coconet.lowering.lower_to_plan import lower
from coconet.runtime.sim import run as sim_run
from coconet.runtime.threaded import ThreadedExecutor

HEADER = Path(coco.__file__).resolve().parents[1] / "toolchain" / "coco_device.h"

SPECIAL = {
    "f32": np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -2.5, 1e-30, 3.0], np.float32),
    "f64": np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -2.5, 1e-300, 3.0], np.float64),
    "i32": np.array([0, -7, 7, -1, 2**31 - 1, -(2**31), 3, 0], np.int32),
}
# The second operand, so that every pair of interest meets once (x / 0, NaN vs number, ...).
PARTNER = {
    "f32": np.array([1.0, np.nan, 2.0, 0.0, -0.0, 0.5, -np.inf, 0.0], np.float32),
    "f64": np.array([1.0, np.nan, 2.0, 0.0, -0.0, 0.5, -np.inf, 0.0], np.float64),
    "i32": np.array([0, 2, -2, 0, 1, -1, 3, 5], np.int32),
}


def _elementwise_ops() -> set[type]:
    return {op for op in coco.Coco.operations if issubclass(op, coco.BinaryOp | coco.UnaryOp)}


def test_every_elementwise_op_has_one_row():
    assert set(ELEMENTWISE) == _elementwise_ops()
    assert set(COMPARISONS) == {p.value for p in coco.CmpPredicate}


def test_every_device_function_is_in_the_device_layer():
    header = HEADER.read_text()
    for op, semantics in ELEMENTWISE.items():
        for is_float in (True, False):
            name, is_operator = semantics.device_for(is_float)
            if not is_operator:
                assert f" {name}(" in header, f"{op.name}: no {name} in coco_device.h"


def _program(op: type, elt: str) -> Program:
    t = f"!coco.tensor<8x{elt}>"
    binary = issubclass(op, coco.BinaryOp)
    operands = "%a, %b" if binary else "%a"
    text = f"""
func.func @f(%a: {t}, %b: {t}) -> {t} attributes {{coco.grid = #coco.grid<[1]>}} {{
  %r = {op.name} {operands} : {t}
  func.return %r : {t}
}}
"""
    return Program(parse_module(text), "f")


def _cases() -> list:
    cases = []
    for op in sorted(ELEMENTWISE, key=lambda o: o.name):
        float_only = issubclass(op, coco.UnaryOp) and op.FLOAT_ONLY
        for elt in SPECIAL:
            if elt == "i32" and float_only:
                continue
            cases.append(pytest.param(op, elt, id=f"{op.name}-{elt}"))
    return cases


@pytest.mark.parametrize(("op", "elt"), _cases())
def test_sim_and_host_kernel_agree_on_special_values(op, elt):
    program = _program(op, elt)
    inputs = {"a": SPECIAL[elt], "b": PARTNER[elt]}
    want = sim_run(program, {k: v.copy() for k, v in inputs.items()}, ranks=1).outputs
    got = ThreadedExecutor(lower(program, ranks=1)).run({k: v.copy() for k, v in inputs.items()})
    (name,) = want
    np.testing.assert_array_equal(
        got[name].view(f"u{got[name].itemsize}"),
        want[name].view(f"u{want[name].itemsize}"),
        err_msg=f"{op.name} on {elt}: sim {want[name]!r}, host kernel {got[name]!r}",
    )


def test_broadcasts_over_short_innermost_dims_run_vectors_of_their_size():
    """A broadcast's vectors stay within the innermost dim, so on the host their tile shrinks
    to the largest power of two dividing it (coco_vec_lanes) where a 1 KiB tile would not
    fit and every element would take the element loop: innermost dims of 1-300 elements,
    odd and even, over an uneven row slice at 1 and 3 ranks, give the sim's bits."""
    from coconet.runtime.sim import prepare_inputs

    inner = (1, 3, 8, 12, 45, 128, 300)
    t = "!coco.tensor<{}x7x{}x{}, sliced<0>>"
    args = [f"%x{c}: {t.format(5, c, 'f32')}" for c in inner]
    body = [
        f"  %y{c} = coco.mul %x{c}, %b : {t.format(5, c, 'f32')}, !coco.tensor<7x1xf32> "
        f"-> {t.format(5, c, 'f32')}"
        for c in inner
    ]
    types = ", ".join(t.format(5, c, "f32") for c in inner)
    results = ", ".join(f"%y{c}" for c in inner)
    text = (
        f"func.func @bcast({', '.join(args)}, %b: !coco.tensor<7x1xf32>) -> ({types}) {{\n"
        + "\n".join(body)
        + f"\n  func.return {results} : {types}\n}}\n"
    )
    program = Program(parse_module(text))
    for ranks in (1, 3):
        plan = lower(program, ranks)
        assert "coco_vec_lanes(COCO_VEC_BYTES / 4, " in plan.cuda_source
        inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
        want = sim_run(program, inputs, ranks=ranks, inplace=False).outputs
        got = ThreadedExecutor(plan).run(inputs)
        assert set(got) == set(want)
        for name, value in want.items():
            assert np.array_equal(got[name], value), (name, ranks)
