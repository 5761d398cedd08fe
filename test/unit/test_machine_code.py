"""The machine code of the fused optimizers' kernels (lowering/machine_code.py): compiled by
NVRTC for sm_90 as a GPU build of their plan compiles them, disassembled by nvdisasm, they
spill nothing and issue every global load of a vector iteration -- every peer's piece of the
gradient, the state, the weights -- before they compute on any loaded value, so that an
iteration waits for memory once (docs/architecture.md section 5, coco_device.h VECTORS).

The check reads the SASS itself: the loops of each kernel's control-flow graph, the global
loads of each one's own body, and the first floating-point instruction (and the first
division or square root) that reads a loaded value. Under the kernel text and device layer
of commit 5037287 the Adam kernel fails it: the peers' gradients were read in a loop whose
trip count is known only at run time, `v` after that loop and `w` after the divisions."""

from __future__ import annotations

from pathlib import Path

import pytest

from coconet.lowering.machine_code import (
    MachineCodeError,
    disassemble,
    kernel_reports,
    parse_ptxas_log,
    parse_sass,
    vector_loops,
)
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

EXAMPLES = Path(__file__).parents[2] / "examples"


def _tools_missing() -> str | None:
    if not nvrtc_available():
        return "the nvidia-cuda-nvrtc wheel is not installed"
    from coconet.lowering.machine_code import nvdisasm_path

    if nvdisasm_path() is None:
        return "nvdisasm is not installed (the nvidia-cuda-nvdisasm wheel, coconet[test])"
    return None


needs_tools = pytest.mark.skipif(_tools_missing() is not None, reason=str(_tools_missing()))


def _adamw(n: int = 4096):
    """AdamW (decoupled weight decay, torch.optim.AdamW): Adam's update plus lr * wd * w."""
    from coconet import frontend
    from coconet.frontend import F32, AllReduce, Local, Replicated, Scalar, Sqrt, Tensor, Update

    @frontend.program(grid=[None])
    def adamw(
        g: Tensor(F32, [n], Local),
        w: Tensor(F32, [n], Replicated),
        m: Tensor(F32, [n], Replicated),
        v: Tensor(F32, [n], Replicated),
        lr: Scalar(F32),
        beta1: Scalar(F32),
        beta2: Scalar(F32),
        eps: Scalar(F32),
        weight_decay: Scalar(F32),
        step: Scalar(F32),
    ):
        g1 = AllReduce("+", g)
        m1 = beta1 * m + (1 - beta1) * g1
        v1 = beta2 * v + (1 - beta2) * g1 * g1
        Update(m, m1)
        Update(v, v1)
        mhat = m1 / (1 - beta1**step)
        vhat = v1 / (1 - beta2**step)
        w1 = w - lr * (mhat / (Sqrt(vhat) + eps) + weight_decay * w)
        Update(w, w1)

    return adamw


def _fused(name: str, symmetric_w: bool = False):
    import coconet
    from coconet.core.program import mark_symmetric
    from coconet.schedule import apply_schedule

    program = _adamw() if name == "adamw" else coconet.load(EXAMPLES / f"{name}.mlir")
    if symmetric_w:  # the weights assembled in place (no staging store, an exit step)
        mark_symmetric(program.func, [a.value.index for a in program.arguments if a.name == "w"])
    return apply_schedule(program, "fuse(rs-c-ag)")


@needs_tools
@pytest.mark.parametrize(
    ("ranks", "symmetric_w"),
    # (on one rank the kernel is a plain one either way)
    [(1, False), (4, False), (8, False), (4, True), (8, True)],
    ids=["1", "4", "8", "4-in-place", "8-in-place"],
)
@pytest.mark.parametrize("name", ["adam", "adamw", "sgd", "lamb"])
def test_fused_optimizer_kernels_issue_all_loads_first_and_spill_nothing(name, ranks, symmetric_w):
    """Every kernel of the fused optimizer (LAMB: both), built for its plan on 1, 4 and 8
    ranks, its weights staged or assembled in place: no spills, no stack, and in every
    vector loop every global load issued before the first computation on loaded data -- in
    particular before the first division or square root, whose slow paths are calls that
    ptxas schedules no load across."""
    from coconet.lowering.lower_to_plan import lower

    plan = lower(_fused(name, symmetric_w), ranks)
    reports = kernel_reports(plan.device_source(), "sm_90")
    assert {r.name for r in reports} == set(plan.kernels())
    for r in reports:
        context = f"{name} at {ranks} ranks, {r.name}: {r}"
        assert r.spills == 0, context
        assert r.usage.stack_bytes == 0, context
        assert 0 < r.usage.registers <= 128, context
        assert r.loops, context  # the vector loop, at least
        for loop in r.loops:
            assert loop.loads_first, (context, loop)
            assert loop.loads_before_division, (context, loop)


@needs_tools
@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.mlir")), ids=lambda p: p.stem)
@pytest.mark.parametrize("schedule", ["fuse(rs-c-ag)", "ar-c"])
def test_every_example_kernel_loads_first_and_spills_nothing(path, schedule):
    """Every kernel of every example under the fused schedule and the unfused one, built for
    4 ranks: the vector loops of fused elementwise and fused collective kernels, reduction
    kernels and pulls all issue their loads first; nothing spills."""
    import coconet
    from coconet.lowering.lower_to_plan import lower
    from coconet.schedule import apply_schedule

    try:
        program = apply_schedule(coconet.load(path), schedule)
    except coconet.CocoError as e:
        assert "schedule-unknown" in str(e)
        pytest.skip(f"{schedule} does not apply to {path.stem}")
    for r in kernel_reports(lower(program, 4).device_source(), "sm_90"):
        assert r.spills == 0, r
        for loop in r.loops:
            assert loop.loads_first, (r.name, loop)


