"""The device layer (toolchain/coco_device.h) and its two compilers.

Hand-written kernels in the house convention are (a) compiled with NVRTC for sm_80 and sm_90
without warnings, and (b) compiled with the host compiler and run through ctypes with several
grid and block sizes against NumPy. (c) checks the counter-based hash against its Python
definition, (d) the on-disk kernel cache.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest

from coconet.toolchain import host_compiler
from coconet.toolchain.host_compiler import (
    HOST_CACHE,
    HostCompileError,
    HostLibrary,
    compile_host,
    host_cache_path,
)
from coconet.toolchain.nvrtc import (
    NvrtcError,
    compile_all_archs,
    compile_cuda,
    nvrtc_available,
)

F32, F16, BF16 = np.float32, np.float16, ml_dtypes.bfloat16
E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
VP = ctypes.c_void_p
BLOCK_SIZES = (1, 3, 32, 128)
GRID_SIZES = (1, 2, 7)
MASK64 = (1 << 64) - 1


# ----------------------------------------------------------------------------------------------
# Python twins of the header's definitions
# ----------------------------------------------------------------------------------------------


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def counter_hash(seed: int, index: int, stream: int) -> int:
    return mix64((index + mix64(seed ^ ((stream * 0x9E3779B97F4A7C15) & MASK64))) & MASK64)


def dropout_keep(seed: int, index: int, stream: int, threshold: int) -> bool:
    return (counter_hash(seed, index, stream) >> 40) >= threshold


def _mix64_np(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def counter_hash_np(seed: np.ndarray, index: np.ndarray, stream: np.ndarray) -> np.ndarray:
    """Vectorized twin (uint64 arrays wrap silently, which is the definition)."""
    return _mix64_np(index + _mix64_np(seed ^ (stream * np.uint64(0x9E3779B97F4A7C15))))


# ----------------------------------------------------------------------------------------------
# Kernels, in the convention documented at the top of coco_device.h
# ----------------------------------------------------------------------------------------------

# Grid-stride elementwise y = a*x + y, for each element type ($T).
AXPY_GRID_STRIDE = """
COCO_KERNEL(axpy_$T, const $T* __restrict__ x, $T* __restrict__ y, float a, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  COCO_FOR_THREADS {
    const coco_i64 stride = (coco_i64)coco_grid_dim() * coco_block_dim();
    for (coco_i64 i = (coco_i64)coco_block_idx() * coco_block_dim() + coco_thread_idx(); i < n;
         i += stride) {
      y[i] = coco_from_f32<$T>(a * coco_to_f32(x[i]) + coco_to_f32(y[i]));
    }
  }
  COCO_KERNEL_BODY_END
}
"""

# Block-contiguous chunks with a thread stride inside the block: y = a*x + b.
AFFINE_CHUNKED = """
COCO_KERNEL(affine_$T, const $T* __restrict__ x, $T* __restrict__ y, float a, float b,
            coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 8);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) {
    y[i] = coco_from_f32<$T>(a * coco_to_f32(x[i]) + b);
  }
  COCO_KERNEL_BODY_END
}
"""

# Per-block sum: per-thread partials in dynamic shared memory, then a tree over any block size.
BLOCK_SUM = """
COCO_KERNEL(block_sum_f32, const float* __restrict__ x, float* __restrict__ out, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  COCO_SHARED_DYN(float, part, 0);
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_FOR_THREADS {
    float acc = 0.0f;
    for (coco_i64 i = r.begin + coco_thread_idx(); i < r.end; i += coco_block_dim()) acc += x[i];
    part[coco_thread_idx()] = acc;
  }
  coco_sync_block();
  for (coco_u32 s = 1; s < coco_block_dim(); s *= 2) {
    COCO_FOR_THREADS {
      const coco_u32 t = coco_thread_idx();
      if (t % (2 * s) != 0 || t + s >= coco_block_dim()) continue;
      part[t] += part[t + s];
    }
    coco_sync_block();
  }
  COCO_FOR_THREADS {
    if (coco_thread_idx() == 0) out[coco_block_idx()] = part[0];
  }
  COCO_KERNEL_BODY_END
}
"""

# Static shared memory: reverse each block's tile of 128 elements.
TILE_REVERSE = """
COCO_KERNEL(tile_reverse_f32, const float* __restrict__ x, float* __restrict__ y, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  COCO_SHARED(float, tile, 128);
  for (coco_i64 base = (coco_i64)coco_block_idx() * 128; base < n;
       base += (coco_i64)coco_grid_dim() * 128) {
    const coco_i64 len = n - base < 128 ? n - base : 128;
    COCO_FOR_THREADS {
      for (coco_i64 k = coco_thread_idx(); k < len; k += coco_block_dim()) tile[k] = x[base + k];
    }
    coco_sync_block();
    COCO_FOR_THREADS {
      for (coco_i64 k = coco_thread_idx(); k < len; k += coco_block_dim())
        y[base + k] = tile[len - 1 - k];
    }
    coco_sync_block();
  }
  COCO_KERNEL_BODY_END
}
"""

# Block-uniform branches around phases, with an `else` after a phase (the host must bind it
# to the kernel's `if`, as CUDA does) and a phase as the body of an unbraced block-level `for`.
BRANCHING_PHASES = """
COCO_KERNEL(branching_phases, int* __restrict__ out, int mode, int rounds) {
  COCO_KERNEL_BODY_BEGIN
  const coco_i64 base = (coco_i64)coco_block_idx() * coco_block_dim();
  if (mode == 0)
    COCO_FOR_THREADS { out[base + coco_thread_idx()] = 10; }
  else
    COCO_FOR_THREADS { out[base + coco_thread_idx()] = 20 + (int)coco_thread_idx(); }
  coco_sync_block();
  for (int k = 0; k < rounds; ++k)
    COCO_FOR_THREADS { out[base + coco_thread_idx()] += 1; }
  COCO_KERNEL_BODY_END
}
"""

ATOMICS = """
COCO_KERNEL(atomics, const float* __restrict__ x, float* sum32, double* sum64,
            coco_u32* counters, coco_u32* tickets, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  COCO_FOR_THREADS {
    const coco_i64 stride = (coco_i64)coco_grid_dim() * coco_block_dim();
    for (coco_i64 i = (coco_i64)coco_block_idx() * coco_block_dim() + coco_thread_idx(); i < n;
         i += stride) {
      coco_atomic_add_f32(sum32, x[i]);
      coco_atomic_add_f64(sum64, (double)x[i]);
      tickets[i] = coco_atomic_add_u32(counters, 1u);
      coco_atomic_add_u32_system(counters + 1, 2u);
    }
  }
  COCO_KERNEL_BODY_END
}
"""

HASH_AND_DROPOUT = """
COCO_KERNEL(counter_hash_u64, const coco_u64* __restrict__ seed, const coco_u64* __restrict__ idx,
            const coco_u64* __restrict__ stream, coco_u64* __restrict__ out,
            coco_u8* __restrict__ keep, coco_u32 threshold, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) {
    out[i] = coco_counter_hash(seed[i], idx[i], stream[i]);
    keep[i] = coco_dropout_keep(seed[i], idx[i], stream[i], threshold) ? 1 : 0;
  }
  COCO_KERNEL_BODY_END
}

