"""The translation-validation checker (coconet/equivalence.py) and coco-opt
--verify-equivalence: equal programs pass; each kind of semantic change is caught and named.

Every "must fail" test here would pass if the checker stopped detecting mismatches, so each
asserts the exact output, rank counts and kind reported, not merely `not report.ok`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from coconet.core.program import Program, parse_module
from coconet.dialects import coco
from coconet.equivalence import (
    EXACT,
    TOLERANCES,
    EquivalenceError,
    check_equivalence,
    check_module_equivalence,
)

RANKS = (1, 2, 4)


def prog(text: str) -> Program:
    return Program(parse_module(text))


SGD = """
func.func @sgd(%g: !coco.tensor<16xf32, local>, %w: !coco.tensor<16xf32>, %lr: !coco.tensor<f32>) {
  %g1 = comm.all_reduce sum %g : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
  %s = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %w1 = coco.sub %w, %s : !coco.tensor<16xf32>
  coco.update %w, %w1 : !coco.tensor<16xf32>
  func.return
}
"""

# SGD after split + reorder, written by hand: the same meaning, bit for bit.
SGD_SPLIT = """
func.func @sgd(%g: !coco.tensor<16xf32, local>, %w: !coco.tensor<16xf32>, %lr: !coco.tensor<f32>) {
  %rs = comm.reduce_scatter sum %g : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
  %s = coco.mul %lr, %rs : !coco.tensor<f32>, !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32, sliced<0>>
  %ws = coco.slice %w : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
  %w1 = coco.sub %ws, %s : !coco.tensor<16xf32, sliced<0>>
  %w2 = comm.all_gather %w1 : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
  coco.update %w, %w2 : !coco.tensor<16xf32>
  func.return
}
"""

ADAM = """
func.func @adam(%g: !coco.tensor<16xf32, local>, %w: !coco.tensor<16xf32>, %m: !coco.tensor<16xf32>) {
  %g1 = comm.all_reduce sum %g : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
  %b = coco.constant 0.9 : !coco.tensor<f32>
  %bm = coco.mul %b, %m : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %c = coco.constant 0.1 : !coco.tensor<f32>
  %cg = coco.mul %c, %g1 : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %m1 = coco.add %bm, %cg : !coco.tensor<16xf32>
  %lr = coco.constant 0.01 : !coco.tensor<f32>
  %d = coco.mul %lr, %m1 : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<16xf32>
  coco.update %m, %m1 : !coco.tensor<16xf32>
  coco.update %w, %w1 : !coco.tensor<16xf32>
  func.return
}
"""

# Adam after split, reorder and as-slice: %m is now kept sliced (its argument type changed),
# which compares equal because outputs are logical values.
ADAM_AS_SLICE = """
func.func @adam(%g: !coco.tensor<16xf32, local>, %w: !coco.tensor<16xf32>, %m: !coco.tensor<16xf32, sliced<0>>) {
  %rs = comm.reduce_scatter sum %g : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
  %b = coco.constant 0.9 : !coco.tensor<f32>
  %bm = coco.mul %b, %m : !coco.tensor<f32>, !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32, sliced<0>>
  %c = coco.constant 0.1 : !coco.tensor<f32>
  %cg = coco.mul %c, %rs : !coco.tensor<f32>, !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32, sliced<0>>
  %m1 = coco.add %bm, %cg : !coco.tensor<16xf32, sliced<0>>
  %lr = coco.constant 0.01 : !coco.tensor<f32>
  %d = coco.mul %lr, %m1 : !coco.tensor<f32>, !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32, sliced<0>>
  %ws = coco.slice %w : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
  %w1 = coco.sub %ws, %d : !coco.tensor<16xf32, sliced<0>>
  %w2 = comm.all_gather %w1 : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
  coco.update %m, %m1 : !coco.tensor<16xf32, sliced<0>>
  coco.update %w, %w2 : !coco.tensor<16xf32>
  func.return
}
"""

DROPOUT = """
func.func @layer(%x: !coco.tensor<4x8xf32, local>, %b: !coco.tensor<8xf32>) -> !coco.tensor<4x8xf32> {
  %s = comm.all_reduce sum %x : !coco.tensor<4x8xf32, local> -> !coco.tensor<4x8xf32>
  %h = coco.add %s, %b : !coco.tensor<4x8xf32>, !coco.tensor<8xf32> -> !coco.tensor<4x8xf32>
  %out = coco.dropout %h, 0.5 seed 7 : !coco.tensor<4x8xf32>
  func.return %out : !coco.tensor<4x8xf32>
}
"""


# -- equal programs ----------------------------------------------------------------------------


def test_a_program_equals_itself() -> None:
    report = check_equivalence(prog(SGD), prog(SGD))
    assert report.ok, str(report)
    assert report.checked == [(1, 0), (1, 1), (2, 0), (2, 1), (4, 0), (4, 1)]
    assert report.outputs == ["w"]
    assert "equivalent (bit-exact" in str(report)


def test_split_schedule_is_bit_identical() -> None:
    report = check_equivalence(prog(SGD), prog(SGD_SPLIT))
    assert report.ok, str(report)


def test_layout_change_of_an_argument_compares_as_logical_value() -> None:
    report = check_equivalence(prog(ADAM), prog(ADAM_AS_SLICE))
    assert report.ok, str(report)
    assert report.outputs == ["m", "w"]


def test_returned_values_match_by_position_not_name() -> None:
    renamed = DROPOUT.replace("%out", "%result_of_pass")
    report = check_equivalence(prog(DROPOUT), prog(renamed))
    assert report.ok, str(report)


def test_nan_equals_nan_in_exact_mode() -> None:
    text = """
