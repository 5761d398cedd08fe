"""The Python front end (coconet/frontend/): names, literals, operators, grids, errors."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type, IntegerType
from xdsl.utils.exceptions import VerifyException

import coconet
from coconet import frontend as fe
from coconet.core.program import CocoError, Program, parse_module
from coconet.dialects import coco, comm
from coconet.frontend import (
    BF16,
    F16,
    F32,
    GROUP,
    I1,
    I32,
    RANK,
    Abs,
    AllGather,
    AllReduce,
    AllToAll,
    Broadcast,
    Cast,
    Const,
    Dropout,
    Eq,
    Exp,
    Gelu,
    GroupRank,
    Ite,
    Local,
    Log,
    MatMul,
    Max,
    Min,
    Ne,
    Neg,
    Norm,
    Pow,
    Reduce,
    ReduceMax,
    ReduceMin,
    ReduceScatter,
    ReduceSum,
    Relu,
    Replicated,
    Rsqrt,
    Scalar,
    Scatter,
    Send,
    Sigmoid,
    Slice,
    Sliced,
    Sqrt,
    Tanh,
    Tensor,
    Update,
    program,
)


def ops_of(p: Program) -> list:
    return list(p.func.body.block.ops)


def op_named(p: Program, name: str):
    """The op whose result is called %name."""
    for op in p.func.body.block.ops:
        if op.results and op.results[0].name_hint == name:
            return op
    raise AssertionError(f"no %{name} in\n{p.print()}")


def roundtrips(p: Program) -> None:
    text = p.print()
    assert Program(parse_module(text)).print() == text


# --------------------------------------------------------------------------------------------
# Programs and declarations
# --------------------------------------------------------------------------------------------


def test_decorator_returns_a_verified_program() -> None:
    @program(grid=[None])
    def sgd(g: Tensor(F32, [16], Local), w: Tensor(F32, [16]), lr: Scalar(F32)):
        g1 = AllReduce("+", g)
        Update(w, w - lr * g1)

    assert isinstance(sgd, Program)
    assert sgd.name == "sgd"
    assert str(sgd.grid) == "[?]"
    assert [a.name for a in sgd.arguments] == ["g", "w", "lr"]
    assert [o.name for o in sgd.outputs] == ["w"]
    sgd.verify()
    roundtrips(sgd)


def test_bare_decorator_and_explicit_name_and_grid() -> None:
    @program
    def f(x: Tensor(F32, [8])):
        return x + 1

    assert f.name == "f"
    assert str(f.grid) == "[?]"

    @program(grid=[2, 4], name="renamed")
    def g(x: Tensor(F32, [8], [Local, Sliced(0)])):
        return x

    assert g.name == "renamed"
    assert g.grid.shape == (2, 4)
    h = fe.build_program(lambda x=Tensor(F32, [4]): x * 2, grid=[None], name="lam")
    assert h.name == "lam"
    assert [a.name for a in h.arguments] == ["x"]


def test_three_ways_to_declare_arguments_in_order() -> None:
    @program
    def f(a: Tensor(F32, [4]), b=Tensor(F32, [4], Replicated, "bee")):
        c = Tensor(F32, [4], Local, "c")
        d = Scalar(F32)  # named by its variable
        return AllReduce(a + b + c) * d

    assert [a.name for a in f.arguments] == ["a", "bee", "c", "d"]
    assert [str(a.type) for a in f.arguments] == [
        "!coco.tensor<4xf32>",
        "!coco.tensor<4xf32>",
        "!coco.tensor<4xf32, local>",
        "!coco.tensor<f32>",
    ]


def test_string_annotations_are_evaluated(tmp_path) -> None:
    source = textwrap.dedent(
        """
        from __future__ import annotations
        from coconet import frontend
        from coconet.frontend import F16, Local, Tensor, AllReduce

        N = 32

        def build():
            M = 8  # a closure variable used in an annotation
            @frontend.program(grid=[None])
            def f(g: Tensor(F16, [N, M], Local)):
                total = AllReduce("+", g)
                return total
            return f
        """
    )
    path = tmp_path / "stringly.py"
    path.write_text(source)
    p = coconet.load(path)
    assert str(p.arguments[0].type) == "!coco.tensor<32x8xf16, local>"


def test_each_build_makes_fresh_arguments() -> None:
    decl = Tensor(F32, [4], Local)

    def body(g=decl):
        return AllReduce(g)

    p1 = fe.build_program(body)
    p2 = fe.build_program(body)
    assert p1.print() == p2.print()
    assert p1.arguments[0].value is not p2.arguments[0].value


def test_return_tuple_and_run_in_the_sim() -> None:
    @program(grid=[None])
    def f(g: Tensor(F32, [8], Local), w: Tensor(F32, [8])):
        total = AllReduce("+", g)
        biggest = AllReduce("max", g)
        return total + w, biggest

    # an unnamed returned value is called by its position
    assert [o.name for o in f.outputs] == ["result0", "biggest"]
    g = np.arange(24, dtype=np.float32).reshape(3, 8)
    w = np.ones(8, np.float32)
    out = coconet.run(f, {"g": g, "w": w}, ranks=3).outputs
    np.testing.assert_array_equal(out["biggest"], g[2])
    np.testing.assert_array_equal(out["result0"], g.sum(0) + 1)


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------


def test_locals_name_intermediate_values() -> None:
    @program
    def f(m: Tensor(F32, [8]), g: Tensor(F32, [8], Local), beta1: Scalar(F32)):
        g1 = AllReduce("+", g)
        m1 = beta1 * m + (1 - beta1) * g1
        return m1

    text = f.print()
    assert "%g1 = comm.all_reduce sum %g" in text
    assert re.search(r"%m1 = coco.add %\d+, %\d+", text)
    # unnamed temporaries print as numbers
    assert re.search(r"%\d+ = coco.constant 1.0 : !coco.tensor<f32>", text)
    assert f.outputs[0].name == "m1"


def test_rebinding_names_every_value() -> None:
    """A rebound variable names the value it held at the next op, and the final one at the
    return; xDSL's printer keeps them apart with a suffix."""

    @program
    def f(x: Tensor(F32, [8])):
        y = x * 2
        y = y + 1
        return y

    muls = [op for op in ops_of(f) if isinstance(op, coco.MulOp)]
    adds = [op for op in ops_of(f) if isinstance(op, coco.AddOp)]
    assert muls[0].result.name_hint == "y"
    assert adds[0].result.name_hint == "y"
    text = f.print()
    assert "%y = coco.mul %x" in text
    assert "%y_1 = coco.add %y" in text