COCO_KERNEL(dropout_f32, const float* __restrict__ x, float* __restrict__ y, coco_u64 seed,
            coco_u64 stream, coco_u32 threshold, float scale, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  COCO_FOR_THREADS {
    const coco_i64 stride = (coco_i64)coco_grid_dim() * coco_block_dim();
    for (coco_i64 i = (coco_i64)coco_block_idx() * coco_block_dim() + coco_thread_idx(); i < n;
         i += stride) {
      y[i] = coco_dropout_keep(seed, (coco_u64)i, stream, threshold) ? x[i] * scale : 0.0f;
    }
  }
  COCO_KERNEL_BODY_END
}
"""

CONVERSIONS = """
COCO_KERNEL(f16_to_f32, const coco_f16* __restrict__ x, float* __restrict__ y, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) { y[i] = coco_to_f32(x[i]); }
  COCO_KERNEL_BODY_END
}
COCO_KERNEL(f32_to_f16, const float* __restrict__ x, coco_f16* __restrict__ y, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) { y[i] = coco_f16_from_f32(x[i]); }
  COCO_KERNEL_BODY_END
}
COCO_KERNEL(bf16_to_f32, const coco_bf16* __restrict__ x, float* __restrict__ y, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) { y[i] = coco_to_f32(x[i]); }
  COCO_KERNEL_BODY_END
}
COCO_KERNEL(f32_to_bf16, const float* __restrict__ x, coco_bf16* __restrict__ y, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) { y[i] = coco_bf16_from_f32(x[i]); }
  COCO_KERNEL_BODY_END
}
"""

FP8_CONVERSIONS = "".join(
    f"""
COCO_KERNEL({t}_to_f32, const coco_{t}* __restrict__ x, float* __restrict__ y, coco_i64 n) {{
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) {{ y[i] = coco_to_f32(x[i]); }}
  COCO_KERNEL_BODY_END
}}
COCO_KERNEL(f32_to_{t}, const float* __restrict__ x, coco_{t}* __restrict__ y, coco_i64 n) {{
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) {{ y[i] = coco_{t}_from_f32(x[i]); }}
  COCO_KERNEL_BODY_END
}}
"""
    for t in ("f8e4m3", "f8e5m2")
)

MATH = """
COCO_KERNEL(math_$T, const $T* __restrict__ x, $T* __restrict__ out, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) {
    const $T v = x[i];
    out[0 * n + i] = coco_sqrt(v);
    out[1 * n + i] = coco_rsqrt(v);
    out[2 * n + i] = coco_exp(v);
    out[3 * n + i] = coco_log(v);
    out[4 * n + i] = coco_tanh(v);
    out[5 * n + i] = coco_gelu(v);
    out[6 * n + i] = coco_sigmoid(v);
  }
  COCO_KERNEL_BODY_END
}
"""

# Two "ranks" exchange a chunk per block through flags in each other's memory: block b of one
# rank waits only for block b of the other (the channel rule of the design).
EXCHANGE = """
COCO_KERNEL(exchange_f32, const float* __restrict__ mine, float* my_buf, const float* peer_buf,
            volatile coco_u32* my_flags, volatile coco_u32* peer_flags, float* __restrict__ out,
            coco_u32 epoch, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 1);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) { my_buf[i] = mine[i]; }
  coco_sync_block();
  COCO_FOR_THREADS {
    if (coco_thread_idx() != 0) continue;
    coco_threadfence_system();
    coco_store_release_u32(my_flags + coco_block_idx(), epoch);
    coco_wait_flag_geq(peer_flags + coco_block_idx(), epoch);
  }
  coco_sync_block();
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) { out[i] = mine[i] + peer_buf[i]; }
  COCO_KERNEL_BODY_END
}

