"""The fused all_to_all (issue #28.2): `coco-fuse{mode=all_to_all}` regions lowered to ONE
kernel per rank over symmetric memory (lowering/fused_all_to_all.py), run by the cpu backend
(host kernels, in-process ranks) against the sim, bit for bit: f32, bf16 and f16 data, 2-D
and 3-D tensors, every pair of dims (a, b), uneven cuts at 2, 3, 4 and 7 ranks, with and
without producers (a scale, a cast to bf16 before the exchange) and consumers (a cast back,
a weighted combine by broadcast weights, a residual add); the dispatch form; 2-D grids;
updates; groups across nodes (op by op); the named schedule `fuse(a2a)`; the equivalence
checker; NVRTC.

Each program holds every case of one element type (one all_to_all per pair and variant), so
one host compile serves them all."""

from __future__ import annotations

import functools
import itertools

import ml_dtypes
import numpy as np
import pytest

from coconet.compile import apply_pipeline
from coconet.core.program import Program, parse_module
from coconet.dialects import comm
from coconet.equivalence import check_equivalence
from coconet.lowering.lower_to_plan import LaunchConfig, Lowering, lower
from coconet.lowering.plan import Collective, Copy, Launch
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule, named_schedules
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

SHAPES = {2: (11, 9), 3: (10, 7, 9)}  # no rank count of 2..7 cuts these evenly, save 7
PAIRS = [(r, a, b) for r in SHAPES for a, b in itertools.permutations(range(r), 2)]
# every pair without computation and with both sides; one side alone on the 2-D pairs
CASES = [(pair, v) for pair in PAIRS for v in ("bare", "both")] + [
    (pair, v) for pair in PAIRS if pair[0] == 2 for v in ("producers", "consumers")
]
RANKS = (2, 3, 4, 7)
DTYPES = {
    "f32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f16": np.dtype(np.float16),
}


def t(shape, elt: str, layout: str = "replicated") -> str:
    return f"!coco.tensor<{''.join(f'{n}x' for n in shape)}{elt}, {layout}>"


NARROW = {"f32": "bf16", "f16": "bf16", "bf16": None}  # the cast before dispatch


def case(elt: str, rank: int, a: int, b: int, variant: str) -> tuple[list[str], list[str], str]:
    """(arguments, ops, `result|type`) of one all_to_all of `variant`, named after its case."""
    tag = f"{variant}{rank}{a}{b}"  # (a name ending in `_<digits>` loses them)

    def ty(e: str, dim: int) -> str:
        return t(SHAPES[rank], e, f"sliced<{dim}>")

    scalar = t((), elt)
    args = [f"%x_{tag}: {ty(elt, a)}"]
    ops: list[str] = []
    sent, sent_elt = f"%x_{tag}", elt
    if variant in ("producers", "both"):
        args.append(f"%s_{tag}: {scalar}")
        ops.append(
            f"%u_{tag} = coco.mul %x_{tag}, %s_{tag} : {ty(elt, a)}, {scalar} -> {ty(elt, a)}"
        )
        sent = f"%u_{tag}"
        narrow = NARROW[elt]
        if narrow is not None:
            ops.append(f"%c_{tag} = coco.cast %u_{tag} : {ty(elt, a)} -> {ty(narrow, a)}")
            sent, sent_elt = f"%c_{tag}", narrow
    ops.append(f"%y_{tag} = comm.all_to_all {sent} : {ty(sent_elt, a)} -> {ty(sent_elt, b)}")
    result, result_t = f"%y_{tag}", ty(sent_elt, b)
    if variant in ("consumers", "both"):
        w_t = t((*SHAPES[rank][:-1], 1), "f32")
        args += [f"%w_{tag}: {w_t}", f"%r_{tag}: {ty('f32', b)}"]
        wide = f"%y_{tag}"
        if sent_elt != "f32":
            ops.append(f"%b_{tag} = coco.cast %y_{tag} : {result_t} -> {ty('f32', b)}")
            wide = f"%b_{tag}"
        ops += [
            f"%m_{tag} = coco.mul {wide}, %w_{tag} : {ty('f32', b)}, {w_t} -> {ty('f32', b)}",
            f"%z_{tag} = coco.add %m_{tag}, %r_{tag} : {ty('f32', b)}",
        ]
        result, result_t = f"%z_{tag}", ty("f32", b)
    return args, ops, f"{result}|{result_t}"


