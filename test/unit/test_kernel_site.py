"""lowering/kernel_site.py: sites of one computation share one kernel build. The plans are
what building every site's kernel gives, for every example under every named schedule, and
sites that differ in anything their kernel's text shows do not share."""

from __future__ import annotations

from pathlib import Path

import pytest

from coconet.compile import apply_schedule
from coconet.core.program import Program, parse_module
from coconet.lowering.kernel_site import kernel_site
from coconet.lowering.kernels.spec import Store
from coconet.lowering.lower_to_plan import Lowering, lower
from coconet.lowering.plan_cache import dump_plan
from coconet.schedule import named_schedules

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))


def _plans(program: Program, ranks: int) -> tuple[bytes, bytes]:
    memoized = dump_plan(lower(program, ranks))
    Lowering.memoize_kernels = False
    try:
        built = dump_plan(lower(program, ranks))
    finally:
        Lowering.memoize_kernels = True
    return memoized, built


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_schedule_lowers_to_the_plan_of_building_every_kernel(path: Path):
    program = Program(parse_module(path.read_text(), str(path)))
    for name in ["none", *named_schedules(program)]:
        scheduled = apply_schedule(program, name)
        memoized, built = _plans(scheduled, 2)
        assert memoized == built, (path.stem, name)


def _site(text: str):
    program = Program(parse_module(text))
    ops = [op for op in program.func.body.block.ops if op.name.startswith("coco.")]
    result = ops[-1].results[0]
    inputs = [a.value for a in program.arguments]
    return kernel_site(ops, result.type, inputs, [Store(result, result.type)])


T = "!coco.tensor<16xf32>"


def _chain(body: str) -> str:
    return (
        f"func.func @f(%a: {T}, %b: {T}) -> {T} attributes {{coco.grid = #coco.grid<[?]>}} {{\n"
        f"{body}\n  func.return %r : {T}\n}}\n"
    )


def test_sites_share_up_to_names_and_seeds_only():
    base = _site(_chain(f"  %t = coco.add %a, %b : {T}\n  %r = coco.dropout %t, 0.1 seed 3 : {T}"))
    renamed = _site(
        _chain(f"  %u = coco.add %a, %b : {T}\n  %r = coco.dropout %u, 0.1 seed 9 : {T}")
    )
    assert base is not None
    assert renamed is not None
    assert base.key == renamed.key
    for other in (
        f"  %t = coco.add %b, %a : {T}\n  %r = coco.dropout %t, 0.1 seed 3 : {T}",  # operands
        f"  %t = coco.add %a, %a : {T}\n  %r = coco.dropout %t, 0.1 seed 3 : {T}",  # binding
        f"  %t = coco.mul %a, %b : {T}\n  %r = coco.dropout %t, 0.1 seed 3 : {T}",  # op
        f"  %t = coco.add %a, %b : {T}\n  %r = coco.dropout %t, 0.2 seed 3 : {T}",  # prob
    ):
        site = _site(_chain(other))
        assert site is not None
        assert site.key != base.key, other
