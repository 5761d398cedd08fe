"""Minimized regressions of what the fuzzer (test/fuzz) found, through the library API:
`coconet.load` on files it could not read, and fused regions the lowering crashed on, now
run on the cpu backend and compared with the sim."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import coconet
from coconet.core.program import CocoError, Program, parse_module
from coconet.core.values import NUMPY_DTYPES
from coconet.dialects import comm
from coconet.lowering.lower_to_plan import LaunchConfig, lower
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor

LIT = Path(__file__).resolve().parents[1] / "filecheck"


def test_load_names_the_byte_that_is_not_utf8(tmp_path):
    path = tmp_path / "p.mlir"
    path.write_bytes(b"func.func @f() {\n  func.return\n}\n\xff\n")
    with pytest.raises(CocoError, match=r"p\.mlir:4:1: the program is not UTF-8 text \(byte 0xff"):
        coconet.load(path)


def test_load_of_a_directory_is_a_clean_error(tmp_path):
    (tmp_path / "x.mlir").mkdir()
    with pytest.raises(CocoError, match=r"x\.mlir: cannot read the program: Is a directory"):
        coconet.load(tmp_path / "x.mlir")


def test_load_reports_a_build_that_raises(tmp_path):
    path = tmp_path / "p.py"
    path.write_text("def build():\n    raise RuntimeError('no weights')\n")
    with pytest.raises(CocoError, match=r"p\.py: build\(\) failed: RuntimeError: no weights"):
        coconet.load(path)


def test_a_literal_its_type_cannot_hold_is_a_clean_error():
    text = (LIT / "tools/Inputs/literal_overflow.mlir").read_text()
    with pytest.raises(CocoError, match="a literal does not fit its type"):
        parse_module(text, "overflow.mlir")


def test_a_dense_integer_its_builtin_type_cannot_hold_is_a_clean_error():
    """xDSL raises a ValueError for a dense integer out of its builtin element type's range
    (generic form, `tensor<2xi1>`): a parse error, not a traceback."""
    text = (
        "func.func @f() {\n"
        '  %0 = "coco.constant"() <{value = dense<[1, 2]> : tensor<2xi1>}> '
        ": () -> !coco.tensor<2xf32>\n  func.return\n}\n"
    )
    with pytest.raises(CocoError, match=r"d\.mlir: a literal does not fit its type: .* i1"):
        parse_module(text, "d.mlir")


def test_a_program_cut_off_after_a_tensor_type_name_is_a_clean_error():
    """Text ending right after `!coco.tensor` (no `<`): the type parser's memo looked past
    the end of the text."""
    with pytest.raises(CocoError, match=r"(?s)t\.mlir: cannot parse the program:.*'<' expected"):
        parse_module("func.func @f(%a: !coco.tensor", "t.mlir")


@pytest.mark.parametrize("op", ["comm.all_reduce", "comm.reduce_scatter", "coco.reduce"])
def test_a_program_cut_off_before_a_reduction_kind_is_a_clean_error(op):
    """Text ending right after `comm.all_reduce ` (the fuzzer: a truncated file): the kind's
    parser read the character at the end of the text to mark the word."""
    text = (
        "func.func @f(%a: !coco.tensor<8xf32, local>) attributes {coco.grid = "
        f"#coco.grid<[?]>}} {{\n  %t = {op} "
    )
    with pytest.raises(CocoError, match=r"(?s)t\.mlir: cannot parse the program:.*Expected `"):
        parse_module(text, "t.mlir")


@pytest.mark.parametrize("field", ["block", "max_blocks", "elements_per_thread"])
@pytest.mark.parametrize("value", [0, -1])
def test_launch_config_out_of_range_is_refused(field, value):
    with pytest.raises(CocoError, match=rf"\[launch-config\] {field} must be"):
        LaunchConfig(**{field: value})


def test_a_negative_rank_count_is_refused():
    program = coconet.load(Path(__file__).resolve().parents[2] / "examples/sgd.mlir")
    with pytest.raises(CocoError, match="at least 1 rank"):
        lower(program, -2)
    with pytest.raises(CocoError, match="at least 1 rank"):
        sim.run(program, ranks=0)


def _chunks(path: Path) -> list[str]:
    return [c for c in path.read_text().split("// -----") if "func.func" in c]


@pytest.mark.parametrize("index", range(3))
def test_fused_regions_computing_nothing_or_reading_outside_values_run_like_the_sim(index):
    text = _chunks(LIT / "lowering/fused_edge_cases.mlir")[index]
    program = Program(parse_module(text))
    want = sim.run(program, ranks=1, seed=3)
    got = ThreadedExecutor(lower(program, 1)).run(want.inputs)
    assert set(got) == set(want.outputs)
    for name, value in want.outputs.items():
        assert np.array_equal(got[name], value), name


def test_reshape_of_an_uneven_slice_runs_on_every_rank_and_backend():
    """Fuzz seed 0 case 299: a reshape of 3 rows cut over 2 ranks (2 + 1 rows) reshaped every
    piece to the largest piece's shape, a ValueError in the sim."""
    text = """
func.func @f(%x: !coco.tensor<3x16xf32, sliced<0>>) -> !coco.tensor<3x4x4xf32, sliced<0>>
    attributes {coco.grid = #coco.grid<[2]>} {
  %r = coco.reshape %x : !coco.tensor<3x16xf32, sliced<0>> -> !coco.tensor<3x4x4xf32, sliced<0>>
  func.return %r : !coco.tensor<3x4x4xf32, sliced<0>>
}
"""
    program = Program(parse_module(text))
    x = np.arange(48, dtype=np.float32).reshape(3, 16)
    want = sim.run(program, {"x": x.copy()}, ranks=2)
    (name,) = want.outputs
    assert np.array_equal(want.outputs[name], x.reshape(3, 4, 4))
    got = ThreadedExecutor(lower(program, 2)).run({"x": x.copy()})
    assert np.array_equal(got[name], x.reshape(3, 4, 4))