def test_caller_names_win_over_helper_parameters() -> None:
    def bias_dropout(t, b):
        u = t + b
        return Dropout(u, 0.1, seed=1)

    @program
    def f(x: Tensor(F32, [4, 8], Local), bias: Tensor(F32, [8])):
        total = AllReduce(x)
        out = bias_dropout(total, bias)
        return out

    names = [op.results[0].name_hint for op in ops_of(f) if op.results]
    assert names == ["total", "u", "out"]


def test_named_overrides_and_explicit_names_are_checked() -> None:
    @program
    def f(x: Tensor(F32, [8])):
        y = (x * 2).named("doubled")
        return y

    assert op_named(f, "doubled")

    with pytest.raises(CocoError, match="cannot name"):

        @program
        def g(x: Tensor(F32, [8])):
            return (x * 2).named("2x")

    with pytest.raises(CocoError, match="trailing '_<digits>'"):
        Tensor(F32, [8], Replicated, "w_1")

    with pytest.raises(CocoError, match="argument named 'w'"):

        @program
        def h(w: Tensor(F32, [8])):
            Tensor(F32, [8], Replicated, "w")


def test_argument_names_are_fixed() -> None:
    with pytest.raises(CocoError, match="program argument"):

        @program
        def f(x: Tensor(F32, [8])):
            x.named("y")