func.func @f(%x: !coco.tensor<8xf32>) -> !coco.tensor<8xf32> {
  %n = coco.neg %x : !coco.tensor<8xf32>
  %l = coco.log %n : !coco.tensor<8xf32>
  func.return %l : !coco.tensor<8xf32>
}
"""
    p = prog(text)
    out = __import__("coconet").run(p, None, ranks=1, inplace=False).outputs["l"]
    assert np.isnan(out).all()  # the premise: the program computes NaNs
    assert check_equivalence(p, prog(text)).ok


# -- semantic changes are caught, and named -------------------------------------------------------


def test_changed_constant_is_caught_at_every_rank_count() -> None:
    report = check_equivalence(prog(ADAM), prog(ADAM.replace("0.01", "0.02")))
    assert not report.ok
    assert report.mismatched_outputs() == ["w"]  # %m does not depend on the learning rate
    assert {(m.ranks, m.seed) for m in report.mismatches} == {(n, s) for n in RANKS for s in (0, 1)}
    for m in report.mismatches:
        assert m.kind == "value"
        assert m.rank == 0  # replicated: every rank holds the wrong value, rank 0 first
        assert m.max_abs_error > 0
        assert m.max_rel_error > 0
        assert m.num_different == m.num_elements == 16
    text = str(report)
    assert "NOT equivalent" in text
    assert "output 'w' at 4 rank(s), seed 0" in text
    assert "first differing rank 0" in text
    assert "max abs error" in text


def test_dropped_update_is_a_missing_output() -> None:
    after = ADAM.replace("  coco.update %m, %m1 : !coco.tensor<16xf32>\n", "")
    report = check_equivalence(prog(ADAM), prog(after))
    assert report.mismatched_outputs() == ["m"]
    assert all(m.kind == "missing" for m in report.mismatches)
    assert len(report.mismatches) == len(RANKS) * 2
    assert "no longer produces this updated argument" in str(report)


def test_extra_output_is_a_mismatch() -> None:
    after = DROPOUT.replace(
        "func.return %out : !coco.tensor<4x8xf32>",
        "func.return %out, %h : !coco.tensor<4x8xf32>, !coco.tensor<4x8xf32>",
    ).replace("-> !coco.tensor<4x8xf32> {", "-> (!coco.tensor<4x8xf32>, !coco.tensor<4x8xf32>) {")
    report = check_equivalence(prog(DROPOUT), prog(after))
    assert report.mismatched_outputs() == ["h"]
    assert all(m.kind == "extra" for m in report.mismatches)


def test_changed_dropout_seed_is_caught() -> None:
    report = check_equivalence(prog(DROPOUT), prog(DROPOUT.replace("seed 7", "seed 8")))
    assert report.mismatched_outputs() == ["out"]
    assert {m.ranks for m in report.mismatches} == set(RANKS)
    # Different masks: some elements kept in one and dropped in the other.
    assert all(0 < m.num_different < m.num_elements for m in report.mismatches)


def test_wrong_reduction_kind_is_caught_where_it_matters() -> None:
    after = SGD.replace("comm.all_reduce sum", "comm.all_reduce max")
    report = check_equivalence(prog(SGD), prog(after))
    assert report.mismatched_outputs() == ["w"]
    # On one rank sum and max of one value agree: the checker must not invent a difference
    # there, and must find it on 2 and 4 ranks.
    assert {m.ranks for m in report.mismatches} == {2, 4}
    assert (1, 0) in report.checked


def test_first_differing_rank_is_the_rank_holding_the_wrong_piece() -> None:
    before = """