BATCHED = """
func.func @batched(%x: !coco.tensor<2x4x8xf32, sliced<0>>, %xb: !coco.tensor<2x8x16xf32{rhs}>)
    -> !coco.tensor<2x4x16xf32, sliced<0>> {{
  %y = coco.matmul %x, %xb : !coco.tensor<2x4x8xf32, sliced<0>>, !coco.tensor<2x8x16xf32{rhs}>
      -> !coco.tensor<2x4x16xf32, sliced<0>>
  func.return %y : !coco.tensor<2x4x16xf32, sliced<0>>
}}
"""


def test_a_batch_slice_times_a_replicated_batch_is_refused():
    """Fuzz case 8171 (seed 0): `sliced(batch) x batched R` was accepted, and at 2 ranks every
    rank multiplied its slice of the batch by the whole batch (the sim made pieces of the wrong
    shape, the cpu backend raised a ValueError)."""
    with pytest.raises(CocoError, match=r"\[matmul-layouts\] the left operand is sliced on batch"):
        Program(parse_module(BATCHED.format(rhs=""), "batched.mlir"))


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_batch_slice_times_the_same_batch_slice_runs_like_numpy(ranks):
    program = Program(parse_module(BATCHED.format(rhs=", sliced<0>"), "batched.mlir"))
    want = sim.run(program, ranks=ranks, seed=3)
    x, xb = want.inputs["x"], want.inputs["xb"]
    np.testing.assert_allclose(want.outputs["y"], np.matmul(x, xb), rtol=1e-6)
    got = ThreadedExecutor(lower(program, ranks)).run(want.inputs)
    np.testing.assert_array_equal(got["y"], want.outputs["y"])


def test_ranks_sharing_a_process_leave_the_resource_tracker_nothing_to_complain_of():
    """Found by `make fuzz` (its log, not a case): fused kernels on thread ranks (the fuzzer's
    cpu stage) put every rank's symmetric segment in one process, whose resource tracker then
    printed `KeyError: '/coconet-...'` tracebacks when a segment was unlinked (a peer had
    untracked the name its owner had registered). The process's stderr is clean."""
    import subprocess
    import sys

    script = """
import coconet
from coconet.compile import apply_schedule
from coconet.lowering.lower_to_plan import lower
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
p = apply_schedule(coconet.load("examples/sgd.mlir"), "fuse(rs-c-ag)")
want = sim.run(p, ranks=2, seed=7)
got = ThreadedExecutor(lower(p, 2)).run(want.inputs)
assert set(got) == set(want.outputs)
print("ran")
"""
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ran"
    assert "Traceback" not in r.stderr, r.stderr
    assert "KeyError" not in r.stderr, r.stderr