# --------------------------------------------------------------------------------------------
# Literals
# --------------------------------------------------------------------------------------------


def constants(p: Program) -> list[coco.ConstantOp]:
    return [op for op in ops_of(p) if isinstance(op, coco.ConstantOp)]


@pytest.mark.parametrize(
    ("dtype", "literal", "want"),
    [
        (F16, 1, "1.0 : !coco.tensor<f16>"),
        (BF16, 0.5, "0.5 : !coco.tensor<bf16>"),
        (F32, 2, "2.0 : !coco.tensor<f32>"),
        (I32, 3, "3 : !coco.tensor<i32>"),
    ],
)
def test_literals_take_the_tensor_element_type(dtype, literal, want) -> None:
    @program
    def f(x: Tensor(dtype, [8])):
        return x * literal

    (c,) = constants(f)
    assert c.result.type.element_type == dtype
    assert f"coco.constant {want}" in f.print()


def test_literal_on_either_side_keeps_operand_order() -> None:
    @program
    def f(x: Tensor(F32, [8])):
        a = 1 - x
        b = 2 / x
        c = 3**x
        d = x - 1
        return a, b, c, d

    for name, cls, lit_first in (("a", coco.SubOp, True), ("b", coco.DivOp, True),
                                 ("c", coco.PowOp, True), ("d", coco.SubOp, False)):  # fmt: skip
        op = op_named(f, name)
        assert isinstance(op, cls)
        lhs_is_const = isinstance(op.lhs.owner, coco.ConstantOp)
        assert lhs_is_const == lit_first


def test_literal_constants_are_shared_but_const_is_fresh() -> None:
    @program
    def f(b1: Scalar(F32), b2: Scalar(F32)):
        c = Const(F32, 1.0)
        return (1 - b1) * (1.0 - b2) * c

    consts = constants(f)
    assert len(consts) == 2  # one shared literal 1.0, one explicit Const
    assert consts[0].result.name_hint == "c"  # Const comes first in the body
    assert len(list(consts[1].result.uses)) == 2


def test_boolean_literals_and_i1() -> None:
    @program
    def f(x: Tensor(F32, [8])):
        mask = x > 0
        both = Eq(mask, True)
        return Ite(both, x, 0)

    (cmp0, cmp1) = [op for op in ops_of(f) if isinstance(op, coco.CmpOp)]
    assert cmp0.predicate.data == "gt"
    assert cmp1.predicate.data == "eq"
    assert isinstance(cmp1.rhs.owner, coco.ConstantOp)
    assert cmp1.rhs.type.element_type == I1


@pytest.mark.parametrize(
    ("dtype", "literal", "message"),
    [
        (I32, 0.5, "float literal 0.5 meets an integer"),
        (F32, True, "booleans only combine with i1"),
        (I1, 2, "meets an i1 tensor"),
        (F32, float("inf"), "not finite"),
        (F32, "1", "neither a tensor nor a number"),
        (F32, np.complex64(1 + 2j), "is not a real number"),
    ],
)
def test_bad_literals(dtype, literal, message) -> None:
    with pytest.raises(CocoError, match=message):

        @program
        def f(x: Tensor(dtype, [8])):
            return x + literal


def test_numpy_scalars_are_literals() -> None:
    @program
    def f(x: Tensor(F32, [8])):
        return x * np.float32(0.25) + np.int64(1) + np.float64(3.0) * x

    assert [c.number for c in constants(f)] == [0.25, 1.0, 3.0]
    (left,) = [op for op in ops_of(f) if isinstance(op, coco.MulOp) and
               isinstance(op.lhs.owner, coco.ConstantOp)]  # fmt: skip
    assert left.lhs.owner.number == 3.0


