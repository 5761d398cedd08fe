"""The example programs (examples/NAME.mlir and examples/NAME.py) against independent NumPy
references (numpy_references.py), in the sim at 1, 2, 4 and 8 ranks (the pipeline: 2, 4, 8).

Comparisons are exact. The optimizers compute in a fixed order (the all_reduce sums in rank
order in f64; every elementwise op rounds in f32), so the reference reproduces every bit. The
matmul examples get dyadic operands (multiples of 2^-6 in [-1, 1]): every product is a
multiple of 2^-12 and every partial sum is below 2^8 in magnitude, so it has at most 20
significant bits and the f32 GEMM is exact in any accumulation order; what follows (rounding
the partial sums to f16, which does lose bits, the f64 all_reduce, bias, dropout, residual)
has a fixed order. One more test feeds them general random values,
where GEMM order may differ by one f16 ulp per partial sum: see test_matmul_examples_random.
"""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import ml_dtypes
import numpy as np
import numpy_references as ref
import pytest

import coconet
from coconet.core.program import Program
from coconet.runtime import sim

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

OPTIMIZERS = ["sgd", "adam", "adam_f16_grads", "adam_bf16_grads", "lamb", "zero3_adamw"]
MATMULS = ["model_parallel_attention", "model_parallel_mlp"]
NORMS = ["allreduce_rmsnorm", "megatron_sp_layernorm"]
ALL = [*OPTIMIZERS, *MATMULS, "pipeline_boundary", *NORMS, "softmax_rows"]

N = 4096
B, S, H = 2, 16, 64
GRAD_DTYPES = {
    "sgd": np.float32,
    "adam": np.float32,
    "adam_f16_grads": np.float16,
    "adam_bf16_grads": ml_dtypes.bfloat16,
    "lamb": np.float32,
    "zero3_adamw": np.float32,
}
K = {
    "model_parallel_attention": H,
    "model_parallel_mlp": 4 * H,
    "megatron_sp_layernorm": 4 * H,
    "pipeline_boundary": H,
}


def rank_counts(name: str) -> list[int]:
    return [2, 4, 8] if name == "pipeline_boundary" else [1, 2, 4, 8]