func.func @f(%x: !coco.tensor<16xf32, sliced<0>>) -> !coco.tensor<16xf32, sliced<0>> {
  %c = coco.constant 0.05 : !coco.tensor<f32>
  %y = coco.max %x, %c : !coco.tensor<16xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<16xf32, sliced<0>>
  func.return %y : !coco.tensor<16xf32, sliced<0>>
}
"""
    after = before.replace("0.05", "0.5")
    x = np.array([0.9] * 4 + [0.1] * 12, dtype=np.float32)  # rank 0's quarter is above 0.5
    report = check_equivalence(prog(before), prog(after), ranks=(4,), inputs={"x": x})
    (m,) = report.mismatches
    assert (m.output, m.ranks, m.seed, m.rank) == ("y", 4, None, 1)
    assert m.num_different == 12
    assert m.max_abs_error == pytest.approx(0.4, rel=1e-6)
    assert "first differing rank 1" in str(report)


def test_inputs_may_be_a_function_of_ranks_and_seed() -> None:
    seen = []

    def inputs(ranks: int, seed: int) -> dict[str, np.ndarray]:
        seen.append((ranks, seed))
        rng = np.random.default_rng(seed)
        return {
            "g": rng.random((ranks, 16), dtype=np.float32),
            "w": rng.random(16, dtype=np.float32),
            "lr": np.float32(0.5),
        }

    assert check_equivalence(prog(SGD), prog(SGD_SPLIT), inputs=inputs).ok
    assert seen == [(n, s) for n in RANKS for s in (0, 1)]


# -- exactness and tolerances ---------------------------------------------------------------------

NUDGE = """
func.func @f(%x: !coco.tensor<16xf32>) -> !coco.tensor<16xf32> {
  %c = coco.constant 1.0e-07 : !coco.tensor<f32>
  %y = coco.add %x, %c : !coco.tensor<16xf32>, !coco.tensor<f32> -> !coco.tensor<16xf32>
  func.return %y : !coco.tensor<16xf32>
}
"""


def test_exact_by_default_tolerant_on_request() -> None:
    # x + 1e-7 moves x in [0.1, 1) by at most an ulp or two: not bit-identical, but well
    # within the f32 tolerance.
    before = NUDGE.replace("1.0e-07", "0.0")
    exact = check_equivalence(prog(before), prog(NUDGE))
    assert not exact.ok
    assert exact.mismatched_outputs() == ["y"]
    assert max(m.max_rel_error for m in exact.mismatches) < 1e-6
    assert check_equivalence(prog(before), prog(NUDGE), exact=False).ok
    # ... and the tolerance is not a blank cheque:
    big = NUDGE.replace("1.0e-07", "1.0e-03")
    assert not check_equivalence(prog(before), prog(big), exact=False).ok


def test_signed_zero_differs_bitwise_only() -> None:
    text = """
