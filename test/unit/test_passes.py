"""The schedule passes on CoCoNet's workloads: every pipeline CoCoNet uses keeps the sim's
outputs equal to the unscheduled program's, on 1, 2, 4 and 8 ranks (pipeline programs on
2, 4 and 8); illegal targeted requests fail with one `[rule]` message and leave the IR as it
was."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline
from xdsl.utils.exceptions import PassFailedException

import coconet
from coconet.core.program import make_context, parse_module
from coconet.dialects import coco, comm
from coconet.schedule import get_all_passes

# --------------------------------------------------------------------------------------------
# Programs (small shapes: the sim is the oracle, not a benchmark)
# --------------------------------------------------------------------------------------------

SGD = """
func.func @sgd(%g: !coco.tensor<128xf32, local>, %w: !coco.tensor<128xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<128xf32, local> -> !coco.tensor<128xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<128xf32> -> !coco.tensor<128xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<128xf32>
  coco.update %w, %w1 : !coco.tensor<128xf32>
  func.return
}
"""

# a reduce_scatter chain whose result the function returns (no all_gather, no state)
SLICE_RETURNED = """
func.func @slice_returned(%g: !coco.tensor<128xf32, local>, %lr: !coco.tensor<f32>) -> !coco.tensor<128xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<128xf32, local> -> !coco.tensor<128xf32, sliced<0>>
  %d = coco.mul %lr, %g1_rs : !coco.tensor<f32>, !coco.tensor<128xf32, sliced<0>> -> !coco.tensor<128xf32, sliced<0>>
  func.return %d : !coco.tensor<128xf32, sliced<0>>
}
"""

ADAM = """
!T = !coco.tensor<256xf32>
!S = !coco.tensor<f32>
func.func @adam(%g: !coco.tensor<256xf16, local>, %w: !T, %m: !T, %v: !T, %lr: !S) attributes {coco.grid = #coco.grid<[?]>} {
  %g16 = comm.all_reduce sum %g : !coco.tensor<256xf16, local> -> !coco.tensor<256xf16>
  %g1 = coco.cast %g16 : !coco.tensor<256xf16> -> !T
  %b1 = coco.constant 0.9 : !S
  %b2 = coco.constant 0.999 : !S
  %one = coco.constant 1.0 : !S
  %eps = coco.constant 1.0e-8 : !S
  %c1 = coco.sub %one, %b1 : !S
  %c2 = coco.sub %one, %b2 : !S
  %mb = coco.mul %b1, %m : !S, !T -> !T
  %gb = coco.mul %c1, %g1 : !S, !T -> !T
  %m1 = coco.add %mb, %gb : !T
  coco.update %m, %m1 : !T
  %vb = coco.mul %b2, %v : !S, !T -> !T
  %gg = coco.mul %g1, %g1 : !T
  %gg2 = coco.mul %c2, %gg : !S, !T -> !T
  %v1 = coco.add %vb, %gg2 : !T
  coco.update %v, %v1 : !T
  %mh = coco.div %m1, %c1 : !T, !S -> !T
  %vh = coco.div %v1, %c2 : !T, !S -> !T
  %sq = coco.sqrt %vh : !T
  %den = coco.add %sq, %eps : !T, !S -> !T
  %r = coco.div %mh, %den : !T
  %st = coco.mul %lr, %r : !S, !T -> !T
  %w1 = coco.sub %w, %st : !T
  coco.update %w, %w1 : !T
  func.return
}
"""

LAMB = """
!T = !coco.tensor<256xf32>
!S = !coco.tensor<f32>
func.func @lamb(%g: !coco.tensor<256xf32, local>, %w: !T, %m: !T, %v: !T, %lr: !S) -> !S attributes {coco.grid = #coco.grid<[?]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<256xf32, local> -> !T
  %b1 = coco.constant 0.9 : !S
  %b2 = coco.constant 0.999 : !S
  %one = coco.constant 1.0 : !S
  %eps = coco.constant 1.0e-6 : !S
  %lam = coco.constant 0.01 : !S
  %c1 = coco.sub %one, %b1 : !S
  %c2 = coco.sub %one, %b2 : !S
  %mb = coco.mul %b1, %m : !S, !T -> !T
  %gb = coco.mul %c1, %g1 : !S, !T -> !T
  %m1 = coco.add %mb, %gb : !T
  coco.update %m, %m1 : !T
  %vb = coco.mul %b2, %v : !S, !T -> !T
  %gg = coco.mul %g1, %g1 : !T
  %gg2 = coco.mul %c2, %gg : !S, !T -> !T
  %v1 = coco.add %vb, %gg2 : !T
  coco.update %v, %v1 : !T
  %mh = coco.div %m1, %c1 : !T, !S -> !T
  %vh = coco.div %v1, %c2 : !T, !S -> !T
  %sq = coco.sqrt %vh : !T
  %den = coco.add %sq, %eps : !T, !S -> !T
  %u = coco.div %mh, %den : !T
  %lw = coco.mul %lam, %w : !S, !T -> !T
  %r = coco.add %u, %lw : !T
  %rn = coco.reduce norm %r : !T -> !S
  %wn = coco.reduce norm %w : !T -> !S
  %ratio = coco.div %wn, %rn : !S
  %s = coco.mul %lr, %ratio : !S
  %d = coco.mul %s, %r : !S, !T -> !T
  %w1 = coco.sub %w, %d : !T
  coco.update %w, %w1 : !T
  %rmax = coco.reduce max %r : !T -> !S
  func.return %rmax : !S
}
"""

# Megatron's attention/MLP output: B=2, S=8, H=32, tensor parallel over the whole world.
MODEL_PARALLEL = """
!X = !coco.tensor<2x8x32xf32>
func.func @mp(%in: !coco.tensor<2x8x32xf32, sliced<2>>, %w: !coco.tensor<32x32xf32, sliced<0>>, %b: !coco.tensor<32xf32>, %r: !X) -> !X attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %in, %w : !coco.tensor<2x8x32xf32, sliced<2>>, !coco.tensor<32x32xf32, sliced<0>> -> !coco.tensor<2x8x32xf32, local>
  %sum = comm.all_reduce sum %layer : !coco.tensor<2x8x32xf32, local> -> !X
  %sb = coco.add %sum, %b : !X, !coco.tensor<32xf32> -> !X
  %d = coco.dropout %sb, 0.1 seed 7 : !X
  %out = coco.add %d, %r : !X
  func.return %out : !X
}
"""

# A pipeline stage boundary on a [2, ?] grid: tensor parallel inside a stage (axis 1), the
# result sent to the same rank of the next stage (axis 0).
PIPELINE = """
!L = !coco.tensor<2x8x32xf32, [local, replicated]>
func.func @pp(%in: !coco.tensor<2x8x32xf32, [local, sliced<2>]>, %w: !coco.tensor<32x32xf32, [local, sliced<0>]>, %b: !coco.tensor<32xf32, [local, replicated]>, %r: !L) -> !L attributes {coco.grid = #coco.grid<[2, ?]>} {
  %layer = coco.matmul %in, %w : !coco.tensor<2x8x32xf32, [local, sliced<2>]>, !coco.tensor<32x32xf32, [local, sliced<0>]> -> !coco.tensor<2x8x32xf32, [local, local]>
  %sum = comm.all_reduce sum %layer over [1] : !coco.tensor<2x8x32xf32, [local, local]> -> !L
  %sb = coco.add %sum, %b : !L, !coco.tensor<32xf32, [local, replicated]> -> !L
  %d = coco.dropout %sb, 0.1 seed 7 : !L
  %out = coco.add %d, %r : !L
  %recv = comm.send %out along 0 shift 1 : !L
  func.return %recv : !L
}
"""

RANKS = (1, 2, 4, 8)
PIPELINE_RANKS = (2, 4, 8)

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def schedule(src: str, pipeline: str) -> ModuleOp:
    module = parse_module(src)
    if pipeline:
        PassPipeline.parse_spec(get_all_passes(), pipeline).apply(make_context(), module)
    module.verify()
    return module


def ops_of(module: ModuleOp, cls) -> list:
    return [op for op in module.walk() if isinstance(op, cls)]


def assert_same_outputs(src: str, scheduled: ModuleOp, ranks, *, exact: bool = True) -> None:
    for n in ranks:
        ref = coconet.run(parse_module(src), None, ranks=n, seed=11)
        got = coconet.run(scheduled, ref.inputs, ranks=n, seed=11, inplace=False)
        assert set(got.outputs) == set(ref.outputs)
        for name, want in ref.outputs.items():
            have = got.outputs[name]
            assert have.shape == want.shape, name
            assert have.dtype == want.dtype, name
            if exact:
                np.testing.assert_array_equal(have, want, err_msg=f"{name} on {n} ranks")
            else:
                np.testing.assert_allclose(
                    have.astype(np.float64),
                    want.astype(np.float64),
                    rtol=2e-6,
                    atol=1e-7,
                    err_msg=f"{name} on {n} ranks",
                )


def text(module: ModuleOp) -> str:
    return str(module)


# --------------------------------------------------------------------------------------------
# CoCoNet's schedules, checked against the oracle
# --------------------------------------------------------------------------------------------

SPLIT = "coco-split-allreduce"
REORDER = "coco-split-allreduce,coco-reorder"

DATA_PARALLEL_PIPELINES = [
    "",
    SPLIT,
    REORDER,
    REORDER + ",coco-as-slice{ops=m,v}",
    REORDER + ",coco-as-slice",
    REORDER + ",coco-as-slice{ops=m,v},coco-fuse",
    REORDER + ",coco-as-slice,coco-fuse,coco-dce",
    REORDER + ",coco-fuse{mode=all_reduce}",
    "coco-fuse",  # AR_C: the all_reduce, then one kernel
]


@pytest.mark.parametrize("pipeline", DATA_PARALLEL_PIPELINES)
def test_sgd_schedules(pipeline: str) -> None:
    if "ops=m,v" in pipeline:
        pipeline = pipeline.replace("{ops=m,v}", "{ops=w}")
    assert_same_outputs(SGD, schedule(SGD, pipeline), RANKS)


@pytest.mark.parametrize("pipeline", DATA_PARALLEL_PIPELINES)
def test_adam_schedules(pipeline: str) -> None:
    assert_same_outputs(ADAM, schedule(ADAM, pipeline), RANKS)


@pytest.mark.parametrize("pipeline", DATA_PARALLEL_PIPELINES)
def test_lamb_schedules(pipeline: str) -> None:
    # norms and max over slices combine partial results: the order of the sum changes
    assert_same_outputs(LAMB, schedule(LAMB, pipeline), RANKS, exact=False)


MODEL_PARALLEL_PIPELINES = [
    "coco-split-allreduce{dim=2}",
    "coco-split-allreduce{dim=1},coco-reorder",
    "coco-split-allreduce{dim=2},coco-reorder,coco-fuse",
    "coco-split-allreduce{dim=2},coco-reorder,coco-fuse,coco-overlap",
    "coco-split-allreduce{dim=1},coco-reorder,coco-fuse,coco-overlap{chunks=2}",
    "coco-split-allreduce{dim=2},coco-reorder,coco-overlap{chunks=2}",
    "coco-overlap",
    "coco-fuse,coco-overlap",
]


@pytest.mark.parametrize("pipeline", MODEL_PARALLEL_PIPELINES)
def test_model_parallel_schedules(pipeline: str) -> None:
    assert_same_outputs(MODEL_PARALLEL, schedule(MODEL_PARALLEL, pipeline), RANKS)


PIPELINE_PIPELINES = [
    "coco-split-allreduce{dim=2}",
    "coco-split-allreduce{dim=2},coco-reorder",
    "coco-split-allreduce{dim=2},coco-reorder,coco-sliced-send",
    "coco-split-allreduce{dim=1},coco-reorder,coco-sliced-send,coco-fuse",
    "coco-split-allreduce{dim=2},coco-reorder,coco-sliced-send,coco-fuse,coco-overlap",
    "coco-fuse,coco-overlap",
]


@pytest.mark.parametrize("pipeline", PIPELINE_PIPELINES)
def test_pipeline_schedules(pipeline: str) -> None:
    assert_same_outputs(PIPELINE, schedule(PIPELINE, pipeline), PIPELINE_RANKS)


# --------------------------------------------------------------------------------------------
# What the schedules look like
# --------------------------------------------------------------------------------------------


def test_split_replaces_all_reduce() -> None:
    m = schedule(SGD, SPLIT)
    assert not ops_of(m, comm.AllReduceOp)
    (rs,) = ops_of(m, comm.ReduceScatterOp)
    (ag,) = ops_of(m, comm.AllGatherOp)
    assert ag.input is rs.result
    assert rs.result.name_hint == "g1_rs"
    assert ag.result.name_hint == "g1"


def test_reorder_moves_the_update_onto_slices() -> None:
    m = schedule(ADAM, REORDER)
    (rs,) = ops_of(m, comm.ReduceScatterOp)
    # every elementwise op now computes on slices, except scalar arithmetic
    for op in ops_of(m, coco.ElementwiseOp):
        t = op.results[0].type
        assert t.rank == 0 or t.layout_text() == "sliced<0>", op
    # m, v, w read through slices; three gathers feed the three updates
    slices = {op.input.name_hint for op in ops_of(m, coco.SliceOp)}
    assert slices == {"m", "v", "w"}
    gathers = ops_of(m, comm.AllGatherOp)
    assert {g.result.name_hint for g in gathers} == {"m1", "v1", "w1"}
    for u in ops_of(m, coco.UpdateOp):
        assert isinstance(u.value.owner, comm.AllGatherOp)
    assert rs.result.uses


def test_as_slice_changes_the_signature() -> None:
    m = schedule(ADAM, REORDER + ",coco-as-slice{ops=m,v}")
    (fn,) = [op for op in m.ops]
    types = {a.name_hint: a.type.layout_text() for a in fn.args}
    assert types == {
        "g": "local",
        "w": "replicated",
        "m": "sliced<0>",
        "v": "sliced<0>",
        "lr": "replicated",
    }
    assert [i.layout_text() for i in fn.function_type.inputs] == list(types.values())
    assert len(ops_of(m, comm.AllGatherOp)) == 1  # only w is re-replicated


def test_fuse_builds_one_fused_all_reduce() -> None:
    m = schedule(ADAM, REORDER + ",coco-as-slice{ops=m,v},coco-fuse")
    (fn,) = list(m.ops)
    top = [op.name for op in fn.body.block.ops]
    assert top == ["comm.fused", "func.return"]
    (fused,) = ops_of(m, comm.FusedOp)
    assert fused.kind.data == "all_reduce"
    inner = [op.name for op in fused.body.block.ops]
    assert inner.count("comm.reduce_scatter") == 1
    assert inner.count("comm.all_gather") == 1
    assert inner.count("coco.update") == 3


def test_lamb_norm_over_slices() -> None:
    m = schedule(LAMB, REORDER)
    norms = [op for op in ops_of(m, coco.ReduceOp) if op.kind.data == "norm"]
    assert [n.input.name_hint for n in norms] == ["w"]  # ||w|| is not downstream of g1
    ars = ops_of(m, comm.AllReduceOp)
    assert {a.kind.data for a in ars} == {"sum", "max"}
    assert all(a.input.type.rank == 0 for a in ars)
    # w is read by a norm: greedy as-slice keeps it replicated
    m2 = schedule(LAMB, REORDER + ",coco-as-slice")
    fn = next(iter(m2.ops))
    assert {a.name_hint: a.type.layout_text() for a in fn.args}["w"] == "replicated"


def test_lamb_fuses_norms_into_the_collective() -> None:
    m = schedule(LAMB, REORDER + ",coco-as-slice,coco-fuse")
    (fused,) = [op for op in ops_of(m, comm.FusedOp) if op.kind.data == "all_reduce"]
    names = [op.name for op in fused.body.block.ops]
    # The partial norm of r, the partial max, and ||w||: w is replicated and only the chain
    # reads its norm, so coco-fuse computes it on the chain's slice too.
    assert names.count("comm.all_reduce") == 3
    assert "comm.all_gather" in names
    (fn,) = list(m.ops)
    assert not [op for op in fn.body.block.ops if isinstance(op, coco.ReduceOp)]


def test_model_parallel_overlap_holds_the_fused_all_reduce() -> None:
    m = schedule(MODEL_PARALLEL, "coco-split-allreduce{dim=2},coco-reorder,coco-fuse,coco-overlap")
    (ov,) = ops_of(m, comm.OverlapOp)
    assert ov.chunks.value.data == 4
    inner = list(ov.body.block.ops)
    assert isinstance(inner[0], coco.MatmulOp)
    assert isinstance(inner[1], comm.FusedOp)
    assert inner[1].kind.data == "all_reduce"
    assert ov.results[0].name_hint == "out"  # the program's output keeps its name


def test_pipeline_sends_slices() -> None:
    m = schedule(PIPELINE, "coco-split-allreduce{dim=2},coco-reorder,coco-sliced-send")
    (send,) = ops_of(m, comm.SendOp)
    assert send.input.type.layout_text() == "[local, sliced<2>]"
    (ag,) = [g for g in ops_of(m, comm.AllGatherOp)]
    assert ag.input is send.result
    assert ag.result.name_hint == "recv"


def test_pipeline_full_schedule_structure() -> None:
    m = schedule(
        PIPELINE, "coco-split-allreduce{dim=2},coco-reorder,coco-sliced-send,coco-fuse,coco-overlap"
    )
    fn = next(iter(m.ops))
    top = [op.name for op in fn.body.block.ops]
    assert top == ["comm.overlap", "comm.fused", "comm.all_gather", "func.return"]
    (fused,) = ops_of(m, comm.FusedOp)
    assert fused.kind.data == "send"


# --------------------------------------------------------------------------------------------
# Greedy passes are idempotent; dce keeps the program's effects
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "pipeline"),
    [
        (ADAM, REORDER + ",coco-as-slice,coco-fuse"),
        (LAMB, REORDER + ",coco-as-slice,coco-fuse"),
        (MODEL_PARALLEL, "coco-split-allreduce{dim=2},coco-reorder,coco-fuse,coco-overlap"),
        (
            PIPELINE,
            "coco-split-allreduce{dim=2},coco-reorder,coco-sliced-send,coco-fuse,coco-overlap",
        ),
    ],
)
def test_greedy_passes_reach_a_fixpoint(src: str, pipeline: str) -> None:
    once = schedule(src, pipeline)
    twice = schedule(src, pipeline + "," + pipeline)
    assert text(once) == text(twice)


def test_dce_keeps_updates_and_erases_dead_code() -> None:
    src = SGD.replace(
        "  func.return",
        "  %dead = coco.mul %d, %d : !coco.tensor<128xf32>\n"
        "  %dead2 = comm.all_reduce sum %g : !coco.tensor<128xf32, local> -> !coco.tensor<128xf32>\n"
        "  func.return",
    )
    m = schedule(src, "coco-dce")
    assert "dead" not in text(m)
    assert len(ops_of(m, coco.UpdateOp)) == 1
    assert_same_outputs(src, m, (1, 4))


# --------------------------------------------------------------------------------------------
# Refusals: one [rule] message, nothing half-rewritten
# --------------------------------------------------------------------------------------------

REFUSALS = [
    # (program, schedule before, refused pass, rule)
    (SGD, "", "coco-split-allreduce{ops=d}", "[split-allreduce-op]"),
    (LAMB, "", "coco-split-allreduce{ops=rn}", "[split-allreduce-op]"),
    (SGD, "", "coco-split-allreduce{ops=g1 dim=1}", "[split-allreduce-scalar]"),
    (SGD, "", "coco-reorder{ops=g1}", "[reorder-gather]"),  # not split yet
    (SGD, SPLIT, "coco-reorder{ops=g1_rs}", "[reorder-gather]"),
    (SGD, SPLIT, "coco-reorder{ops=w1}", "[reorder-gather]"),  # reads no gather
    (
        MODEL_PARALLEL,
        "coco-split-allreduce{dim=2}",
        "coco-reorder{ops=layer}",
        "[reorder-elementwise]",
    ),
    (ADAM, SPLIT, "coco-as-slice{ops=m}", "[as-slice-uses]"),
    (LAMB, REORDER, "coco-as-slice{ops=m,w}", "[as-slice-uses]"),
    (ADAM, "", "coco-as-slice{ops=nope}", "[as-slice-arg]"),
    # (w sliced by as-slice, the chain has no all_gather: ZeRO-3's step, fused; one whose
    # result leaves the chain is not)
    (SLICE_RETURNED, "", "coco-fuse{mode=all_reduce ops=g1_rs}", "[fuse-chain]"),
    (MODEL_PARALLEL, "", "coco-fuse{mode=elementwise ops=layer,sb}", "[fuse-elementwise]"),
    (LAMB, "", "coco-fuse{mode=elementwise ops=r,never}", "[fuse-block]"),
    (LAMB, "", "coco-fuse{mode=elementwise ops=r,rn,u}", "[fuse-elementwise]"),
    (MODEL_PARALLEL, "", "coco-overlap{ops=layer chunks=3}", "[overlap-chunks]"),
    (MODEL_PARALLEL, "", "coco-overlap{ops=sb}", "[overlap-producer]"),
    (PIPELINE, "", "coco-sliced-send{ops=recv}", "[sliced-send-gather]"),
    (SGD, "", "coco-dce{ops=d}", "[dce-live]"),
]


@pytest.mark.parametrize(("src", "before", "refused", "rule"), REFUSALS)
def test_refusals_name_the_rule_and_change_nothing(
    src: str, before: str, refused: str, rule: str
) -> None:
    module = schedule(src, before)
    snapshot = text(module)
    (p,) = PassPipeline.parse_spec(get_all_passes(), refused).passes
    with pytest.raises(PassFailedException) as info:
        p.apply(make_context(), module)
    message = str(info.value)
    assert message.startswith(rule), message
    assert "\n" not in message
    assert text(module) == snapshot
    module.verify()


def test_targeted_reorder_of_named_computations() -> None:
    # CoCoNet's reorder(comps, ag): only the named ops move; the rest read the gather
    m = schedule(ADAM, SPLIT + ",coco-reorder{ops=g1,gb,mb,m1}")
    moved = {
        op.results[0].name_hint
        for op in ops_of(m, coco.ElementwiseOp)
        if op.results[0].type.layout_text() == "sliced<0>"
    }
    assert moved == {"g1_s", "mb_s", "gb_s", "m1_s"}
    assert {s.input.name_hint for s in ops_of(m, coco.SliceOp)} == {"m"}
    assert_same_outputs(ADAM, m, RANKS)


def test_registry_names_match_classes() -> None:
    passes = get_all_passes()
    assert set(passes) >= {
        "coco-split-allreduce",
        "coco-reorder",
        "coco-as-slice",
        "coco-dce",
        "coco-fuse",
        "coco-overlap",
        "coco-sliced-send",
        "coco-canonicalize",
    }
    for name, factory in passes.items():
        cls = factory()
        assert cls.name == name
        assert cls.__doc__
        assert "[" in cls.__doc__


@pytest.mark.parametrize("src", [SGD, ADAM])
def test_zero3_step_fuses_its_reduce_scatter_with_the_sliced_update(src: str) -> None:
    """With the state sliced by as-slice (w, m, v stay sliced: ZeRO-3), the chain has no
    all_gather; coco-fuse makes it one fused collective (reduce_scatter, update, stores), which
    lowers to ONE launch and computes what the program does, on uneven cuts too."""
    import numpy as np

    from coconet.core.program import Program
    from coconet.lowering.lower_to_plan import lower
    from coconet.lowering.plan import Launch
    from coconet.runtime import sim
    from coconet.runtime.check import compare_piece
    from coconet.runtime.threaded import ThreadedExecutor

    sliced = schedule(src, REORDER + ",coco-as-slice")
    assert not ops_of(sliced, comm.AllGatherOp)
    m = schedule(src, REORDER + ",coco-as-slice,coco-fuse")
    (region,) = ops_of(m, comm.FusedOp)
    assert isinstance(next(iter(region.body.block.ops)), comm.ReduceScatterOp)
    assert_same_outputs(src, m, RANKS)
    for ranks in (2, 3, 7):
        p = Program(m)
        plan = lower(p, ranks)
        assert [type(s) for s in plan.steps] == [Launch], plan.format()
        want = sim.run(p, ranks=ranks, seed=ranks)
        got = ThreadedExecutor(plan).run(want.inputs)
        for name, value in want.outputs.items():
            assert compare_piece(name, 0, np.asarray(got[name]), value)[0] is None
