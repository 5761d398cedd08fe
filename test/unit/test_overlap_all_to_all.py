"""The all_to_all forms of coco-overlap (`ol(mm,a2a)`, `ol(a2a,mm)`: passes/overlap.py,
lowering/overlap.py `_lower_exchange_form`) match the sim oracle at 1-4 ranks, uneven cuts
included, on the sim, the cpu backend (threaded ranks) and the strict GPU double; their plans
exchange blocks of the chunked dim on the communication stream between events."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from test_runtime_cuda import run_fake

import coconet
from coconet.core.program import Program, parse_module
from coconet.equivalence import check_equivalence
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import COMM_STREAM, Collective, Matmul
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, enumerate_scheduled_programs, named_schedules

# E=5 experts and G=7 token groups: uneven at 2, 3 and 4 ranks; C=4 slots (4 chunks).
EXPERTS = """
func.func @experts(%d: !coco.tensor<5x7x4x6xf32, sliced<1>>, %t: !coco.tensor<5x7x6x6xf32, sliced<1>>, %w1: !coco.tensor<5x6x8xf32, sliced<0>>, %w2: !coco.tensor<5x8x6xf32, sliced<0>>, %cw: !coco.tensor<5x7x3x4xf32, sliced<1>>) -> !coco.tensor<5x7x3x6xf32, sliced<1>> attributes {coco.grid = #coco.grid<[?]>} {
  %buf = coco.matmul %d, %t : !coco.tensor<5x7x4x6xf32, sliced<1>>, !coco.tensor<5x7x6x6xf32, sliced<1>> -> !coco.tensor<5x7x4x6xf32, sliced<1>>
  %ein = comm.all_to_all %buf : !coco.tensor<5x7x4x6xf32, sliced<1>> -> !coco.tensor<5x7x4x6xf32, sliced<0>>
  %r = coco.reshape %ein : !coco.tensor<5x7x4x6xf32, sliced<0>> -> !coco.tensor<5x28x6xf32, sliced<0>>
  %up = coco.matmul %r, %w1 : !coco.tensor<5x28x6xf32, sliced<0>>, !coco.tensor<5x6x8xf32, sliced<0>> -> !coco.tensor<5x28x8xf32, sliced<0>>
  %h = coco.relu %up : !coco.tensor<5x28x8xf32, sliced<0>>
  %down = coco.matmul %h, %w2 : !coco.tensor<5x28x8xf32, sliced<0>>, !coco.tensor<5x8x6xf32, sliced<0>> -> !coco.tensor<5x28x6xf32, sliced<0>>
  %o = coco.reshape %down : !coco.tensor<5x28x6xf32, sliced<0>> -> !coco.tensor<5x7x4x6xf32, sliced<0>>
  %back = comm.all_to_all %o : !coco.tensor<5x7x4x6xf32, sliced<0>> -> !coco.tensor<5x7x4x6xf32, sliced<1>>
  %comb = coco.matmul %cw, %back : !coco.tensor<5x7x3x4xf32, sliced<1>>, !coco.tensor<5x7x4x6xf32, sliced<1>> -> !coco.tensor<5x7x3x6xf32, sliced<1>>
  func.return %comb : !coco.tensor<5x7x3x6xf32, sliced<1>>
}
"""

# The dispatch form (local tensors: dim 0's blocks go to the members); dim 1 (6) is cut in 3.
DISPATCH = """
func.func @dispatch(%a: !coco.tensor<12x6x8xf32, local>, %w: !coco.tensor<8x8xf32>, %v: !coco.tensor<8x4xf32>) -> !coco.tensor<12x6x4xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
  %h = coco.matmul %a, %w : !coco.tensor<12x6x8xf32, local>, !coco.tensor<8x8xf32> -> !coco.tensor<12x6x8xf32, local>
  %x = comm.all_to_all %h : !coco.tensor<12x6x8xf32, local> -> !coco.tensor<12x6x8xf32, local>
  %y = coco.matmul %x, %v : !coco.tensor<12x6x8xf32, local>, !coco.tensor<8x4xf32> -> !coco.tensor<12x6x4xf32, local>
  func.return %y : !coco.tensor<12x6x4xf32, local>
}
"""

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROGRAMS = {"experts": EXPERTS, "dispatch": DISPATCH}
NAMES = ("ol(mm,a2a)", "ol(a2a,mm)")


@functools.cache
def program(name: str) -> Program:
    return Program(parse_module(PROGRAMS[name]))


def dyadic_inputs(p: Program, ranks: int, seed: int) -> dict[str, np.ndarray]:
    """Multiples of 1/16 in [-1, 1]: exact products and sums, whatever the matmul's order."""
    shapes = sim.prepare_inputs(p, None, p.grid.bind(ranks), seed=seed)
    rng = np.random.default_rng(seed)
    return {
        k: (rng.integers(-16, 17, size=v.shape) / 16).astype(v.dtype) for k, v in shapes.items()
    }