func.func @f(%x: !coco.tensor<8xf32>) -> !coco.tensor<8xf32> {
  %z = coco.constant 0.0 : !coco.tensor<f32>
  %y = coco.mul %x, %z : !coco.tensor<8xf32>, !coco.tensor<f32> -> !coco.tensor<8xf32>
  func.return %y : !coco.tensor<8xf32>
}
"""
    after = text.replace("coco.constant 0.0", "coco.constant -0.0")
    report = check_equivalence(prog(text), prog(after), ranks=(1,), seeds=(0,))
    (m,) = report.mismatches
    assert m.max_abs_error == 0.0
    assert "signed zero" in m.detail
    assert check_equivalence(prog(text), prog(after), exact=False).ok


def test_tolerance_table_covers_every_element_type() -> None:
    assert set(TOLERANCES) == set(coco.ELEMENT_TYPE_NAMES)
    for name in ("i1", "i32", "i64"):
        assert TOLERANCES[name] == EXACT
    assert TOLERANCES["f16"].rtol == 2e-3
    assert TOLERANCES["bf16"].rtol == 1.6e-2
    assert TOLERANCES["f32"].rtol == 1e-5
    assert TOLERANCES["f64"].rtol == 1e-12


def test_integer_outputs_compare_exactly_even_when_tolerant() -> None:
    text = """
func.func @f(%g: !coco.tensor<8xi32, local>) -> !coco.tensor<8xi32> {
  %s = comm.all_reduce sum %g : !coco.tensor<8xi32, local> -> !coco.tensor<8xi32>
  func.return %s : !coco.tensor<8xi32>
}
"""
    after = text.replace("%s = comm.all_reduce sum %g", "%t = comm.all_reduce sum %g").replace(
        "func.return %s",
        "%one = coco.constant 1 : !coco.tensor<i32>\n"
        "  %s = coco.add %t, %one : !coco.tensor<8xi32>, !coco.tensor<i32> -> !coco.tensor<8xi32>\n"
        "  func.return %s",
    )
    assert not check_equivalence(prog(text), prog(after), exact=False).ok


# -- rank counts a program cannot take -------------------------------------------------------------


def test_grid_that_cannot_take_a_rank_count_is_skipped() -> None:
    text = """
func.func @p(%x: !coco.tensor<8xf32, [local, local]>) -> !coco.tensor<8xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %s = comm.all_reduce sum %x over [1] : !coco.tensor<8xf32, [local, local]> -> !coco.tensor<8xf32, [local, replicated]>
  func.return %s : !coco.tensor<8xf32, [local, replicated]>
}
"""
    report = check_equivalence(prog(text), prog(text))
    assert report.ok
    assert [(s.ranks, s.program) for s in report.skipped] == [(1, "before")]
    assert "multiple of 2" in report.skipped[0].reason
    assert {n for n, _ in report.checked} == {2, 4}


def test_an_overlap_with_too_few_rows_narrows() -> None:
    """An overlap needs `chunks` rows in every rank's piece, which a launch checks
    ([overlap-chunks]): a rank count that leaves fewer is a narrowing, listed, not a failure
    (the random-pipeline search reported it as a changed meaning)."""
    before = """
func.func @f(%x: !coco.tensor<4x8xf32, [replicated, sliced<1>]>, %w: !coco.tensor<8x4xf32, [replicated, sliced<0>]>) -> !coco.tensor<4x4xf32> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %m = coco.matmul %x, %w : !coco.tensor<4x8xf32, [replicated, sliced<1>]>, !coco.tensor<8x4xf32, [replicated, sliced<0>]> -> !coco.tensor<4x4xf32, [replicated, local]>
  %s = comm.all_reduce sum %m over [1] : !coco.tensor<4x4xf32, [replicated, local]> -> !coco.tensor<4x4xf32>
  func.return %s : !coco.tensor<4x4xf32>
}
"""
    from coconet.schedule.api import apply_pipeline

    written = prog(before)
    after = apply_pipeline(written, "coco-split-allreduce,coco-overlap{chunks=4}")
    report = check_equivalence(written, after, ranks=(2, 4))
    assert report.ok, str(report)
    assert [(s.ranks, s.program) for s in report.narrowed] == [(4, "after")]
    assert "[overlap-chunks]" in report.narrowed[0].reason
    assert {n for n, _ in report.checked} == {2}


def test_uneven_slices_are_checked_and_empty_ones_narrow() -> None:
    # 3 elements over 4 ranks: a rank would hold nothing
    before = """
