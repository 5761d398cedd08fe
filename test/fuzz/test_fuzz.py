"""The fuzzer's CI slice: 2,000 seeded mutations of the examples and lit inputs through every
stage (fuzz_oracle.py), and no traceback, hang or silent acceptance among them.

`make fuzz` runs 20,000 (`FUZZ_INPUTS`, `FUZZ_SEED`); COCONET_FULL=1 runs a second, deeper
slice here. Each finding is listed with its case index: `python test/fuzz/fuzz_driver.py
--seed S --show INDEX` prints the input, `--only INDEX --traceback` reruns it.
"""

from __future__ import annotations

import os
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_driver import format_summary, run_fuzz
from fuzz_inputs import (
    RULE_MUTATIONS,
    _divisors,
    accumulation,
    all_to_all_round_trip,
    make_case,
    reduction_kind,
    seeds,
    segment_mark,
    verifying_seeds,
)
from fuzz_oracle import Oracle, _spread

FULL = os.environ.get("COCONET_FULL") == "1"


def _assert_clean(summary: dict) -> None:
    o = summary["outcomes"]
    assert o["traceback"] == o["hang"] == o["silent"] == 0, format_summary(summary)


def test_ci_slice_finds_no_traceback_hang_or_silent_acceptance():
    # 600 inputs (seed 0): about 340 of the corpus's ~490 seeds, each mutation kind at least
    # 8 times; `make fuzz` and test_full_slice go deeper
    summary = run_fuzz(600, seed=0, jobs=2, depth="quick")
    print(format_summary(summary))
    assert summary["inputs"] == 600
    _assert_clean(summary)
    o = summary["outcomes"]
    # The slice reaches every stage: programs accepted and run, others refused cleanly.
    assert summary["distinct_accepted_programs"] >= 80
    assert o["rejected"] >= 300
    # and its profile accounts for the stages every accepted program goes through
    assert {"load", "coco-opt", "lower", "sim", "schedules"} <= set(summary["stage_seconds"])


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="the deeper slice: set COCONET_FULL=1")
def test_full_slice():
    summary = run_fuzz(6000, seed=1, jobs=2, depth="full")
    print(format_summary(summary))
    _assert_clean(summary)


def test_the_corpus_holds_every_example_and_lit_input():
    names = {s.name.split("#")[0] for s in seeds()}
    root = Path(__file__).resolve().parents[2]
    for path in [*(root / "examples").glob("*.mlir"), *(root / "test/filecheck").rglob("*.mlir")]:
        assert str(path.relative_to(root)) in names
    assert "examples/adam.py" in names  # the Python programs' printed IR


def test_cases_are_reproducible_from_their_index():
    a, b = make_case(5, 123), make_case(5, 123)
    assert a.data == b.data
    assert a.mutations == b.mutations
    assert make_case(5, 124).data != a.data or make_case(5, 124).seed != a.seed


@pytest.mark.parametrize("rule", sorted(RULE_MUTATIONS))
def test_the_oracle_flags_a_rule_break_that_is_accepted(rule, tmp_path):
    """The silent-acceptance check can fail: a case claiming to break a rule while holding a
    valid program is reported as `silent`, and the real rule breaks are refused."""
    import random

    from fuzz_inputs import Case

    text = (Path(__file__).resolve().parents[2] / "examples/sgd.mlir").read_text()
    oracle = Oracle(tmp_path)
    fake = Case(0, "ir", "examples/sgd.mlir", text.encode(), ["none"], must_reject="made-up")
    assert oracle.run(fake)["outcome"] == "silent"
    mutated, must_reject = RULE_MUTATIONS[rule](text, random.Random(0))
    case = Case(1, "ir", "examples/sgd.mlir", mutated.encode(), [rule], must_reject)
    result = oracle.run(case)
    assert result["outcome"] == "rejected", result
    assert f"[{must_reject}]" in result["message"] or must_reject == "foreign-op", result


