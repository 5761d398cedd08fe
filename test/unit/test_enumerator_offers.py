"""An enumerator that offers only what runs (issue #25, item 6): the pipelines printed for a
program's schedules replay in coco-opt on its printed text (stable names for unnamed values);
every schedule listed launches at the rank counts it is listed for; a program whose only
all_reduce is of a scalar is told so."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from conftest import FULL, example_params
from hypothesis import HealthCheck, given, settings
from program_generator import GeneratedProgram, programs

from coconet.core.program import CocoError, Program, load, parse_module
from coconet.lowering.lower_to_plan import lower
from coconet.schedule import (
    apply_schedule,
    enumerate_scheduled_programs,
    named_schedules,
    why_not_offered,
)
from coconet.tools.coco_opt import CocoOptMain

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FRONTEND_EXAMPLES = sorted(
    p for p in EXAMPLES.glob("*.py") if re.search(r"^program = |^def build\(", p.read_text(), re.M)
)
SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": False,
}


def coco_opt(text: str, pipeline: str, tmp: Path) -> str:
    """`coco-opt FILE -p PIPELINE` on `text`, in this process: its output."""
    path = tmp / "printed.mlir"
    path.write_text(text)
    out = io.StringIO()
    with redirect_stdout(out):
        CocoOptMain([str(path), "-p", pipeline]).run()
    return out.getvalue()


def assert_replays(program: Program, tmp: Path) -> int:
    """Every offered named schedule's pipeline, run by coco-opt on the program's printed
    text, gives the IR apply_schedule gives."""
    offers = named_schedules(program)
    text = program.print()  # a program not built by the front end nor loaded: named now
    for name, pipeline in offers.items():
        want = apply_schedule(program, name).print()
        got = coco_opt(text, pipeline, tmp) if pipeline else text
        assert got.strip() == want.strip(), f"{name}: {pipeline}"
    return len(offers)


def strip_names(module_text: str) -> Program:
    """The program with every op result unnamed (arguments keep their names), as a front-end
    program built from expressions is."""
    program = Program(parse_module(module_text))
    for op in program.func.walk():
        for r in op.results:
            r.name_hint = None
    return program


# -- 1. printed pipelines replay -------------------------------------------------------------


@pytest.mark.parametrize("path", FRONTEND_EXAMPLES, ids=lambda p: p.stem)
def test_example_pipelines_replay_on_the_printed_program(path: Path, tmp_path: Path):
    assert_replays(load(path), tmp_path)


UNNAMED = """
from coconet import frontend
from coconet.frontend import F32, AllReduce, Local, MatMul, Replicated, Sliced, Tensor, Update

@frontend.program(grid=[None])
def step(g: Tensor(F32, [16, 8], Local), w: Tensor(F32, [16, 8], Replicated),
         m: Tensor(F32, [16, 8], Replicated)):
    Update(w, w - 0.1 * Update(m, 0.9 * m + AllReduce("+", g)))

@frontend.program(grid=[None])
def layer(x: Tensor(F32, [8, 16], Sliced(1)), a: Tensor(F32, [16, 4], Sliced(0)),
          b: Tensor(F32, [8, 4], Replicated)):
    Update(b, AllReduce("+", MatMul(x, a)) + b)
