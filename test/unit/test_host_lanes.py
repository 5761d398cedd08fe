"""The host form of row phases (lowering/host_lanes.py) and the shared encoding of stored
narrow floats (lowering/kernels/encodings.py): kernel-text changes that must not change a bit.

Row kernels walk a row in the lanes order of row reductions; the host walks it a run of lanes
at a time so that g++ vectorizes across lanes. Rows whose length is no multiple of the lanes
(a partial last run), shorter than a run, peers reduced at 3 ranks, and every phase kind
(norms: one reduction; LayerNorm: two; softmax: max, then sum) reproduce the oracle bit for
bit; the host form compiles without warnings and its lanes loops vectorize (g++'s own report).
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
from test_long_rows import norm_block

import coconet
from coconet.core.program import Program, parse_module
from coconet.lowering.host_lanes import host_row_lanes
from coconet.lowering.kernel_ir import (
    Assign,
    Binary,
    Call,
    Decl,
    For,
    Index,
    Kernel,
    LaneLoop,
    Lit,
    LocalArray,
    RowLanes,
    Var,
    uses,
)
from coconet.lowering.kernels.encodings import share_encodings
from coconet.lowering.lower_to_plan import LaunchConfig, lower
from coconet.lowering.plan import Launch
from coconet.lowering.signature import F32, F64, I32, I64, CType
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_schedule
from coconet.toolchain.host_compiler import compile_host, host_compile_flags

# (kind, row length, element type): partial last runs (33, 100, 1003), rows shorter than a
# run (7, 31), and a row of several runs exactly (64), in every float the kernels store
CASES = [
    ("rmsnorm", 33, "f32"),
    ("rmsnorm", 7, "bf16"),
    ("rmsnorm", 1003, "f16"),
    ("layernorm", 100, "bf16"),
    ("layernorm", 31, "f32"),
    ("softmax", 64, "f16"),
    ("softmax", 1003, "f32"),
]


@pytest.mark.parametrize(("kind", "hidden", "dtype"), CASES)
def test_fused_rows_of_any_length_match_the_oracle_bit_for_bit(kind, hidden, dtype):
    fused = apply_schedule(norm_block(kind, hidden, dtype), "fuse(rs-c-ag)")
    for ranks in (1, 3):
        for config in (LaunchConfig(), LaunchConfig(block=3, max_blocks=2)):
            plan = lower(fused, ranks, config)
            assert "#else" in plan.cuda_source  # the host form was printed
            inputs = prepare_inputs(fused, None, plan.grid_shape, seed=hidden + ranks)
            want = coconet.run(fused, inputs, ranks=ranks, inplace=False).outputs
            got = ThreadedExecutor(plan).run(inputs)
            for name, value in want.items():
                context = f"{name} at {ranks} ranks, block {config.block}"
                assert np.array_equal(got[name], value, equal_nan=True), context


@pytest.mark.parametrize("count", [129, 200, 1003])
@pytest.mark.parametrize("elt", ["f32", "bf16"])
def test_row_reductions_of_any_length_match_the_oracle(count: int, elt: str):
    """The plain row reduction kernel (block per row: rows longer than 4 runs of lanes)."""
    t = f"!coco.tensor<5x{count}x{elt}>"
    r = f"!coco.tensor<5x{elt}>"
    program = Program(
        parse_module(
            f"func.func @rows(%x: {t}) -> ({r}, {r}) {{\n"
            f"  %s = coco.reduce_dims sum %x dims [1] : {t} -> {r}\n"
            f"  %m = coco.reduce_dims max %x dims [1] : {t} -> {r}\n"
            f"  func.return %s, %m : {r}, {r}\n}}\n"
        )
    )
    plan = lower(program, 1)
    assert any("reduce_dims" in s.kernel for s in plan.steps if isinstance(s, Launch))
    inputs = prepare_inputs(program, None, plan.grid_shape, seed=count)
    want = coconet.run(program, inputs, ranks=1, inplace=False).outputs
    got = ThreadedExecutor(plan).run(inputs)
    for name, value in want.items():
        assert np.array_equal(got[name], value, equal_nan=True), name


def test_the_host_form_vectorizes_its_lanes_loops(tmp_path):
    """g++ reports every lanes loop of the fused RMSNorm's row phase vectorized (the element
    loops of the other phases were already); the unit compiles without warnings."""
    fused = apply_schedule(norm_block("rmsnorm", 1024, "bf16"), "fuse(rs-c-ag)")
    source = lower(fused, 2).cuda_source
    compile_host(source, warnings_as_errors=True)
    unit = tmp_path / "unit.cpp"
    unit.write_text(source)
    from coconet.toolchain.host_compiler import HEADER_DIR, _compiler

    # -O3 (the level users run; the suite builds its kernels at -O0), one object, no library
    flags = [f for f in host_compile_flags() if f not in ("-shared", "-lmvec")]
    flags = [*(f for f in flags if not f.startswith("-O")), "-O3"]
    report = subprocess.run(
        [_compiler(), *flags, f"-I{HEADER_DIR}", "-c", "-x", "c++", str(unit), "-o", "/dev/null"]
        + ["-fopt-info-vec-optimized"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    # (lanes loops over a run's width are the host form's only)
    lanes = [n + 1 for n, line in enumerate(source.splitlines()) if "(k_, width_)" in line]
    assert lanes, "no lanes loop in the host form"
    vectorized = {
        int(m) for m in re.findall(r"unit\.cpp:(\d+):\d+: optimized: loop vectorized", report)
    }
    missed = [n for n in lanes if not any(n <= v <= n + 2 for v in vectorized)]
    assert not missed, f"lanes loops at lines {missed} not vectorized:\n{report}"


def test_the_host_form_splits_at_peer_loops_and_recomputes_indices():
    """Structure: accumulators and values read after a peer loop live in tiles; an index
    (arithmetic on the row and element) is declared again where it is read, so loads through
    it stay contiguous; the peer loop runs the lanes inside it."""
    lane, e = Var(I64, None, "lane_"), Var(I64, None, "e_")
    row, x, out = Var(I64, None, "row_"), Var(F32.ptr(), None, "x"), Var(F32.ptr(), None, "out")
    i, acc, total, p = (
        Var(I64, None, "i"),
        Var(F64, None, "acc_"),
        Var(F64, None, "total"),
        Var(I32, None, "p_"),
    )
    nranks, partials = Var(I32, None, "nranks"), Var(F64.ptr(), None, "partials")
    phase = RowLanes(
        lane,
        e,
        Lit("100"),
        32,
        (Decl(acc, Lit("0"), const=False),),
        (
            Decl(i, Binary("+", row, e)),
            Decl(total, Index(x, i), const=False),
            For(p, Lit("1"), nranks, (Assign(total, Binary("+", total, Index(x, i))),)),
            Assign(acc, Binary("+", acc, total)),
            Assign(Index(out, i), total),
        ),
        (Assign(Index(partials, lane), acc),),
    )
    host = host_row_lanes(phase)
    tiles = [s.var for s in host if isinstance(s, LocalArray)]
    assert [t.fallback for t in tiles] == ["acc__t", "total_t"]  # not the index
    walk = next(s for s in host if isinstance(s, For))
    pieces = walk.body[1:]
    assert [type(s) for s in pieces] == [LaneLoop, For, LaneLoop]
    assert isinstance(pieces[1].body[0], LaneLoop)  # the lanes inside the peer loop
    for piece in (pieces[0], pieces[1].body[0], pieces[2]):
        assert uses(piece, row)  # the index is computed in each piece that reads it
        assert not uses(piece, lane)
        assert not uses(piece, e)


def test_a_stored_rounded_value_is_encoded_once():
    """The store takes the rounding's encoding; the value is decoded from it only where
    something else reads it; a store in another type keeps the rounding as it is."""
    y, z = Var(F32, "y", "t0"), Var(F32, "z", "t1")
    q = Var(CType("coco_f8e4m3").ptr(), None, "q")
    rounded = Decl(y, Call("coco_round_f8e4m3", (Lit("1.0f"),)))
    store = Assign(Index(q, Lit("0")), Call("coco_f8e4m3_from_f32", (y,)))
    loop = For(Var(I32, None, "j"), Lit("0"), Lit("4"), (store,))

    only_stored = share_encodings(Kernel("k", (), (rounded, loop)))
    code, shared_loop = only_stored.body
    assert isinstance(code, Decl)
    assert code.init == Call("coco_f8e4m3_from_f32", (Lit("1.0f"),))
    assert isinstance(shared_loop, For)
    assert shared_loop.body[0].value is code.var  # type: ignore[attr-defined]

    read = share_encodings(Kernel("k", (), (rounded, loop, Decl(z, Binary("*", y, y)))))
    code, value = read.body[:2]
    assert isinstance(value, Decl)
    assert value.var is y
    assert value.init == Call("coco_to_f32", (code.var,))  # type: ignore[attr-defined]

    other = Kernel("k", (), (rounded, Assign(Index(q, Lit("0")), Call("coco_bf16_from_f32", (y,)))))
    assert share_encodings(other) is other
