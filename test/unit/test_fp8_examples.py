"""The fp8 examples (examples/fp8_allgather_matmul, allreduce_rmsnorm_fp8, adam_fp8_wire; issue
#31 item 6) against independent NumPy / ml_dtypes references written here: every schedule the
enumerator offers each (as written, and every named schedule that fits; the FSDP gather's
`fuse(ag)` -- quantize, fp8 all_gather and dequantize as one exchange kernel -- and the
autotuner's `coco-fuse{mode=elementwise}`), at 1, 2 and 4 ranks, in the sim and on the cpu
kernels (in-process ranks), and the cuda unit of the fused forms compiled by NVRTC.

Comparisons are exact (bit for bit) except where a GEMM's accumulation order is free:

* fp8 rounding is ml_dtypes' `astype`; quantize is saturating: `np.clip(x / s, -max, max)`
  computed in f32, then `astype(fp8)`; dequantize `q * s` rounded once to f32.
* sums across ranks accumulate in f64 in rank order and round once (a few fp8 or bf16 values
  sum exactly in f64, so any order gives the same bits); elementwise ops compute in f32 and
  round to their type; RMSNorm's row mean is exact in f64 (numpy_references.rms_norm).
* the GEMM gets operands that make it exact in any order (dyadic activations; weights whose
  amax makes the scale a power of two and whose codes are multiples of 16); a second test
  feeds general values and bounds the GEMM's rounding instead.
"""

from __future__ import annotations

import functools
from pathlib import Path

import ml_dtypes
import numpy as np
import numpy_references as ref
import pytest

import coconet
from coconet.core.program import Program
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import Collective, Launch
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_pipeline, apply_schedule, named_schedules, why_not_offered
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["fp8_allgather_matmul", "allreduce_rmsnorm_fp8", "adam_fp8_wire"]
RANKS = [1, 2, 4]

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E4M3_MAX = np.float32(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448
F32, F64, BF16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16)

# What the enumerator offers each example: named schedules, and for the FSDP gather (only
# fuse(ag) and its overlap with the GEMM fit it) the autotuner's elementwise pipeline beside
# "as written".
NAMED = {
    "fp8_allgather_matmul": ["fuse(ag)", "ol(fuse(ag),mm)"],
    "allreduce_rmsnorm_fp8": ["ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)"],
    "adam_fp8_wire": ["ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)"],
}
PIPELINES = {"fp8_allgather_matmul": ["coco-fuse{mode=elementwise}"]}


@functools.cache
def load(name: str, form: str = "mlir") -> Program:
    return coconet.load(EXAMPLES / f"{name}.{form}")


@functools.cache
def scheduled(name: str, schedule: str | None) -> Program:
    p = load(name)
    if schedule is None:
        return p
    if schedule in PIPELINES.get(name, []):
        return apply_pipeline(p, schedule)
    return apply_schedule(p, schedule)


def schedules(name: str) -> list[str | None]:
    return [None, *NAMED[name], *PIPELINES.get(name, [])]


# --------------------------------------------------------------------------------------------
# The references
# --------------------------------------------------------------------------------------------