COCO_KERNEL(flag_reached, const coco_u32* __restrict__ cur, const coco_u32* __restrict__ val,
            coco_u8* __restrict__ out, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, 0, n) { out[i] = coco_flag_reached(cur[i], val[i]); }
  COCO_KERNEL_BODY_END
}
"""

# The cross-rank protocol of fused collective kernels (coco_peers_*), as the generated kernels
# call it: entry, the last-block ticket, done, and the exchange of the last blocks.
PEERS_PROTOCOL = """
COCO_KERNEL(peers_protocol, const coco_u64* __restrict__ flags, coco_u32* __restrict__ counter,
            coco_u32* __restrict__ lasts, coco_u32 epoch, coco_i32 me, coco_i32 nranks) {
  COCO_KERNEL_BODY_BEGIN
  COCO_SHARED(bool, last, 1);
  COCO_FOR_THREADS {
    if (coco_thread_idx() == 0)
      coco_peers_entry(flags, me, nranks, epoch, coco_grid_dim(), coco_block_idx());
  }
  coco_sync_block();
  COCO_FOR_THREADS {
    if (coco_thread_idx() == 0) last[0] = coco_block_is_last(counter, coco_grid_dim());
  }
  coco_sync_block();
  COCO_FOR_THREADS {
    if (coco_thread_idx() == 0)
      coco_peers_done(flags, me, nranks, epoch, coco_grid_dim(), coco_block_idx());
  }
  COCO_FOR_THREADS {
    if (coco_thread_idx() == 0 && last[0]) {
      coco_threadfence_system();
      lasts[0] += 1;
      coco_peers_exchange(flags, me, nranks, epoch, coco_grid_dim());
      counter[0] = 0u;
    }
  }
  COCO_KERNEL_BODY_END
}
"""

ELEMENT_TYPES = ("coco_f16", "coco_bf16", "float")
NUMPY_TYPE = {"coco_f16": F16, "coco_bf16": BF16, "float": F32, "double": np.float64}


def _per_type(template: str, types: tuple[str, ...]) -> str:
    return "".join(template.replace("$T", t) for t in types)


SNIPPETS: dict[str, str] = {
    "axpy_grid_stride": _per_type(AXPY_GRID_STRIDE, ELEMENT_TYPES),
    "affine_chunked": _per_type(AFFINE_CHUNKED, ELEMENT_TYPES),
    "block_sum": BLOCK_SUM,
    "tile_reverse": TILE_REVERSE,
    "branching_phases": BRANCHING_PHASES,
    "atomics": ATOMICS,
    "hash_and_dropout": HASH_AND_DROPOUT,
    "conversions": CONVERSIONS,
    "fp8_conversions": FP8_CONVERSIONS,
    "math": _per_type(MATH, ("float", "double")),
    "exchange": EXCHANGE,
    "peers_protocol": PEERS_PROTOCOL,
}


def translation_unit(*snippets: str, prelude: str = "") -> str:
    return prelude + '#include "coco_device.h"\n' + "".join(snippets)


ALL_KERNELS = translation_unit(*SNIPPETS.values())


# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test module run starts from an empty cache: hits and builds are then predictable."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COCONET_CACHE_DIR", str(tmp_path_factory.mktemp("coconet-cache")))
        yield


@pytest.fixture(scope="module")
def lib() -> HostLibrary:
    # -Werror: the header itself must stay warning-free under -Wall -Wextra.
    return compile_host(ALL_KERNELS, warnings_as_errors=True)


def _u32(value: int) -> ctypes.c_uint:
    return ctypes.c_uint(value)


# ----------------------------------------------------------------------------------------------
# (a) NVRTC
# ----------------------------------------------------------------------------------------------

needs_nvrtc = pytest.mark.skipif(
    not nvrtc_available(),
    reason="NVRTC wheel (nvidia-cuda-nvrtc) not installed: pip install 'coconet[nvrtc]'",
)


@needs_nvrtc
@pytest.mark.parametrize("snippet", sorted(SNIPPETS))
def test_nvrtc_compiles_without_warnings(snippet: str) -> None:
    results = compile_all_archs(translation_unit(SNIPPETS[snippet]))
    assert set(results) == {"sm_80", "sm_90"}
    for arch, result in results.items():
        assert result.cubin, arch
        assert "warning" not in result.log.lower()


@needs_nvrtc
def test_nvrtc_ptx_keeps_round_each_op_numerics() -> None:
    """--fmad=false: a*x+y stays a separate mul and add, like the host's -ffp-contract=off;
    fp16/bf16 conversions are single round-to-nearest-even cvt instructions."""
    ptx = compile_cuda(translation_unit(SNIPPETS["axpy_grid_stride"]), "compute_80").ptx
    assert ptx is not None
    text = ptx.decode()
    entry = text[text.index(".entry axpy_float") :]
    entry = entry[: entry.index("ret;")]
    assert "mul.rn.f32" in entry
    assert "add.rn.f32" in entry
    assert "fma" not in entry
    assert "cvt.rn.f16.f32" in text
    assert "cvt.rn.bf16.f32" in text


@needs_nvrtc
def test_nvrtc_reports_errors_and_warnings() -> None:
    with pytest.raises(NvrtcError, match="undefined_thing"):
        compile_cuda(translation_unit("COCO_KERNEL(k, int* p) { undefined_thing(p); }"))
    warns = translation_unit(
        "COCO_KERNEL(k, int* p) { COCO_KERNEL_BODY_BEGIN int unused;"
        " COCO_FOR_THREADS { p[0] = 1; } COCO_KERNEL_BODY_END }"
    )
    with pytest.raises(NvrtcError, match="never referenced") as info:
        compile_cuda(warns)
    assert "unused" in info.value.log
    assert compile_cuda(warns, warnings_as_errors=False).cubin


# ----------------------------------------------------------------------------------------------
# (b) host execution against NumPy
# ----------------------------------------------------------------------------------------------

CONFIGS = [(g, b) for b in BLOCK_SIZES for g in GRID_SIZES]


def _random(n: int, dtype: object, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(F32).astype(dtype)


@pytest.mark.parametrize(("grid", "block"), CONFIGS)
@pytest.mark.parametrize("elt", ELEMENT_TYPES)
def test_axpy_grid_stride(lib: HostLibrary, elt: str, grid: int, block: int) -> None:
    dtype, n, a = NUMPY_TYPE[elt], 1001, F32(0.75)
    x, y = _random(n, dtype, 1), _random(n, dtype, 2)
    expected = (a * x.astype(F32) + y.astype(F32)).astype(dtype)
    kernel = lib.kernel(f"axpy_{elt}", VP, VP, ctypes.c_float, ctypes.c_longlong)
    kernel(grid, block, x, y, float(a), n)
    np.testing.assert_array_equal(y.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize(("grid", "block"), CONFIGS)
@pytest.mark.parametrize("elt", ELEMENT_TYPES)
def test_affine_chunked(lib: HostLibrary, elt: str, grid: int, block: int) -> None:
    dtype, n, a, b = NUMPY_TYPE[elt], 1003, F32(-1.5), F32(0.25)
    x, y = _random(n, dtype, 3), np.zeros(n, dtype)
    expected = (a * x.astype(F32) + b).astype(dtype)
    kernel = lib.kernel(f"affine_{elt}", VP, VP, ctypes.c_float, ctypes.c_float, ctypes.c_longlong)
    kernel(grid, block, x, y, float(a), float(b), n)
    np.testing.assert_array_equal(y.view(np.uint8), expected.view(np.uint8))


def _block_sum_reference(x: np.ndarray, grid: int, block: int) -> np.ndarray:
    """The kernel's exact float32 summation order: sequential per-thread partials over a
    thread-strided chunk, then the pairwise tree over the block's threads."""
    n = len(x)
    per = -(-n // grid)
    out = np.zeros(grid, F32)
    for b in range(grid):
        chunk = x[min(b * per, n) : min(b * per + per, n)]
        part = np.zeros(block, F32)
        padded = np.zeros(-(-len(chunk) // block) * block, F32)
        padded[: len(chunk)] = chunk
        for row in padded.reshape(-1, block):
            part = part + row  # adding 0.0f where the kernel skips is exact
        s = 1
        while s < block:
            for t in range(0, block - s, 2 * s):
                part[t] = part[t] + part[t + s]
            s *= 2
        out[b] = part[0]
    return out


@pytest.mark.parametrize(("grid", "block"), CONFIGS)
def test_block_sum_matches_exact_summation_order(lib: HostLibrary, grid: int, block: int) -> None:
    n = 999
    x = _random(n, F32, 4)
    out = np.full(grid, np.nan, F32)
    kernel = lib.kernel("block_sum_f32", VP, VP, ctypes.c_longlong)
    kernel(grid, block, x, out, n, shared_bytes=4 * block)
    np.testing.assert_array_equal(out, _block_sum_reference(x, grid, block))
    assert np.isclose(out.sum(dtype=np.float64), x.sum(dtype=np.float64), rtol=1e-4)


@pytest.mark.parametrize(("grid", "block"), CONFIGS)
def test_static_shared_tile_reverse(lib: HostLibrary, grid: int, block: int) -> None:
    n = 700  # not a multiple of the tile: the last tile is partial
    x = _random(n, F32, 5)
    y = np.zeros(n, F32)
    lib.kernel("tile_reverse_f32", VP, VP, ctypes.c_longlong)(grid, block, x, y, n)
    expected = np.concatenate([t[::-1] for t in np.split(x, range(128, n, 128))])
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize(("grid", "block"), [(1, 1), (2, 3), (7, 32)])
@pytest.mark.parametrize("mode", [0, 1])
def test_branching_phases(lib: HostLibrary, mode: int, grid: int, block: int) -> None:
    out = np.full(grid * block, -1, np.int32)
    kernel = lib.kernel("branching_phases", VP, ctypes.c_int, ctypes.c_int)
    kernel(grid, block, out, mode, 3)
    first = np.full(block, 10) if mode == 0 else 20 + np.arange(block)
    np.testing.assert_array_equal(out, np.tile(first + 3, grid))


@pytest.mark.parametrize(("grid", "block"), CONFIGS)
def test_atomics(lib: HostLibrary, grid: int, block: int) -> None:
    n = 2000
    # Small integers: every partial sum is exact, so the order of atomic adds cannot matter.
    x = np.random.default_rng(6).integers(-50, 50, n).astype(F32)
    sum32, sum64 = np.zeros(1, F32), np.zeros(1, np.float64)
    counters, tickets = np.zeros(2, np.uint32), np.zeros(n, np.uint32)
    kernel = lib.kernel("atomics", VP, VP, VP, VP, VP, ctypes.c_longlong)
    kernel(grid, block, x, sum32, sum64, counters, tickets, n)
    assert sum32[0] == x.sum()
    assert sum64[0] == x.sum()
    assert counters.tolist() == [n, 2 * n]
    np.testing.assert_array_equal(np.sort(tickets), np.arange(n, dtype=np.uint32))


@pytest.mark.parametrize(("grid", "block"), [(1, 1), (3, 32), (7, 128)])
def test_dropout_is_independent_of_launch_shape(lib: HostLibrary, grid: int, block: int) -> None:
    n, seed, stream, p = 5000, 1234, 7, 0.3
    threshold = round(p * (1 << 24))
    x = _random(n, F32, 7)
    y = np.full(n, np.nan, F32)
    scale = F32(1.0 / (1.0 - p))
    kernel = lib.kernel(
        "dropout_f32",
        VP,
        VP,
        ctypes.c_uint64,
        ctypes.c_uint64,
        ctypes.c_uint,
        ctypes.c_float,
        ctypes.c_longlong,
    )
    kernel(grid, block, x, y, seed, stream, threshold, float(scale), n)
    hashes = counter_hash_np(
        np.full(n, seed, np.uint64), np.arange(n, dtype=np.uint64), np.full(n, stream, np.uint64)
    )
    keep = (hashes >> np.uint64(40)) >= threshold
    np.testing.assert_array_equal(y, np.where(keep, x * scale, F32(0)))
    assert abs(keep.mean() - (1 - p)) < 0.03


def _conversion(lib: HostLibrary, name: str, x: np.ndarray, out_dtype: object) -> np.ndarray:
    y = np.zeros(len(x), out_dtype)
    lib.kernel(name, VP, VP, ctypes.c_longlong)(4, 64, x, y, len(x))
    return y


def _interesting_f32(rng: np.random.Generator) -> np.ndarray:
    """Random bit patterns plus every float32 near the f16 / bf16 rounding boundaries."""
    random_bits = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0x33000000, 0x33800000, 0x38800000, 0x477FE000, 0x477FF000, 0x7F7FFFFF])
    near = (edges[:, None] + np.arange(-4096, 4096)[None, :]).ravel().astype(np.uint32)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 1, 0x00800000], np.uint32)
    bits = np.concatenate([random_bits, near, specials])
    return np.concatenate([bits, bits | np.uint32(0x80000000)]).view(F32)


