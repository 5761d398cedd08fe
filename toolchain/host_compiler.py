"""Compile generated CUDA C for the CPU with the host C++ compiler, and load it with ctypes.

The same kernel text that NVRTC compiles for the GPU is compiled here against the host
implementation of coco_device.h (blocks -> OpenMP loop, threads -> loops; see the header).
This is the `cpu` backend and the way CI executes every generated kernel.

Flags are chosen for reproducible results first: -ffp-contract=off (every operation rounds, as
on the GPU with --fmad=false) and no -ffast-math. -fno-math-errno and -fno-trapping-math change
no value; they only let sqrt be inlined and loops with float selects be vectorized.

The instruction set is an x86-64 microarchitecture level, not -march=native: x86-64-v3 (AVX2,
256-bit vectors) where the CPU has it, else the baseline (SSE2). The level is one of the flags,
and so part of the cache key: a machine without AVX2 never loads an AVX2 build from a shared
cache. It changes no value either (no contraction; vector division and square root round as
the scalar ones do; libm is called as before), but the vectorized kernels run on twice as many
lanes: the fused Adam kernel is ~1.7x faster with it on a 2-core EPYC (8.4M elements, one rank:
12 ms -> 7 ms). COCONET_HOST_MARCH=<level> overrides it (`default`: no -march).

The optimization level is -O3; COCONET_HOST_OPT=0..3 sets another. It is a flag, so part of
the cache key, and changes no value (the flags above fix the arithmetic at every level): the
test suite builds its many one-use kernels at -O0, in under half the time (its small
inputs run as fast), and keeps -O3, the level users run, for the named schedules of every
other example (test_lowering; all of them under COCONET_FULL=1) and the checks of
vectorized code.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coconet.core.env import env_choice
from coconet.toolchain.kernel_cache import KernelCache, content_key, pinned

__all__ = [
    "HOST_CACHE",
    "HOST_OPT_ENV",
    "HostCompileError",
    "HostKernel",
    "HostLibrary",
    "PackedLaunch",
    "compile_host",
    "host_cache_path",
    "host_compile_flags",
]

HEADER_DIR = Path(__file__).resolve().parent
HOST_CACHE = KernelCache("host")
HOST_OPT_ENV = "COCONET_HOST_OPT"
# Bumped when the build recipe changes in a way the flags do not capture.
_RECIPE_VERSION = "host-v1"


class HostCompileError(RuntimeError):
    """The host compiler rejected the source; `output` holds its full diagnostics, `note` a
    cause they may not state (a full disk)."""

    def __init__(self, message: str, output: str = "", note: str = "") -> None:
        headline = f"{message}: {note}" if note else message
        super().__init__(f"{headline}\n{output}".rstrip())
        self.output = output
        self.note = note


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


@functools.cache
def _compiler_identity(compiler: str) -> str:
    """`--version` plus target triple: a compiler upgrade must miss the cache."""
    try:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, check=True
        ).stdout
        machine = subprocess.run(
            [compiler, "-dumpmachine"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise HostCompileError(f"host C++ compiler {compiler!r} is not usable: {exc}") from exc
    return version + machine


# What x86-64-v3 needs of the CPU, as /proc/cpuinfo names it (lzcnt is `abm`), v2's included.
_X86_64_V3 = frozenset(
    [
        "cx16",
        "lahf_lm",
        "popcnt",
        "sse4_1",
        "sse4_2",
        "ssse3",
        "avx",
        "avx2",
        "bmi1",
        "bmi2",
        "f16c",
        "fma",
        "abm",
        "movbe",
        "xsave",
    ]
)


def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def _march(compiler: str) -> str | None:
    """The -march level for this machine (see the module docstring), if the compiler knows it."""
    level = os.environ.get("COCONET_HOST_MARCH")
    if level is None:
        import platform

        if platform.machine() not in ("x86_64", "AMD64") or not _X86_64_V3 <= _cpu_flags():
            return None
        level = "x86-64-v3"
    if level in ("", "default"):
        return None
    try:
        probe = subprocess.run(
            [compiler, f"-march={level}", "-x", "c++", "-E", "-o", os.devnull, os.devnull],
            capture_output=True,
            check=False,
        )
    except OSError:
        return None
    return level if probe.returncode == 0 else None


@functools.cache
def _libmvec(compiler: str) -> bool:
    """Whether builds link glibc's vector math library, which the `fast` numerics policy's f32
    functions vectorize through (coco_device.h; docs/architecture.md §3.4.2): on x86-64 with
    g++ where the compiler finds it. COCONET_HOST_LIBMVEC=0 turns it off."""
    import platform

    if os.environ.get("COCONET_HOST_LIBMVEC", "1") == "0":
        return False
    if platform.machine() not in ("x86_64", "AMD64") or "clang" in Path(compiler).name:
        return False
    try:
        found = subprocess.run(
            [compiler, "-print-file-name=libmvec.so"], capture_output=True, text=True, check=False
        )
    except OSError:
        return False
    return found.returncode == 0 and os.path.isabs(found.stdout.strip())


def host_compile_flags(*, openmp: bool = True, warnings_as_errors: bool = False) -> list[str]:
    flags = [
        f"-O{env_choice(HOST_OPT_ENV, ('0', '1', '2', '3'), '3')}",
        "-std=c++17",
        "-fPIC",
        "-shared",
        "-ffp-contract=off",
        "-fno-math-errno",
        # Value-preserving as well (only FP exception flags, which nobody reads); it lets g++
        # if-convert and vectorize loops with selects on floats (fp16 conversions, masks).
        "-fno-trapping-math",
        # Only the COCO_KERNEL entry points are exported (they carry visibility("default")).
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
    ]
    march = _march(_compiler())
    if march is not None:
        flags.append(f"-march={march}")
    if _libmvec(_compiler()):
        flags += ["-DCOCO_HOST_LIBMVEC", "-lmvec"]
    if openmp:
        flags.append("-fopenmp")
    if warnings_as_errors:
        flags.append("-Werror")
    return flags


def _device_headers() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(HEADER_DIR.glob("*.h"))}


def _cache_key(source: str, flags: Sequence[str], headers: dict[str, str]) -> str:
    header_parts = [part for name in sorted(headers) for part in (name, headers[name])]
    return content_key(
        _RECIPE_VERSION,
        source,
        *header_parts,
        "\0".join(flags),
        _compiler_identity(_compiler()),
    )


def host_cache_path(source: str, *, openmp: bool = True, warnings_as_errors: bool = False) -> Path:
    """Where compile_host would cache the library for `source` (used by tests and tools)."""
    flags = host_compile_flags(openmp=openmp, warnings_as_errors=warnings_as_errors)
    return HOST_CACHE.path_for(_cache_key(source, flags, _device_headers()), ".so")


# ----------------------------------------------------------------------------------------------
# Loaded libraries
# ----------------------------------------------------------------------------------------------

# Leading parameters of every host entry point: grid, block, dynamic shared bytes.
_LAUNCH_ARGTYPES: list[Any] = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint]


def _to_c_argument(value: object, argtype: Any) -> object:
    """NumPy arrays travel as their data pointer; everything else as ctypes converts it."""
    if not isinstance(value, np.ndarray):
        return value
    if not value.flags.c_contiguous:
        raise ValueError("kernel arguments must be C-contiguous arrays")
    if argtype is ctypes.c_void_p:
        return value.ctypes.data
    return value.ctypes.data_as(argtype)


@dataclass
class PackedLaunch:
    """One launch's arguments converted to C values once (HostKernel.pack): calling it
    launches with them, through an entry point without argtypes, so ctypes converts nothing
    (a plan's arguments do not change from step to step: epochs advance on the device)."""

    function: Any
    values: list[Any]  # ctypes instances: grid, block, shared bytes, then the kernel's own

    def __call__(self) -> None:
        self.function(*self.values)


@dataclass
class HostKernel:
    """A COCO_KERNEL entry point: call it like a CUDA launch, kernel(grid, block, *args)."""

    name: str
    function: Any
    argtypes: tuple[Any, ...]
    # the same entry point without argtypes, for packed launches (`pack`)
    raw: Any = None

    def pack(
        self, grid: int, block: int, *args: int | float, shared_bytes: int = 0
    ) -> PackedLaunch:
        """The launch `self(grid, block, *args)` with its arguments converted once (pointers
        as addresses, scalars as numbers)."""
        if grid < 1 or block < 1:
            raise ValueError(f"{self.name}: grid ({grid}) and block ({block}) must be >= 1")
        if len(args) != len(self.argtypes):
            raise TypeError(f"{self.name} takes {len(self.argtypes)} arguments, got {len(args)}")
        launch = [t(v) for t, v in zip(_LAUNCH_ARGTYPES, (grid, block, shared_bytes), strict=True)]
        own = [t(v) for t, v in zip(self.argtypes, args, strict=True)]
        return PackedLaunch(self.raw, launch + own)

    def __call__(self, grid: int, block: int, *args: object, shared_bytes: int = 0) -> None:
        if grid < 1 or block < 1:
            # The same configurations CUDA rejects; an empty launch is the caller's to skip.
            raise ValueError(f"{self.name}: grid ({grid}) and block ({block}) must be >= 1")
        if len(args) != len(self.argtypes):
            raise TypeError(f"{self.name} takes {len(self.argtypes)} arguments, got {len(args)}")
        converted = [_to_c_argument(v, t) for v, t in zip(args, self.argtypes, strict=True)]
        self.function(grid, block, shared_bytes, *converted)


@dataclass
class HostLibrary:
    """A compiled translation unit; `cache_hit` says whether it came from the disk cache."""

    path: Path
    cache_hit: bool
    library: ctypes.CDLL = field(repr=False)

    def kernel(self, name: str, *argtypes: Any) -> HostKernel:
        """Bind entry point `name`; `argtypes` are the ctypes types of the kernel's own
        parameters (pointers as ctypes.c_void_p or POINTER(...)), without launch parameters."""
        try:
            function = getattr(self.library, name)
        except AttributeError:
            raise HostCompileError(f"no kernel named {name!r} in {self.path}") from None
        function.argtypes = [*_LAUNCH_ARGTYPES, *argtypes]
        function.restype = None
        raw = self.library[name]  # a function object of its own (getattr's is cached)
        raw.restype = None
        return HostKernel(name, function, tuple(argtypes), raw)


# ----------------------------------------------------------------------------------------------
# Compilation
# ----------------------------------------------------------------------------------------------


def _run_compiler(source: str, headers: dict[str, str], flags: Sequence[str], out: Path) -> None:
    """Compile in a scratch directory holding the source and a copy of the device headers,
    so the build never depends on where the package is installed."""
    # libraries after the source that needs them (an --as-needed link drops them before)
    libs = [f for f in flags if f.startswith("-l")]
    options = [f for f in flags if not f.startswith("-l")]
    try:
        with tempfile.TemporaryDirectory(prefix="coconet-host-") as scratch:
            src = Path(scratch) / "kernels.cpp"
            src.write_text(source)
            for name, text in headers.items():
                (Path(scratch) / name).write_text(text)
            cmd = [_compiler(), *options, "-I", scratch, "-o", str(out), str(src), *libs]
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=scratch)
    except OSError as e:  # e.g. ENOSPC writing the source: not a library that fails to load
        raise HostCompileError(f"host compilation failed: {e}") from e
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        raise HostCompileError(
            f"host compilation failed ({' '.join([_compiler(), *options])} ...)",
            output,
            _disk_full(output, out.parent),
        )