def test_the_oracle_reports_an_internal_error_as_a_traceback(tmp_path, monkeypatch):
    from fuzz_inputs import Case

    import coconet.lowering.lower_to_plan as lowering

    def broken(*args, **kwargs):
        raise KeyError("an internal error")

    monkeypatch.setattr(lowering, "lower", broken)
    text = (Path(__file__).resolve().parents[2] / "examples/sgd.mlir").read_bytes()
    result = Oracle(tmp_path).run(Case(0, "ir", "examples/sgd.mlir", text, []))
    assert result["outcome"] == "traceback", result
    assert result["error"] == "KeyError", result
    assert result["stage"].startswith("lower@")
    assert "in broken" in result["where"]


def test_a_traceback_another_process_prints_on_the_workers_stderr_is_seen(tmp_path):
    """What no exception carries to the oracle -- a child of the worker (multiprocessing's
    resource tracker, say) printing a traceback on the stderr it inherited -- is still found:
    the worker's stderr is a file the driver reads after each case."""
    import subprocess

    here = Path(__file__).resolve().parent
    script = f"""
import subprocess, sys
sys.path.insert(0, {str(here)!r})
from pathlib import Path
from fuzz_driver import _StderrWatch
watch = _StderrWatch(Path({str(tmp_path / "stderr")!r}))
print(watch.traceback())
subprocess.run([sys.executable, "-c", "import sys; print('a warning', file=sys.stderr)"])
print(watch.traceback())
subprocess.run([sys.executable, "-c", "{{}}[1]"])
print(watch.traceback())
print(watch.traceback())
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["None", "None", "KeyError: 1", "None"]


def test_the_reliability_report_quotes_the_fuzzer_counts(tmp_path):
    """benchmarks/reliability.py turns a fuzz summary into the README's table."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("reliability", root / "benchmarks/reliability.py")
    reliability = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reliability)
    summary = run_fuzz(60, seed=3, jobs=1, depth="quick")
    (tmp_path / "s.json").write_text(__import__("json").dumps(summary))
    out = tmp_path / "report.md"
    code = reliability.main(
        ["--fuzz-json", str(tmp_path / "s.json"), "--fuzz-only", "--markdown", str(out)]
    )
    o = summary["outcomes"]
    row = (
        f"| 60 | {o['accepted']} ({summary['distinct_accepted_programs']}) | {o['rejected']} "
        f"| {o['traceback']} | {o['hang']} | {o['silent']} |"
    )
    assert row in out.read_text()
    assert code == (1 if o["traceback"] or o["hang"] or o["silent"] else 0)


def test_every_case_is_profiled_by_stage(tmp_path):
    """Each result carries the seconds spent per kind of stage (the driver sums them into the
    summary's profile): an accepted example goes through every stage, at full depth (every
    enumerated schedule, some of them checked) included."""
    from fuzz_inputs import Case

    text = (Path(__file__).resolve().parents[2] / "examples/sgd.mlir").read_bytes()
    oracle = Oracle(tmp_path, schedule_limit=None, checked_schedules=2)
    result = oracle.run(Case(0, "ir", "examples/sgd.mlir", text, []))
    assert result["outcome"] == "accepted", result
    stages = result["stage_seconds"]
    for stage in ("load", "coco-opt", "roundtrip", "lower", "sim", "schedules"):
        assert stage in stages, stages
    assert "schedule-lower" in stages, stages
    assert "schedule-check" in stages, stages
    assert all(v >= 0 for v in stages.values())


def test_checked_schedules_are_spread_over_the_enumeration():
    assert _spread(list(range(10)), 4) == [0, 3, 6, 9]
    assert _spread(list(range(3)), 8) == [0, 1, 2]
    assert _spread(list(range(5)), None) == [0, 1, 2, 3, 4]
    assert _spread(list(range(5)), 1) == [4]


UNEVEN_ROWS = """
func.func @vocab(%x: !coco.tensor<7x45xf32, sliced<1>>) -> !coco.tensor<7x1xf32> {
  %p = coco.reduce_dims sum %x dims [1] keepdims : !coco.tensor<7x45xf32, sliced<1>> -> !coco.tensor<7x1xf32, local>
  %r = comm.all_reduce sum %p : !coco.tensor<7x1xf32, local> -> !coco.tensor<7x1xf32>
  func.return %r : !coco.tensor<7x1xf32>
}
"""


