"""The kernel IR (lowering/kernel_ir.py) and its CUDA printer (lowering/cuda_printer.py):
C precedence, naming (SSA names where they exist, valid, unreserved and unique in scope,
positional names otherwise), the table-form rewrite, and a program whose SSA names collide
with C keywords, libm functions and the kernel's own variables, compiled by both compilers
and run against the oracle."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import coconet
from coconet.dialects.reduction import Reduction
from coconet.lowering.cuda_printer import CudaPrinter, c_identifier, print_kernel
from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    GRID_DIM,
    Assign,
    Binary,
    Cast,
    Combine,
    Decl,
    For,
    Identity,
    Index,
    Kernel,
    Lit,
    Param,
    Select,
    Unary,
    Var,
    binary,
    peer,
    rewrite,
    structural_key,
)
from coconet.lowering.kernels.reductions import reduction_kernels
from coconet.lowering.kernels.table import table_form
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.signature import F32, F64, I32, I64, CType, ParamKind
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available


def _printer(*names: str) -> tuple[CudaPrinter, list[Var]]:
    printer = CudaPrinter(stream=io.StringIO())
    variables = [Var(F32, name, name) for name in names]
    for v in variables:
        printer.declare(v)
    return printer, variables


def test_expressions_get_the_parentheses_c_needs():
    p, (a, b, c) = _printer("a", "b", "c")
    cases = [
        (a - (b - c), "a - (b - c)"),
        (a - b - c, "a - b - c"),
        ((a + b) * c, "(a + b) * c"),
        (a + b * c, "a + b * c"),
        (Unary("-", Unary("-", a)), "-(-a)"),
        (Unary("-", Lit("-1.0f")), "-(-1.0f)"),
        (Cast(F64, a + b), "(double)(a + b)"),
        (Cast(F64, Cast(I32, a)), "(double)(coco_i32)a"),
        (Index(peer(a, b, F32, const=True), c), "((const float*)a[b])[c]"),
        (Select(a, Select(b, a, c), c), "a ? (b ? a : c) : c"),
        (Cast(F32, Select(a, b, c)), "(float)(a ? b : c)"),
        # No comparisons of comparisons, no && inside || without parentheses (-Wparentheses).
        (binary("==", binary("<", a, b), c), "(a < b) == c"),
        (Binary("||", Binary("&&", a, b), c), "(a && b) || c"),
        (Binary("&&", Binary("&&", a, b), c), "a && b && c"),
        (Combine(Reduction.MAX, F64, a, b), "coco_max(a, b)"),
        (Combine(Reduction.MIN, I64, a, b), "coco_min(a, b)"),
        (Identity(Reduction.MAX, F64), "-(1.0 / 0.0)"),
        (Identity(Reduction.MAX, I64), "-9223372036854775807LL - 1"),
        (a * Identity(Reduction.MIN, F64), "a * (1.0 / 0.0)"),
    ]
    for expr, text in cases:
        assert p.expr(expr) == text


@pytest.mark.parametrize(
    ("hint", "identifier"),
    [("m1_s", "m1_s"), ("_x", "v_x"), ("a__b", "a_b"), ("3d", "v_3d"), ("x.1", "x_1")]
    + [("coco_thing", "v_coco_thing"), ("COCO_T", "v_COCO_T")],
)
def test_names_are_valid_unreserved_c_identifiers(hint: str, identifier: str):
    assert c_identifier(hint) == identifier


def test_names_are_unique_in_scope_and_reused_after_it():
    i = Param(I64, "i", "in0", kind=ParamKind.IN)
    n = Param(I64, None, "n", kind=ParamKind.COUNT)
    pow_ = Var(F32, "pow", "t0")
    twin = Var(F32, "i", "t1")
    loops = [For(Var(I32, None, "p_"), Lit("0"), n, ()) for _ in range(2)]
    inner = Var(I32, None, "p_")
    nested = For(Var(I32, None, "p_"), Lit("0"), n, (For(inner, Lit("0"), n, ()),))
    kernel = Kernel(
        "k",
        (i, n),
        (Decl(pow_, Lit("1.0f")), Decl(twin, pow_), *loops, nested, Assign(twin, pow_)),
    )
    text = print_kernel(kernel)
    assert "COCO_KERNEL(k, coco_i64 i, coco_i64 n) {" in text
    assert "const float pow_1 = 1.0f;" in text  # libm's pow stays callable
    assert "const float i_1 = pow_1;" in text  # not the parameter's name
    # Sequential loops reuse a name; a nested one cannot shadow the outer one.
    assert text.count("for (coco_i32 p_ = 0; p_ < n; ++p_)") == 3
    assert "for (coco_i32 p__1 = 0;" not in text
    assert "for (coco_i32 p_1 = 0;" in text
    # Up to naming: fallbacks only.
    positional = print_kernel(kernel, hints=False)
    assert "COCO_KERNEL(k, coco_i64 in0, coco_i64 n) {" in positional
    assert "const float t0 = 1.0f;" in positional
    assert "const float t1 = t0;" in positional


def _axpy(x_hint: str, y_hint: str, *, same_operand: bool = False, comment: str = "") -> Kernel:
    """`out[i] = x[i] * a + y[i]` over parameters named by the hints (`x * a + x` when
    `same_operand`)."""
    x = Param(F32.ptr(const=True), x_hint, "in0", kind=ParamKind.IN)
    y = Param(F32.ptr(const=True), y_hint, "in1", kind=ParamKind.IN)
    out = Param(F32.ptr(), f"{x_hint}_out", "out0", kind=ParamKind.OUT)
    n = Param(I64, None, "n", kind=ParamKind.COUNT)
    i = Var(I64, None, "i")
    t = Var(F32, f"{x_hint}_t", "t0")
    second = x if same_operand else y
    body = (
        Decl(t, Index(x, i) * Lit("2.0f") + Index(second, i), comment=comment),
        Assign(Index(out, i), t),
    )
    return Kernel(f"k_{x_hint}", (x, y, out, n), (For(i, Lit("0"), n, body),))


def test_kernels_compare_by_structure_as_they_print_up_to_naming():
    """The lowering dedupes kernels by `structural_key` instead of printing them: equal
    keys where the positional text is equal (other names, hints and kernel names), and
    different keys where the text differs, also by which variable is read where."""
    a, b = _axpy("w", "g"), _axpy("m", "v")
    assert print_kernel(a) != print_kernel(b)
    assert structural_key(a) == structural_key(b)
    assert hash(structural_key(a)) == hash(structural_key(b))
    assert print_kernel(replace(a, name="@"), hints=False) == print_kernel(
        replace(b, name="@"), hints=False
    )
    # x * 2 + x is not x * 2 + y: a binding, not a spelling.
    c = _axpy("w", "g", same_operand=True)
    assert structural_key(c) != structural_key(a)
    assert print_kernel(replace(c, name="@"), hints=False) != print_kernel(
        replace(a, name="@"), hints=False
    )
    # Comments name the values computed: they count unless left out.
    d = _axpy("w", "g", comment="%w_t = coco.add")
    assert structural_key(d) != structural_key(a)
    assert structural_key(d, comments=False) == structural_key(a, comments=False)


def test_rewrite_copies_only_what_changes():
    """`rewrite` replaces the nodes fn names and rebuilds their ancestors; a subtree it does
    not touch is the same object (the nodes are immutable), and a rebuilt node equals the
    one `dataclasses.replace` makes."""
    x, y, z = Var(F32, "x", "a"), Var(F32, "y", "b"), Var(F32, "z", "c")
    kept = Decl(z, Binary("*", y, Lit("2")))
    body = (Decl(x, Binary("+", y, Lit("1")), comment="%x"), kept)
    out = rewrite(body, lambda n: Lit("3") if n == Lit("1") else None)
    assert out[1] is kept
    assert out[0] == replace(body[0], init=replace(body[0].init, rhs=Lit("3")))
    assert out[0].comment == "%x"
    # nothing to replace: the very same tuple
    assert rewrite(body, lambda n: None) is body
    # fn sees expressions, statements and variables, never their plain fields
    seen = []
    rewrite(body, lambda n: seen.append(type(n)) or None)
    assert str not in seen
    assert set(seen) == {Decl, Binary, Var, Lit}


def test_ctype_validates_and_knows_its_abi():
    assert CType("coco_u32").abi == "u32"
    assert F32.ptr(const=True).abi == "ptr"
    with pytest.raises(ValueError, match="not a C type"):
        CType("long double")
    with pytest.raises(ValueError, match="qualify pointers"):
        CType("float", const=True)
    with pytest.raises(ValueError, match="by value"):
        _ = CType("coco_f16").abi


def test_table_form_rewrites_the_launch_geometry_and_tables_every_parameter():
    partial, _ = reduction_kernels("k_reduce_sum_f32", "sum", "f32")
    table = table_form(partial, "k_table")
    assert [p.kind for p in table.params] == [
        ParamKind.IN,
        ParamKind.PARTIALS,
        ParamKind.COUNT,
        ParamKind.BLOCKS,
        ParamKind.NTENSORS,
    ]
    assert [p.table for p in table.params] == [True, True, True, False, False]
    assert all(p.ctype.pointer for p in table.params[:3])
    found: list[object] = []
    rewrite(partial.body, lambda n: found.append(n) if n in (BLOCK_IDX, GRID_DIM) else None)
    assert found  # the single-tensor body uses them ...
    found.clear()
    rewrite(table.body[6:], lambda n: found.append(n) if n in (BLOCK_IDX, GRID_DIM) else None)
    assert not found  # ... the table form's body reads its tensor's own block and grid
    text = print_kernel(table)
    assert "const float* const x = (const float*)x_tab[t_];" in text
    assert "partials[tb_] = a;" in text


COLLIDING = """
func.func @names(%i: !coco.tensor<64xf32>, %end: !coco.tensor<64xf32>, %pow: !coco.tensor<f32>)
    -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %f = comm.fused elementwise -> !coco.tensor<64xf32> {
    %int = coco.add %i, %end : !coco.tensor<64xf32>
    %coco_x = coco.mul %pow, %int : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
    %r_ = coco.pow %coco_x, %pow : !coco.tensor<64xf32>, !coco.tensor<f32> -> !coco.tensor<64xf32>
    %j_ = coco.sub %r_, %i : !coco.tensor<64xf32>
    comm.yield %j_ : !coco.tensor<64xf32>
  }
  func.return %f : !coco.tensor<64xf32>
}
"""


def test_ssa_names_that_collide_with_c_compile_and_compute_the_same(tmp_path: Path):
    path = tmp_path / "names.mlir"
    path.write_text(COLLIDING)
    program = coconet.load(path)
    plan = lower(program, 2)
    src = plan.cuda_source
    for line in (
        "const float pow_1 = pow_in[0];",
        "const float i_1 = i_in[i];",
        "const float int_1 = i_1 + end_1;  // coco.add %int",
        "const float v_coco_x = pow_1 * int_1;  // coco.mul %coco_x",
        "const float r_1 = (float)coco_pow((double)v_coco_x, (double)pow_1);  // coco.pow %r_",
    ):
        assert line in src, line
    if nvrtc_available():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(src, arch, warnings_as_errors=True).binary
    inputs = prepare_inputs(program, None, plan.grid_shape, seed=3)
    want = coconet.run(program, inputs, ranks=2, inplace=False).outputs
    got = ThreadedExecutor(plan).run(inputs)
    for name, value in want.items():
        assert np.array_equal(got[name], value), name