# --------------------------------------------------------------------------------------------
# Operators and functions: one op each, with the inferred type
# --------------------------------------------------------------------------------------------

ELEMENTWISE = [
    (lambda x, y: x + y, coco.AddOp),
    (lambda x, y: x - y, coco.SubOp),
    (lambda x, y: x * y, coco.MulOp),
    (lambda x, y: x / y, coco.DivOp),
    (lambda x, y: x**y, coco.PowOp),
    (lambda x, y: Pow(x, y), coco.PowOp),
    (lambda x, y: Max(x, y), coco.MaxOp),
    (lambda x, y: Min(x, y), coco.MinOp),
    (lambda x, y: -x, coco.NegOp),
    (lambda x, y: Neg(x), coco.NegOp),
    (lambda x, y: abs(x), coco.AbsOp),
    (lambda x, y: Abs(x), coco.AbsOp),
    (lambda x, y: Sqrt(x), coco.SqrtOp),
    (lambda x, y: Rsqrt(x), coco.RsqrtOp),
    (lambda x, y: Exp(x), coco.ExpOp),
    (lambda x, y: Log(x), coco.LogOp),
    (lambda x, y: Tanh(x), coco.TanhOp),
    (lambda x, y: Relu(x), coco.ReluOp),
    (lambda x, y: Gelu(x), coco.GeluOp),
    (lambda x, y: Sigmoid(x), coco.SigmoidOp),
    (lambda x, y: Dropout(x, 0.25, seed=9), coco.DropoutOp),
]


@pytest.mark.parametrize(("build", "cls"), ELEMENTWISE, ids=lambda v: getattr(v, "name", ""))
def test_elementwise_operators(build, cls) -> None:
    @program
    def f(x: Tensor(F16, [4, 8], Sliced(1)), y: Tensor(F16, [8])):
        out = build(x, y)
        return out

    op = op_named(f, "out")
    assert isinstance(op, cls)
    assert str(op.results[0].type) == "!coco.tensor<4x8xf16, sliced<1>>"
    roundtrips(f)


@pytest.mark.parametrize(
    ("sym", "pred"),
    [("<", "lt"), ("<=", "le"), (">", "gt"), (">=", "ge"), ("Eq", "eq"), ("Ne", "ne")],
)
def test_comparisons(sym, pred) -> None:
    fns = {
        "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b, "Eq": Eq, "Ne": Ne,
    }  # fmt: skip

    @program
    def f(x: Tensor(F32, [8], Local), y: Tensor(F32, [8], Local)):
        c = fns[sym](x, y)
        return c

    op = op_named(f, "c")
    assert isinstance(op, coco.CmpOp)
    assert op.predicate.data == pred
    assert str(op.result.type) == "!coco.tensor<8xi1, local>"


def test_python_equality_keeps_identity() -> None:
    @program
    def f(x: Tensor(F32, [8])):
        y = x + 1
        assert (y == y) is True
        assert (y == x) is False
        assert len({x, y, x}) == 2
        return y

    assert len(constants(f)) == 1


def test_truth_value_is_refused() -> None:
    with pytest.raises(CocoError, match="no truth value.*Ite"):

        @program
        def f(x: Tensor(F32, [8])):
            if x > 0:
                return x