def test_the_cpu_stage_finds_a_kernel_given_the_largest_piece_s_extents(tmp_path, monkeypatch):
    """The kind of hole of issue #25 (a row kernel handed the largest piece's extent on every
    rank read past smaller pieces, with exit 0): the cpu stage runs a program cut unevenly at
    2 and 3 ranks and reports the lowering that hands every rank the largest extent as a
    silent acceptance; the real lowering is accepted."""
    from fuzz_inputs import Case

    import coconet.lowering.lower_to_plan as lowering

    case = Case(0, "ir", "uneven", UNEVEN_ROWS.encode(), [])
    assert Oracle(tmp_path, cpu_fraction=1.0).run(case)["outcome"] == "accepted"
    real = lowering.Lowering.per_rank

    def largest(self, label, fn, key=None):
        got = real(self, label, fn, key)
        return got if isinstance(got, int) else max(got.table)

    monkeypatch.setattr(lowering.Lowering, "per_rank", largest)
    result = Oracle(tmp_path, cpu_fraction=1.0).run(case)
    assert result["outcome"] == "silent", result
    assert "cpu backend and sim differ" in result["message"], result


def test_an_offered_schedule_that_fails_to_lower_is_a_traceback(tmp_path, monkeypatch):
    """An "internal:" CocoError is the compiler's fault, not a refusal: the kind of hole of a
    fused optimizer updating its state after a global norm (test_late_updates.py), offered by
    the enumerator and then refused by the lowering, is reported; the real lowering passes."""
    from fuzz_inputs import Case

    import coconet.lowering.fused_collective as fused
    import coconet.lowering.segments as segments

    path = Path(__file__).resolve().parents[1] / "unit/programs/late_updates.mlir"
    text = path.read_text()
    start = text.index("func.func @lamb_late(")
    lamb = text[start : text.index("\n}", start) + 2]  # (one function: fewer schedules)
    case = Case(0, "ir", "late_updates", lamb.encode(), [])
    assert Oracle(tmp_path, schedule_limit=None).run(case)["outcome"] == "accepted"

    def ignoring_updates(v, inside, stored):  # the lowering before the fix
        return any(u.operation not in inside and u.operation.name != "coco.update" for u in v.uses)

    monkeypatch.setattr(segments, "updates_where_computed", lambda body, deferred: body)
    monkeypatch.setattr(fused, "needed_after", ignoring_updates)
    result = Oracle(tmp_path, schedule_limit=None).run(case)
    assert result["outcome"] == "traceback", result
    assert result["error"] == "InternalError", result
    assert "no buffer holds m1_s" in result["message"], result
    assert result["stage"].startswith("schedule "), result
    assert "fuse" in result["stage"], result


def test_the_all_to_all_round_trip_keeps_the_program():
    """The mutation that puts comm.all_to_alls into programs (so every stage meets them)
    yields a program equal to its seed, where it lands outside a fused region."""
    from coconet.core.program import CocoError, Program, parse_module
    from coconet.runtime import sim

    tried = 0
    for s in verifying_seeds():
        made = all_to_all_round_trip(s.text, random.Random(0))
        if made is None:
            continue
        before = Program(parse_module(s.text))
        try:
            after = Program(parse_module(made[0]))
        except CocoError as e:
            # landed inside a region that may not hold it (an overlap names its one exchange)
            assert re.search(r"\[[\w.-]+\]", str(e)), str(e)[:300]
            continue
        count = [
            sum(op.name == "comm.all_to_all" for op in p.module.walk()) for p in (before, after)
        ]
        assert count[1] == count[0] + 2
        ranks = next((n for n in (2, 3, 4, 8) if _fits(before, n)), None)
        if ranks is None:
            continue
        want = sim.run(before, ranks=ranks, seed=1)
        got = sim.run(after, want.inputs, ranks=ranks, inplace=False)
        # in order: a returned value renamed (the round trip's) names its output anew
        assert len(got.outputs) == len(want.outputs)
        for (k, v), g in zip(want.outputs.items(), got.outputs.values()):
            assert np.array_equal(g, v, equal_nan=True), (s.name, k)
        tried += 1
    assert tried >= 5