def quantize(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Saturating e4m3 quantize: x / scale in f32, clipped to +-448, rounded once."""
    with np.errstate(all="ignore"):
        v = np.asarray(x).astype(F32) / np.asarray(scale).astype(F32)
    return np.clip(v, -E4M3_MAX, E4M3_MAX).astype(E4M3)


def fp8_allgather_matmul(inputs: dict[str, np.ndarray], ranks: int) -> dict[str, np.ndarray]:
    """Rank by rank: its slice's max |w|, the max over ranks (exact), scale = amax / 448 in
    f32, its slice quantized; the codes gathered in rank order, dequantized (q * scale in f32)
    and multiplied with x (in f64, rounded once: exact for the dyadic inputs)."""
    w, x = inputs["w"], inputs["x"]
    slices = np.array_split(w, ranks, axis=0)
    amax = max(np.max(np.abs(s)) for s in slices).astype(F32)
    scale = np.asarray(amax / E4M3_MAX, F32)
    gathered = np.concatenate([quantize(s, scale) for s in slices], axis=0)
    wd = (gathered.astype(F32) * scale).astype(F32)
    return {"y": (x.astype(F64) @ wd.astype(F64)).astype(F32)}


def allreduce_rmsnorm_fp8(inputs: dict[str, np.ndarray], ranks: int) -> dict[str, np.ndarray]:
    """The bf16 epilogue of numpy_references.allreduce_rmsnorm, its output quantized."""
    x, residual, weight = inputs["x"], inputs["residual"], inputs["weight"]
    total = ref.all_reduce_sum([x[r] for r in range(ranks)], x.dtype)
    hidden = ref.ew(np.add, total, residual, out=x.dtype)
    normed = ref.rms_norm(hidden, weight, 1e-6)
    return {"hidden": hidden, "q": quantize(normed, inputs["scale"])}


def adam_fp8_wire(inputs: dict[str, np.ndarray], ranks: int) -> dict[str, np.ndarray]:
    """Widening e4m3 to f32 is exact, so the step is Adam on f32 gradients (the f32 sum of
    the ranks' codes in f64, rounded once): numpy_references.adam on g.astype(f32)."""
    return ref.adam({**inputs, "g": inputs["g"].astype(F32)}, ranks)


REFERENCES = {
    "fp8_allgather_matmul": fp8_allgather_matmul,
    "allreduce_rmsnorm_fp8": allreduce_rmsnorm_fp8,
    "adam_fp8_wire": adam_fp8_wire,
}


def dyadic_weight(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Multiples of 1/16 in [-1.75, 1.75] with 1.75 (= 448 / 256) among them: scale = 2^-8
    exactly, every w / scale a multiple of 16 (exact in e4m3 up to 256, beyond it ties and
    roundings to multiples of 32), every dequantized value a multiple of 1/16."""
    w = rng.integers(-28, 29, size=shape) / 16
    w.flat[rng.integers(w.size)] = -1.75
    return w.astype(F32)


def make_inputs(name: str, ranks: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "fp8_allgather_matmul":
        # x: multiples of 2^-6 in [-1, 1]; products with w multiples of 2^-10, |y| < 2^7
        x = (rng.integers(-64, 65, size=(16, 64)) / 64).astype(F32)
        return {"w": dyadic_weight(rng, (64, 32)), "x": x}
    if name == "allreduce_rmsnorm_fp8":
        return {
            "x": rng.standard_normal((ranks, 16, 64)).astype(BF16),
            "residual": rng.standard_normal((16, 64)).astype(BF16),
            "weight": (1 + 0.1 * rng.standard_normal(64)).astype(BF16),
            # |normed| reaches ~3.5: the largest rows saturate at 448 codes
            "scale": np.asarray(3.0 / 448, BF16),
        }
    n = 4096
    return {
        "g": rng.standard_normal((ranks, n)).astype(E4M3),
        "w": rng.standard_normal(n).astype(F32),
        "m": (0.1 * rng.standard_normal(n)).astype(F32),
        "v": (0.01 * rng.random(n)).astype(F32),
        "lr": np.asarray(1e-3, F32),
        "beta1": np.asarray(0.9, F32),
        "beta2": np.asarray(0.999, F32),
        "eps": np.asarray(1e-6, F32),
        "step": np.asarray(3.0, F32),
    }


def assert_same_bits(got: dict[str, np.ndarray], want: dict[str, np.ndarray], where: str):
    assert set(got) == set(want), where
    for k, w in want.items():
        g = np.asarray(got[k])
        assert g.dtype == w.dtype, f"{where}: {k} is {g.dtype}"
        assert g.shape == w.shape, f"{where}: {k} is {g.shape}"
        bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[w.dtype.itemsize]
        off = np.flatnonzero(g.view(bits) != w.view(bits))
        assert off.size == 0, (
            f"{where}: '{k}' differs in {off.size} element(s), first at {off[0]}: "
            f"{g.ravel()[off[0]]!r} vs the reference's {w.ravel()[off[0]]!r}"
        )


# --------------------------------------------------------------------------------------------
# The two forms, and what the enumerator offers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_python_form_builds_the_mlir_form(name: str) -> None:
    assert load(name, "py").print() == load(name, "mlir").print()
    for form in ("mlir", "py"):
        text = (EXAMPLES / f"{name}.{form}").read_text()
        assert text.startswith("//" if form == "mlir" else '"""')
        assert "Schedules:" in text


@pytest.mark.parametrize("name", NAMES)
def test_the_enumerator_offers_the_stated_schedules(name: str) -> None:
    assert list(named_schedules(load(name))) == NAMED[name]


def test_only_the_fused_gather_fits_the_fsdp_gather() -> None:
    """Its only all_reduce is of a scalar (the amax); the GEMM reads the dequantized weight,
    where ol(ag,mm) needs the all_gather itself as an operand. fuse(ag) makes the quantize
    (sender's side), the fp8 exchange and the dequantize (receiver's side) one kernel: 1
    byte an element crosses, and neither the codes nor the dequantized weight's pieces go
    through memory between them."""
    p = load("fp8_allgather_matmul")
    for name in ("ar-c", "rs-c-ag", "fuse(rs-c-ag)"):
        assert "needs an all_reduce" in (why_not_offered(p, name) or "")
    assert "a matmul reading an all_gather" in (why_not_offered(p, "ol(ag,mm)") or "")
    plan = lower(apply_schedule(p, "fuse(ag)"), 4)
    launches = [s.kernel for s in plan.steps if isinstance(s, Launch)]
    fused = [k for k in launches if k.startswith("k_fused_all_gather")]
    assert len(fused) == 1, launches
    assert not any(isinstance(s, Collective) and s.op == "all_gather" for s in plan.steps)
    (staged,) = [b for b in plan.buffers if b.symmetric and b.name.endswith("_staged")]
    assert staged.type.elt == "f8E4M3FN"  # what crosses: the codes


# --------------------------------------------------------------------------------------------
# Every schedule, sim and cpu kernels, vs the reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", RANKS)
@pytest.mark.parametrize("name", NAMES)
def test_every_schedule_matches_the_reference(name: str, ranks: int) -> None:
    inputs = make_inputs(name, ranks, seed=ranks)
    want = REFERENCES[name]({k: v.copy() for k, v in inputs.items()}, ranks)
    for schedule in schedules(name):
        p = scheduled(name, schedule)
        sim = coconet.run(p, inputs, ranks=ranks, inplace=False).outputs
        assert_same_bits(sim, want, f"sim, {schedule or 'as written'} at {ranks} rank(s)")
        cpu = ThreadedExecutor(lower(p, ranks)).run(inputs)
        assert_same_bits(cpu, want, f"cpu, {schedule or 'as written'} at {ranks} rank(s)")


def test_the_references_see_rounding_and_saturation() -> None:
    """The inputs reach what the examples are about: e4m3 ties and roundings in the gathered
    weight, saturated codes in the epilogue's output."""
    inputs = make_inputs("fp8_allgather_matmul", 2, seed=2)
    codes = quantize(inputs["w"], np.float32(2.0**-8)).astype(F32)
    assert (codes != inputs["w"] * 256).any()  # 272 = 256 + 16 rounds to 256 (a tie), ...
    assert np.abs(codes).max() == E4M3_MAX
    rms = make_inputs("allreduce_rmsnorm_fp8", 4, seed=4)
    q = allreduce_rmsnorm_fp8(rms, 4)["q"].astype(F32)
    assert (np.abs(q) == E4M3_MAX).sum() > 0
    assert (np.abs(q) < E4M3_MAX).mean() > 0.9


@pytest.mark.parametrize("ranks", [2, 4])
def test_fsdp_gather_on_general_values(ranks: int) -> None:
    """Gaussian weights (scale not a power of two: some w / scale land above 448 and
    saturate) and activations: the GEMM may round in any order, so y is within the bound of
    a K-term f32 dot product, K * 2^-24 * sum |x||wd| per element, of the exact product of
    the reference's dequantized weight -- far below one e4m3 rounding of any weight."""
    rng = np.random.default_rng(10 + ranks)
    inputs = {
        "w": (rng.standard_normal((64, 32)) * 0.02).astype(F32),
        "x": rng.standard_normal((16, 64)).astype(F32),
    }
    slices = np.array_split(inputs["w"], ranks, axis=0)
    scale = np.asarray(max(np.abs(s).max() for s in slices) / E4M3_MAX, F32)
    wd = (quantize(inputs["w"], scale).astype(F32) * scale).astype(F32)
    exact = inputs["x"].astype(F64) @ wd.astype(F64)
    bound = 64 * 2.0**-24 * (np.abs(inputs["x"]).astype(F64) @ np.abs(wd).astype(F64))
    for schedule in schedules("fp8_allgather_matmul"):
        p = scheduled("fp8_allgather_matmul", schedule)
        sim = coconet.run(p, inputs, ranks=ranks, inplace=False).outputs["y"]
        cpu = ThreadedExecutor(lower(p, ranks)).run(inputs)["y"]
        for got in (sim, cpu):
            assert (np.abs(got.astype(F64) - exact) <= bound).all(), schedule
        if not (schedule or "").startswith("ol("):  # (an overlap sums chunks of K apart)
            np.testing.assert_array_equal(sim, cpu)  # one GEMM order on both


# --------------------------------------------------------------------------------------------
# The fused forms (issue #31 item 3)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", RANKS)
def test_the_fp8_epilogue_is_one_launch(ranks: int) -> None:
    """fuse(rs-c-ag): reduce_scatter, residual, RMSNorm, quantize and the all_gather of the
    residual and of the fp8 rows are ONE kernel; peers pull the fp8 output (1 byte an
    element; on one rank a plain row kernel stores them where they are returned)."""
    plan = lower(scheduled("allreduce_rmsnorm_fp8", "fuse(rs-c-ag)"), ranks)
    assert len(plan.steps) == 1, plan.format()
    text = plan.format()
    assert ("peers(%q)" in text) == (ranks > 1), text
    assert "buffer %q : 16x64 f8E4M3FN" in text, text


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_fp8_gradient_crosses_the_wire_narrow(ranks: int) -> None:
    """fuse(rs-c-ag) of adam_fp8_wire: peers pull the fp8 gradient itself (no cast kernel, no
    f32 copy of it); as written and rs-c-ag cast it to f32 first (the library moves f32)."""
    plan = lower(scheduled("adam_fp8_wire", "fuse(rs-c-ag)"), ranks)
    text = plan.format()
    assert "peers(%g)" in text, text
    assert "buffer %g : 4096 f8E4M3FN arg symmetric" in text, text
    assert "k_cast" not in text, text
    assert "%gw" not in text, text
    assert len(plan.steps) == 1, text
    for schedule in ("ar-c", "rs-c-ag"):
        assert "%gw" in lower(scheduled("adam_fp8_wire", schedule), ranks).format()


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
def test_the_cuda_units_compile_with_nvrtc() -> None:
    """The fused forms' cuda units (and the FSDP gather's quantize and dequantize kernels) for
    sm_90 without a warning; the gather's also for sm_89, the first with fp8 instructions."""
    units = {
        "fp8_allgather_matmul": lower(scheduled("fp8_allgather_matmul", None), 2).cuda_source,
        "fp8_allgather_matmul fused": lower(
            scheduled("fp8_allgather_matmul", "fuse(ag)"), 4
        ).cuda_source,
        "allreduce_rmsnorm_fp8": lower(
            scheduled("allreduce_rmsnorm_fp8", "fuse(rs-c-ag)"), 4
        ).cuda_source,
        "adam_fp8_wire": lower(scheduled("adam_fp8_wire", "fuse(rs-c-ag)"), 4).cuda_source,
    }
    for name, source in units.items():
        for arch in ("sm_89", "sm_90") if name.startswith("fp8_allgather") else ("sm_90",):
            assert compile_cuda(source, arch, warnings_as_errors=True).binary, (name, arch)


def vectorized_lines(source: str, tmp_path: Path) -> set[int]:
    """The lines of `source` (a plan's translation unit) whose loop the host compiler, with
    the cpu backend's flags, reports vectorized (g++'s -fopt-info)."""
    import re
    import subprocess

    from coconet.toolchain.host_compiler import HEADER_DIR, _compiler, host_compile_flags

    if "g++" not in Path(_compiler()).name:
        pytest.skip("-fopt-info is g++'s")
    (tmp_path / "unit.cu").write_text(source)
    cmd = [_compiler(), *host_compile_flags(), "-x", "c++", "-I", str(HEADER_DIR)]
    cmd += ["-fopt-info-vec-optimized", "-o", str(tmp_path / "unit.so"), str(tmp_path / "unit.cu")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return {
        int(m) for m in re.findall(r"unit\.cu:(\d+):\d+: optimized: loop vectorized", done.stderr)
    }


def lines_with(source: str, text: str) -> list[int]:
    return [n + 1 for n, line in enumerate(source.splitlines()) if text in line]


@pytest.mark.usefixtures("product_host_build")
def test_the_epilogue_s_last_phase_vectorizes_on_the_host(tmp_path: Path) -> None:
    """The fused epilogue's last phase (normalize, times the bf16 weight, quantize, store the
    fp8 row) is a loop the host compiler vectorizes: the weight is read at the innermost
    coordinate, the row's plus e_ (row_collective.py build_indices). Read through `i % 64`,
    it was a gather, which AVX2 lacks for 16-bit values, so the loop ran scalar and the fp8
    epilogue at [1024, 4096] took 2-3x the f32 one on the cpu backend."""
    source = lower(scheduled("allreduce_rmsnorm_fp8", "fuse(rs-c-ag)"), 2).cuda_source
    (line,) = lines_with(source, "COCO_BLOCK_STRIDE_LOOP(coco_i64, e_, 0, 64)")
    assert line in vectorized_lines(source, tmp_path)


def test_a_slice_is_not_rounded_again() -> None:
    """A `coco.slice` re-indexes a value already on its type's grid (loaded from bf16 storage,
    or computed and rounded): the kernel declares it as that value, where it encoded and
    decoded the bf16 residual of the fused epilogue once more per element (and would have
    quieted a signaling NaN the sim copies bit for bit)."""
    source = lower(scheduled("allreduce_rmsnorm_fp8", "fuse(rs-c-ag)"), 2).cuda_source
    slices = [ln for ln in source.splitlines() if "// coco.slice" in ln]
    assert slices, source
    for line in slices:
        init = line.split("=", 1)[1].split(";", 1)[0].strip()
        assert init.isidentifier(), line


@pytest.mark.usefixtures("product_host_build")
def test_the_fp8_gradient_widens_in_vectors_on_the_host(tmp_path: Path) -> None:
    """The fused Adam's reduce_scatter combines each further peer's fp8 vector in a lanes loop
    the host compiler vectorizes (both batches' loops: the first's slots 1.., and every
    further batch's): the host runs a slot only where its peer exists (COCO_FOR_PEER_SLOTS),
    so the select in the body is known true. Through the select, the peer's address was
    loaded per lane, a gather of bytes AVX2 has not, and the step at 2 ranks took 2x the f32
    one."""
    source = lower(scheduled("adam_fp8_wire", "fuse(rs-c-ag)"), 2).cuda_source
    slots = lines_with(source, "COCO_FOR_PEER_SLOTS(")
    assert len(slots) == 2, source
    assert {line + 1 for line in slots} <= vectorized_lines(source, tmp_path)


@pytest.mark.usefixtures("product_host_build")
def test_a_kernel_storing_a_scalar_it_computes_vectorizes_on_the_host(tmp_path: Path) -> None:
    """ar-c's quantize kernel also computes the scale (amax / 448) and stores it for the
    dequantize: thread 0 of block 0 stores it once, outside the element loops, whose lanes
    loop the host compiler vectorizes. Stored by the element at coordinate 0 inside the
    lanes loop, the guarded store kept g++ from vectorizing it: the quantize of 2M elements
    took 13.6 ms where the same kernel without the scale took 3.5."""
    source = lower(scheduled("fp8_allgather_matmul", "coco-fuse{mode=elementwise}"), 2).cuda_source
    kernel = source[source.index("COCO_KERNEL(k_fused") :]
    start = source.count("\n", 0, source.index("COCO_KERNEL(k_fused"))
    first = kernel.index("COCO_FOR_LANES(k_, lanes_)")
    line = start + kernel.count("\n", 0, first) + 1
    assert "scale_out[0] = scale;" in kernel[: kernel.index("COCO_BLOCK_STRIDE_LOOP")]
    assert line in vectorized_lines(source, tmp_path)
    plan = lower(scheduled("fp8_allgather_matmul", "coco-fuse{mode=elementwise}"), 3)
    inputs = sim.run(load("fp8_allgather_matmul"), ranks=3, seed=5, inplace=False)
    got = ThreadedExecutor(plan).run(inputs.inputs)
    np.testing.assert_array_equal(got["y"], inputs.outputs["y"])


@pytest.mark.parametrize("ranks", [10, 17])
def test_the_narrow_wire_over_several_peer_batches(ranks: int) -> None:
    """Groups beyond one batch of peers (COCO_PEER_BATCH: 8 on the host): the fused kernel's
    vector loop pulls and widens the fp8 gradient batch by batch, each slot only where its
    peer exists (COCO_FOR_PEER_SLOTS), two and three batches here, every block holding whole
    1 KiB vectors of fp8; the step equals the NumPy reference bit for bit."""
    import runpy

    program = runpy.run_path(str(EXAMPLES / "adam_fp8_wire.py"))["build"](1 << 16)
    inputs = make_inputs("adam_fp8_wire", ranks, seed=ranks)
    rng = np.random.default_rng(ranks)
    n = 1 << 16
    inputs |= {
        "g": rng.standard_normal((ranks, n)).astype(E4M3),
        "w": rng.standard_normal(n).astype(F32),
        "m": (0.1 * rng.standard_normal(n)).astype(F32),
        "v": (0.01 * rng.random(n)).astype(F32),
    }
    want = adam_fp8_wire({k: v.copy() for k, v in inputs.items()}, ranks)
    plan = lower(apply_schedule(program, "fuse(rs-c-ag)"), ranks)
    assert n // ranks // plan.steps[0].grid >= 512  # most blocks run a 1024-lane vector
    assert_same_bits(ThreadedExecutor(plan).run(inputs), want, f"fuse(rs-c-ag) at {ranks}")