def test_matmul_reductions_cast_slice() -> None:
    @program
    def f(
        a: Tensor(F16, [2, 4, 16], Sliced(2)),
        w: Tensor(F16, [16, 8], Sliced(0)),
        r: Tensor(F32, [32]),
    ):
        partial = MatMul(a, w)
        also = a @ w
        total = AllReduce("+", partial)
        wide = Cast(F32, total)
        narrow = Cast(wide, BF16)  # either argument order
        s = ReduceSum(wide)
        mx = ReduceMax(wide)
        mn = ReduceMin(wide)
        n = Norm(r)
        part = Slice(r, 0)
        part2 = Scatter(r)
        return partial, also, narrow, s, mx, mn, n, part, part2

    types = {name: str(op_named(f, name).results[0].type) for name in (
        "partial", "narrow", "s", "mx", "mn", "n", "part", "part2")}  # fmt: skip
    assert types == {
        "partial": "!coco.tensor<2x4x8xf16, local>",
        "narrow": "!coco.tensor<2x4x8xbf16>",
        "s": "!coco.tensor<f32>",
        "mx": "!coco.tensor<f32>",
        "mn": "!coco.tensor<f32>",
        "n": "!coco.tensor<f32>",
        "part": "!coco.tensor<32xf32, sliced<0>>",
        "part2": "!coco.tensor<32xf32, sliced<0>>",
    }
    assert isinstance(op_named(f, "also"), coco.MatmulOp)
    assert op_named(f, "s").kind.data == "sum"
    assert op_named(f, "n").kind.data == "norm"
    roundtrips(f)


def test_collectives() -> None:
    @program(grid=[None])
    def f(g: Tensor(F32, [8, 4], Local)):
        s = AllReduce("+", g)
        p = AllReduce("*", g)
        mx = AllReduce("max", g)
        mn = AllReduce("min", g)
        default = AllReduce(g)
        rs = ReduceScatter("sum", g, dim=1)
        ag = AllGather(rs)
        bc = Broadcast(g, root=1)
        rd = Reduce("+", g, root=2)
        return s, p, mx, mn, default, rs, ag, bc, rd

    kinds = {n: op_named(f, n).kind.data for n in ("s", "p", "mx", "mn", "default", "rs", "rd")}
    assert kinds == {"s": "sum", "p": "prod", "mx": "max", "mn": "min", "default": "sum",
                     "rs": "sum", "rd": "sum"}  # fmt: skip
    assert str(op_named(f, "rs").result.type) == "!coco.tensor<8x4xf32, sliced<1>>"
    assert str(op_named(f, "ag").result.type) == "!coco.tensor<8x4xf32>"
    assert op_named(f, "bc").root.value.data == 1
    assert str(op_named(f, "rd").result.type) == "!coco.tensor<8x4xf32, local>"
    roundtrips(f)
    coconet.run(f, None, ranks=4)


def test_all_to_all() -> None:
    @program(grid=[None])
    def f(x: Tensor(F32, [8, 6], Sliced(0)), d: Tensor(F32, [12, 3], Local)):
        y = AllToAll(x, dim=1)
        back = AllToAll(y, dim=0)
        e = AllToAll(d)
        return y, back, e

    assert str(op_named(f, "y").result.type) == "!coco.tensor<8x6xf32, sliced<1>>"
    assert str(op_named(f, "back").result.type) == "!coco.tensor<8x6xf32, sliced<0>>"
    assert str(op_named(f, "e").result.type) == "!coco.tensor<12x3xf32, local>"
    roundtrips(f)
    for ranks in (1, 2, 3, 4):
        x = np.arange(48, dtype=np.float32).reshape(8, 6)
        d = np.arange(ranks * 36, dtype=np.float32).reshape(ranks, 12, 3)
        out = coconet.run(f, {"x": x, "d": d}, ranks=ranks)
        assert np.array_equal(out["y"], x)
        assert np.array_equal(out["back"], x)
        k = 12 // ranks  # member i's block j is member j's block i
        want = d.reshape(ranks, ranks, k, 3).transpose(1, 0, 2, 3).reshape(ranks, 12, 3)
        assert np.array_equal(out["e"], want)


def test_unknown_reduction() -> None:
    with pytest.raises(CocoError, match="unknown reduction 'avg'"):

        @program
        def f(g: Tensor(F32, [8], Local)):
            AllReduce("avg", g)


# --------------------------------------------------------------------------------------------
# N-D grids
# --------------------------------------------------------------------------------------------