def test_the_accumulation_mutation_states_one_the_verifier_takes_or_names():
    """The mutation that states an accumulation on a reducing collective gives a program that
    verifies with it (printed back) where the type may accumulate its data, and otherwise a
    refusal naming the [<op>-acc] rule: both kinds occur over the seeds."""
    from coconet.core.program import CocoError, Program, parse_module
    from coconet.dialects.comm import ACC_TYPE_NAMES

    verified = refused = 0
    for i, s in enumerate(verifying_seeds()):
        made = accumulation(s.text, random.Random(i))
        if made is None:
            continue
        stated = re.search(r" acc (\w+)", made[0])
        assert stated, s.name
        try:
            printed = Program(parse_module(made[0])).module
        except CocoError as e:
            assert re.search(r"\[[\w.-]+-acc\]", str(e)), (s.name, str(e)[:300])
            refused += 1
            continue
        assert stated.group(1) in ACC_TYPE_NAMES, s.name
        assert f" acc {stated.group(1)}" in str(printed)
        verified += 1
    assert verified >= 5
    assert refused >= 5


def test_the_segment_mutation_is_honoured_or_refused_by_its_rule():
    """A `comm.segment` / `comm.segments` written by hand (the segment mutation) is refused
    by the program rules where it is no integer ([unknown-attribute]), and otherwise lowered
    where it is coco-segment's own or refused naming [segment] or [segment-op] -- never a
    traceback: each kind occurs over the seeds."""
    from coconet.core.program import CocoError, Program, parse_module
    from coconet.lowering.lower_to_plan import lower

    kinds: dict[str, int] = {}
    for i, s in enumerate(verifying_seeds()):
        made = segment_mark(s.text, random.Random(i))
        if made is None:
            continue
        assert "comm.segment" in made[0], s.name
        try:
            module = parse_module(made[0])
        except CocoError as e:
            rule = re.search(r"\[([\w.-]+)\]", str(e))
            key = rule.group(1) if rule else "parse"
            kinds[key] = kinds.get(key, 0) + 1
            continue
        fn = next(op.sym_name.data for op in module.ops if hasattr(op, "sym_name"))
        try:
            lower(Program(module, fn), 4)
            kinds["lowered"] = kinds.get("lowered", 0) + 1
        except CocoError as e:
            rule = re.search(r"\[([\w.-]+)\]", str(e))
            key = rule.group(1) if rule else "other"
            kinds[key] = kinds.get(key, 0) + 1
    assert kinds.get("lowered", 0) >= 3
    assert kinds.get("segment", 0) >= 3
    assert kinds.get("segment-op", 0) >= 3
    assert kinds.get("unknown-attribute", 0) >= 3


def test_a_block_scale_of_a_huge_dim_is_drawn_at_once():
    """The block-scale mutation's divisors of a dim, as a scan to the dim found them, found
    up to its square root (a literal mutation makes dims of 10^12, whose scan hung the
    driver's case generation), none past 2^40."""
    for n in range(1, 300):
        assert _divisors(n) == [d for d in range(2, n) if n % d == 0], n
    assert _divisors(10**12)[:3] == [2, 4, 5]
    assert _divisors(10**12)[-1] == 5 * 10**11
    assert _divisors(10**18) == []


def _fits(program, ranks: int) -> bool:
    try:
        program.grid.bind(ranks)
    except ValueError:
        return False
    return True


def test_the_reduction_mutation_gives_programs_that_verify_and_ones_refused_by_subset():
    """The mutation that names another reduction gives, over the seeds, programs that verify
    with the new word (an op's own subset) and parse errors that list the op's subset where
    the word is another op's (a norm on a collective, a mean on coco.reduce)."""
    from coconet.core.program import CocoError, Program, parse_module

    verified = refused = 0
    for i, s in enumerate(verifying_seeds()):
        made = reduction_kind(s.text, random.Random(i))
        if made is None:
            continue
        try:
            Program(parse_module(made[0]))
        except CocoError as e:
            if "Expected `sum`" in str(e):
                refused += 1
            continue
        verified += 1
    assert verified >= 5
    assert refused >= 5