# Less free space than this where the library is linked: a failed link is taken for ENOSPC.
_FULL_DISK_BYTES = 4 << 20


def _disk_full(output: str, directory: Path) -> str:
    """The note for a build that failed on a full disk: the linker may say so on a line
    without "error" (which is all coco-run shows), or say only `collect2: error: ld returned
    1 exit status`."""
    try:
        st = os.statvfs(directory)
        full = st.f_bavail * st.f_frsize < _FULL_DISK_BYTES or st.f_favail == 0
    except OSError:
        full = False
    if not full and "No space left on device" not in output:
        return ""
    return f"no space left on the disk holding {directory} (ENOSPC: No space left on device)"


def _load(path: Path) -> ctypes.CDLL:
    # `path` names the checked file only while the cache's descriptor is open: the library is
    # loaded under a name that stays its own (see kernel_cache.pinned)
    return ctypes.CDLL(pinned(path), mode=ctypes.RTLD_LOCAL)


def _serial_openmp_after_fork() -> None:
    """In a child forked after host kernels ran: libgomp keeps, for each thread that started a
    parallel region, a pool of worker threads, and `fork` copies the pool's bookkeeping but
    not its threads, so the forking thread's next region would wait forever for them (a
    forked fuzz worker, a DataLoader worker, a user's multiprocessing pool). That thread's
    regions run on one thread instead (omp_set_num_threads sets the calling thread's
    count); threads the child starts build pools of their own and keep every core."""
    try:
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return  # libgomp not loaded: no pool to lose
    gomp.omp_set_num_threads(1)


os.register_at_fork(after_in_child=_serial_openmp_after_fork)


def compile_host(
    source: str, *, openmp: bool = True, warnings_as_errors: bool = False
) -> HostLibrary:
    """Compile `source` (CUDA C in the coco kernel convention) into a loaded shared library.

    A library with the same source, headers, flags and compiler is loaded from the cache
    without compiling. Raises HostCompileError with the compiler's output on failure.
    """
    if shutil.which(_compiler()) is None:
        raise HostCompileError(f"host C++ compiler {_compiler()!r} not found (set CXX)")
    flags = host_compile_flags(openmp=openmp, warnings_as_errors=warnings_as_errors)
    headers = _device_headers()
    key = _cache_key(source, flags, headers)
    path = HOST_CACHE.path_for(key, ".so")
    try:
        artifact = HOST_CACHE.get_or_build(
            key, ".so", lambda out: _run_compiler(source, headers, flags, out), _load
        )
    except OSError as exc:  # a fresh build that does not load (e.g. no libgomp)
        raise HostCompileError(f"cannot load the compiled kernels from {path}: {exc}") from exc
    return HostLibrary(artifact.path, artifact.cache_hit, artifact.value)