def test_two_d_grid_collectives_span_the_right_axes() -> None:
    @program(grid=[2, None])
    def f(x: Tensor(F32, [8, 8], [Local, Local]), y: Tensor(F32, [8, 8])):
        inner = AllReduce("+", x, over=[1])
        outer = AllReduce("+", x, over=0)
        everywhere = AllReduce("+", x)
        sent = Send(inner, along=0, shift=1)
        via_group_rank = Send(inner, GroupRank(GROUP + 1, RANK))
        repl_sent = Send(y)
        part = Slice(y, 1, over=[1])
        return sent, via_group_rank, outer, everywhere, repl_sent, part

    t = {n: op_named(f, n).results[0].type.layout_text() for n in (
        "inner", "outer", "everywhere", "sent", "via_group_rank", "repl_sent", "part")}  # fmt: skip
    assert t == {
        "inner": "[local, replicated]",
        "outer": "[replicated, local]",
        "everywhere": "replicated",
        "sent": "[local, replicated]",
        "via_group_rank": "[local, replicated]",
        "repl_sent": "[local, replicated]",
        "part": "[replicated, sliced<1>]",
    }
    assert "over [1]" in f.print()
    roundtrips(f)
    coconet.run(f, None, ranks=4)


def test_group_rank_helper() -> None:
    assert GroupRank(GROUP + 2, RANK).group.shift == 2
    with pytest.raises(CocoError, match="this rank itself"):
        GroupRank(GROUP, RANK)


# --------------------------------------------------------------------------------------------
# Friendly errors
# --------------------------------------------------------------------------------------------


def build_error(fn, grid=(None,)) -> CocoError:
    with pytest.raises(CocoError) as info:
        fe.build_program(fn, grid)
    err = info.value
    # one clear message, not a chained xDSL traceback
    assert err.__suppress_context__ or err.__context__ is None
    assert not isinstance(err, VerifyException)
    return err


def test_elementwise_layout_violation_names_rule_and_python_names() -> None:
    def bad(grads: Tensor(F32, [16], Local), weights: Tensor(F32, [16], Sliced(0))):
        mixed = grads + weights  # noqa: F841

    msg = str(build_error(bad))
    assert "[elementwise-layouts]" in msg
    assert "`grads + weights`" in msg
    assert "'grads'" in msg
    assert "'weights'" in msg
    assert re.search(r"test_frontend\.py:\d+", msg)


def test_intermediate_operands_are_named_by_their_variables() -> None:
    def bad(g: Tensor(F32, [16], Local), w: Tensor(F32, [16], Sliced(0)), lr: Scalar(F32)):
        step_size = lr * 2
        scaled = step_size * g
        sliced = w * 3
        return scaled - sliced

    msg = str(build_error(bad))
    assert "`scaled - sliced`" in msg
    assert "[elementwise-layouts]" in msg


