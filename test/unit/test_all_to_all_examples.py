"""The all_to_all examples (issue #28): examples/ulysses_attention (sequence-sliced attention
re-cut to head slices and back) and examples/moe_layer (GShard top-2 routing, dispatch and
combine all_to_alls around each rank's experts).

Every schedule the program is offered -- its named schedules (coconet.schedule.
named_schedules) and the autotuner's space (enumerate_scheduled_programs), one per distinct
IR -- runs at 1, 2, 3 and 4 ranks on the sim and on the cpu backend's kernels (in-process
ranks over the MPI transport's Alltoallv), against the independent NumPy references
(numpy_references.py: the all_to_alls written out rank by rank, GShard's routing as loops
over tokens). The sizes divide by none of 3 and 4 ranks (14 positions and 10 heads; 10
groups; 8 experts at 3 ranks), so the all_to_alls cut unevenly.

Exactness: the MoE layer is bit-exact (dyadic operands make every matmul exact; the gates'
products and the combine's sums follow the dialect's order); the attention's P @ V and
output projection are f32 matmuls whose accumulation order BLAS picks, compared within f32
tolerance. On real MPI ranks: test/mpi/test_mpi_cpu.py; NVRTC: test_lowering.py."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import numpy as np
import numpy_references as ref
import pytest

import coconet
from coconet.core.program import Program
from coconet.lowering.lower_to_plan import lower
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, enumerate_scheduled_programs, named_schedules

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ("ulysses_attention", "moe_layer")
RANKS = (1, 2, 3, 4)
EXACT = {"ulysses_attention": False, "moe_layer": True}


@functools.cache
def load(name: str, form: str = "mlir") -> Program:
    return coconet.load(EXAMPLES / f"{name}.{form}")


@functools.cache
def offered(name: str) -> dict[str, Program]:
    """Every schedule the program is offered, one per distinct IR: the named ones first."""
    p = load(name)
    found: dict[str, Program] = {}
    seen: set[str] = set()
    candidates = [(n, apply_schedule(p, n)) for n in named_schedules(p)]
    candidates += [(n, q) for n, _, q in enumerate_scheduled_programs(p)]
    for label, q in candidates:
        text = q.print()
        if text not in seen:
            seen.add(text)
            found[label] = q
    return found


def dyadic(rng: np.random.Generator, shape: tuple[int, ...], steps: int = 64) -> np.ndarray:
    """Multiples of 1/steps in [-1, 1]: exact products and sums in the examples' matmuls."""
    return (rng.integers(-steps, steps + 1, size=shape) / steps).astype(np.float32)


def make_inputs(name: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "ulysses_attention":  # H, S, D, E = 10, 14, 16, 32
        return {
            "q": dyadic(rng, (10, 14, 16)),
            "kt": dyadic(rng, (10, 16, 14)),
            "v": dyadic(rng, (10, 14, 16)),
            "wo": dyadic(rng, (10, 16, 32)),
        }
    # G, S, M, E, F = 10, 8, 8, 8, 16; the experts' weights in 1/16 steps keep the FFN exact
    wg = dyadic(rng, (8, 8))
    wg[:, 5] = wg[:, 2]  # experts 2 and 5 tie on every token: the first wins
    return {
        "x": dyadic(rng, (10, 8, 8)),
        "wg": wg,
        "w1": dyadic(rng, (8, 8, 16), 16),
        "w2": dyadic(rng, (8, 16, 8), 16),
    }


def assert_matches(name: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype, k
        assert got[k].shape == w.shape, k
        if EXACT[name]:
            np.testing.assert_array_equal(got[k], w, err_msg=k)
        else:
            np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("name", NAMES)
def test_python_form_builds_the_mlir_form(name: str) -> None:
    assert load(name, "py").print() == load(name, "mlir").print()
    header = (EXAMPLES / f"{name}.mlir").read_text()
    assert header.startswith("//")
    assert "Schedules:" in header
    assert "Schedules:" in (EXAMPLES / f"{name}.py").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_the_examples_exchange_by_all_to_all_only(name: str) -> None:
    ops = [op.name for op in load(name).func.walk() if op.name.startswith("comm.")]
    assert ops == ["comm.all_to_all"] * (4 if name == "ulysses_attention" else 2)
    assert "as-written" in offered(name)


CASES = [(name, label) for name in NAMES for label in offered(name)]


@pytest.mark.parametrize(("name", "label"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_every_offered_schedule_matches_numpy_on_sim_and_cpu(name: str, label: str) -> None:
    scheduled = offered(name)[label]
    for ranks in RANKS:
        inputs = make_inputs(name, seed=ranks)
        want = ref.REFERENCES[name]({k: v.copy() for k, v in inputs.items()}, ranks)
        sim = coconet.run(scheduled, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
        assert_matches(name, sim.outputs, want)
        cpu = ThreadedExecutor(lower(scheduled, ranks)).run(
            {k: v.copy() for k, v in inputs.items()}
        )
        try:
            assert_matches(name, cpu, want)
        except AssertionError as e:
            raise AssertionError(f"{label} on the cpu backend at {ranks} ranks: {e}") from None


def test_the_moe_inputs_exercise_ties_and_capacity() -> None:
    """The inputs meet what routing has to decide: logits that tie for the top (the first
    expert wins, as argmax) and experts whose buffers fill, dropping first and second choices
    (capacity 3 of a group's 8 tokens)."""
    dropped = [0, 0]
    for seed in RANKS:
        inputs = make_inputs("moe_layer", seed)
        logits = np.einsum("gsm,me->gse", inputs["x"].astype(np.float64), inputs["wg"])
        assert np.any((logits == logits.max(-1, keepdims=True)).sum(-1) > 1)
        first = logits.argmax(-1)
        np.put_along_axis(logits, first[..., None], -np.inf, -1)
        second = logits.argmax(-1)
        for g in range(logits.shape[0]):
            firsts = np.bincount(first[g], minlength=8)
            seconds = np.bincount(second[g], minlength=8)
            dropped[0] += int(np.maximum(firsts - 3, 0).sum())
            dropped[1] += int(np.maximum(np.minimum(firsts, 3) + seconds - 3, 0).sum())
    assert dropped[0] > 0, dropped
    assert dropped[1] > 0, dropped


@pytest.mark.parametrize("ranks", [2, 3])
def test_switch_routing_top1(ranks: int) -> None:
    """build(k=1): Switch-style top-1 routing, gates not renormalized."""
    program = runpy.run_path(str(EXAMPLES / "moe_layer.py"))["build"](k=1)
    inputs = make_inputs("moe_layer", seed=ranks)
    want = ref.moe_layer({k: v.copy() for k, v in inputs.items()}, ranks, k=1)
    assert_matches("moe_layer", coconet.run(program, inputs, ranks=ranks).outputs, want)