@needs_tools
def test_coco_opt_sass_report(capsys):
    """`coco-opt -t sass-report` prints the report of each function's plan."""
    from coconet.tools.coco_opt import main

    main(
        [
            str(EXAMPLES / "adam.mlir"),
            "-p",
            'coco-schedule{name="fuse(rs-c-ag)"}',
            "-t",
            "sass-report{ranks=2}",
        ]
    )
    out = capsys.readouterr().out
    assert "@adam on 2 rank(s), sm_90, COCO_PEERS_MAX 2" in out
    line = next(x for x in out.splitlines() if x.startswith("k_fused_all_reduce"))
    assert line.split()[-2:] == ["yes", "yes"]
    assert "0/0" in line


def test_sass_report_needs_a_real_architecture(capsys):
    from coconet.tools.coco_opt import main

    with pytest.raises(SystemExit):
        main([str(EXAMPLES / "sgd.mlir"), "-t", "sass-report{arch=compute_90}"])
    assert "real architecture" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The reading of SASS itself, on machine code written for it
# ---------------------------------------------------------------------------------------------

# A loop whose second load waits behind a division of the first's value (a load after the
# math: the waves the vector loops must not have), then a loop with every load first.
_SASS = """
        .section        .text.k,"ax",@progbits
k:
.text.k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   MUFU.RCP R9, UR6 ;
        /*0030*/                   FCHK P0, R4, UR6 ;
        /*0040*/              @!P0 BRA `(.L_x_1) ;
        /*0050*/                   CALL.REL.NOINC `($__internal_div) ;
.L_x_1:
        /*0060*/                   LDG.E.128 R12, desc[UR4][R10.64] ;
        /*0070*/                   FADD R12, R12, R4 ;
        /*0080*/                   STG.E.128 desc[UR4][R2.64], R12 ;
        /*0090*/               @P1 BRA `(.L_x_0) ;
.L_x_2:
        /*00a0*/                   LD.E.128 R4, desc[UR4][R2.64] ;
        /*00b0*/                   LDG.E.128 R8, desc[UR4][R6.64] ;
        /*00c0*/                   MUFU.RCP R20, UR6 ;
        /*00d0*/                   F2F.F64.F32 R12, R4 ;
        /*00e0*/                   DADD R14, R12, R12 ;
        /*00f0*/                   F2F.F32.F64 R8, R14 ;
        /*0100*/                   ST.E.128 desc[UR4][R2.64], R8 ;
        /*0110*/               @P1 BRA `(.L_x_2) ;
        /*0120*/                   EXIT ;
        .type           $__internal_div,@function
$__internal_div:
        /*0130*/                   FFMA R4, R4, R9, RZ ;
        /*0140*/                   RET.REL.NODEC R2 `(k) ;
"""


def test_vector_loops_find_loads_behind_math():
    functions = parse_sass(_SASS)
    assert set(functions) == {"k", "$__internal_div"}
    waves, first = vector_loops(functions["k"])
    assert (waves.header, first.header) == (0x10, 0xA0)
    # the loop-invariant reciprocal (of a uniform register) is not math on loaded data
    assert (waves.first_math, waves.first_division) == (0x30, 0x30)
    assert [x.address for x in waves.loads_after_division] == [0x60]
    assert not waves.loads_first
    assert not waves.loads_before_division
    assert (waves.vector_loads, waves.vector_stores) == (2, 1)
    assert first.first_math == 0xD0
    assert first.first_division is None
    assert first.loads_first
    assert first.loads_before_division
    assert (first.vector_loads, first.vector_stores) == (2, 1)


def test_ptxas_log_gives_registers_and_spills():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_a' for 'sm_90'
ptxas info    : Function properties for k_a
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 48 registers, used 1 barriers
ptxas info    : Compiling entry function 'k_b' for 'sm_90'
ptxas info    : Function properties for k_b
ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers
ptxas info    : Function properties for __internal_accurate_pow
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
    usage = parse_ptxas_log(log)
    assert usage["k_a"].registers == 48
    assert usage["k_a"].spill_stores == 0
    b = usage["k_b"]
    assert (b.registers, b.stack_bytes, b.spill_stores, b.spill_loads) == (255, 24, 8, 12)
    assert usage["__internal_accurate_pow"].registers == 0


@needs_tools
def test_disassembles_nvrtc_output():
    source = """#include "coco_device.h"
COCO_KERNEL(k_copy, const float* x, float* y, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  COCO_BLOCK_STRIDE_LOOP(coco_i64, v, 0, n / 4) {
    COCO_VEC_IN(float, a, 4, x + 4 * v);
    COCO_VEC_OUT(float, b, 4, y + 4 * v);
    COCO_FOR_LANES(k, 4) { b[k] = a[k] * 2.0f; }
    coco_vec_store(b, y + 4 * v);
  }
  COCO_KERNEL_BODY_END
}
"""
    compiled = compile_cuda(source, "sm_90")
    assert compiled.cubin is not None
    (fn,) = [f for name, f in parse_sass(disassemble(compiled.cubin)).items() if name == "k_copy"]
    (loop,) = vector_loops(fn)
    assert (loop.vector_loads, loop.vector_stores) == (1, 1)
    assert loop.loads_first


def test_a_missing_disassembler_is_one_clear_error(monkeypatch):
    from coconet.lowering.machine_code import nvdisasm_path

    monkeypatch.setenv("COCONET_NVDISASM", "/nonexistent/nvdisasm")
    nvdisasm_path.cache_clear()
    try:
        with pytest.raises(MachineCodeError, match="nvdisasm"):
            disassemble(b"not a cubin")
    finally:
        monkeypatch.undo()
        nvdisasm_path.cache_clear()