func.func @f(%g: !coco.tensor<3xf32, local>) -> !coco.tensor<3xf32> {
  %s = comm.all_reduce sum %g : !coco.tensor<3xf32, local> -> !coco.tensor<3xf32>
  func.return %s : !coco.tensor<3xf32>
}
"""
    after = """
func.func @f(%g: !coco.tensor<3xf32, local>) -> !coco.tensor<3xf32> {
  %r = comm.reduce_scatter sum %g : !coco.tensor<3xf32, local> -> !coco.tensor<3xf32, sliced<0>>
  %s = comm.all_gather %r : !coco.tensor<3xf32, sliced<0>> -> !coco.tensor<3xf32>
  func.return %s : !coco.tensor<3xf32>
}
"""
    report = check_equivalence(prog(before), prog(after))
    assert report.ok
    assert [(s.ranks, s.program) for s in report.narrowed] == [(4, "after")]
    assert "empty-slice" in report.narrowed[0].reason
    # 6 elements over 4 ranks: uneven slices (2, 2, 1, 1), compared like any other
    six = [prog(text.replace("3xf32", "6xf32")) for text in (before, after)]
    uneven = check_equivalence(*six)
    assert uneven.ok
    assert not uneven.narrowed
    assert not uneven.skipped
    assert 4 in {n for n, _ in uneven.checked}
    sliced_arg = before.replace(
        "%g: !coco.tensor<3xf32, local>", "%g: !coco.tensor<3xf32, sliced<0>>"
    )
    sliced_arg = sliced_arg.replace(
        "comm.all_reduce sum %g : !coco.tensor<3xf32, local>",
        "comm.all_gather %g : !coco.tensor<3xf32, sliced<0>>",
    )
    report = check_equivalence(prog(sliced_arg), prog(sliced_arg))
    assert [(s.ranks, s.program) for s in report.skipped] == [(4, "before")]


# -- the transformed program does not run, or cannot take the inputs ------------------------------


def test_transformed_program_that_fails_to_run_is_a_mismatch() -> None:
    before = """
func.func @f(%g: !coco.tensor<8xf32, local>) -> !coco.tensor<8xf32> {
  %b = comm.broadcast %g root 0 : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return %b : !coco.tensor<8xf32>
}
"""
    report = check_equivalence(prog(before), prog(before.replace("root 0", "root 3")))
    errors = [m for m in report.mismatches if m.kind == "error"]
    assert {m.ranks for m in errors} == {1, 2}  # groups of 1 and 2 ranks have no rank 3
    assert "fails to run" in str(report)
    assert {m.ranks for m in report.mismatches if m.kind == "value"} == {4}


def test_signature_change_is_a_mismatch() -> None:
    after = SGD.replace("%g", "%grad")
    report = check_equivalence(prog(SGD), prog(after))
    assert report.mismatches
    assert all(m.kind == "signature" for m in report.mismatches)
    assert "cannot take the original's inputs" in str(report)


def test_module_check_reports_a_removed_function() -> None:
    two = SGD + DROPOUT
    reports = check_module_equivalence(parse_module(two), parse_module(SGD))
    assert [r.function for r in reports] == ["sgd", "layer"]
    assert reports[0].ok
    assert not reports[1].ok
    assert "removed the function" in str(reports[1])
    with pytest.raises(EquivalenceError, match="removed the function"):
        reports[1].raise_if_failed()


# -- coco-opt --verify-equivalence -----------------------------------------------------------------


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "prog.mlir"
    path.write_text(text)
    return str(path)


class BreakLearningRatePass(ModulePass):
    """Test-only: doubles every f32 constant, which changes any optimizer's meaning."""

    name = "test-break-constants"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from xdsl.dialects.builtin import FloatAttr, f64

        for o in op.walk():
            if isinstance(o, coco.ConstantOp) and isinstance(o.value, FloatAttr):
                o.properties["value"] = FloatAttr(o.number * 2, f64)


