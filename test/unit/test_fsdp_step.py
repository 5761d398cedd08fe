"""An FSDP / ZeRO-3 linear layer's training step (examples/fsdp_step): the row-sharded weight
all-gathered for the forward GEMM, the weight gradient's GEMM reduce-scattered to the shards,
AdamW on the shards. Every offered schedule (the overlap of the gradient's GEMM with its
reduce_scatter, of the weight's all_gather with the forward GEMM, the fused reduce-scatter +
AdamW) against an independent NumPy reference, bit
for bit, at 1, 2, 3 and 4 ranks (at 3 the 64 weight rows are cut unevenly), in the sim and on
the cpu backend's kernels; the .mlir and the .py are one program."""

from __future__ import annotations

import numpy as np
import numpy_references as ref
import pytest
from test_examples import dyadic

import coconet
from coconet.core import values as V
from coconet.core.program import CocoError, Program, parse_module
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective, Matmul
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_pipeline, apply_schedule, named_schedules

B, K, N = 16, 64, 128


def _program():
    return coconet.load("examples/fsdp_step.mlir")


def _inputs(ranks: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    x = dyadic(rng, (ranks, B, K), f32)
    return {
        "x": x,
        "xt": np.ascontiguousarray(np.swapaxes(x, 1, 2)),
        "dy": dyadic(rng, (ranks, B, N), f32),
        "w": dyadic(rng, (K, N), f32),
    } | ref.adamw_state(rng, (K, N))


def _equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    assert set(got) == set(want), what
    for name, value in want.items():
        np.testing.assert_array_equal(got[name].view(np.uint32), value.view(np.uint32), what)


def test_the_mlir_and_the_python_example_are_one_program():
    assert _program().print() == coconet.load("examples/fsdp_step.py").print()


def test_the_offered_schedules_fuse_the_update_and_overlap_the_gradient():
    offered = named_schedules(_program(), ranks=4)
    assert {"fuse(rs-c)", "ol(mm,rs)", "ol(ag,mm)"} <= set(offered), offered
    plan = lower(apply_schedule(_program(), "fuse(rs-c)"), 4)
    # the forward's all_gather stays a library collective; the update is one fused kernel
    assert sum(isinstance(s, Collective) for s in plan.steps) == 1, plan.format()


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_every_offered_schedule_matches_the_numpy_reference(ranks: int):
    program = _program()
    inputs = _inputs(ranks, seed=ranks)
    want = ref.fsdp_step({k: v.copy() for k, v in inputs.items()}, ranks)
    for name in ["as-written", *named_schedules(program, ranks=ranks)]:
        scheduled = program if name == "as-written" else apply_schedule(program, name)
        got = sim.run(scheduled, {k: v.copy() for k, v in inputs.items()}, ranks).outputs
        _equal(got, want, f"{name} at {ranks} ranks in the sim")
        if ranks in (1, 3) or name == "fuse(rs-c)":
            got = ThreadedExecutor(lower(scheduled, ranks)).run(
                {k: v.copy() for k, v in inputs.items()}
            )
            _equal(got, want, f"{name} at {ranks} ranks on the cpu backend")


GATHERED_WEIGHT = """
builtin.module {
  func.func @fwd(%x: !coco.tensor<XSHAPExELT, XLAYOUT>, %w: !coco.tensor<64x32xELT, WLAYOUT>) -> !coco.tensor<YSHAPExELT, XLAYOUT> attributes {coco.grid = #coco.grid<[?]>} {
    %wg = comm.all_gather %w : !coco.tensor<64x32xELT, WLAYOUT> -> !coco.tensor<64x32xELT>
    %y = coco.matmul %x, %wg : !coco.tensor<XSHAPExELT, XLAYOUT>, !coco.tensor<64x32xELT> -> !coco.tensor<YSHAPExELT, XLAYOUT>
    func.return %y : !coco.tensor<YSHAPExELT, XLAYOUT>
  }
}
"""

# (the left operand's shape and layout, the weight's layout): each rank's own batch, or the
# batch sliced (unevenly at 4 ranks: 6 rows in 2, 2, 1, 1); the weight sharded by rows (FSDP)
# or by columns; a batched left operand over one weight
GATHER_CASES = [
    ("16x64", "local", "sliced<0>"),
    ("6x64", "sliced<0>", "sliced<0>"),
    ("2x8x64", "local", "sliced<1>"),
]


def _gathered_weight(xshape: str, xlayout: str, wlayout: str, elt: str) -> Program:
    text = (
        GATHERED_WEIGHT.replace("XSHAPE", xshape)
        .replace("YSHAPE", xshape.rsplit("x", 1)[0] + "x32")
        .replace("XLAYOUT", xlayout)
        .replace("WLAYOUT", wlayout)
        .replace("ELT", elt)
    )
    return Program(parse_module(text))


@pytest.mark.parametrize("elt", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(("xshape", "xlayout", "wlayout"), GATHER_CASES)
def test_the_gathered_weight_overlaps_its_matmul_by_chunks_of_the_reduction_dim(
    elt, xshape, xlayout, wlayout
):
    """ol(ag,mm) with the all_gather feeding the matmul's right operand (FSDP's parameter
    gather): chunk c of the weight's rows is gathered while chunk c-1's rows multiply the same
    columns of x, summed into y (f16/bf16: in an f32 accumulator rounded once, as the sim
    rounds the whole product). Bit for bit against the sim (dyadic values sum exactly in any
    order) on the cpu backend's threads and on strict fake GPUs, at 2 and 4 ranks, 2 and 4
    chunks."""
    from test_runtime_cuda import run_fake

    from coconet.runtime.check import compare_outputs

    program = _gathered_weight(xshape, xlayout, wlayout, elt)
    assert named_schedules(program, ranks=4)["ol(ag,mm)"] == "coco-overlap{ops=y}"
    dtype = V.NUMPY_DTYPES[elt]
    rng = np.random.default_rng(7)
    for ranks in (2, 4):
        xs = [int(d) for d in xshape.split("x")]
        inputs = {
            "x": dyadic(rng, xs if xlayout != "local" else [ranks, *xs], dtype),
            "w": dyadic(rng, (64, 32), dtype),
        }
        want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks, inplace=False)
        for chunks in (2, 4):
            scheduled = apply_pipeline(program, f"coco-overlap{{chunks={chunks} ops=y}}")
            plan = lower(scheduled, ranks)
            sums = [s for s in plan.steps if isinstance(s, Matmul)]
            assert [s.k_rows is not None for s in sums] == [True] * chunks, plan.format()
            assert all((s.acc is not None) == (elt != "f32") for s in sums)
            got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
            _equal_bits(got, want.outputs, f"{elt} {chunks} chunks at {ranks} ranks (cpu)")
            _plan, per_rank, _ = run_fake(
                scheduled, ranks, {k: v.copy() for k, v in inputs.items()}
            )
            assert compare_outputs(per_rank, want.per_rank).bit_exact, (elt, chunks, ranks)


def _equal_bits(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    for name, value in want.items():
        bits = np.dtype(f"u{value.dtype.itemsize}")
        np.testing.assert_array_equal(got[name].view(bits), value.view(bits), what)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        # a batch of gathered matrices: a chunk of its rows is no run of one reduction dim
        (
            GATHERED_WEIGHT.replace("64x32xELT", "2x64x32xELT")
            .replace("XSHAPE", "2x8x64")
            .replace("YSHAPE", "2x8x32"),
            "overlap-rows",
        ),
    ],
)
def test_a_gathered_weight_that_cannot_be_chunked_is_refused(text, rule):
    program = Program(
        parse_module(
            text.replace("XLAYOUT", "local").replace("WLAYOUT", "sliced<1>").replace("ELT", "f32")
        )
    )
    with pytest.raises(CocoError, match=rf"\[{rule}\]"):
        apply_pipeline(program, "coco-overlap{ops=y}")