def test_the_named_schedules_are_offered_and_chunk_a_dim_the_exchange_keeps() -> None:
    offers = named_schedules(program("experts"))
    assert offers["ol(mm,a2a)"] == (
        "coco-overlap{ops=buf},coco-overlap{ops=down}"
    )  # dispatch buffers; the expert output through its reshape
    assert offers["ol(a2a,mm)"] == "coco-overlap{ops=ein}"
    assert named_schedules(program("dispatch"))["ol(a2a,mm)"] == "coco-overlap{chunks=3 ops=x}"
    why = named_schedules(coconet.load(EXAMPLES / "ulysses_attention.mlir"), explain=True).dropped
    assert "[overlap-layout]" in why["ol(mm,a2a)"]
    assert "[overlap-layout]" in why["ol(a2a,mm)"]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("schedule", NAMES)
def test_matches_the_oracle_on_sim_and_cpu(name: str, schedule: str) -> None:
    p = program(name)
    q = apply_schedule(p, schedule)
    for ranks in (1, 2, 3, 4):
        inputs = dyadic_inputs(p, ranks, seed=ranks)
        want = coconet.run(p, {k: v.copy() for k, v in inputs.items()}, ranks=ranks).outputs
        got = coconet.run(q, {k: v.copy() for k, v in inputs.items()}, ranks=ranks).outputs
        cpu = ThreadedExecutor(lower(q, ranks)).run({k: v.copy() for k, v in inputs.items()})
        for k, w in want.items():
            np.testing.assert_array_equal(got[k], w, err_msg=f"sim {k} at {ranks} ranks")
            np.testing.assert_array_equal(cpu[k], w, err_msg=f"cpu {k} at {ranks} ranks")


@pytest.mark.parametrize("schedule", NAMES)
def test_fake_gpus_match_the_oracle(schedule: str) -> None:
    p = program("experts")
    q = apply_schedule(p, schedule)
    ranks = 3  # uneven experts and groups
    inputs = dyadic_inputs(p, ranks, seed=5)
    want = sim.run(p, {k: v.copy() for k, v in inputs.items()}, ranks=ranks, inplace=False)
    _plan, got, _ = run_fake(q, ranks, {k: v.copy() for k, v in inputs.items()})
    for r, pieces in enumerate(got):
        for k, v in pieces.items():
            np.testing.assert_array_equal(np.asarray(v), want.per_rank[r][k], err_msg=k)


def test_the_plan_exchanges_chunks_between_events() -> None:
    plan = lower(apply_schedule(program("experts"), "ol(mm,a2a)"), 2)
    exchanges = [s for s in plan.steps if isinstance(s, Collective) and s.op == "all_to_all"]
    assert [s.block for s in exchanges] == [(2, c, c + 1) for c in range(4)] * 2
    assert all(s.stream == COMM_STREAM for s in exchanges)
    text = "\n".join(s.text() for s in plan.steps)
    assert "all_to_all %buf -> %ein over [0] dim 2 [0, 1)" in text
    assert "matmul %d, %t -> %buf dim 2 [1, 2) of %buf" in text
    chunked = [s for s in plan.steps if isinstance(s, Matmul) and s.block is not None]
    assert len(chunked) == 8


def test_the_enumerator_lists_the_moe_layers_overlaps_each_equal_to_the_oracle() -> None:
    """The autotuner's space holds examples/moe_layer.mlir's all_to_all overlaps: the
    dispatch buffers' matmul, or the experts' input (read through a reshape), and the expert
    output (through its reshape), each in 3 chunks (C = 3 slots: 2 and 4 divide none of its
    dims); every one computes what the program as written does."""
    p = coconet.load(EXAMPLES / "moe_layer.mlir")
    listed = {n: q for n, _, q in enumerate_scheduled_programs(p) if "overlap(" in n}
    assert {
        "overlap(buffers,chunks=3)",
        "overlap(expert_in,chunks=3)",
        "overlap(down,chunks=3)",
        "overlap(expert_in,chunks=3)+overlap(down,chunks=3)",
    } <= set(listed), sorted(listed)
    for name, q in listed.items():
        report = check_equivalence(p, q, ranks=(1, 3), seeds=(0,))
        assert report.ok, f"{name}: {report}"
        assert report.checked, f"{name}: {report}"