@pytest.fixture
def broken_pass(monkeypatch: pytest.MonkeyPatch) -> str:
    from coconet.tools import coco_opt

    real = coco_opt.get_all_passes

    def with_broken():
        return {**real(), BreakLearningRatePass.name: lambda: BreakLearningRatePass}

    monkeypatch.setattr(coco_opt, "get_all_passes", with_broken)
    return BreakLearningRatePass.name


def test_cli_mismatch_reports_and_exits_1(tmp_path, capsys, broken_pass: str) -> None:
    from coconet.tools.coco_opt import main

    path = _write(tmp_path, ADAM)
    # Without the flag the broken pass goes unnoticed: that is what the flag is for.
    main([path, "-p", broken_pass])
    assert "coco.constant 1.8" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main([path, "-p", broken_pass, "--verify-equivalence"])
    assert e.value.code == 1
    out, err = capsys.readouterr()
    assert out == ""  # no IR for a pipeline that changed the meaning
    assert "Traceback" not in err
    assert err.startswith("coco-opt: error: --verify-equivalence: the pipeline ")
    assert "changed the meaning of @adam" in err
    assert "output 'm' at 1 rank(s), seed 0" in err
    assert "output 'w'" in err
    assert "first differing rank 0" in err
    assert "max abs error" in err


def test_cli_success_prints_only_the_ir(tmp_path, capsys) -> None:
    from coconet.tools.coco_opt import main

    path = _write(tmp_path, ADAM)
    main([path, "-p", "cse", "--verify-equivalence", "--equivalence-ranks", "2,4"])
    out, err = capsys.readouterr()
    assert out.startswith("builtin.module {")
    assert "func.func @adam" in out
    assert err == ""


def test_cli_options(tmp_path, capsys, broken_pass: str) -> None:
    from coconet.tools.coco_opt import main

    path = _write(tmp_path, ADAM)
    with pytest.raises(SystemExit):
        main(
            [
                path,
                "-p",
                broken_pass,
                "--verify-equivalence",
                "--equivalence-ranks",
                "2",
                "--equivalence-seeds",
                "5",
            ]
        )
    err = capsys.readouterr().err
    assert "at 2 rank(s), seed 5" in err
    assert "at 1 rank(s)" not in err
    # A [2, ?] grid on 1 rank only: nothing compared is an error, not a silent pass.
    grid2 = _write(
        tmp_path,
        """
func.func @p(%x: !coco.tensor<8xf32, [local, local]>) -> !coco.tensor<8xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %s = comm.all_reduce sum %x over [1] : !coco.tensor<8xf32, [local, local]> -> !coco.tensor<8xf32, [local, replicated]>
  func.return %s : !coco.tensor<8xf32, [local, replicated]>
}
""",
    )
    with pytest.raises(SystemExit) as e:
        main([grid2, "--verify-equivalence", "--equivalence-ranks", "1"])
    assert e.value.code == 1
    assert "compared nothing" in capsys.readouterr().err


def test_outputs_the_sim_cannot_tell_apart_are_reported() -> None:
    # Name hints need not be unique: two different returned values both hinted `y`.
    p = prog(DROPOUT)
    ret = p.func.body.block.last_op
    h = ret.operands[0].owner.input
    from xdsl.dialects import func as func_dialect

    new_ret = func_dialect.ReturnOp(ret.operands[0], h)
    p.func.body.block.insert_op_before(new_ret, ret)
    ret.detach()
    ret.erase()
    p.func.update_function_type()
    new_ret.operands[0].name_hint = "y"
    h.name_hint = "y"
    report = check_equivalence(prog(DROPOUT), p)
    assert [m.kind for m in report.mismatches] == ["ambiguous"]
    assert "cannot tell apart" in str(report)