# The random-program search (COCONET_SEARCH=1) found these two: an f16 sum of squares split
# into partials rounded each rank's partial to f16 (an ulp off the program's single rounding,
# beyond tolerance after the log), and the one-shot fusion pulled the ops computing its
# all_reduce's input into its region (an internal lowering error).
NARROW_PARTIALS = """
func.func @random(%g0: !coco.tensor<6xf32, local>, %g1: !coco.tensor<16xf16, local>, %w2: !coco.tensor<16xf16>, %lr3: !coco.tensor<f16>) {
  %v1 = comm.reduce_scatter sum %g1 : !coco.tensor<16xf16, local> -> !coco.tensor<16xf16, sliced<0>>
  %v2 = comm.all_gather %v1 : !coco.tensor<16xf16, sliced<0>> -> !coco.tensor<16xf16>
  %v3 = coco.mul %v2, %v2 : !coco.tensor<16xf16>
  %v4 = coco.reduce sum %v3 : !coco.tensor<16xf16> -> !coco.tensor<f16>
  %v5 = coco.sqrt %v4 : !coco.tensor<f16>
  %v6 = coco.constant 1.0 : !coco.tensor<f16>
  %v7 = coco.add %v5, %v6 : !coco.tensor<f16>
  %v8 = coco.div %v2, %v7 : !coco.tensor<16xf16>, !coco.tensor<f16> -> !coco.tensor<16xf16>
  %v9 = coco.mul %lr3, %v8 : !coco.tensor<f16>, !coco.tensor<16xf16> -> !coco.tensor<16xf16>
  %v10 = coco.sub %w2, %v9 : !coco.tensor<16xf16>
  %v11 = coco.neg %v10 : !coco.tensor<16xf16>
  %v12 = coco.abs %v11 : !coco.tensor<16xf16>
  %v13 = coco.log %v12 : !coco.tensor<16xf16>
  %v14 = comm.reduce sum %v13 root 0 acc f16 : !coco.tensor<16xf16> -> !coco.tensor<16xf16, local>
  %v15 = comm.all_reduce sum %v14 acc f16 : !coco.tensor<16xf16, local> -> !coco.tensor<16xf16>
  coco.update %g1, %v14 : !coco.tensor<16xf16, local>
  coco.update %w2, %v15 : !coco.tensor<16xf16>
  coco.update %lr3, %v7 : !coco.tensor<f16>
  func.return
}
"""

ONE_SHOT_INPUT = """
func.func @f(%g: !coco.tensor<16xf32, local>, %w: !coco.tensor<16xf32>, %lr: !coco.tensor<f32>) -> !coco.tensor<16xf32> {
  %s = comm.reduce_scatter sum %g : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
  %a = comm.all_gather %s : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
  %m = coco.mul %lr, %a : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %d = coco.sub %w, %m : !coco.tensor<16xf32>
  %t = comm.all_reduce sum %d : !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %y = coco.mul %t, %t : !coco.tensor<16xf32>
  func.return %y : !coco.tensor<16xf32>
}
"""


@pytest.mark.parametrize("elt", ["f16", "bf16"])
def test_narrow_partials_keep_the_programs_meaning_at_uneven_cuts(elt):
    """The family: f16 and bf16, 16 elements over 2, 3, 4 and 7 ranks (uneven at 3 and 7)."""
    from coconet.equivalence import check_equivalence
    from coconet.schedule.api import apply_pipeline

    narrow = Program(
        parse_module(
            NARROW_PARTIALS.replace("xf16", f"x{elt}")
            .replace("<f16>", f"<{elt}>")
            .replace("acc f16", f"acc {elt}")
        )
    )
    after = apply_pipeline(narrow, "coco-reorder")
    assert any(op.name == "coco.cast" for op in after.func.walk())  # the widened partials
    report = check_equivalence(narrow, after, ranks=(2, 3, 4, 7), seeds=(0, 1))
    assert report.ok, str(report)


def test_narrow_partials_and_one_shot_inputs_keep_the_programs_meaning():
    from coconet.equivalence import check_equivalence
    from coconet.schedule import apply_schedule
    from coconet.schedule.api import apply_pipeline

    narrow = Program(parse_module(NARROW_PARTIALS))
    after = apply_pipeline(narrow, "coco-reorder")
    report = check_equivalence(narrow, after, ranks=(1, 2, 4), seeds=(0,))
    assert report.ok, str(report)
    one_shot = Program(parse_module(ONE_SHOT_INPUT))
    for ranks in (1, 2, 3):
        want = sim.run(one_shot, ranks=ranks, seed=ranks)
        plan = lower(apply_schedule(one_shot, "fuse(ar-c)"), ranks)
        got = ThreadedExecutor(plan).run(want.inputs)
        np.testing.assert_array_equal(got["y"], want.outputs["y"])


