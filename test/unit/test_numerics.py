"""The numerics policy (docs/architecture.md §3.4.2): `exact` transcendentals compute in f64 and
round once, bit-identical on every target; `fast` ones compute in f32 with each target's f32
functions, within a few f32 ulps of the exact result. Chosen per op or as a function's or
module's default, printed and parsed, honoured by the sim, the kernels (host and CUDA text),
the kernel caches and the equivalence checker."""

from __future__ import annotations

import hashlib
import os
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from xdsl.printer import Printer

import coconet
from coconet import frontend
from coconet.core.program import CocoError, Program, parse_module
from coconet.dialects import coco
from coconet.equivalence import check_equivalence
from coconet.frontend import F32, Exp, Log, Softmax, Tensor
from coconet.lowering.lower_to_plan import lower
from coconet.runtime.check import compare_outputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.toolchain.host_compiler import host_cache_path, host_compile_flags
from coconet.toolchain.nvrtc import compile_cuda, device_headers, nvrtc_available, nvrtc_version

T = "!coco.tensor<4096xf32, sliced<0>>"
# every op a policy applies to, on inputs where f32 libm and rounded f64 results differ
OPS = """
    %e = coco.exp %x{own} : {T}
    %l = coco.log %y{own} : {T}
    %t = coco.tanh %x{own} : {T}
    %s = coco.sigmoid %x{own} : {T}
    %g = coco.gelu %x{own} : {T}
    %p = coco.pow %y, %x{own} : {T}, {T} -> {T}
    %r = coco.rsqrt %y{own} : {T}
"""
RESULTS = ["e", "l", "t", "s", "g", "p", "r"]


def program_text(module_policy: str | None = None, op_policy: str | None = None) -> str:
    attrs = f" attributes {{coco.numerics = #coco<numerics {module_policy}>}}"
    own = f" numerics {op_policy}" if op_policy else ""
    body = OPS.replace("{own}", own).replace("{T}", T)
    results = ", ".join(f"%{r}" for r in RESULTS)
    types = ", ".join([T] * len(RESULTS))
    return (
        f"builtin.module{attrs if module_policy else ''} {{\n"
        f"  func.func @f(%x: {T}, %y: {T}) -> ({types}) "
        f"attributes {{coco.grid = #coco.grid<[?]>}} {{{body}"
        f"    func.return {results} : {types}\n  }}\n}}\n"
    )


def program(module_policy: str | None = None, op_policy: str | None = None) -> Program:
    return Program(parse_module(program_text(module_policy, op_policy)))


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        # gelu's far negative side too, where its tanh form cancelled (1 + tanh(u)): the
        # kernels and the sim compute x / (1 + exp(-2u)) there, bit-identical as well
        "x": rng.uniform(-16, 8, 4096).astype(np.float32),
        "y": rng.uniform(0.01, 30, 4096).astype(np.float32),
    }


def ulps(got: np.ndarray, want: np.ndarray, name: str = "", x: np.ndarray | None = None) -> float:
    """The largest difference in f32 ulps of `want`; for gelu, ulps of max(|want|, |x|): its
    f32 formula cancels in 1 + tanh for negative x, an error relative to x, not to the result."""
    scale = np.abs(want.astype(np.float32))
    if name == "g" and x is not None:
        scale = np.maximum(scale, np.abs(x))
    spacing = np.spacing(scale).astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)) / spacing))


def gelu_f64(x: np.ndarray) -> np.ndarray:
    """The tanh form, and x / (1 + exp(-2u)) where it would cancel (below -3)."""
    u = 0.7978845608028654 * (x + 0.044715 * x**3)
    with np.errstate(over="ignore"):
        return np.where(x >= -3, 0.5 * x * (1 + np.tanh(u)), x / (1 + np.exp(-2 * u)))


