"""Tensors whose sizes do not divide by the rank count (issue #11, "any size").

A dim of n elements cut into p parts is cut as MPI_Reduce_scatter's recvcounts and
np.array_split cut it: the first n % p ranks hold one element more. The optimizers (SGD, Adam,
LAMB, and LAMB over seven tensors of odd sizes) run under every named schedule at 1-4 ranks:
the sim matches the independent NumPy references, and the lowered plans, executed by the cpu
backend's kernels on in-process ranks, match the sim bit for bit. The fused kernels of uneven
slices compile with NVRTC."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import numpy as np
import numpy_references as ref
import pytest
from xdsl.dialects.builtin import f32

import coconet
from coconet.core import values as V
from coconet.core.program import CocoError, Program, parse_module
from coconet.dialects.coco import SlicedAttr, TensorType
from coconet.lowering.lower_to_plan import LaunchConfig, lower
from coconet.lowering.plan import Launch, RankValue
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available
from coconet.tools.coco_run import apply_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RANKS = (1, 2, 3, 4)
# Each optimizer example at a size no rank count above 1 divides evenly (but 1).
ODD = {"sgd": 35, "adam": 4097, "lamb": 1001}
ODD_LAMB_SIZES = (1000, 33, 4097, 12345, 7, 65537, 999)
SCALARS = ("lr", "beta1", "beta2", "eps", "weight_decay", "step")


@functools.cache
def odd_example(name: str) -> Program:
    text = (EXAMPLES / f"{name}.mlir").read_text().replace("4096", str(ODD[name]))
    return Program(parse_module(text))


@functools.cache
def odd_lamb(sizes: tuple[int, ...] = ODD_LAMB_SIZES) -> Program:
    return runpy.run_path(str(EXAMPLES / "lamb_odd_sizes.py"))["build"](sizes)


@functools.cache
def scheduled(program: Program, name: str) -> Program:
    return apply_schedule(program, name)


def optimizer_inputs(name: str, n: int, ranks: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = {
        "g": rng.standard_normal((ranks, n)).astype(np.float32),
        "w": rng.standard_normal(n).astype(np.float32),
        "lr": np.asarray(0.05 if name == "sgd" else 1e-3, np.float32),
    }
    if name != "sgd":
        inputs |= {
            "m": (0.1 * rng.standard_normal(n)).astype(np.float32),
            "v": (0.01 * rng.random(n)).astype(np.float32),
            "beta1": np.asarray(0.9, np.float32),
            "beta2": np.asarray(0.999, np.float32),
            "eps": np.asarray(1e-6, np.float32),
            "step": np.asarray(3.0, np.float32),
        }
    if name == "lamb":
        inputs["weight_decay"] = np.asarray(0.01, np.float32)
    return inputs


def assert_same(got: dict, want: dict, context: str, *, rtol: float = 0.0) -> None:
    assert set(got) == set(want), context
    for k, b in want.items():
        a = got[k]
        assert a.shape == b.shape, f"{context}: {k}"
        assert a.dtype == b.dtype, f"{context}: {k}"
        if rtol:
            # atol: an update that cancels to near zero keeps the absolute error of its terms
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6, err_msg=f"{context}: {k}")
        else:
            assert np.array_equal(a, b, equal_nan=True), f"{context}: {k} differs"


# --------------------------------------------------------------------------------------------
# The partition
# --------------------------------------------------------------------------------------------


def test_uneven_parts_are_mpi_recvcounts():
    assert [V.split_range(33, 4, i) for i in range(4)] == [(0, 9), (9, 8), (17, 8), (25, 8)]
    assert [V.split_range(7, 4, i)[1] for i in range(4)] == [2, 2, 2, 1]
    assert [len(p) for p in np.array_split(np.arange(4097), 3)] == [
        V.split_range(4097, 3, i)[1] for i in range(3)
    ]
    t = TensorType([10], f32, [SlicedAttr(0)])
    assert V.rank_shapes(t, (4,)) == ((3,), (3,), (2,), (2,))
    assert t.local_shape((4,)) == (3,)  # the largest piece: what symmetric memory allocates
    assert V.is_uneven(t, (4,))
    assert not V.is_uneven(t, (5,))


def test_uneven_pieces_tile_the_logical_value():
    """Every rank's piece on a 2-D grid, a dim cut by two axes (mixed radix, outer first) and
    another by one, assembles back into the logical value."""
    grid = (2, 3)
    t = TensorType([11, 7], f32, [SlicedAttr(0), SlicedAttr(0)])
    u = TensorType([5, 7], f32, [SlicedAttr(1), SlicedAttr(0)])
    for typ in (t, u):
        value = np.arange(np.prod(typ.get_shape()), dtype=np.float32).reshape(typ.get_shape())
        pieces = V.distribute(value, typ, grid)
        assert [p.shape for p in pieces] == list(V.rank_shapes(typ, grid))
        assert np.array_equal(V.assemble(pieces, typ, grid), value)
    # 11 rows: axis 0 cuts 6 | 5, then axis 1 cuts 6 into 2, 2, 2 and 5 into 2, 2, 1
    assert [s[0] for s in V.rank_shapes(t, grid)] == [2, 2, 2, 2, 2, 1]


# --------------------------------------------------------------------------------------------
# Every named schedule, 1-4 ranks: sim vs NumPy, plans vs sim
# --------------------------------------------------------------------------------------------


def optimizer_cases():
    for name, size in ODD.items():
        for schedule in named_schedules(odd_example(name)):
            yield pytest.param(name, schedule, id=f"{name}{size}-{schedule}")


@pytest.mark.parametrize(("name", "schedule"), list(optimizer_cases()))
def test_odd_optimizer_under_every_schedule(name: str, schedule: str):
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)"} <= set(named_schedules(odd_example(name)))
    program = scheduled(odd_example(name), schedule)
    # LAMB's norms over slices are sums reassociated by the split (an f32 ulp or so).
    rtol = 1e-5 if name == "lamb" and schedule != "ar-c" else 0.0
    for ranks in RANKS:
        inputs = optimizer_inputs(name, ODD[name], ranks, seed=ranks)
        want = ref.REFERENCES[name]({k: v.copy() for k, v in inputs.items()}, ranks)
        oracle = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
        assert_same(oracle, want, f"sim {name} [{schedule}] ranks={ranks}", rtol=rtol)
        config = LaunchConfig() if ranks != 3 else LaunchConfig(block=3, max_blocks=5)
        plan = lower(program, ranks, config)
        got = ThreadedExecutor(plan).run(inputs)
        assert_same(got, oracle, f"cpu kernels {name} [{schedule}] ranks={ranks}")


def odd_lamb_reference(inputs: dict[str, np.ndarray], ranks: int) -> dict[str, np.ndarray]:
    scalars = {k: inputs[k] for k in SCALARS}
    out = {}
    for i in range(len(ODD_LAMB_SIZES)):
        want = ref.lamb({k: inputs[f"{k}{i}"] for k in "gwmv"} | scalars, ranks)
        out |= {f"{k}{i}": want[k] for k in "wmv"}
    return out


@pytest.mark.parametrize("schedule", ["ar-c", "rs-c-ag", "fuse(rs-c-ag)"])
@pytest.mark.parametrize(
    "ranks", [pytest.param(2, marks=pytest.mark.slow), 3, pytest.param(4, marks=pytest.mark.slow)]
)
def test_lamb_over_seven_odd_tensors(schedule: str, ranks: int):
    assert schedule in named_schedules(odd_lamb(), ranks=ranks)
    program = scheduled(odd_lamb(), schedule)
    result = coconet.run(program, None, ranks=ranks, seed=ranks, inplace=False)
    want = odd_lamb_reference(result.inputs, ranks)
    assert_same(result.outputs, want, f"sim [{schedule}]", rtol=0.0 if schedule == "ar-c" else 1e-5)
    plan = lower(program, ranks)
    got = ThreadedExecutor(plan).run(result.inputs)
    assert_same(got, result.outputs, f"cpu kernels [{schedule}] ranks={ranks}")


def test_fused_kernel_pulls_each_member_by_its_own_count():
    """fuse(rs-c-ag) of 35 elements on 4 ranks (9, 9, 9, 8): the plan passes the kernel its
    own count per rank and the members' counts, which is what the all_gather's pull reads."""
    plan = lower(scheduled(odd_example("sgd"), "fuse(rs-c-ag)"), 4)
    (fused,) = [s for s in plan.steps if isinstance(s, Launch) and "fused" in s.kernel]
    counts = [a for a in fused.args if isinstance(a, RankValue) and a.label == "count"]
    assert [c.table for c in counts] == [(9, 9, 9, 8)]
    params = {p.name for p in plan.signatures[fused.kernel]}
    assert "counts" in params
    even = lower(scheduled(coconet.load(EXAMPLES / "sgd.mlir"), "fuse(rs-c-ag)"), 4)
    (fused_even,) = [s for s in even.steps if isinstance(s, Launch) and "fused" in s.kernel]
    assert "counts" not in {p.name for p in even.signatures[fused_even.kernel]}


def test_a_rank_count_above_the_smallest_size_is_refused_before_launch():
    """7 elements cannot be cut into 8 parts: one message naming the rule, nothing runs."""
    program = scheduled(odd_lamb(), "rs-c-ag")
    with pytest.raises(CocoError, match=r"\[empty-slice\]"):
        lower(program, 8)
    with pytest.raises(CocoError, match=r"\[empty-slice\].*size 7"):
        coconet.run(program, None, ranks=8)


# Model parallel at odd sizes: K cut unevenly for the matmul; the split dim (the one
# auto_split_dim picks) uneven too: dim 2 of [2, 15, 64] at 3 ranks is a strided slice, which
# the fused kernel pulls by each member's own sizes; dim 1 of [3, 16, 64] takes the overlap.
MODEL_PARALLEL = {
    "mlp-s15-k250": ("model_parallel_mlp", {"2x16x": "2x15x", "256x": "250x"}, 3),
    "attention-b3": ("model_parallel_attention", {"2x16x": "3x16x"}, 3),
    "pipeline-b3": ("pipeline_boundary", {"2x16x": "3x16x"}, 6),
}


@functools.cache
def odd_model_parallel(key: str) -> Program:
    name, replacements, _ = MODEL_PARALLEL[key]
    text = (EXAMPLES / f"{name}.mlir").read_text()
    for old, new in replacements.items():
        text = text.replace(old, new)
    return Program(parse_module(text))


def model_parallel_cases():
    for key in MODEL_PARALLEL:
        for schedule in named_schedules(odd_model_parallel(key)):
            yield pytest.param(key, schedule, id=f"{key}-{schedule}")


@pytest.mark.parametrize(("key", "schedule"), list(model_parallel_cases()))
def test_odd_model_parallel_under_every_schedule(key: str, schedule: str):
    ranks = MODEL_PARALLEL[key][2]
    program = scheduled(odd_model_parallel(key), schedule)
    try:
        plan = lower(program, ranks)
    except CocoError as e:
        # Overlapping rows that ranks hold unevenly is refused before launch, by its rule.
        assert schedule.startswith("ol("), str(e)
        assert "[overlap-layout]" in str(e), str(e)
        return
    assert any(b.rank_shapes for b in plan.buffers) or schedule == "ar-c"
    inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
    want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
    assert_same(ThreadedExecutor(plan).run(inputs), want, f"{key} [{schedule}] ranks={ranks}")


# --------------------------------------------------------------------------------------------
# NVRTC
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
@pytest.mark.parametrize(
    "which",
    ["adam", "lamb", "mlp-s15-k250", pytest.param("lamb_odd_sizes", marks=pytest.mark.slow)],
)
def test_uneven_fused_kernels_compile_with_nvrtc(which: str):
    if which in MODEL_PARALLEL:
        program = odd_model_parallel(which)
    else:
        program = odd_lamb() if which == "lamb_odd_sizes" else odd_example(which)
    plan = lower(scheduled(program, "fuse(rs-c-ag)"), 3)
    assert "counts" in plan.cuda_source  # the uneven pull
    if which in MODEL_PARALLEL:
        assert "dims2" in plan.cuda_source  # a strided pull: the members' sizes
    for arch in ("sm_80", "sm_90"):
        assert len(compile_cuda(plan.cuda_source, arch, warnings_as_errors=True).binary) > 0


# --------------------------------------------------------------------------------------------
# The cuda backend's plan paths, against the strict double (test/unit/cuda_double.py)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["rs-c-ag", "fuse(rs-c-ag)"])
@pytest.mark.parametrize(
    ("gpus", "exact"),
    [(3, False), pytest.param(3, True, marks=pytest.mark.slow), (1, False)],
)
def test_cuda_backend_runs_uneven_slices(schedule: str, gpus: int, exact: bool):
    """Three ranks on three GPUs (NCCL, library or exact reductions) or sharing one (host-
    staged collectives): Adam over 4097 elements matches the sim, with no unordered access."""
    from test_runtime_cuda import run_fake

    from coconet.runtime import sim
    from coconet.runtime.check import compare_outputs

    program = scheduled(odd_example("adam"), schedule)
    inputs = sim.prepare_inputs(program, None, (3,), seed=5)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=3, inplace=False)
    _plan, got, backends = run_fake(program, 3, inputs, gpus=gpus, exact=exact)
    result = compare_outputs(got, want.per_rank)
    assert result.ok, "\n".join(map(str, result.differences))
    assert result.bit_exact or not exact
    assert [g["w"].shape for g in got] == [(4097,)] * 3
    assert not any(b.device.hazards for b in backends)


# RMSNorm after the reduce_scatter and the residual add
# (test/filecheck/passes/coco-fuse-all-reduce.mlir's @rmsnorm) over 3 rows.
RMSNORM_3_ROWS = """
func.func @rmsnorm(%x: !coco.tensor<3x64xf32, local>, %res: !coco.tensor<3x64xf32>, %w: !coco.tensor<64xf32>) -> (!coco.tensor<3x64xf32>, !coco.tensor<3x64xf32>) {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<3x64xf32, local> -> !coco.tensor<3x64xf32, sliced<0>>
  %res_s = coco.slice %res : !coco.tensor<3x64xf32> -> !coco.tensor<3x64xf32, sliced<0>>
  %h_s = coco.add %rs, %res_s : !coco.tensor<3x64xf32, sliced<0>>
  %h = comm.all_gather %h_s : !coco.tensor<3x64xf32, sliced<0>> -> !coco.tensor<3x64xf32>
  %sq = coco.mul %h_s, %h_s : !coco.tensor<3x64xf32, sliced<0>>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<3x64xf32, sliced<0>> -> !coco.tensor<3x1xf32, sliced<0>>
  %eps = coco.constant 1.0e-06 : !coco.tensor<f32>
  %d = coco.add %ms, %eps : !coco.tensor<3x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<3x1xf32, sliced<0>>
  %r = coco.rsqrt %d : !coco.tensor<3x1xf32, sliced<0>>
  %n = coco.mul %h_s, %r : !coco.tensor<3x64xf32, sliced<0>>, !coco.tensor<3x1xf32, sliced<0>> -> !coco.tensor<3x64xf32, sliced<0>>
  %y_s = coco.mul %n, %w : !coco.tensor<3x64xf32, sliced<0>>, !coco.tensor<64xf32> -> !coco.tensor<3x64xf32, sliced<0>>
  %y = comm.all_gather %y_s : !coco.tensor<3x64xf32, sliced<0>> -> !coco.tensor<3x64xf32>
  func.return %h, %y : !coco.tensor<3x64xf32>, !coco.tensor<3x64xf32>
}
"""


def test_uneven_row_collective_pulls_whole_rows():
    """RMSNorm fused between reduce_scatter and all_gather over 3 rows on 2 ranks (2 and 1
    rows): each block pulls a member's piece in runs of whole rows, as that member's blocks
    computed them (the fuzzer's case: the row kernel had no row alignment for the pull)."""
    src = RMSNORM_3_ROWS
    program = apply_pipeline(Program(parse_module(src, "rows3.mlir")), "coco-fuse{mode=all_reduce}")
    for config in (LaunchConfig(), LaunchConfig(block=1, max_blocks=2)):
        plan = lower(program, 2, config)
        inputs = prepare_inputs(program, None, plan.grid_shape, seed=3)
        want = coconet.run(program, inputs, ranks=2, inplace=False).outputs
        got = ThreadedExecutor(plan).run(inputs)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