@functools.cache
def family(elt: str) -> Program:
    """Every pair and variant of `elt` as one function."""
    args: list[str] = []
    ops: list[str] = []
    results: list[str] = []
    for (rank, a, b), variant in CASES:
        more_args, more_ops, result = case(elt, rank, a, b, variant)
        args += more_args
        ops += more_ops
        results.append(result)
    names = ", ".join(r.split("|")[0] for r in results)
    types = ", ".join(r.split("|")[1] for r in results)
    body = "\n  ".join(ops)
    text = f"""
func.func @family({", ".join(args)}) -> ({types}) attributes {{coco.grid = #coco.grid<[?]>}} {{
  {body}
  func.return {names} : {types}
}}"""
    return Program(parse_module(text))


def fused(p: Program) -> Program:
    return apply_pipeline(p, "coco-fuse{mode=all_to_all}")


def regions(p: Program) -> list[comm.FusedOp]:
    return [op for op in p.func.walk() if isinstance(op, comm.FusedOp)]


def check_against_sim(p: Program, q: Program, ranks: int, seed: int = 0) -> None:
    want = sim.run(p, None, ranks=ranks, seed=seed)
    plan = lower(q, ranks)
    assert not [s for s in plan.steps if isinstance(s, Collective)], "not one kernel"
    got = ThreadedExecutor(plan).run(want.inputs)
    for k, w in want.outputs.items():
        assert got[k].dtype == w.dtype, k
        assert np.array_equal(got[k], w, equal_nan=True), (ranks, k)


@pytest.mark.parametrize("elt", DTYPES)
def test_every_pair_and_side_matches_the_sim(elt):
    p = family(elt)
    q = fused(p)
    found = regions(q)
    assert len(found) == len(CASES)
    # producers and consumers went into the regions: nothing is computed outside them
    top = [op.name for op in q.func.body.block.ops]
    assert set(top) == {"comm.fused", "func.return"}, top
    for ranks in RANKS:
        check_against_sim(p, q, ranks, seed=ranks)


def test_one_launch_per_region_and_one_rank():
    q = fused(family("f32"))
    plan = lower(q, 4)
    launches = [s for s in plan.steps if isinstance(s, Launch)]
    assert len(launches) == len(regions(q))
    # kernels that differ only in their tensors' cuts share one text (boxes are arguments)
    assert len({s.kernel for s in launches}) < len(launches)
    check_against_sim(family("f32"), q, 1)


# --------------------------------------------------------------------------------------------
# The dispatch form, 2-D grids, updates, nodes
# --------------------------------------------------------------------------------------------

MORE = """
func.func @more(%d: !coco.tensor<12x5xf32, [replicated, local]>, %e: !coco.tensor<12x5xf32, [replicated, local]>,
                %g: !coco.tensor<9x10x7xf32, [sliced<0>, sliced<1>]>,
                %h: !coco.tensor<9x10x7xbf16, [sliced<0>, sliced<0>]>,
                %p: !coco.tensor<9x10x7xf32, [replicated, sliced<2>]>,
                %acc: !coco.tensor<9x10x7xf32, [replicated, sliced<0>]>,
                %v: !coco.tensor<12xf16, [replicated, local]>)
    -> (!coco.tensor<12x5xf32, [replicated, local]>, !coco.tensor<9x10x7xf32, [sliced<0>, sliced<2>]>,
        !coco.tensor<9x10x7xf32, [sliced<2>, sliced<2>]>, !coco.tensor<12xf16, [replicated, local]>)
    attributes {coco.grid = #coco.grid<[2, ?]>} {
  %d2 = coco.mul %d, %d : !coco.tensor<12x5xf32, [replicated, local]>
  %dx = comm.all_to_all %d2 over [1] : !coco.tensor<12x5xf32, [replicated, local]>
  %de = coco.add %dx, %e : !coco.tensor<12x5xf32, [replicated, local]>
  %gx = comm.all_to_all %g over [1] : !coco.tensor<9x10x7xf32, [sliced<0>, sliced<1>]> -> !coco.tensor<9x10x7xf32, [sliced<0>, sliced<2>]>
  %hx = comm.all_to_all %h : !coco.tensor<9x10x7xbf16, [sliced<0>, sliced<0>]> -> !coco.tensor<9x10x7xbf16, [sliced<2>, sliced<2>]>
  %hf = coco.cast %hx : !coco.tensor<9x10x7xbf16, [sliced<2>, sliced<2>]> -> !coco.tensor<9x10x7xf32, [sliced<2>, sliced<2>]>
  %px = comm.all_to_all %p over [1] : !coco.tensor<9x10x7xf32, [replicated, sliced<2>]> -> !coco.tensor<9x10x7xf32, [replicated, sliced<0>]>
  %pa = coco.add %px, %acc : !coco.tensor<9x10x7xf32, [replicated, sliced<0>]>
  coco.update %acc, %pa : !coco.tensor<9x10x7xf32, [replicated, sliced<0>]>
  coco.update %d, %de : !coco.tensor<12x5xf32, [replicated, local]>
  %vx = comm.all_to_all %v over [1] : !coco.tensor<12xf16, [replicated, local]>
  %vv = coco.neg %vx : !coco.tensor<12xf16, [replicated, local]>
  func.return %de, %gx, %hf, %vv : !coco.tensor<12x5xf32, [replicated, local]>, !coco.tensor<9x10x7xf32, [sliced<0>, sliced<2>]>, !coco.tensor<9x10x7xf32, [sliced<2>, sliced<2>]>, !coco.tensor<12xf16, [replicated, local]>
}"""


