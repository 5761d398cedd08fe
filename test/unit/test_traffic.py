"""The traffic report (lowering/traffic.py, `coco-opt -t traffic`): what each plan moves per
rank against the floor its scheduled program sets, checked against hand counts for SGD and
Adam, at the floor where the kernels are, and bounded where they move more."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

import coconet
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.traffic import floor_total, plan_total
from coconet.schedule import apply_pipeline, named_schedules

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
N = 4096  # the elements of SGD's and Adam's tensors (f32)


def measured(example: str, schedule: str, ranks: int) -> tuple[int, int]:
    """(T, F) on rank 0 of `example` under its named `schedule` on `ranks` ranks."""
    program = coconet.load(str(EXAMPLES / f"{example}.mlir"))
    scheduled = apply_pipeline(program, named_schedules(program)[schedule])
    plan = lower(scheduled, ranks)
    return plan_total(plan, 0), floor_total(scheduled.func, plan.grid_shape, 0)


@pytest.mark.parametrize("p", [1, 2, 8])
def test_sgd_fused_against_a_hand_count(p):
    """SGD (w -= lr * all_reduce(g)) under fuse(rs-c-ag), n f32 elements, p ranks. Floor:
    g read once (4n: its slice of every member's g, (p-1)/p from peers), w's slice read (4n/p),
    the all_gather's (p-1)/p of w received (4n (p-1)/p), w written (4n), lr (4): 12n + 4 at
    every p. On several ranks the kernel moves one more slice of w, 4n/p: it stores the
    updated slice twice, into its symmetric staging buffer (%w1, what the peers pull) and into
    w, so T/F = 1 + 1/(3p). On one rank the collectives are identities: no staging, T = F."""
    t, f = measured("sgd", "fuse(rs-c-ag)", p)
    assert f == 12 * N + 4
    assert t == f + (4 * N // p if p > 1 else 0)


@pytest.mark.parametrize("p", [1, 2, 8])
def test_adam_fused_against_a_hand_count(p):
    """Adam under fuse(rs-c-ag): g read once (4n), w's slice read (4n/p), m and v (sliced by
    as-slice) read and written (16n/p), w's gather received (4n (p-1)/p), w written (4n), five
    scalars (20): 4 (3n + 4n/p) + 20 -- at 1 rank 28 bytes per parameter (docs/gpu.md). On
    several ranks the kernel writes the updated slice of w twice (staging buffer, then w):
    4n/p more. On one rank it moves the floor, 28 bytes per parameter."""
    t, f = measured("adam", "fuse(rs-c-ag)", p)
    assert f == 4 * (3 * N + 4 * N // p) + 20
    assert t == f + (4 * N // p if p > 1 else 0)


@pytest.mark.parametrize("p", [1, 2, 8])
@pytest.mark.parametrize(
    ("example", "schedule"),
    [("zero3_adamw", "fuse(rs-c)"), ("allreduce_rmsnorm", "fuse(rs-c-ag)")],
)
def test_kernels_at_the_floor(example, schedule, p):
    """These kernels move exactly the floor: ZeRO-3's step keeps its result sliced (nothing
    staged), and the RMSNorm's outputs are the symmetric buffers peers pull from."""
    t, f = measured(example, schedule, p)
    assert t == f


# T/F on 2 ranks, as measured: a kernel moving more bytes fails the bound (a kernel's block
# partials count the grid's blocks, not the buffer's room for MAX_COLLECTIVE_BLOCKS). Where above 1:
# the staging write of a gathered update (sgd, adam*, lamb*), one-shot all_reduces reading
# every peer's whole input (fuse(ar-c)), stored intermediates and library steps beside the
# kernels (norms, scalars, matmul operands, a2a dispatch buffers: moe_layer stores and
# re-reads its experts' activations, which the floor counts as free).
EXCESS = {
    ("adam", "fuse(rs-c-ag)"): 1.100,
    ("adam", "fuse(ar-c)"): 1.067,
    ("adam_bf16_grads", "fuse(rs-c-ag)"): 1.111,
    ("adam_bf16_grads", "fuse(ar-c)"): 1.037,
    ("adam_clip_global_norm", "fuse(rs-c-ag)"): 1.303,
    ("adam_clip_global_norm", "fuse(ar-c)"): 1.468,
    ("adam_f16_grads", "fuse(rs-c-ag)"): 1.111,
    ("adam_f16_grads", "fuse(ar-c)"): 1.037,
    ("adam_fp8_wire", "fuse(rs-c-ag)"): 1.118,
    ("adam_fp8_wire", "fuse(ar-c)"): 1.000,
    ("adam_loss_scaling", "fuse(rs-c-ag)"): 1.491,
    ("adam_loss_scaling", "fuse(ar-c)"): 3.307,
    ("allreduce_rmsnorm", "fuse(rs-c-ag)"): 1.000,
    ("allreduce_rmsnorm", "fuse(ar-c)"): 1.110,
    ("allreduce_rmsnorm_fp8", "fuse(rs-c-ag)"): 1.000,
    ("allreduce_rmsnorm_fp8", "fuse(ar-c)"): 1.123,
    ("lamb", "fuse(rs-c-ag)"): 1.401,
    ("lamb", "fuse(ar-c)"): 1.734,
    ("lamb_scattered", "fuse(rs-c-ag)"): 1.508,
    ("lamb_scattered", "fuse(ar-c)"): 1.603,
    # the amax's kernel reading w, and the dequantized weight the GEMM reads (8 KiB written
    # whole by the fused gather, read by the matmul) beside the fp8 exchange
    ("fp8_allgather_matmul", "fuse(ag)"): 2.914,
    # the forward's gathered weight and the gradient's GEMM output are whole temporaries
    # beside the fused reduce-scatter + AdamW (which alone is 1.000: zero3_adamw)
    ("fsdp_step", "fuse(rs-c)"): 2.059,
    # on [?, 2] at 2 ranks each dp group has one member: the fused step is a plain kernel
    ("megatron_dist_optimizer", "fuse(rs-c-ag)"): 1.000,
    ("megatron_dist_optimizer", "fuse(ar-c)"): 1.000,
    ("megatron_sp_layernorm", "fuse(rs-c-ag)"): 1.208,
    ("megatron_sp_layernorm", "fuse(ar-c)"): 1.261,
    ("model_parallel_attention", "fuse(rs-c-ag)"): 1.566,
    ("model_parallel_attention", "fuse(ar-c)"): 1.620,
    ("model_parallel_mlp", "fuse(rs-c-ag)"): 1.249,
    ("model_parallel_mlp", "fuse(ar-c)"): 1.293,
    ("moe_layer", "fuse(a2a)"): 32.321,
    ("pipeline_boundary", "fuse(rs-c-ag)"): 1.795,
    ("pipeline_boundary", "fuse(ar-c)"): 1.795,
    ("pipeline_boundary", "fuse(sliced-send)"): 2.193,
    ("sgd", "fuse(rs-c-ag)"): 1.167,
    ("sgd", "fuse(ar-c)"): 1.143,
    ("softmax_rows", "fuse(rs-c-ag)"): 1.465,
    ("softmax_rows", "fuse(ar-c)"): 1.581,
    ("ulysses_attention", "fuse(a2a)"): 4.362,
    ("vocab_parallel_cross_entropy", "fuse(rs-c-ag)"): 4.004,
    ("zero3_adamw", "fuse(rs-c)"): 1.000,
}