def _midpoints(dtype: object) -> np.ndarray:
    """Exact float32 ties between consecutive finite values of a 16-bit float type."""
    with np.errstate(invalid="ignore"):  # NaN patterns of bf16
        vals = np.arange(1 << 16, dtype=np.uint16).view(dtype).astype(np.float64)
    vals = np.sort(vals[np.isfinite(vals)])
    return ((vals[:-1] + vals[1:]) / 2).astype(F32)


def _assert_same_bits_or_both_nan(got: np.ndarray, want: np.ndarray) -> None:
    both_nan = np.isnan(got.astype(F32)) & np.isnan(want.astype(F32))
    bits_g, bits_w = got.view(np.uint16), want.view(np.uint16)
    bad = (bits_g != bits_w) & ~both_nan
    assert not bad.any(), f"{bad.sum()} mismatches, e.g. {got[bad][:5]} vs {want[bad][:5]}"


def _check_f16_conversions(lib: HostLibrary) -> None:
    every_half = np.arange(1 << 16, dtype=np.uint16).view(F16)
    widened = _conversion(lib, "f16_to_f32", every_half, F32)
    finite = ~np.isnan(every_half)
    np.testing.assert_array_equal(
        widened[finite].view(np.uint32), every_half[finite].astype(F32).view(np.uint32)
    )
    assert np.isnan(widened[~finite]).all()

    x = np.concatenate([_interesting_f32(np.random.default_rng(8)), _midpoints(F16), widened])
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(F16)
    _assert_same_bits_or_both_nan(_conversion(lib, "f32_to_f16", x, F16), want)