# Found by COCONET_SEARCH: %w6's update stores the all_gather of %w5's slice, read after
# %w5's update. Sliced, %w5's slices fold to %w5 itself, so %w6's update read %w5 after
# %w5's update -- IR that no longer verified ([update-last-use]). Each argument is now planned
# on the IR the earlier rewrites left, and that update is refused ([as-slice-update]): greedy,
# %w6 stays replicated; named, the pass names the rule.
SHARED_GATHER = """
func.func @shared(%w5: !coco.tensor<16xf32>, %w6: !coco.tensor<16xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %v3 = coco.slice %w5 : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
  %v4 = comm.all_gather %v3 : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
  %v9 = coco.slice %w6 : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
  %v10 = comm.all_gather %v9 : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
  coco.update %w5, %v4 : !coco.tensor<16xf32>
  coco.update %w6, %v4 : !coco.tensor<16xf32>
  func.return
}
"""


def test_as_slice_never_reads_an_argument_after_its_update():
    from coconet.equivalence import check_equivalence
    from coconet.schedule.api import apply_pipeline

    program = Program(parse_module(SHARED_GATHER))
    after = apply_pipeline(program, "coco-as-slice")  # verifies the result
    types = [str(a.type) for a in after.func.args]
    assert types == ["!coco.tensor<16xf32, sliced<0>>", "!coco.tensor<16xf32>"]
    report = check_equivalence(program, after, ranks=(1, 2, 4), seeds=(0,))
    assert report.ok, report
    with pytest.raises(CocoError, match=r"\[as-slice-update\] the update of %w6 stores"):
        apply_pipeline(program, "coco-as-slice{ops=w5,w6}")


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_scalar_all_reduce_accumulating_in_bf16_runs_like_the_sim(ranks):
    """The random-program search (COCONET_SEARCH): an all_reduce of one scalar per rank with
    `acc bf16` combined its pieces as NumPy scalars, and rounding to odd computed a zero
    scalar's bits minus 1 (a wrap NumPy warns about): a RuntimeWarning on the cpu backend."""
    text = """
func.func @f(%x: !coco.tensor<8xf32, sliced<0>>, %t: !coco.tensor<bf16>)
    attributes {coco.grid = #coco.grid<[?]>} {
  %s = coco.reduce sum %x : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<f32, local>
  %c = coco.cast %s : !coco.tensor<f32, local> -> !coco.tensor<bf16, local>
  %r = comm.all_reduce sum %c acc bf16 : !coco.tensor<bf16, local> -> !coco.tensor<bf16>
  coco.update %t, %r : !coco.tensor<bf16>
  func.return
}
"""
    program = Program(parse_module(text))
    inputs = {"x": np.zeros(8, np.float32), "t": np.ones((), ml_dtypes.bfloat16)}
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
    got = ThreadedExecutor(lower(program, ranks)).run({k: v.copy() for k, v in inputs.items()})
    assert got["t"].tobytes() == want.outputs["t"].tobytes()