def test_every_fused_schedule_within_its_measured_excess():
    seen = set()
    for path in sorted(glob.glob(str(EXAMPLES / "*.mlir"))):
        example = Path(path).stem
        program = coconet.load(path)
        for schedule in named_schedules(program):
            if not schedule.startswith("fuse"):
                continue
            seen.add((example, schedule))
            t, f = measured(example, schedule, 2)
            assert f <= t, (example, schedule)  # the floor is a lower bound
            assert t / f <= EXCESS[example, schedule] + 5e-4, (example, schedule, t / f)
    assert seen == set(EXCESS)


REDUCE = """
builtin.module {
  func.func @r(%x: !coco.tensor<100000xELT, local>) -> !coco.tensor<ELT, local> attributes {coco.grid = #coco.grid<[?]>} {
    %r = coco.reduce KIND %x : !coco.tensor<100000xELT, local> -> !coco.tensor<ELT, local>
    func.return %r : !coco.tensor<ELT, local>
  }
}
"""


@pytest.mark.parametrize(
    ("elt", "kind"),
    [
        (elt, kind)
        for elt in ("f64", "f32", "f16", "bf16", "f8E4M3FN", "f8E5M2", "i32")
        for kind in ("sum", "max", "min", "norm")
        if not (elt == "i32" and kind == "norm")  # (a norm needs floats)
    ],
)
def test_reduction_partials_are_allocated_as_wide_as_the_kernel_writes_them(elt, kind):
    """A full reduction's per-block partials are kept in its accumulator (f32 for the max of
    bf16, f64 or f32 for sums): the scratch buffer holds elements of that width, never the
    tensor's (a bf16 max's partials once got 2-byte elements the kernel wrote 4 into, past
    the allocation) -- and every kernel pointer of the plan is given a buffer of its width."""
    from coconet.core.program import Program, parse_module
    from coconet.lowering.kernels.elements import reduce_accumulator
    from coconet.lowering.signature import CTYPE_BYTES
    from coconet.lowering.traffic import itemsize, pointer_width_errors

    program = Program(parse_module(REDUCE.replace("ELT", elt).replace("KIND", kind)))
    for ranks in (1, 3):
        plan = lower(program, ranks)
        assert pointer_width_errors(plan) == []
        (partials,) = [b for b in plan.buffers if b.name.endswith("_partials")]
        want = CTYPE_BYTES[reduce_accumulator(elt, kind).name]  # type: ignore[arg-type]
        assert itemsize(partials) == want, (partials.describe(), want)


def test_a_buffer_narrower_than_its_kernel_pointer_is_reported():
    import dataclasses

    from coconet.core.program import Program, parse_module
    from coconet.lowering.plan import Launch
    from coconet.lowering.traffic import pointer_width_errors

    program = Program(parse_module(REDUCE.replace("ELT", "bf16").replace("KIND", "max")))
    plan = lower(program, 2)
    (partials,) = [b for b in plan.buffers if b.name.endswith("_partials")]
    narrow = dataclasses.replace(partials, elt="")  # the tensor's bf16, where floats are kept
    plan.steps = [
        dataclasses.replace(s, args=[narrow if a is partials else a for a in s.args])
        if isinstance(s, Launch)
        else s
        for s in plan.steps
    ]
    errors = pointer_width_errors(plan)
    assert {e.split(":")[0] for e in errors} == {
        s.kernel for s in plan.steps if isinstance(s, Launch)
    }  # (the partials' writer and reader)
    assert all("r_partials of 2-byte elements" in e for e in errors)