def exact_f64(name: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """What `exact` computes: the result rounded once from f64 (rsqrt: in f32)."""
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    value = {
        "e": np.exp(xd),
        "l": np.log(yd),
        "t": np.tanh(xd),
        "s": 1 / (1 + np.exp(-xd)),
        "g": gelu_f64(xd),
        "p": np.power(yd, xd),
        # rsqrt is not transcendental: exact is 1/sqrt in f32, each operation rounded
        "r": np.float32(1) / np.sqrt(y),
    }[name]
    return value.astype(np.float32)


def test_policy_prints_parses_and_resolves():
    """Per op and per module, in the custom and the generic form; the op's own policy wins,
    then its function's, then its module's; exact by default."""
    for module_policy, op_policy in (
        (None, None),
        ("fast", None),
        ("fast", "exact"),
        (None, "fast"),
    ):
        text = program_text(module_policy, op_policy)
        p = Program(parse_module(text))
        printed = str(p.module)
        assert ("numerics" in printed) == bool(module_policy or op_policy)
        if module_policy:
            assert f"coco.numerics = #coco<numerics {module_policy}>" in printed
        if op_policy:
            assert f"coco.exp %x numerics {op_policy} :" in printed
        again = parse_module(printed)
        assert str(again) == printed
        generic = StringIO()
        Printer(stream=generic, print_generic_format=True).print_op(p.module)
        if op_policy:
            assert f"<{{numerics = #coco<numerics {op_policy}>}}>" in generic.getvalue()
        assert str(parse_module(generic.getvalue())) == printed
        want = op_policy or module_policy or "exact"
        for op in p.func.walk():
            if isinstance(op, coco.NUMERICS_OPS):
                assert coco.numerics_of(op).value == want
    # a function's default sits between its module's and its ops'
    text = program_text("exact").replace(
        "attributes {coco.grid", "attributes {coco.numerics = #coco<numerics fast>, coco.grid"
    )
    p = Program(parse_module(text))
    assert {coco.numerics_of(op) for op in p.func.walk() if isinstance(op, coco.ExpOp)} == {
        coco.Numerics.FAST
    }
    # what no policy applies to is exact; a default that is no policy is refused
    assert coco.numerics_of(p.func.body.block.last_op) == coco.Numerics.EXACT
    with pytest.raises(CocoError, match=r"\[unknown-attribute\].*numerics policy"):
        parse_module(
            program_text().replace(
                "builtin.module {", 'builtin.module attributes {coco.numerics = "fast"} {'
            )
        )
    with pytest.raises(CocoError):
        parse_module(program_text(op_policy="quick"))


def test_sim_fast_is_f32_and_exact_is_rounded_f64():
    """exact: each op's f64 result rounded once; fast: NumPy's f32 loops, which differ from
    it (somewhere on these inputs, for exp and the ops built on it) and stay within 4 f32
    ulps of it."""
    given = inputs()
    exact = coconet.run(program(), given, ranks=2, inplace=False).outputs
    fast = coconet.run(program("fast"), given, ranks=2, inplace=False).outputs
    x, y = given["x"], given["y"]
    for name, result in zip(RESULTS, exact):
        want = exact_f64(name, x, y)
        assert np.array_equal(exact[result], want), name
        assert ulps(fast[result], want, name, x) <= 4, name
    assert np.array_equal(fast[exact_key(exact, "e")], np.exp(x))  # NumPy's f32 exp itself
    assert not np.array_equal(fast[exact_key(exact, "e")], exact[exact_key(exact, "e")])
    assert not np.array_equal(fast[exact_key(exact, "p")], exact[exact_key(exact, "p")])
    # an op's own `exact` wins over the module's `fast`
    mixed = coconet.run(program("fast", "exact"), given, ranks=2, inplace=False).outputs
    assert all(np.array_equal(mixed[k], exact[k]) for k in exact)


def exact_key(outputs: dict[str, np.ndarray], name: str) -> str:
    return list(outputs)[RESULTS.index(name)]


@pytest.mark.usefixtures("product_host_build")  # libmvec's calls come from vectorized loops
def test_host_kernels_follow_the_policy():
    """The cpu backend's kernels: exact still bit-identical to the sim; fast within a few f32
    ulps of the fast sim and of rounded f64, with the f32 functions in the text (and no
    double), and a different text, so no cache shares a kernel between the two."""
    given = inputs()
    texts = {}
    for policy in ("exact", "fast"):
        p = program(policy)
        plan = lower(p, 2)
        texts[policy] = plan.cuda_source
        want = coconet.run(p, given, ranks=2, inplace=False).outputs
        got = ThreadedExecutor(plan).run(given)
        for name, key in zip(RESULTS, want):
            if policy == "exact":
                assert np.array_equal(got[key], want[key]), name
            else:
                x = given["x"]
                assert ulps(got[key], want[key], name, x) <= 8, name
                assert ulps(got[key], exact_f64(name, x, given["y"]), name, x) <= 8, name
        # coco-run --check's comparison: exact bit-exact, fast within f32's tolerance
        checked = compare_outputs([got], [want])
        assert checked.ok
        assert checked.bit_exact == (policy == "exact")
    for fn in ("exp", "log", "tanh", "sigmoid", "gelu", "pow", "rsqrt"):
        assert f"coco_fast_{fn}(" in texts["fast"]
        assert f"coco_fast_{fn}(" not in texts["exact"]
    assert "coco_exp((double)" in texts["exact"]
    assert "coco_exp(" not in texts["fast"]
    assert host_cache_path(texts["exact"]) != host_cache_path(texts["fast"])
    if "-DCOCO_HOST_LIBMVEC" in host_compile_flags():
        # fast's loops call glibc's vector expf (_ZGVdN8v_expf under AVX2); exact's, none
        assert b"v_expf" in host_cache_path(texts["fast"]).read_bytes()
        assert b"v_expf" not in host_cache_path(texts["exact"]).read_bytes()


def test_the_policy_survives_schedules_into_fused_kernels():
    """A module default reaches the ops a schedule moves into a fused region (the row kernel
    of fuse(rs-c-ag)); the front end's numerics= and per-op policies build the same IR."""

    @frontend.program(grid=[None], numerics="fast")
    def rows(x: Tensor(F32, [8, 64], frontend.Local)):
        return Softmax(frontend.AllReduce("+", x))

    assert str(rows.module).startswith(
        "builtin.module attributes {coco.numerics = #coco<numerics fast>}"
    )
    from coconet.schedule import apply_schedule

    fused = apply_schedule(rows, "fuse(rs-c-ag)")
    source = lower(fused, 2).cuda_source
    assert "coco_fast_exp(" in source
    assert "coco_exp(" not in source
    report = check_equivalence(rows, fused, ranks=(2,), seeds=(0,))
    assert report.ok, str(report)

    @frontend.program(grid=[None])
    def per_op(x: Tensor(F32, [64], frontend.Sliced(0))):
        return Exp(x, numerics="fast"), Log(x)

    printed = str(per_op.module)
    assert "coco.exp %x numerics fast" in printed
    assert "coco.log %x :" in printed
    with pytest.raises(CocoError, match="unknown numerics policy 'quick'"):

        @frontend.program(grid=[None])
        def wrong(x: Tensor(F32, [64], frontend.Sliced(0))):
            return Exp(x, numerics="quick")

    with pytest.raises(CocoError, match="numerics='quick'"):
        frontend.program(grid=[None], numerics="quick")(lambda: None)


def test_equivalence_loosens_only_what_a_fast_op_feeds():
    """An output a fast op feeds compares within f32's tolerance; one it does not feed stays
    bit-exact: sigmoid written as 1 / (1 + exp(-x)) in f32 ops differs from the exact
    sigmoid in the last bits, and that is still a mismatch."""
    t = "!coco.tensor<256xf32, sliced<0>>"

    def text(fast: bool, composed: bool) -> str:
        own = " numerics fast" if fast else ""
        if composed:
            sig = (
                f"%n = coco.neg %x : {t}\n    %en = coco.exp %n : {t}\n"
                f"    %one = coco.constant 1.0 : !coco.tensor<f32>\n"
                f"    %d = coco.add %one, %en : !coco.tensor<f32>, {t} -> {t}\n"
                f"    %s = coco.div %one, %d : !coco.tensor<f32>, {t} -> {t}"
            )
        else:
            sig = f"%s = coco.sigmoid %x : {t}"
        return (
            f"builtin.module {{\n  func.func @f(%x: {t}) -> ({t}, {t}) "
            f"attributes {{coco.grid = #coco.grid<[?]>}} {{\n"
            f"    %e = coco.exp %x{own} : {t}\n    {sig}\n"
            f"    func.return %e, %s : {t}, {t}\n  }}\n}}\n"
        )

    before = Program(parse_module(text(False, False)))
    given = {"x": np.random.default_rng(3).uniform(-8, 8, 256).astype(np.float32)}
    report = check_equivalence(
        before, Program(parse_module(text(True, False))), ranks=(2,), inputs=given
    )
    assert report.ok, str(report)
    assert report.fast == ["%e"]
    report = check_equivalence(
        before, Program(parse_module(text(True, True))), ranks=(2,), inputs=given
    )
    assert report.mismatched_outputs() == ["s"], str(report)
    assert "fast-numerics" in report.summary()


def _ptx(source: str) -> str:
    """NVRTC's PTX of `source` for compute_90, once per suite run (a file in the suite's cache
    directory keyed by everything NVRTC reads), and a warning-free sm_90 build beside it."""
    parts = ["numerics", source, *sorted(device_headers().items()), str(nvrtc_version())]
    key = hashlib.sha256(repr(parts).encode()).hexdigest()
    marker = Path(os.environ["COCONET_CACHE_DIR"]) / "test-nvrtc-ptx" / key
    if not marker.exists():
        assert compile_cuda(source, "sm_90", warnings_as_errors=True).cubin
        ptx = compile_cuda(source, "compute_90", warnings_as_errors=True).ptx
        assert ptx is not None
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(ptx.decode())
    return marker.read_text()


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_nvrtc_compiles_the_fast_form_to_f32_math():
    """sm_90: exact computes exp in double (f64 arithmetic in the PTX); fast calls CUDA's expf,
    whose f32 range reduction ends in the ex2.approx.f32 instruction, and rsqrtf, one
    rsqrt.approx.f32, with no f64 arithmetic left."""
    exact = _ptx(lower(program(), 2).cuda_source)
    fast = _ptx(lower(program("fast"), 2).cuda_source)
    assert ".f64" in exact
    assert "rsqrt.approx" not in exact
    assert "ex2.approx.f32" in fast or "ex2.approx.ftz.f32" in fast
    assert "rsqrt.approx.f32" in fast
    assert not any(op in fast for op in ("mul.rn.f64", "fma.rn.f64", "add.rn.f64", "cvt.f64.f32"))