def test_f16_conversions_exhaustive(lib: HostLibrary) -> None:
    _check_f16_conversions(lib)


def test_f16_conversions_via_float16_opt_in() -> None:
    """The opt-in _Float16 path rounds exactly like the default bit-level path."""
    source = translation_unit(CONVERSIONS, prelude="#define COCO_HOST_USE_FLOAT16 1\n")
    _check_f16_conversions(compile_host(source, warnings_as_errors=True))


def test_bf16_conversions_exhaustive(lib: HostLibrary) -> None:
    every_bf16 = np.arange(1 << 16, dtype=np.uint16).view(BF16)
    widened = _conversion(lib, "bf16_to_f32", every_bf16, F32)
    np.testing.assert_array_equal(
        widened.view(np.uint32), every_bf16.view(np.uint16).astype(np.uint32) << np.uint32(16)
    )

    x = np.concatenate([_interesting_f32(np.random.default_rng(9)), _midpoints(BF16)])
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(BF16)
    _assert_same_bits_or_both_nan(_conversion(lib, "f32_to_bf16", x, BF16), want)


@pytest.mark.parametrize(("name", "dtype"), [("f8e4m3", E4M3), ("f8e5m2", E5M2)])
def test_fp8_conversions_exhaustive(lib: HostLibrary, name: str, dtype: object) -> None:
    """Every fp8 code widens exactly; f32 narrows bit for bit as ml_dtypes' astype does (round
    to nearest even, e4m3fn overflowing to NaN and e5m2 to inf, the sign of a NaN kept): on
    random bit patterns, every tie between two fp8 values and its neighbours, every f32 near
    the subnormal, normal and overflow edges, and every widened code."""
    every = np.arange(1 << 8, dtype=np.uint8).view(dtype)
    widened = _conversion(lib, f"{name}_to_f32", every, F32)
    finite = ~np.isnan(every.astype(F32))
    np.testing.assert_array_equal(
        widened[finite].view(np.uint32), every[finite].astype(F32).view(np.uint32)
    )
    assert np.isnan(widened[~finite]).all()
    assert (np.signbit(widened[~finite]) == (every[~finite].view(np.uint8) >= 0x80)).all()

    finite_values = np.sort(every.astype(np.float64)[finite])
    ties = ((finite_values[:-1] + finite_values[1:]) / 2).astype(F32)
    largest = float(finite_values[-1])
    beyond = np.array([largest * 1.0625, largest * 1.125, largest * 1.5], F32)
    near = ties.view(np.uint32)[:, None] + np.arange(-3, 4, dtype=np.int64)[None, :]
    x = np.concatenate(
        [
            _interesting_f32(np.random.default_rng(10)),
            ties,
            near.ravel().astype(np.uint32).view(F32),
            beyond,
            -beyond,
            widened,
        ]
    )
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dtype)
    got = _conversion(lib, f"f32_to_{name}", x, dtype)
    bad = got.view(np.uint8) != want.view(np.uint8)
    assert not bad.any(), (
        f"{bad.sum()} mismatches, e.g. {x[bad][:5]}: {got[bad][:5]} vs {want[bad][:5]}"
    )