def test_cli_sim_failure_is_one_clear_error(tmp_path, capsys, monkeypatch) -> None:
    from coconet import equivalence
    from coconet.tools.coco_opt import main

    def crash(*args, **kwargs):
        raise ValueError("the sim fell over")

    monkeypatch.setattr(equivalence, "check_module_equivalence", crash)
    with pytest.raises(SystemExit) as e:
        main([_write(tmp_path, SGD), "--verify-equivalence"])
    assert e.value.code == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    assert "the sim cannot run the original program" in err
    assert "the sim fell over" in err


# -- reassociated reductions (docs/architecture.md §3.4: tolerance where the order changes) ----

FULL_SUM = """
func.func @f(%x: !coco.tensor<16xf32>, %y: !coco.tensor<16xf32>) -> (!coco.tensor<f32>, !coco.tensor<16xf32>) {
  %s = coco.reduce sum %x : !coco.tensor<16xf32> -> !coco.tensor<f32>
  %c = coco.constant 3.0 : !coco.tensor<f32>
  %z = coco.mul %y, %c : !coco.tensor<16xf32>, !coco.tensor<f32> -> !coco.tensor<16xf32>
  func.return %s, %z : !coco.tensor<f32>, !coco.tensor<16xf32>
}
"""

# What reorder makes of a sum over a gathered value: per-slice partials, then an all_reduce.
PARTIAL_SUM = """
func.func @f(%x: !coco.tensor<16xf32>, %y: !coco.tensor<16xf32>) -> (!coco.tensor<f32>, !coco.tensor<16xf32>) {
  %xs = coco.slice %x : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
  %p = coco.reduce sum %xs : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<f32, local>
  %s = comm.all_reduce sum %p : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %c = coco.constant 3.0 : !coco.tensor<f32>
  %z = coco.mul %y, %c : !coco.tensor<16xf32>, !coco.tensor<f32> -> !coco.tensor<16xf32>
  func.return %s, %z : !coco.tensor<f32>, !coco.tensor<16xf32>
}
"""


def _rounding_inputs() -> dict[str, np.ndarray]:
    # 1 + 0.75 ulp rounds up; each quarter's partial (1 + 0.375 ulp, then 0.375 ulp) rounds
    # the first half-ulp away, so on 4 ranks the partial-sum schedule ends 1 ulp lower.
    x = np.zeros(16, dtype=np.float32)
    x[0], x[1], x[4] = 1.0, 0.75 * 2.0**-24, 0.75 * 2.0**-24
    return {"x": x, "y": np.linspace(0.1, 1.0, 16, dtype=np.float32)}


def test_reassociated_sum_is_compared_within_tolerance() -> None:
    before, after, inputs = prog(FULL_SUM), prog(PARTIAL_SUM), _rounding_inputs()
    strict = check_equivalence(
        before, after, ranks=(2, 4), inputs=inputs, allow_reassociation=False
    )
    (m,) = strict.mismatches  # the premise: the order change is visible, on 4 ranks
    assert (m.output, m.ranks) == ("s", 4)
    assert m.max_abs_error == 2.0**-23
    report = check_equivalence(before, after, ranks=(2, 4), inputs=inputs)
    assert report.ok, str(report)
    assert report.reassociated == ["%p"]
    assert "within tolerance downstream of reassociated %p" in str(report)


def test_reassociation_loosens_only_what_it_feeds() -> None:
    # %z does not depend on the reassociated sum: it must still match bit for bit.
    after = PARTIAL_SUM.replace("coco.constant 3.0", "coco.constant 3.0000002")
    report = check_equivalence(prog(FULL_SUM), prog(after))
    assert report.reassociated == ["%p"]
    assert report.mismatched_outputs() == ["z"]
    assert max(m.max_rel_error for m in report.mismatches) < 1e-6  # within f32 tolerance


def test_a_wrong_reassociated_reduction_is_still_caught() -> None:
    after = PARTIAL_SUM.replace("comm.all_reduce sum %p", "comm.all_reduce max %p")
    report = check_equivalence(prog(FULL_SUM), prog(after))
    assert report.mismatched_outputs() == ["s"]
    assert {m.ranks for m in report.mismatches} == {2, 4}
    assert "beyond the tolerance allowed for the reassociated reduction(s) %p" in str(report)
