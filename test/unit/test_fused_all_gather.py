"""`fuse(ag)` (`coco-fuse{mode=all_gather}`): an all_gather with the elementwise computation of
its input (FSDP's cast of the f32 master shard to bf16, an fp8 quantize) and of its result as
ONE exchange kernel (lowering/fused_all_to_all.py): each rank computes its piece into its
symmetric staging buffer once and pulls every member's whole piece.

A family against the sim, bit for bit: every element type, a weight cut by rows or columns,
on a 1-D grid and on the inner or outer axis of [2, ?], uneven cuts (64 rows at 3 and 7
ranks), producers and consumers; on the cpu backend's threads and on strict fake GPUs. A
pulled element only stored is copied as bits (NaN payloads kept) in a loop the host
compiler vectorizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_fp8_examples import lines_with, vectorized_lines
from test_runtime_cuda import run_fake

from coconet.core.program import Program, parse_module
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective, Launch
from coconet.runtime import sim
from coconet.runtime.check import compare_outputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules

CAST_GATHER = """
builtin.module {
  func.func @gather(%w: !coco.tensor<64x24xf32, LAYOUT>, %s: !coco.tensor<f32>) -> !coco.tensor<64x24xOUT, GATHERED> attributes {coco.grid = #coco.grid<GRID>} {
    %a = coco.mul %w, %s : !coco.tensor<64x24xf32, LAYOUT>, !coco.tensor<f32> -> !coco.tensor<64x24xf32, LAYOUT>
    %wb = coco.cast %a : !coco.tensor<64x24xf32, LAYOUT> -> !coco.tensor<64x24xELT, LAYOUT>
    %wg = comm.all_gather %wb AXES: !coco.tensor<64x24xELT, LAYOUT> -> !coco.tensor<64x24xELT, GATHERED>
    CONSUMER
  }
}
"""
# the gathered value returned as it is, or cast back to f32 on the receiver's side
RETURN = "func.return %wg : !coco.tensor<64x24xELT, GATHERED>"
CAST_BACK = """%z = coco.cast %wg : !coco.tensor<64x24xELT, GATHERED> -> !coco.tensor<64x24xf32, GATHERED>
    func.return %z : !coco.tensor<64x24xf32, GATHERED>"""

# (grid, layout of the shard, axes gathered, layout gathered, rank counts)
PLACES = [
    ("[?]", "sliced<0>", "", "replicated", (1, 2, 3, 4, 7)),
    ("[?]", "sliced<1>", "", "replicated", (2, 3, 4)),
    ("[2, ?]", "[replicated, sliced<0>]", "over [1] ", "[replicated, replicated]", (2, 4, 6)),
    ("[2, ?]", "[sliced<0>, sliced<1>]", "over [0] ", "[replicated, sliced<1>]", (2, 4, 6)),
]


def _program(elt: str, place: tuple, consumer: bool) -> Program:
    grid, layout, axes, gathered, _ranks = place
    out = "f32" if consumer else elt
    text = (
        CAST_GATHER.replace("CONSUMER", CAST_BACK if consumer else RETURN)
        .replace("GRID", grid)
        .replace("GATHERED", gathered)
        .replace("LAYOUT", layout)
        .replace("AXES", axes)
        .replace("OUT", out)
        .replace("ELT", elt)
    )
    return Program(parse_module(text))


@pytest.mark.parametrize("consumer", [False, True], ids=["stored", "cast-back"])
@pytest.mark.parametrize("place", PLACES, ids=lambda p: f"{p[0]}{p[1]}")
@pytest.mark.parametrize("elt", ["f32", "bf16", "f16", "f8E4M3FN", "f8E5M2"])
def test_the_fused_gather_computes_what_the_program_does(elt, place, consumer):
    program = _program(elt, place, consumer)
    assert named_schedules(program)["fuse(ag)"].startswith("coco-fuse{mode=all_gather")
    fused = apply_schedule(program, "fuse(ag)")
    for ranks in place[4]:
        want = sim.run(program, ranks=ranks, seed=ranks, inplace=False)
        plan = lower(fused, ranks)
        kernels = [s.kernel for s in plan.steps if isinstance(s, Launch)]
        (kernel,) = kernels
        assert kernel.startswith("k_fused_all_gather"), kernels
        assert not any(isinstance(s, Collective) for s in plan.steps)
        got = ThreadedExecutor(plan).run(want.inputs)
        _same_bits(got, want.outputs, f"{elt} at {ranks} ranks")
        if ranks in (2, 3):  # strict fake GPUs: the same plan through the cuda executor
            _plan, per_rank, _ = run_fake(fused, ranks, want.inputs)
            assert compare_outputs(per_rank, want.per_rank).bit_exact, (elt, ranks)


def _same_bits(got: dict, want: dict, what: str) -> None:
    for k, v in want.items():
        bits = np.dtype(f"u{v.dtype.itemsize}")
        np.testing.assert_array_equal(np.asarray(got[k]).view(bits), v.view(bits), what)


def test_a_pulled_element_is_copied_bits_and_all():
    """A bf16 NaN with a payload crosses a bare fused all_gather unchanged, as the library's
    all_gather (a byte copy) and the sim move it: the receiver stores the peer's bits, with
    no round trip through f32 (which quiets a signalling NaN)."""
    text = """
    builtin.module {
      func.func @bare(%w: !coco.tensor<8x4xbf16, sliced<0>>) -> !coco.tensor<8x4xbf16> attributes {coco.grid = #coco.grid<[?]>} {
        %wg = comm.all_gather %w : !coco.tensor<8x4xbf16, sliced<0>> -> !coco.tensor<8x4xbf16>
        func.return %wg : !coco.tensor<8x4xbf16>
      }
    }
    """
    from coconet.schedule import apply_pipeline

    program = Program(parse_module(text))
    fused = apply_pipeline(program, "coco-fuse{mode=all_gather ops=wg}")
    w = np.arange(32, dtype=np.uint16).reshape(8, 4) + np.uint16(0x3F80)
    w[3, 2] = 0x7F81  # a signalling NaN's bits
    w[6, 1] = 0xFFC3  # a negative quiet NaN with a payload
    import ml_dtypes

    inputs = {"w": w.view(ml_dtypes.bfloat16)}
    for ranks in (2, 3):
        got = ThreadedExecutor(lower(fused, ranks)).run(inputs)["wg"]
        np.testing.assert_array_equal(np.asarray(got).view(np.uint16), w)


@pytest.mark.usefixtures("product_host_build")
def test_the_receivers_copy_vectorizes_on_the_host(tmp_path: Path) -> None:
    """The receiver's loop storing the pulled bf16 elements copies their bits: g++ vectorizes
    it (as a struct assignment it did not, and the fused cast + gather ran 1.6x slower than
    the cast kernel and MPI's Allgather)."""
    program = _program("bf16", PLACES[0], consumer=False)
    source = lower(apply_schedule(program, "fuse(ag)"), 2).cuda_source
    (copy,) = lines_with(source, "wg_out[i].bits = ")
    loop = max(n for n in lines_with(source, "COCO_BLOCK_STRIDE_LOOP(") if n < copy)
    assert loop in vectorized_lines(source, tmp_path), source


FSDP_FORWARD = """
builtin.module {
  func.func @fwd(%x: !coco.tensor<XSHAPExELT, local>, %w: !coco.tensor<64x32xf32, WLAYOUT>) -> !coco.tensor<YSHAPExELT, local> attributes {coco.grid = #coco.grid<[?]>} {
    %wb = coco.cast %w : !coco.tensor<64x32xf32, WLAYOUT> -> !coco.tensor<64x32xELT, WLAYOUT>
    %wg = comm.all_gather %wb : !coco.tensor<64x32xELT, WLAYOUT> -> !coco.tensor<64x32xELT>
    %y = coco.matmul MATMUL
    func.return %y : !coco.tensor<YSHAPExELT, local>
  }
}
"""
# the gathered weight as the right operand (x [16, 64] @ W) or the left one (W [64, 32] @ v)
OPERANDS = {
    "right": (
        "16x64",
        "16x32",
        "%x, %wg : !coco.tensor<16x64xELT, local>, !coco.tensor<64x32xELT> -> !coco.tensor<16x32xELT, local>",
    ),
    "left": (
        "32x8",
        "64x8",
        "%wg, %x : !coco.tensor<64x32xELT>, !coco.tensor<32x8xELT, local> -> !coco.tensor<64x8xELT, local>",
    ),
}


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("wlayout", ["sliced<0>", "sliced<1>"])
@pytest.mark.parametrize("elt", ["f32", "bf16", "f16"])
def test_the_fused_gather_pipelines_with_its_matmul(elt, wlayout, side):
    """ol(fuse(ag),mm): chunk c of the cast weight's rows is cast and gathered by the exchange
    kernel (its boxes cut to those rows of every member's piece) on the communication stream
    while the matmul multiplies chunk c-1; bit for bit against the sim (dyadic values sum
    exactly in any order) at 2 and 4 ranks, 2 and 4 chunks, on cpu threads and fake GPUs."""
    from test_examples import dyadic

    from coconet.core import values as V
    from coconet.lowering.plan import COMM_STREAM, Matmul
    from coconet.schedule import apply_pipeline

    xshape, yshape, matmul = OPERANDS[side]
    text = (
        FSDP_FORWARD.replace("MATMUL", matmul)
        .replace("XSHAPE", xshape)
        .replace("YSHAPE", yshape)
        .replace("WLAYOUT", wlayout)
        .replace("ELT", elt)
    )
    program = Program(parse_module(text))
    assert "ol(fuse(ag),mm)" in named_schedules(program, ranks=4)
    rng = np.random.default_rng(5)
    for ranks in (2, 4):
        xs = [int(d) for d in xshape.split("x")]
        inputs = {
            "x": dyadic(rng, [ranks, *xs], V.NUMPY_DTYPES[elt]),
            "w": dyadic(rng, (64, 32), np.float32),
        }
        want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks, inplace=False)
        for chunks in (2, 4):
            pipeline = f"coco-fuse{{mode=all_gather}},coco-overlap{{chunks={chunks} ops=y}}"
            scheduled = apply_pipeline(program, pipeline)
            plan = lower(scheduled, ranks)
            kernels = [s for s in plan.steps if isinstance(s, Launch)]
            assert len(kernels) == chunks, plan.format()
            assert all(s.stream == COMM_STREAM for s in kernels)
            assert len([s for s in plan.steps if isinstance(s, Matmul)]) == chunks
            got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
            _same_bits(got, want.outputs, f"{elt} {side} {chunks} chunks at {ranks} ranks")
            _plan, per_rank, _ = run_fake(
                scheduled, ranks, {k: v.copy() for k, v in inputs.items()}
            )
            assert compare_outputs(per_rank, want.per_rank).bit_exact, (elt, side, ranks)