def _gelu_reference(x: np.ndarray) -> np.ndarray:
    # the tanh form (the kernels take x / (1 + exp(-2u)), the same function, below -3)
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


@pytest.mark.parametrize(("elt", "rtol"), [("float", 2e-6), ("double", 1e-14)])
def test_math_helpers(lib: HostLibrary, elt: str, rtol: float) -> None:
    dtype = NUMPY_TYPE[elt]
    x = np.linspace(0.05, 6.0, 997).astype(dtype)
    out = np.zeros(7 * len(x), dtype)
    lib.kernel(f"math_{elt}", VP, VP, ctypes.c_longlong)(3, 32, x, out, len(x))
    x64 = x.astype(np.float64)
    references = [
        np.sqrt(x64),
        1 / np.sqrt(x64),
        np.exp(x64),
        np.log(x64),
        np.tanh(x64),
        _gelu_reference(x64),
        1 / (1 + np.exp(-x64)),
    ]
    for name, got, want in zip(
        ["sqrt", "rsqrt", "exp", "log", "tanh", "gelu", "sigmoid"],
        out.reshape(7, -1),
        references,
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 1e-3, err_msg=name)
    # sqrt is correctly rounded on both targets: exactly numpy's.
    np.testing.assert_array_equal(out[: len(x)], np.sqrt(x))


def test_flag_reached_is_wraparound_safe(lib: HostLibrary) -> None:
    pairs = [
        (0, 0, 1),
        (5, 4, 1),
        (4, 5, 0),
        (0, 0xFFFFFFFF, 1),
        (0xFFFFFFFF, 0, 0),
        (0x7FFFFFFF, 0, 1),
        (0x80000000, 1, 1),
        (0x80000001, 1, 0),
    ]
    # The last pair is 2^31 ahead: past half the ring it counts as behind (wrapped).
    cur = np.array([p[0] for p in pairs], np.uint32)
    val = np.array([p[1] for p in pairs], np.uint32)
    out = np.zeros(len(pairs), np.uint8)
    lib.kernel("flag_reached", VP, VP, VP, ctypes.c_longlong)(1, 1, cur, val, out, len(pairs))
    assert out.tolist() == [p[2] for p in pairs]


