"""The plan cache (lowering/plan_cache.py): a compiled program's plan is stored once and
loaded on the next compile of the same text, schedule, ranks and target; entries follow the
kernel cache's integrity and permission rules."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from coconet.compile import apply_schedule, compile as coco_compile
from coconet.core.program import Program, load, parse_module
from coconet.lowering import plan_cache
from coconet.lowering.lower_to_plan import lower
from coconet.runtime import sim

ROOT = Path(__file__).resolve().parents[2]
ADAM = ROOT / "examples" / "adam.mlir"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COCONET_CACHE_DIR", str(tmp_path / "cache"))
    plan_cache.PLAN_CACHE.stats = type(plan_cache.PLAN_CACHE.stats)()


def _key(text: str, schedule: str = "ar-c", ranks: int = 2, target: str = "cpu") -> str:
    return plan_cache.plan_key(text, None, schedule, ranks, (), "LaunchConfig()", target)


def _builder(text: str, schedule: str, ranks: int):
    calls: list[int] = []

    def build():
        calls.append(1)
        return lower(apply_schedule(Program(parse_module(text)), schedule), ranks)

    return build, calls


def test_a_second_compile_loads_the_stored_plan_without_building():
    text = ADAM.read_text()
    build, calls = _builder(text, "fuse(rs-c-ag)", 2)
    cold = plan_cache.cached_plan(_key(text, "fuse(rs-c-ag)"), build)
    warm = plan_cache.cached_plan(_key(text, "fuse(rs-c-ag)"), build)
    assert (cold.cache_hit, warm.cache_hit) == (False, True)
    assert len(calls) == 1
    assert warm.value is not cold.value
    assert warm.value.format() == cold.value.format()
    assert warm.value.cuda_source == cold.value.cuda_source
    assert warm.value.signatures == cold.value.signatures
    stats = plan_cache.PLAN_CACHE.stats
    assert (stats.builds, stats.hits) == (1, 1)


def test_the_key_covers_text_schedule_ranks_and_target():
    text = ADAM.read_text()
    keys = {
        _key(text),
        _key(text + "\n"),
        _key(text, schedule="rs-c-ag"),
        _key(text, ranks=4),
        _key(text, target="cuda"),
        plan_cache.plan_key(text, None, "ar-c", 2, (0, 1), "LaunchConfig()", "cpu"),
    }
    assert len(keys) == 6


def test_a_corrupted_entry_is_rebuilt():
    text = ADAM.read_text()
    key = _key(text)
    build, calls = _builder(text, "ar-c", 2)
    first = plan_cache.cached_plan(key, build)
    data = bytearray(first.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.path.write_bytes(bytes(data))
    again = plan_cache.cached_plan(key, build)
    assert not again.cache_hit
    assert len(calls) == 2
    assert plan_cache.PLAN_CACHE.stats.rebuilt_corrupt == 1
    assert again.value.format() == first.value.format()
    assert plan_cache.cached_plan(key, build).cache_hit  # the rebuilt entry is intact


def test_an_entry_others_may_write_is_never_loaded():
    text = ADAM.read_text()
    key = _key(text)
    build, calls = _builder(text, "ar-c", 2)
    first = plan_cache.cached_plan(key, build)
    assert (first.path.stat().st_mode & 0o777) == 0o600
    os.chmod(first.path, 0o666)
    again = plan_cache.cached_plan(key, build)
    assert not again.cache_hit
    assert len(calls) == 2
    assert plan_cache.PLAN_CACHE.stats.untrusted == 1
    assert (again.path.stat().st_mode & 0o777) == 0o600  # republished privately


def test_an_entry_that_is_not_a_plan_is_rebuilt():
    text = ADAM.read_text()
    key = _key(text)
    build, calls = _builder(text, "ar-c", 2)
    first = plan_cache.cached_plan(key, build)

    # a well-formed pickle of something else, published with a matching digest
    def publish_other(tmp: Path) -> None:
        tmp.write_bytes(pickle.dumps({"not": "a plan"}))

    first.path.unlink()
    plan_cache.PLAN_CACHE.get_or_build(key, ".plan.pickle", publish_other, lambda path: None)
    again = plan_cache.cached_plan(key, build)
    assert not again.cache_hit
    assert len(calls) == 2
    assert again.value.format() == first.value.format()


def test_compile_starts_warm_from_the_plan_cache_and_computes_the_same():
    pytest.importorskip("mpi4py")
    for expect_hit in (False, True):
        compiled = coco_compile(ADAM, schedule="fuse(rs-c-ag)", backend="cpu")
        assert compiled.plan_cache_hit is expect_hit
        # the types the program as written declares travel with the plan (the caller's)
        assert set(compiled.plan.written_types) == {"m", "v"}
        rng = np.random.default_rng(0)
        inputs = {
            n: rng.uniform(0.1, 1, s).astype(d) for n, (s, d) in compiled.input_shapes().items()
        }
        logical = {n: v.copy() for n, v in inputs.items()}
        logical["g"] = logical["g"][None]
        want = sim.run(load(ADAM), logical, ranks=1, inplace=False).outputs
        out = compiled(**inputs)
        for name in ("w", "m", "v"):
            assert np.array_equal(out[name], want[name]), (expect_hit, name)
        # the scheduled program is still there, parsed on demand after a warm start
        assert "comm.fused" in str(compiled.program.module)
        compiled.close()
    uncached = coco_compile(ADAM, schedule="fuse(rs-c-ag)", backend="cpu", cache=False)
    assert not uncached.plan_cache_hit
    uncached.close()


def test_an_entry_stores_tensor_types_as_text_and_loads_equal_ones():
    """Loading a plan rebuilt every tensor type's xDSL attribute tree (most of a large
    program's warm start); an entry holds each type's text instead, parsed once per distinct
    type, and the loaded plan's types equal the built ones."""
    text = ADAM.read_text()
    plan = lower(apply_schedule(Program(parse_module(text)), "fuse(rs-c-ag)"), 2)
    data = plan_cache.dump_plan(plan)
    assert b"ArrayAttr" not in data
    assert b"IntAttr" not in data
    loaded = pickle.loads(data)
    assert [b.type for b in loaded.buffers] == [b.type for b in plan.buffers]
    assert loaded.cuda_source == plan.cuda_source
    assert loaded.format() == plan.format()
    with pytest.raises(ValueError, match="not a coco tensor type"):
        plan_cache.tensor_type_from_text("f32")