@pytest.mark.parametrize(
    ("rule", "fn"),
    [
        ("all-reduce-input", lambda w=Tensor(F32, [16], Sliced(0), "w"): AllReduce(w)),
        ("all-gather-input", lambda w=Tensor(F32, [16], Local, "w"): AllGather(w)),
        ("reduce-scatter-input", lambda w=Tensor(F32, [16], Sliced(0), "w"): ReduceScatter(w)),
        ("all-to-all-layouts", lambda w=Tensor(F32, [4, 4], Sliced(0), "w"): AllToAll(w, 0)),
        ("all-to-all-layouts", lambda w=Tensor(F32, [4, 4], name="w"): AllToAll(w, 1)),
        ("all-to-all-layouts", lambda w=Tensor(F32, [4, 4], Sliced(0), "w"): AllToAll(w, 2)),
        (
            "matmul-layouts",
            lambda a=Tensor(F16, [4, 8], Sliced(1), "a"), b=Tensor(F16, [8, 4], Sliced(1), "b"): (
                MatMul(a, b)
            ),
        ),
        ("matmul-shapes", lambda a=Tensor(F16, [4, 8]), b=Tensor(F16, [4, 8]): MatMul(a, b)),
        ("element-types", lambda a=Tensor(F16, [8]), b=Tensor(F32, [8]): a + b),
        ("element-types", lambda a=Tensor(I32, [8]): Sqrt(a)),
        ("norm-of-slice", lambda a=Tensor(F32, [8], Sliced(0)): Norm(a)),
        ("broadcast-shapes", lambda a=Tensor(F32, [8]), b=Tensor(F32, [4]): a * b),
        ("dropout-probability", lambda a=Tensor(F32, [8]): Dropout(a, 1.5)),
        ("slice-layouts", lambda a=Tensor(F32, [8], Local): Slice(a, 0)),
        ("sliced-dim-in-range", lambda a=Tensor(F32, [8]): Slice(a, 1)),
        ("update-type", lambda w=Tensor(F32, [8]), g=Tensor(F32, [8], Local): Update(w, g)),
        ("update-type", lambda w=Tensor(F32, [8]), g=Tensor(F16, [8]): Update(w, g)),
    ],
)
def test_rule_violations(rule: str, fn) -> None:
    assert f"[{rule}]" in str(build_error(fn))


def test_grid_rules_at_declaration() -> None:
    msg = str(build_error(lambda x=Tensor(F16, [4, 16], Local): x, grid=[2, None]))
    assert "[layouts-per-axis]" in msg
    assert "[Local, Sliced(0)]" in msg
    msg = str(build_error(lambda x=Tensor(F16, [3], Sliced(0)): x, grid=[4]))
    assert "[empty-slice]" in msg
    msg = str(build_error(lambda x=Tensor(F16, [10], Local): AllReduce(x, over=[3])))
    assert "[collective-axes]" in msg


def test_bad_declarations() -> None:
    with pytest.raises(CocoError, match="not an element type"):
        Tensor("f32", [4])
    with pytest.raises(CocoError, match="positive ints"):
        Tensor(F32, [4, 0])
    with pytest.raises(CocoError, match="not a layout"):
        Tensor(F32, [4], "local")
    with pytest.raises(CocoError, match="Sliced\\(dim\\)"):
        Tensor(F32, [4], Sliced)
    with pytest.raises(CocoError, match="sliced-dim-in-range"):
        Tensor(F32, [4], Sliced(1))
    with pytest.raises(CocoError, match="grid sizes"):
        program(grid=[0])(lambda: None)


def test_updates_are_checked() -> None:
    def read_after(w: Tensor(F32, [8]), g: Tensor(F32, [8])):
        Update(w, w - g)
        return w + 1

    msg = str(build_error(read_after))
    assert "reads 'w' after Update(w, ...)" in msg

    def twice(w: Tensor(F32, [8]), g: Tensor(F32, [8])):
        Update(w, g)
        Update(w, g * 2)

    assert "after Update(w" in str(build_error(twice))

    def not_an_argument(w: Tensor(F32, [8])):
        Update(w * 2, w)

    assert "not a declared tensor" in str(build_error(not_an_argument))


def test_update_returns_the_new_value() -> None:
    @program
    def f(m: Tensor(F32, [8]), g: Tensor(F32, [8])):
        m1 = Update(m, m * 0.5 + g)
        return m1 * 2

    assert next(o.name for o in f.outputs) == "m"
    inputs = {"m": np.full(8, 2, np.float32), "g": np.ones(8, np.float32)}
    out = coconet.run(f, inputs, ranks=1).outputs
    np.testing.assert_array_equal(out["m"], 2)
    np.testing.assert_array_equal(inputs["m"], 2)