@pytest.mark.parametrize(("grid", "block"), [(1, 1), (5, 3), (8, 32)])
def test_cross_rank_flags_between_concurrent_launches(
    lib: HostLibrary, grid: int, block: int
) -> None:
    """Two 'ranks' (Python threads, each launching an OpenMP kernel; ctypes drops the GIL)
    exchange data through flags for several epochs. With 2 cores the OpenMP teams oversubscribe
    the machine, so this only finishes if the spin-wait yields."""
    n, epochs = 4000, 6
    rng = np.random.default_rng(10)
    base = [rng.standard_normal(n).astype(F32) for _ in range(2)]
    # Double-buffered by epoch parity: a rank can be at most one epoch ahead of its peer, so
    # it never overwrites a slot the peer is still reading, and every epoch's data differ.
    bufs = [np.zeros((2, n), F32) for _ in range(2)]
    flags = [np.zeros(grid, np.uint32) for _ in range(2)]
    results: list[list[np.ndarray]] = [[], []]
    kernel = lib.kernel("exchange_f32", VP, VP, VP, VP, VP, VP, ctypes.c_uint, ctypes.c_longlong)
    errors: list[Exception] = []

    def rank(r: int) -> None:
        try:
            for epoch in range(1, epochs + 1):
                mine, out, slot = base[r] * F32(epoch), np.zeros(n, F32), epoch % 2
                kernel(
                    grid,
                    block,
                    mine,
                    bufs[r][slot],
                    bufs[1 - r][slot],
                    flags[r],
                    flags[1 - r],
                    out,
                    epoch,
                    n,
                )
                results[r].append(out)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "cross-rank exchange deadlocked"
    assert not errors
    for r in range(2):
        for epoch, out in enumerate(results[r], start=1):
            e = F32(epoch)
            np.testing.assert_array_equal(out, base[r] * e + base[1 - r] * e)
        assert flags[r].tolist() == [epochs] * grid


@pytest.mark.parametrize(("nranks", "grid", "block"), [(2, 1, 1), (3, 5, 3), (4, 8, 32)])
def test_peers_protocol_flag_layout(lib: HostLibrary, nranks: int, grid: int, block: int) -> None:
    """Ranks (threads) run the protocol of fused collective kernels for several epochs. It
    finishes (every wait is on a flag a peer sets), exactly one block per launch takes the
    last ticket and resets the counter, and every flag of the documented layout (entry and
    done: nranks x grid each, then nranks exchange flags) carries the epoch: no step writes
    outside its region or leaves part of it unset."""
    epochs = 5
    size = 2 * nranks * grid + nranks
    flags = [np.zeros(size, np.uint32) for _ in range(nranks)]
    table = np.array([f.ctypes.data for f in flags], np.uint64)
    counters = [np.zeros(1, np.uint32) for _ in range(nranks)]
    lasts = [np.zeros(1, np.uint32) for _ in range(nranks)]
    kernel = lib.kernel("peers_protocol", VP, VP, VP, ctypes.c_uint, ctypes.c_int, ctypes.c_int)
    errors: list[Exception] = []
    barrier = threading.Barrier(nranks)
    seen: list[list[np.ndarray]] = [[] for _ in range(nranks)]

    def rank(r: int) -> None:
        try:
            for epoch in range(1, epochs + 1):
                kernel(grid, block, table, counters[r], lasts[r], epoch, r, nranks)
                barrier.wait(timeout=60)  # every rank's launch of this epoch is done
                seen[r].append(flags[r].copy())
                barrier.wait(timeout=60)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "the peers protocol deadlocked"
    assert not errors
    for r in range(nranks):
        for epoch, snapshot in enumerate(seen[r], start=1):
            assert snapshot.tolist() == [epoch] * size
        assert lasts[r].tolist() == [epochs]
        assert counters[r].tolist() == [0]


def test_block_level_misuse_is_rejected_by_the_host_build() -> None:
    """The host build is the convention's checker: a sync inside a phase, or a thread index
    where no thread is, does not compile."""
    for body in ("COCO_FOR_THREADS { coco_sync_block(); }", "p[coco_thread_idx()] = 1;"):
        source = translation_unit(
            f"COCO_KERNEL(k, int* p) {{ COCO_KERNEL_BODY_BEGIN {body} COCO_KERNEL_BODY_END }}"
        )
        with pytest.raises(HostCompileError, match="must be at block level|coco_t_"):
            compile_host(source)


def test_the_host_build_reads_the_c_math_header_alone(tmp_path) -> None:
    """coco_device.h takes glibc's <math.h> without libstdc++'s <cmath> behind it (0.2 s of
    every host compile); the preprocessed unit says which headers it read."""
    (tmp_path / "unit.cpp").write_text(translation_unit())
    for header in host_compiler.HEADER_DIR.glob("*.h"):
        (tmp_path / header.name).write_text(header.read_text())
    flags = [f for f in host_compiler.host_compile_flags() if not f.startswith(("-l", "-shared"))]
    cmd = [host_compiler._compiler(), *flags, "-E", "-dM", "-I", str(tmp_path), "unit.cpp"]
    macros = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    if "__GLIBCXX__" not in macros:
        pytest.skip("not libstdc++: the macro that skips <cmath> is libstdc++'s")
    assert "_GLIBCXX_CMATH" not in macros
    assert "COCO_TARGET_HOST" in macros
    assert "M_PI" in macros  # the C header itself was read


