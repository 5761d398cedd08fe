"""Dense tensor constants (`coco.constant dense<...>`, issue #11): one value per element, the
same on every rank.

The program (programs/dense_constants.mlir) reads dense constants of f32, f16, i1 and i32
next to all_reduces: the sim matches an independent NumPy reference at 1, 2 and 4 ranks
(6 rows: uneven slices at 4); under every schedule (the named ones and the greedy pipelines,
which read slices and broadcasts of the constants inside split and fused kernels) the
kernels, run by the cpu backend's host device layer on in-process ranks, match the sim bit
for bit, and NVRTC compiles their text for sm_80 and sm_90. The front end's `Constant`
builds them from NumPy arrays."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from xdsl.dialects.builtin import f32, i32

import coconet
from coconet import frontend
from coconet.core.program import CocoError, Program, parse_module
from coconet.dialects import coco
from coconet.frontend import AllReduce, Constant, Local, Tensor
from coconet.lowering.lower_to_plan import lower
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available
from coconet.tools.coco_run import apply_pipeline

PROGRAM = Path(__file__).parent / "programs" / "dense_constants.mlir"
RANKS = (1, 2, 4)
PIPELINES = {
    "split": "coco-split-allreduce",
    "split-reorder": "coco-split-allreduce,coco-reorder",
    "rs-c-ag-greedy": "coco-split-allreduce,coco-reorder,coco-as-slice",
    "fused-greedy": "coco-split-allreduce,coco-reorder,coco-as-slice,coco-fuse",
    "ar-fused-greedy": "coco-fuse",
}

# The constants of the program, restated: the reference does not read them from the IR.
BIAS = [0.1, -1.5, 2.0, np.inf, 0.3, -0.0, 1.0e-3, 7.25]
SCALE = [[0.5], [-2.0], [3.0], [0.1], [1.0e30], [-0.75]]
MASK = [
    [1, 1, 1, 0, 0, 1, 1, 0],
    [0, 1, 1, 0, 1, 1, 1, 1],
    [1, 1, 1, 0, 1, 0, 1, 0],
    [1, 1, 0, 1, 1, 0, 1, 0],
    [1, 1, 0, 1, 1, 1, 0, 1],
    [1, 1, 0, 1, 1, 1, 1, 0],
]
TABLE = [
    [-0.2334, -0.2558, 0.962, -1.1814, 0.738, -1.099, -0.3313, -0.8405],
    [1.4487, 0.5682, 2.4317, 0.6419, 0.845, 0.8407, -0.6066, -0.07],
    [1.3504, -0.3966, 0.1888, -0.0212, 0.6092, -0.3649, -0.1524, 0.2424],
    [0.103, -0.865, 0.8958, -1.2985, -1.2011, -1.2825, 0.967, -0.3606],
    [-0.971, -1.136, 0.4211, -1.0548, -1.2721, 0.614, -1.1967, -0.3224],
    [-0.0068, -0.4453, -0.0541, 1.3388, -0.5169, -1.2593, -1.8367, -0.2048],
]
LIMITS = [3, -7, 2147483647, 0, -2147483648, 5, 1, -1]


def reference(inputs: dict[str, np.ndarray], ranks: int) -> dict[str, np.ndarray]:
    """Each value rounded once from its decimal (f64) to the element type; ops in f32 (i64)
    rounded to the element type; all_reduces summed in f64 (i64) in rank order."""

    def all_reduce(x: np.ndarray, acc: type) -> np.ndarray:
        total = x[0].astype(acc)
        for r in range(1, ranks):
            total = total + x[r].astype(acc)
        return total.astype(x.dtype)

    with np.errstate(all="ignore"):
        s = all_reduce(inputs["x"], np.float64)
        biased = s + np.array(BIAS).astype(np.float32)
        scaled = (biased * np.array(SCALE).astype(np.float32)).astype(np.float32)
        masked = np.where(np.array(MASK, bool), scaled, np.float32(0))
        hs = all_reduce(inputs["h"], np.float64)
        table = np.array(TABLE).astype(np.float16)
        shifted = (hs.astype(np.float32) + table.astype(np.float32)).astype(np.float16)
        ns = all_reduce(inputs["n"], np.int64)
        counts = (ns.astype(np.int64) + np.array(LIMITS, np.int64)).astype(np.int32)
    return {"masked": masked, "shifted": shifted, "counts": counts}


@functools.cache
def program() -> Program:
    return coconet.load(PROGRAM)


@functools.cache
def schedules() -> dict[str, Program]:
    found = {"as written": program()}
    for name in named_schedules(program()):
        found[name] = apply_schedule(program(), name)
    for name, pipeline in PIPELINES.items():
        found[name] = apply_pipeline(coconet.load(PROGRAM), pipeline)
    return found


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], context: str) -> None:
    assert set(got) == set(want), context
    for k in want:
        assert got[k].dtype == want[k].dtype, f"{context}: {k}"
        assert np.array_equal(got[k], want[k], equal_nan=True), f"{context}: {k}"


@pytest.mark.parametrize("ranks", RANKS)
def test_sim_matches_numpy(ranks: int) -> None:
    inputs = prepare_inputs(program(), None, (ranks,), seed=ranks)
    got = coconet.run(program(), inputs, ranks=ranks, inplace=False).outputs
    assert_same(got, reference(inputs, ranks), f"{ranks} ranks")


def test_every_schedule_reads_the_constants() -> None:
    """The schedules do reach the constants: split and fused ones read slices of them."""
    found = schedules()
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)"} <= set(found)
    text = str(found["rs-c-ag"].module)
    assert "coco.slice %bias" in text or "coco.slice %scale" in text


@pytest.mark.parametrize(
    "name", list(PIPELINES) + ["as written", "ar-c", "rs-c-ag", "fuse(rs-c-ag)"]
)
def test_kernels_match_the_sim_under_every_schedule(name: str) -> None:
    scheduled = schedules()[name]
    for ranks in RANKS:
        plan = lower(scheduled, ranks)
        inputs = prepare_inputs(scheduled, None, plan.grid_shape, seed=ranks)
        want = coconet.run(scheduled, inputs, ranks=ranks, inplace=False).outputs
        got = ThreadedExecutor(plan).run(inputs)
        assert_same(got, want, f"{name} at {ranks} ranks")


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
@pytest.mark.parametrize("name", ["as written", "rs-c-ag", "fuse(rs-c-ag)"])
def test_constant_arrays_compile_with_nvrtc(name: str) -> None:
    source = lower(schedules()[name], 2).cuda_source
    # the values are in the kernel text, rounded to the element type (0.1 in f32)
    assert "static const float bias_values[8] = {" in source
    assert float(np.float32(0.1)).hex() + "f" in source
    assert "static const bool mask_values[48] = {" in source
    for arch in ("sm_80", "sm_90"):
        assert compile_cuda(source, arch, warnings_as_errors=True).binary


def test_front_end_constant_from_numpy() -> None:
    bias = np.linspace(-1, 1, 8, dtype=np.float32)
    per_row = np.array([[0.1], [2.5], [-3.0], [7.0]])  # f64 values of an f32 constant

    @frontend.program(grid=[None])
    def biased(x: Tensor(f32, [4, 8], Local)):
        return (AllReduce("+", x) + Constant(bias)) * Constant(per_row, f32)

    ops = [op for op in biased.func.walk() if isinstance(op, coco.ConstantOp)]
    assert [op.result.type for op in ops] == [
        coco.TensorType([8], f32),
        coco.TensorType([4, 1], f32),
    ]
    assert all(op.is_dense for op in ops)
    assert "coco.constant dense<[[0.1], [2.5], [-3.0], [7.0]]> : !coco.tensor<4x1xf32>" in str(
        biased.module
    )
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    (out,) = coconet.run(biased, {"x": x}, ranks=2).outputs.values()
    total = (x[0].astype(np.float64) + x[1]).astype(np.float32)
    want = (total + bias) * per_row.astype(np.float32)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, want)


def test_front_end_constant_refusals() -> None:
    with pytest.raises(CocoError, match="no element type holds"):

        @frontend.program(grid=[None])
        def strings(x: Tensor(f32, [2], Local)):
            return x + Constant(np.array(["a", "b"]))

    with pytest.raises(CocoError, match="needs integer values"):

        @frontend.program(grid=[None])
        def floats_as_ints(x: Tensor(i32, [2], Local)):
            return x + Constant(np.array([1.5, 2.0]), i32)

    with pytest.raises(CocoError, match=r"\[constant-type\] constant 4294967296 does not fit"):

        @frontend.program(grid=[None])
        def too_big(x: Tensor(i32, [2], Local)):
            return x + Constant(np.array([1, 2**32]), i32)


def test_fused_kernels_across_nodes_read_the_constants() -> None:
    """The fused schedule lowered hierarchically (2 nodes of 2 ranks): the node kernels and
    the computation between them read the constants too."""
    from coconet.core import values as V

    scheduled = schedules()["fuse(rs-c-ag)"]
    plan = lower(scheduled, 4, None, V.nodes_of(4, 2))
    inputs = prepare_inputs(scheduled, None, plan.grid_shape, seed=3)
    want = coconet.run(scheduled, inputs, ranks=4, inplace=False).outputs
    assert_same(ThreadedExecutor(plan).run(inputs), want, "across nodes")
    if nvrtc_available():
        assert compile_cuda(plan.cuda_source, "sm_90", warnings_as_errors=True).binary


def test_integer_constants_read_as_unsigned_bits_wrap_alike() -> None:
    """The verifier admits an integer type's unsigned reading (up to 2^width - 1, splat or
    dense): the sim wraps it to the signed value as the kernels' literals do (the fuzzer
    found the sim raising on `coco.constant 4294967295 : !coco.tensor<i32>`)."""
    text = """
    func.func @wrap() -> (!coco.tensor<2xi32>, !coco.tensor<3xi64>) attributes {coco.grid = #coco.grid<[?]>} {
      %a = coco.constant 4294967295 : !coco.tensor<2xi32>
      %b = coco.constant dense<[18446744073709551615, -9223372036854775808, 2147483648]> : !coco.tensor<3xi64>
      func.return %a, %b : !coco.tensor<2xi32>, !coco.tensor<3xi64>
    }
    """
    wrapped = Program(parse_module(text))
    want = {
        "a": np.array([-1, -1], np.int32),
        "b": np.array([-1, -(2**63), 2**31], np.int64),
    }
    assert_same(coconet.run(wrapped, {}, ranks=2).outputs, want, "sim")
    assert_same(ThreadedExecutor(lower(wrapped, 2)).run({}), want, "kernels")