def test_dispatch_form_two_dimensional_grids_updates_and_vectors():
    p = Program(parse_module(MORE))
    q = fused(p)
    assert len(regions(q)) == 5
    for ranks in (2, 4, 6):
        want = sim.run(p, None, ranks=ranks, seed=ranks)
        plan = lower(q, ranks)
        # %acc is stored by its kernel; %d, which the sender's side reads, is copied after
        assert [s.dst.name for s in plan.steps if isinstance(s, Copy)] == ["d"]
        got = ThreadedExecutor(plan).run(want.inputs)
        assert {"acc", "d"} <= set(want.outputs)  # the updated arguments
        for k, w in want.outputs.items():
            assert np.array_equal(got[k], w), (ranks, k)


def test_groups_across_nodes_run_op_by_op():
    p = Program(parse_module(MORE))
    q = fused(p)
    config = LaunchConfig()
    plan = Lowering(q, q.grid.bind(4), config, nodes=(0, 0, 1, 1)).run()
    # the groups over axis 1 are {0, 1} and {2, 3}: within nodes; the grid-wide one spans them
    assert [s.op for s in plan.steps if isinstance(s, Collective)] == ["all_to_all"]
    want = sim.run(p, None, ranks=4, seed=5)
    got = ThreadedExecutor(plan).run(want.inputs)
    for k, w in want.outputs.items():
        assert np.array_equal(got[k], w), k


# --------------------------------------------------------------------------------------------
# The named schedule, the equivalence checker, NVRTC
# --------------------------------------------------------------------------------------------

MOE = """
func.func @moe(%x: !coco.tensor<8x6xf32, sliced<0>>, %s: !coco.tensor<f32>, %w: !coco.tensor<8x1xf32>,
               %r: !coco.tensor<8x6xf32, sliced<1>>) -> !coco.tensor<8x6xf32, sliced<0>>
    attributes {coco.grid = #coco.grid<[?]>} {
  %u = coco.mul %x, %s : !coco.tensor<8x6xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<8x6xf32, sliced<0>>
  %c = coco.cast %u : !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<8x6xbf16, sliced<0>>
  %y = comm.all_to_all %c : !coco.tensor<8x6xbf16, sliced<0>> -> !coco.tensor<8x6xbf16, sliced<1>>
  %b = coco.cast %y : !coco.tensor<8x6xbf16, sliced<1>> -> !coco.tensor<8x6xf32, sliced<1>>
  %m = coco.mul %b, %w : !coco.tensor<8x6xf32, sliced<1>>, !coco.tensor<8x1xf32> -> !coco.tensor<8x6xf32, sliced<1>>
  %z = coco.add %m, %r : !coco.tensor<8x6xf32, sliced<1>>
  %back = comm.all_to_all %z : !coco.tensor<8x6xf32, sliced<1>> -> !coco.tensor<8x6xf32, sliced<0>>
  %o = coco.add %back, %x : !coco.tensor<8x6xf32, sliced<0>>
  func.return %o : !coco.tensor<8x6xf32, sliced<0>>
}"""


def test_the_named_schedule_and_the_equivalence_checker():
    p = Program(parse_module(MOE))
    assert "fuse(a2a)" in named_schedules(p)
    q = apply_schedule(p, "fuse(a2a)")
    # dispatch: scale, cast, exchange, cast back, combine, residual; combine: exchange, add
    assert [len(list(r.body.block.ops)) for r in regions(q)] == [7, 3]
    report = check_equivalence(p, q, ranks=(1, 2, 3, 4))
    assert report.ok, report
    for ranks in (2, 3):
        check_against_sim(p, q, ranks, seed=ranks)


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_the_kernels_compile_with_nvrtc():
    for q in (apply_schedule(Program(parse_module(MOE)), "fuse(a2a)"), fused(family("bf16"))):
        plan = lower(q, 4)
        assert compile_cuda(plan.cuda_source, "sm_90", warnings_as_errors=True).binary