FORKED_AFTER_A_PARALLEL_REGION = """
import ctypes, os, sys
import numpy as np
from coconet.toolchain.host_compiler import compile_host

kernel = compile_host(sys.argv[1]).kernel("k", ctypes.c_void_p)
x = np.zeros(8 * 4, np.int32)
kernel(8, 4, x)  # on the main thread, with two OpenMP threads: it now has a pool
pid = os.fork()
if pid == 0:
    y = np.zeros(8 * 4, np.int32)
    kernel(8, 4, y)  # the thread that forked, in the child
    os._exit(0 if (y == 1).all() else 3)
status = os.waitpid(pid, 0)[1]
print("parent", int((x == 1).all()), "child", os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_after_host_kernels_ran_runs_them() -> None:
    """libgomp's thread pool does not survive fork: a child whose forking thread had started
    parallel regions waited forever in its next one (the fuzzer's forked workers did, after
    a test in the same process ran kernels). The forking thread runs its regions serially."""
    source = translation_unit(
        "COCO_KERNEL(k, int* p) { COCO_KERNEL_BODY_BEGIN COCO_FOR_THREADS {"
        " p[coco_block_idx() * coco_block_dim() + coco_thread_idx()] = 1; }"
        " COCO_KERNEL_BODY_END }"
    )
    compile_host(source)  # built here: the script then loads it from the cache
    proc = subprocess.Popen(
        [sys.executable, "-c", FORKED_AFTER_A_PARALLEL_REGION, source],
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the forked child waited forever in its first parallel region")
    assert proc.returncode == 0
    assert out.split() == ["parent", "1", "child", "0"]


# ----------------------------------------------------------------------------------------------
# (c) the counter hash against its Python definition
# ----------------------------------------------------------------------------------------------


def test_counter_hash_python_twins_agree() -> None:
    rng = np.random.default_rng(11)
    triples = rng.integers(0, 1 << 63, (200, 3), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    vectorized = counter_hash_np(triples[:, 0], triples[:, 1], triples[:, 2])
    for (s, i, st), h in zip(triples.tolist(), vectorized.tolist(), strict=True):
        assert counter_hash(s, i, st) == h
    # Pinned value of the definition in the brief, so a change to either twin is noticed.
    assert counter_hash(0, 0, 0) == mix64(mix64(0))


def test_counter_hash_matches_python(lib: HostLibrary) -> None:
    rng = np.random.default_rng(12)
    n = 20000
    seed = rng.integers(0, 1 << 64, n, dtype=np.uint64)
    index = rng.integers(0, 1 << 64, n, dtype=np.uint64)
    stream = rng.integers(0, 1 << 64, n, dtype=np.uint64)
    # Small and extreme values too: the wrap-around of index + mix64(...) must match.
    for col in (seed, index, stream):
        col[:64] = np.arange(64, dtype=np.uint64)
        col[64:128] = np.uint64(MASK64) - np.arange(64, dtype=np.uint64)
    out = np.zeros(n, np.uint64)
    keep = np.zeros(n, np.uint8)
    threshold = 1 << 23
    kernel = lib.kernel("counter_hash_u64", VP, VP, VP, VP, VP, ctypes.c_uint, ctypes.c_longlong)
    kernel(7, 32, seed, index, stream, out, keep, threshold, n)
    np.testing.assert_array_equal(out, counter_hash_np(seed, index, stream))
    for k in range(0, n, 97):  # the integer definition, literally
        s, i, st = int(seed[k]), int(index[k]), int(stream[k])
        assert int(out[k]) == counter_hash(s, i, st)
        assert bool(keep[k]) == dropout_keep(s, i, st, threshold)


# ----------------------------------------------------------------------------------------------
# (d) the kernel cache
# ----------------------------------------------------------------------------------------------

TINY = translation_unit(
    "COCO_KERNEL(fill, int* p, int v, coco_i64 n) { COCO_KERNEL_BODY_BEGIN"
    " COCO_BLOCK_STRIDE_LOOP(coco_i64, i, 0, n) { p[i] = v; } COCO_KERNEL_BODY_END }\n"
)


def _fill_works(lib: HostLibrary) -> bool:
    p = np.zeros(5, np.int32)
    lib.kernel("fill", VP, ctypes.c_int, ctypes.c_longlong)(1, 2, p, 7, 5)
    return p.tolist() == [7] * 5


def test_second_compile_is_a_cache_hit() -> None:
    source = TINY + "// hit test\n"
    builds = HOST_CACHE.stats.builds
    first = compile_host(source)
    assert not first.cache_hit
    assert HOST_CACHE.stats.builds == builds + 1
    second = compile_host(source)
    assert second.cache_hit
    assert HOST_CACHE.stats.builds == builds + 1
    assert second.path == first.path
    assert _fill_works(second)
    # Different flags are a different entry.
    assert not compile_host(source, openmp=False).cache_hit


def test_corrupt_cache_entry_is_rebuilt() -> None:
    source = TINY + "// corrupt test\n"
    path = host_cache_path(source)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF this is not a shared library")
    corrupt = HOST_CACHE.stats.rebuilt_corrupt
    lib = compile_host(source)
    assert not lib.cache_hit
    assert HOST_CACHE.stats.rebuilt_corrupt == corrupt + 1
    assert _fill_works(lib)
    assert compile_host(source).cache_hit


def test_concurrent_compiles_build_once() -> None:
    source = TINY + "// concurrency test\n"
    builds = HOST_CACHE.stats.builds
    results: list[HostLibrary] = []
    threads = [
        threading.Thread(target=lambda: results.append(compile_host(source))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    assert HOST_CACHE.stats.builds == builds + 1
    assert sum(not r.cache_hit for r in results) == 1
    assert all(_fill_works(r) for r in results)


def test_compile_error_carries_compiler_output() -> None:
    with pytest.raises(HostCompileError, match="no_such_function") as info:
        compile_host(translation_unit("COCO_KERNEL(k, int* p) { no_such_function(p); }"))
    assert "error" in info.value.output
    # Nothing was published for the failed source.
    assert not any(host_compiler.HOST_CACHE.directory.glob("*/*.tmp"))