@functools.cache
def load(name: str, form: str) -> Program:
    return coconet.load(EXAMPLES / f"{name}.{form}")


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def dyadic(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Multiples of 2^-6 in [-1, 1]: exact in f16, and their products (multiples of 2^-12)
    sum exactly in f32 over K <= 256 terms (|sum| < 2^8: 20 significant bits <= 24)."""
    return (rng.integers(-64, 65, size=shape) / 64).astype(dtype)


# The element type of each example as written (its build()'s default): f16 unless listed.
AS_WRITTEN_DTYPE = {"softmax_rows": np.float32}


def make_inputs(name: str, ranks: int, seed: int = 0, dtype=None) -> dict[str, np.ndarray]:
    if dtype is None:
        dtype = AS_WRITTEN_DTYPE.get(name, np.float16)
    rng = np.random.default_rng(seed)
    f32 = np.float32
    if name in OPTIMIZERS:
        inputs = {
            "g": rng.standard_normal((ranks, N)).astype(GRAD_DTYPES[name]),
            "w": rng.standard_normal(N).astype(f32),
            "lr": np.asarray(0.05 if name == "sgd" else 1e-3, f32),
        }
        if name != "sgd":
            inputs |= {
                "m": (0.1 * rng.standard_normal(N)).astype(f32),
                "v": (0.01 * rng.random(N)).astype(f32),
                "beta1": np.asarray(0.9, f32),
                "beta2": np.asarray(0.999, f32),
                "eps": np.asarray(1e-6, f32),
                "step": np.asarray(3.0, f32),
            }
        if name in ("lamb", "zero3_adamw"):
            inputs["weight_decay"] = np.asarray(0.01, f32)
        return inputs
    if name == "softmax_rows":  # the queries and transposed keys of one attention head
        return {"q": dyadic(rng, (16, H), dtype), "kt": dyadic(rng, (H, 40), dtype)}
    if name == "allreduce_rmsnorm":  # f16 partial sums of a projection, residual, weight
        return {
            "x": rng.standard_normal((ranks, 16, H)).astype(dtype),
            "residual": rng.standard_normal((16, H)).astype(dtype),
            "weight": (1 + 0.1 * rng.standard_normal(H)).astype(dtype),
        }
    lead = (2,) if name == "pipeline_boundary" else ()
    norm_params = {}
    if name == "megatron_sp_layernorm":
        norm_params = {
            "gamma": (1 + 0.1 * rng.standard_normal(H)).astype(dtype),
            "beta": (0.1 * rng.standard_normal(H)).astype(dtype),
        }
    return norm_params | {
        "x": dyadic(rng, (*lead, B, S, K[name]), dtype),
        "w": dyadic(rng, (*lead, K[name], H), dtype),
        "b": rng.standard_normal((*lead, H)).astype(dtype),
        "r": rng.standard_normal((*lead, B, S, H)).astype(dtype),
    }


def assert_outputs_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert got[k].shape == want[k].shape, k
        if not np.array_equal(got[k], want[k]):
            diff = np.flatnonzero(got[k].astype(np.float64) != want[k].astype(np.float64))
            raise AssertionError(
                f"output '{k}' differs in {diff.size} element(s), first at {diff[0]}: "
                f"sim {got[k].ravel()[diff[0]]!r}, reference {want[k].ravel()[diff[0]]!r}"
            )


# --------------------------------------------------------------------------------------------
# The two forms are one program
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_python_form_builds_the_mlir_form(name: str) -> None:
    assert load(name, "py").print() == load(name, "mlir").print()


@pytest.mark.parametrize("name", ALL)
def test_examples_have_headers(name: str) -> None:
    text = (EXAMPLES / f"{name}.mlir").read_text()
    assert text.startswith("//")
    assert "Schedules:" in text
    source = (EXAMPLES / f"{name}.py").read_text()
    assert source.startswith('"""')
    assert "Schedules:" in source


# --------------------------------------------------------------------------------------------
# Sim vs reference
# --------------------------------------------------------------------------------------------

CASES = [
    pytest.param(name, form, ranks, id=f"{name}-{form}-{ranks}")
    for name in ALL
    for form in ("mlir", "py")
    for ranks in rank_counts(name)
]


@pytest.mark.parametrize(("name", "form", "ranks"), CASES)
def test_example_matches_reference(name: str, form: str, ranks: int) -> None:
    inputs = make_inputs(name, ranks, seed=ranks)
    want = ref.REFERENCES[name]({k: v.copy() for k, v in inputs.items()}, ranks)
    result = coconet.run(load(name, form), inputs, ranks=ranks)
    assert_outputs_equal(result.outputs, want)


@pytest.mark.parametrize("name", [*MATMULS, "pipeline_boundary"])
@pytest.mark.parametrize("ranks", [2, 8])
def test_matmul_examples_in_f32(name: str, ranks: int) -> None:
    """build(F32) gives the same workload in fp32 (not written as .mlir)."""
    from coconet.frontend import F32

    namespace = runpy.run_path(str(EXAMPLES / f"{name}.py"))
    program = namespace["build"](F32)
    inputs = make_inputs(name, ranks, seed=7, dtype=np.float32)
    want = ref.REFERENCES[name]({k: v.copy() for k, v in inputs.items()}, ranks)
    assert_outputs_equal(coconet.run(program, inputs, ranks=ranks).outputs, want)


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("ranks", [2, 4])
def test_norm_examples_in_f32(name: str, ranks: int) -> None:
    """build(F32) of the row-wise examples: still bit-exact (rows of 64 f32 values of
    similar magnitude sum exactly in f64, in any order)."""
    from coconet.frontend import F32

    namespace = runpy.run_path(str(EXAMPLES / f"{name}.py"))
    program = namespace["build"](F32)
    inputs = make_inputs(name, ranks, seed=7, dtype=np.float32)
    want = ref.REFERENCES[name]({k: v.copy() for k, v in inputs.items()}, ranks)
    assert_outputs_equal(coconet.run(program, inputs, ranks=ranks).outputs, want)


@pytest.mark.parametrize("ranks", [2, 4])
def test_softmax_example_in_f16(ranks: int) -> None:
    """build(F16) of the softmax example: the partial scores round to f16, exp rounds once
    from f64 to f16, and the masked keys' exp is 0 (exp(-inf))."""
    from coconet.frontend import F16

    program = runpy.run_path(str(EXAMPLES / "softmax_rows.py"))["build"](F16)
    inputs = make_inputs("softmax_rows", ranks, seed=7, dtype=np.float16)
    want = ref.REFERENCES["softmax_rows"]({k: v.copy() for k, v in inputs.items()}, ranks)
    got = coconet.run(program, inputs, ranks=ranks).outputs
    assert_outputs_equal(got, want)
    assert np.all(got["probs"][0, 25:] == 0)  # query 0 sees keys 0..24 only


@pytest.mark.parametrize("name", [*MATMULS, "pipeline_boundary"])
def test_matmul_examples_random(name: str) -> None:
    """General f16 operands (the magnitudes of the sim's own seeded inputs, uniform in
    [0.1, 1)): the f32 GEMM
    may now round differently in another accumulation order, by at most one f16 ulp per
    partial sum (2^-10 relative). All terms are positive, so nothing cancels: the all_reduce,
    bias, dropout scale and residual add each add at most one more f16 rounding, and the
    result stays within 4 ulps, i.e. 4 * 2^-10 ~ 4e-3 relative. The dropout mask does not
    depend on values, so dropped elements must match exactly (out == residual there)."""
    ranks = 4
    program = load(name, "mlir")
    seeded = sim.prepare_inputs(program, None, program.grid.bind(ranks), seed=11)
    positive = {k: np.abs(v) for k, v in seeded.items()}
    result = coconet.run(program, positive, ranks=ranks, inplace=False)
    want = ref.REFERENCES[name](result.inputs, ranks)
    (key,) = want
    got, exp = result.outputs[key], want[key]
    np.testing.assert_allclose(got.astype(np.float32), exp.astype(np.float32), rtol=4e-3, atol=0)
    residual = result.inputs["r"]
    if name == "pipeline_boundary":  # stage s receives stage s-1's output
        np.testing.assert_array_equal(got[0], 0)
        got, exp, residual = got[1:], exp[1:], residual[:-1]
    np.testing.assert_array_equal(got == residual, exp == residual)


# --------------------------------------------------------------------------------------------
# Semantics worth stating on their own
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sgd", "adam", "adam_f16_grads", "lamb"])
def test_run_updates_the_callers_arrays(name: str) -> None:
    inputs = make_inputs(name, 4, seed=3)
    before = {k: v.copy() for k, v in inputs.items()}
    result = coconet.run(load(name, "py"), inputs, ranks=4)
    updated = ["w"] if name == "sgd" else ["w", "m", "v"]
    for k in updated:
        assert inputs[k] is not before[k]
        np.testing.assert_array_equal(inputs[k], result.outputs[k])
        assert not np.array_equal(inputs[k], before[k]), f"{k} was not updated"
    for k in set(inputs) - set(updated):  # read-only arguments are left alone
        np.testing.assert_array_equal(inputs[k], before[k])


def test_run_without_inputs_leaves_nothing_to_update() -> None:
    result = coconet.run(load("adam", "mlir"), None, ranks=2, seed=5)
    want = ref.adam({k: v.copy() for k, v in result.inputs.items()}, 2)
    assert_outputs_equal(result.outputs, want)


def test_dropout_drops_about_p() -> None:
    inputs = make_inputs("model_parallel_mlp", 2)
    out = coconet.run(load("model_parallel_mlp", "mlir"), inputs, ranks=2).outputs["out"]
    dropped = np.mean(out == inputs["r"])
    assert 0.07 < dropped < 0.13  # p = 0.1 over 2048 elements


def test_pipeline_stages_draw_their_own_masks() -> None:
    """Dropout's stream is the stage (the tensor is local on axis 0): with the same operands on
    both stages, their masks still differ."""
    inputs = make_inputs("pipeline_boundary", 4)
    for k in inputs:
        inputs[k][1] = inputs[k][0]
    program = load("pipeline_boundary", "py")
    recv = coconet.run(program, inputs, ranks=4).outputs["recv"]
    np.testing.assert_array_equal(recv[0], 0)
    # Stage 1 received stage 0's output; compute stage 1's own output by shifting it back in
    # the reference, which draws with stream 1.
    want = ref.pipeline_boundary(inputs, 4, stages=2)
    np.testing.assert_array_equal(recv, want["recv"])
    stage1 = ref._stage_output(
        inputs["x"][1], inputs["w"][1], inputs["b"][1], inputs["r"][1], 2, 0, [0, 1], 3, 1
    )
    assert not np.array_equal(stage1, recv[1])


def test_ranks_must_fill_the_pipeline_grid() -> None:
    with pytest.raises(coconet.CocoError, match="multiple of 2"):
        coconet.run(load("pipeline_boundary", "mlir"), None, ranks=3)