@pytest.mark.parametrize("elt", ["f16", "bf16", "f8E4M3FN", "f8E5M2"])
@pytest.mark.parametrize("kind", ["prod", "sum"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_an_all_reduce_beyond_its_type_s_range_rounds_to_inf_as_the_cpu_kernels_do(
    elt, kind, ranks
):
    """The random-program search (COCONET_SEARCH, the `norm_rows` motif): a product over the
    ranks of f16 row sums of exp (~4e8) rounded to f16 in the sim, where NumPy's cast to f16
    warns on overflow (a RuntimeWarning out of the sim). The result is IEEE's, inf (NaN for
    e4m3fn, as ml_dtypes rounds), bit for bit what the cpu kernels compute, with no warning."""
    npt = NUMPY_DTYPES[elt]
    text = f"""
func.func @f(%x: !coco.tensor<4x{elt}, local>, %t: !coco.tensor<4x{elt}>)
    attributes {{coco.grid = #coco.grid<[?]>}} {{
  %r = comm.all_reduce {kind} %x : !coco.tensor<4x{elt}, local> -> !coco.tensor<4x{elt}>
  coco.update %t, %r : !coco.tensor<4x{elt}>
  func.return
}}
"""
    program = Program(parse_module(text))
    big = float(ml_dtypes.finfo(npt).max)
    row = np.array([big, -big, big / 2, 1], np.float64).astype(npt)
    inputs = {"x": np.tile(row, (ranks, 1)), "t": np.zeros(4, npt)}
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
    got = ThreadedExecutor(lower(program, ranks)).run({k: v.copy() for k, v in inputs.items()})
    assert got["t"].tobytes() == want.outputs["t"].tobytes()
    overflowed = want.outputs["t"].astype(np.float64)[:2]
    assert (np.isinf(overflowed) | np.isnan(overflowed)).all(), want.outputs["t"]


@pytest.mark.parametrize("elt", ["f8E4M3FN", "f8E5M2"])
@pytest.mark.parametrize("kind", ["prod", "sum", "max"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_scalar_fp8_all_reduce_rounds_its_small_results_without_a_warning(elt, kind, ranks):
    """The random-program search (COCONET_SEARCH, an optimizer in e5m2): an all_reduce prod of
    a 0-d fp8 scale (0.001) rounded through the library path's fp8 encoding, whose normal
    path wraps below the smallest normal (the subnormal path is taken there) -- which NumPy
    warns of on a 0-d array only (a RuntimeWarning out of the cpu backend). Tiny, subnormal,
    normal and huge values: bit for bit what the sim rounds, no warning."""
    npt = NUMPY_DTYPES[elt]
    text = f"""
func.func @f(%x: !coco.tensor<{elt}, local>, %t: !coco.tensor<{elt}>)
    attributes {{coco.grid = #coco.grid<[?]>}} {{
  %r = comm.all_reduce {kind} %x : !coco.tensor<{elt}, local> -> !coco.tensor<{elt}>
  coco.update %t, %r : !coco.tensor<{elt}>
  func.return
}}
"""
    program = Program(parse_module(text))
    tiny = float(ml_dtypes.finfo(npt).smallest_subnormal)
    for value in (0.001, tiny, 3 * tiny, 0.75, 300.0):
        inputs = {"x": np.full(ranks, value, np.float64).astype(npt), "t": np.zeros((), npt)}
        want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
        plan = lower(program, ranks)
        got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
        assert got["t"].tobytes() == want.outputs["t"].tobytes(), value


DEAD_EXCHANGE = """
func.func @f(%x: !coco.tensor<8x4xf32, local>, %s: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[?]>} {
  %p = coco.mul %x, %s : !coco.tensor<8x4xf32, local>, !coco.tensor<f32> -> !coco.tensor<8x4xf32, local>
  %e = comm.all_to_all %p : !coco.tensor<8x4xf32, local>
  %q = coco.mul %e, %e : !coco.tensor<8x4xf32, local>
  coco.update %x, %p : !coco.tensor<8x4xf32, local>
  func.return
}
"""


@pytest.mark.parametrize("cleanup", ["coco-dce", "coco-canonicalize", "dce", "canonicalize"])
def test_fusing_around_a_dead_exchange_leaves_ir_every_cleanup_keeps_valid(cleanup):
    """The random-pipeline search: coco-fuse put a dead all_to_all (its result reaching
    nothing) in a region with its producer, which an update kept alive; coco-dce or
    canonicalize then removed the exchange and the region no longer verified
    ([fuse-one-collective]). A dead exchange is not fused now ([fuse-dead] where named), and
    a region whose collective is gone dissolves under canonicalize (DissolveSpentRegion)."""
    from coconet.schedule import apply_pipeline

    program = Program(parse_module(DEAD_EXCHANGE))
    fused = apply_pipeline(program, "coco-fuse")
    assert not any(isinstance(op, comm.FusedOp) and op.kind.data == "all_to_all"
                   for op in fused.func.walk())  # fmt: skip
    cleaned = apply_pipeline(fused, cleanup)
    for ranks in (1, 2, 4):
        want = sim.run(program, ranks=ranks, seed=5)
        got = sim.run(cleaned, want.inputs, ranks=ranks)
        assert np.array_equal(got.outputs["x"], want.outputs["x"])
    with pytest.raises(CocoError, match=r"\[fuse-dead\] the result of %e \(comm.all_to_all\)"):
        apply_pipeline(program, "coco-fuse{mode=all_to_all ops=e}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "func.func @two_blocks(%a: !coco.tensor<8xf32> {coco.symmetric}) {\n"
            "  func.return\n^bb1:\n  func.return\n}\n",
            r"\[function-blocks\] @two_blocks has 2 blocks",
        ),
        (
            "func.func private @d(%a: !coco.tensor<f32> {coco.symmetric})\n",
            r"\[symmetric-argument\] argument #0 of @d is a scalar",
        ),
    ],
)
def test_a_symmetric_argument_of_a_function_without_one_body_block_is_a_clean_error(text, message):
    """Fuzz seed 44 case 771: `{coco.symmetric}` on an argument of a function with two
    blocks (or none) read the argument's type from the body's one block: xDSL's ValueError
    at load, not the rule's message."""
    with pytest.raises(CocoError, match=message):
        parse_module(text)