"""


def test_front_end_values_without_python_names_replay(tmp_path: Path):
    """The all_reduce (and the matmul) of an expression have no Python name: the front end
    names them (`ar0`, `mm0`), the printed program carries the names, and the pipelines that
    target them (`coco-fuse{mode=all_reduce ops=ar0_rs}`) replay on it."""
    ns: dict = {}
    exec(compile(UNNAMED, "unnamed_program.py", "exec"), ns)
    for fn, want in (("step", ("%ar0 = comm.all_reduce",)), ("layer", ("%mm0 = coco.matmul",))):
        program = ns[fn]
        text = program.print()
        assert all(w in text for w in want), text
        assert "fuse(rs-c-ag)" in named_schedules(program)
        assert "ar0_rs" in named_schedules(program)["fuse(rs-c-ag)"]
        assert assert_replays(program, tmp_path) >= 3


def test_loaded_and_hand_built_programs_name_their_targets(tmp_path: Path):
    """A .mlir program with numbered values is named on load; one built by hand is named when
    it is first scheduled (in place: names only), so its printed text replays after that."""
    text = (EXAMPLES / "model_parallel_mlp.mlir").read_text()
    numbered = re.sub(r"%(layer|total)\b", lambda m: {"layer": "%90", "total": "%91"}[m[1]], text)
    path = tmp_path / "numbered.mlir"
    path.write_text(numbered)
    assert "%mm0 = coco.matmul" in load(path).print()
    assert_replays(load(path), tmp_path)
    by_hand = Program(parse_module(numbered))
    assert "%mm0" not in by_hand.print()
    offered = named_schedules(by_hand)
    assert "%mm0 = coco.matmul" in by_hand.print()
    assert any("mm0" in pipe for pipe in offered.values())
    assert_replays(by_hand, tmp_path)


@settings(max_examples=25, **SETTINGS)
@given(programs(max_ops=8, symmetric=False))
def test_random_program_pipelines_replay(tmp_path_factory, gen: GeneratedProgram):
    """Random programs, as generated (named) and with every op result unnamed."""
    tmp = tmp_path_factory.mktemp("replay")
    assert_replays(gen.program, tmp)
    assert_replays(strip_names(gen.text), tmp)


# -- 2. offered only where it launches -------------------------------------------------------

# A vocab-parallel cross-entropy's row max: the partials are [rows, 1], so a split of dim 1
# (a size-1 dim) cannot launch on 2 or more ranks.
ROW_MAX = """
func.func @row_max(%x: !coco.tensor<8x6xf32, [sliced<1>]>) -> !coco.tensor<8x6xf32, [sliced<1>]> attributes {coco.grid = #coco.grid<[?]>} {
  %m = coco.reduce_dims max %x dims [1] keepdims : !coco.tensor<8x6xf32, [sliced<1>]> -> !coco.tensor<8x1xf32, [local]>
  %mx = comm.all_reduce max %m : !coco.tensor<8x1xf32, [local]> -> !coco.tensor<8x1xf32>
  %y = coco.sub %x, %mx : !coco.tensor<8x6xf32, [sliced<1>]>, !coco.tensor<8x1xf32> -> !coco.tensor<8x6xf32, [sliced<1>]>
  func.return %y : !coco.tensor<8x6xf32, [sliced<1>]>
}
"""


def assert_listed_schedules_lower(
    program: Program, ranks=None, allowed: tuple[str, ...] = ()
) -> int:
    """Every enumerated and every named schedule lowers at each rank count it is listed for
    (refusals naming a rule of `allowed` excepted)."""
    offers = named_schedules(program, explain=True, ranks=ranks)
    counts = offers.ranks
    listed = [(n, s) for n, _, s in enumerate_scheduled_programs(program, ranks=ranks)]
    listed += [(n, apply_schedule(program, n)) for n in offers.offered]
    for name, scheduled in listed:
        for n in counts:
            try:
                lower(scheduled, n)
            except CocoError as e:
                if any(f"[{rule}]" in str(e) for rule in allowed):
                    continue
                raise AssertionError(f"{name} is listed for {counts} but at {n}: {e}") from None
    return len(listed)


def test_a_split_of_a_size_one_dim_is_not_offered():
    program = Program(parse_module(ROW_MAX))
    everywhere = [n for n, _, _ in enumerate_scheduled_programs(program, ranks=1)]
    listed = [n for n, _, _ in enumerate_scheduled_programs(program)]
    assert any("dim=1" in n for n in everywhere)
    assert not any("dim=1" in n for n in listed)
    assert set(listed) < set(everywhere)
    assert named_schedules(program, explain=True).ranks == (1, 2, 4)  # 6 columns: not 8
    assert_listed_schedules_lower(program)


def test_named_schedules_dropped_for_a_rank_count_say_so():
    """sgd over 4 elements at 8 ranks: rs-c-ag would slice them 8 ways."""
    text = (EXAMPLES / "sgd.mlir").read_text()
    small = text.replace("4096", "4")
    program = Program(parse_module(small))
    assert "rs-c-ag" in named_schedules(program, ranks=(1, 2, 4))
    offers = named_schedules(program, explain=True, ranks=8)
    assert "rs-c-ag" not in offers.offered
    assert "ar-c" in offers.offered
    why = offers.dropped["rs-c-ag"]
    assert why.startswith("[schedule-ranks] it cannot launch on 8 rank(s)"), why
    assert "[empty-slice]" in why
    assert why_not_offered(program, "rs-c-ag", ranks=8) == why
    assert why_not_offered(program, "rs-c-ag", ranks=[2, 4]) is None
    with pytest.raises(CocoError, match=r"\[schedule-ranks\]"):
        named_schedules(program, ranks=0)


@pytest.mark.parametrize("path", example_params(FRONTEND_EXAMPLES), ids=lambda p: p.stem)
def test_example_schedules_lower_where_listed(path: Path):
    assert_listed_schedules_lower(load(path), ranks=(1, 2, 4))


@settings(max_examples=20 if FULL else 4, **SETTINGS)
@given(programs(max_ops=8, symmetric=False))
def test_random_program_schedules_lower_where_listed(gen: GeneratedProgram):
    # an overlap's chunks need rows in every rank's piece: checked at launch, so a 4x8
    # matmul overlapped in 2 chunks after a split is not listed for 4 ranks
    assert_listed_schedules_lower(gen.program)


# -- 4. a scalar all_reduce ------------------------------------------------------------------


def test_a_scalar_all_reduce_is_named_as_the_reason():
    program = load(EXAMPLES / "fp8_allgather_matmul.py")
    for name in ("ar-c", "rs-c-ag", "fuse(rs-c-ag)"):
        why = why_not_offered(program, name) or ""
        assert "lacks" not in why, why
        assert "needs an all_reduce of a tensor" in why
        assert "only all_reduce (%amax (comm.all_reduce)) reduces a scalar" in why
    none = Program(parse_module(NO_ALL_REDUCE))
    assert "which @f lacks" in (why_not_offered(none, "ar-c") or "")


NO_ALL_REDUCE = """
func.func @f(%x: !coco.tensor<8xf32>, %y: !coco.tensor<8xf32>) -> !coco.tensor<8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %a = coco.add %x, %y : !coco.tensor<8xf32>
  func.return %a : !coco.tensor<8xf32>
}
"""


# -- a lone all_reduce, named or not ---------------------------------------------------------


@pytest.mark.parametrize("name", ["%total", "%0"])
def test_a_lone_all_reduce_gets_the_same_schedules_named_or_not(name: str):
    """rs-c-ag's recipe reorders the computation on an all_reduce's result before its gather;
    a lone all_reduce (a result returned as is, coco-bench's) has none, and was refused when
    named ([reorder-nothing]) but split when not: a schedule must not depend on a name."""
    import numpy as np

    from coconet.runtime.sim import run as sim_run

    text = f"""
    func.func @lone(%x: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32>
        attributes {{coco.grid = #coco.grid<[?]>}} {{
      {name} = comm.all_reduce sum %x : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
      func.return {name} : !coco.tensor<64xf32>
    }}
    """
    program = Program(parse_module(text))
    offered = named_schedules(program)
    assert {"ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)"} <= set(offered)
    x = np.arange(3 * 64, dtype=np.float32).reshape(3, 64)
    want = x.sum(axis=0)
    for schedule in offered:
        got = sim_run(apply_schedule(program, schedule), {"x": x}, ranks=3).outputs
        assert np.array_equal(next(iter(got.values())), want), schedule


# -- 5. the enumerator compares programs by structure ----------------------------------------


@pytest.mark.parametrize("stem", ["adam_clip_global_norm", "model_parallel_mlp", "moe_layer"])
def test_structure_is_equal_exactly_when_the_printed_text_is(stem: str):
    """Program.structure(), which the enumerator dedupes and detects no-op steps by, tells
    programs apart exactly as their printed texts do: across every enumerated schedule, a
    clone, a renamed argument and a new attribute."""
    from xdsl.dialects.builtin import StringAttr

    program = load(EXAMPLES / f"{stem}.mlir")
    scheduled = [s for _n, _p, s in enumerate_scheduled_programs(program)]
    variants = [program, program.clone(), *scheduled]
    renamed = program.clone()
    next(a for a in renamed.func.body.block.args if a.name_hint).name_hint = "renamed"
    attributed = program.clone()
    attributed.func.attributes["coco.note"] = StringAttr("x")
    variants += [renamed, attributed]
    keys = [(v.structure(), v.print()) for v in variants]
    for s1, p1 in keys:
        for s2, p2 in keys:
            assert (s1 == s2) == (p1 == p2)
    assert len({s.structure() for s in scheduled}) == len(scheduled)