def test_misuse_outside_programs() -> None:
    decl = Tensor(F32, [8])
    with pytest.raises(CocoError, match="inside a @program"):
        AllReduce(decl)
    with pytest.raises(CocoError, match="inside a @program"):
        decl + 1

    kept = {}

    @program
    def f(x: Tensor(F32, [8])):
        kept["x"] = x
        return x

    with pytest.raises(CocoError, match="another program"):

        @program
        def g(y: Tensor(F32, [8])):
            return y + kept["x"]

    with pytest.raises(CocoError, match="outside the program"):

        @program
        def h(y: Tensor(F32, [8])):
            return y + decl


def test_parameters_must_be_declared() -> None:
    msg = str(build_error(lambda w: w))
    assert "parameter 'w'" in msg
    assert "not a declared tensor" in msg
    with pytest.raises(CocoError, match="plain positional"):

        @program
        def f(*xs):
            pass


def test_returning_non_tensors() -> None:
    assert "returns 3" in str(build_error(lambda x=Tensor(F32, [4]): 3))


def test_error_leaves_no_builder_active() -> None:
    build_error(lambda w=Tensor(F32, [16], Sliced(0)): AllReduce(w))
    with pytest.raises(CocoError, match="inside a @program"):
        AllReduce(Tensor(F32, [8]))


def test_element_types_exported() -> None:
    assert isinstance(F16, Float16Type)
    assert isinstance(BF16, BFloat16Type)
    assert isinstance(F32, Float32Type)
    assert isinstance(I1, IntegerType)
    assert set(fe.__all__) <= set(dir(fe))
    assert comm.AllReduceOp
    assert coco.AddOp


def test_row_wise_ops_and_norms() -> None:
    """Sum/Mean/AMax over dims, Reshape, and LayerNorm, RMSNorm, Softmax built from them:
    the program prints and parses back, and the sim computes what NumPy does."""

    @fe.program(grid=[None])
    def norms(
        x: fe.Tensor(F32, [8, 16], fe.Sliced(0)),
        g: fe.Tensor(F32, [16], fe.Replicated),
        b: fe.Tensor(F32, [16], fe.Replicated),
    ):
        ln = fe.LayerNorm(x, g, b)
        rms = fe.RMSNorm(x, g, eps=1e-5)
        soft = fe.Softmax(x)
        total = fe.Sum(x, [0, 1])
        cube = fe.Reshape(x, [8, 4, 4])
        return ln, rms, soft, total, cube

    roundtrips(norms)
    ops = [op.name for op in norms.func.walk()]
    assert ops.count("coco.reduce_dims") == 6
    assert "coco.reshape" in ops
    result = coconet.run(norms, ranks=2)
    x, g, b = (result.inputs[k].astype(np.float64) for k in ("x", "g", "b"))
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    e = np.exp(x - x.max(-1, keepdims=True))
    want = {
        "ln": (x - mu) / np.sqrt(var + 1e-5) * g + b,
        "rms": x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g,
        "soft": e / e.sum(-1, keepdims=True),
        "total": [x[:4].sum(), x[4:].sum()],  # local: each rank's partial sum
        "cube": x.reshape(8, 4, 4),
    }
    for name, value in want.items():
        np.testing.assert_allclose(result[name], value, rtol=2e-5, atol=2e-6, err_msg=name)
    assert norms.func.body.block.last_op.operands[3].type.layout_text() == "local"


def test_row_reductions_refuse_with_their_rule() -> None:
    with pytest.raises(CocoError, match=r"\[reduce-dims-layouts\] the mean of x"):

        @fe.program(grid=[None])
        def partial_mean(x: fe.Tensor(F32, [8, 16], fe.Sliced(1))):
            return fe.Mean(x, -1)

    with pytest.raises(CocoError, match=r"5 is not a dim of a rank-2 tensor"):

        @fe.program(grid=[None])
        def bad_dim(x: fe.Tensor(F32, [8, 16], fe.Replicated)):
            return fe.Sum(x, 5)
