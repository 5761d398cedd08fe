"""Compile generated CUDA C with NVRTC, without a GPU and without nvcc.

The `nvidia-cuda-nvrtc` wheel is the compiler of record (docs/architecture.md section 8): CI
uses this module to check that every generated kernel compiles for sm_80 and sm_90 without warnings.
NVRTC is driven through ctypes rather than CuPy because CuPy's compile helpers ask the
(absent) device for its architecture.

The device layer headers (toolchain/*.h) are handed to NVRTC as in-memory headers, so the
result does not depend on any include path or on the CUDA toolkit being installed.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_ARCHS",
    "CompiledCuda",
    "NvrtcError",
    "compile_all_archs",
    "compile_cuda",
    "device_headers",
    "nvrtc_available",
    "nvrtc_library_path",
    "nvrtc_version",
]

DEFAULT_ARCHS: tuple[str, ...] = ("sm_80", "sm_90")
HEADER_DIR = Path(__file__).resolve().parent

# Exact, reproducible numerics: the host build rounds every operation (-ffp-contract=off),
# so the GPU must not contract a*b+c into an FMA either. The rest are NVRTC's defaults,
# spelled out so that a changed default cannot silently change results.
_EXACT_MATH_OPTIONS: tuple[str, ...] = (
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
)
_WARNING_RE = re.compile(r"\bwarning\b", re.IGNORECASE)
_NVRTC_SUCCESS = 0


class NvrtcError(RuntimeError):
    """NVRTC is missing, rejected the source, or (with warnings_as_errors) warned about it."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(f"{message}\n{log}".rstrip())
        self.log = log


@dataclass(frozen=True)
class CompiledCuda:
    """The output of one NVRTC compilation.

    `cubin` is set for a real architecture (sm_XX), `ptx` for a virtual one (compute_XX)."""

    arch: str
    cubin: bytes | None
    ptx: bytes | None
    log: str

    @property
    def binary(self) -> bytes:
        """The cubin where there is one, else the PTX (what a module loader accepts)."""
        data = self.cubin if self.cubin is not None else self.ptx
        assert data is not None
        return data


# ----------------------------------------------------------------------------------------------
# Locating and loading the library
# ----------------------------------------------------------------------------------------------


def _version_key(path: Path) -> tuple[int, ...]:
    """Sort libnvrtc.so.12 < libnvrtc.so.13 < libnvrtc.so.13.1 by the numeric suffix."""
    suffix = path.name.split(".so", 1)[1]
    return tuple(int(p) for p in suffix.split(".") if p.isdigit())


def _wheel_library_candidates() -> list[Path]:
    """libnvrtc.so.* shipped in `nvidia/` wheels: nvidia/cu13/lib (13.x) or
    nvidia/cuda_nvrtc/lib (12.x). `nvidia` is a namespace package spread over site dirs."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[Path] = []
    for root in spec.submodule_search_locations:
        found.extend(Path(root).glob("*/lib/libnvrtc.so.*"))
    # The builtins library is loaded by libnvrtc itself; never load it as the entry point.
    found = [p for p in found if "builtins" not in p.name]
    return sorted(found, key=_version_key, reverse=True)


@functools.cache
def nvrtc_library_path() -> Path | None:
    """The NVRTC library to use: $COCONET_NVRTC_LIBRARY, else the newest one from the wheel."""
    override = os.environ.get("COCONET_NVRTC_LIBRARY")
    if override:
        return Path(override)
    candidates = _wheel_library_candidates()
    return candidates[0] if candidates else None


@functools.cache
def _load_library() -> ctypes.CDLL:
    path = nvrtc_library_path()
    if path is None:
        raise NvrtcError(
            "NVRTC not found: install the `nvidia-cuda-nvrtc` wheel "
            "(pip install 'coconet[nvrtc]') or set COCONET_NVRTC_LIBRARY"
        )
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NvrtcError(f"cannot load NVRTC from {path}: {exc}") from exc
    _declare_signatures(lib)
    return lib


def _declare_signatures(lib: ctypes.CDLL) -> None:
    """Declare prototypes: without them ctypes would pass size_t* and pointers as C ints."""
    c_prog = ctypes.c_void_p
    p_size = ctypes.POINTER(ctypes.c_size_t)
    p_str = ctypes.POINTER(ctypes.c_char_p)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    protos: dict[str, list[object]] = {
        "nvrtcVersion": [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
        "nvrtcCreateProgram": [
            ctypes.POINTER(c_prog),
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_int,
            p_str,
            p_str,
        ],
        "nvrtcDestroyProgram": [ctypes.POINTER(c_prog)],
        "nvrtcCompileProgram": [c_prog, ctypes.c_int, p_str],
        "nvrtcGetProgramLogSize": [c_prog, p_size],
        "nvrtcGetProgramLog": [c_prog, ctypes.c_char_p],
        "nvrtcGetPTXSize": [c_prog, p_size],
        "nvrtcGetPTX": [c_prog, ctypes.c_char_p],
        "nvrtcGetCUBINSize": [c_prog, p_size],
        "nvrtcGetCUBIN": [c_prog, ctypes.c_char_p],
    }
    for name, argtypes in protos.items():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = argtypes


def _check(lib: ctypes.CDLL, result: int, what: str, log: str = "") -> None:
    if result != _NVRTC_SUCCESS:
        reason = lib.nvrtcGetErrorString(result).decode()
        raise NvrtcError(f"{what} failed: {reason}", log)


def nvrtc_available() -> bool:
    """True when the NVRTC library can be loaded and answers a version query."""
    try:
        nvrtc_version()
    except NvrtcError:
        return False
    return True


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    lib = _load_library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


# ----------------------------------------------------------------------------------------------
# Compilation
# ----------------------------------------------------------------------------------------------


def device_headers() -> dict[str, str]:
    """The device layer headers by include name (read each call: they are small, and a
    stale copy would make edits to the header invisible in a long-lived process)."""
    return {p.name: p.read_text() for p in sorted(HEADER_DIR.glob("*.h"))}


def _string_array(items: Sequence[str]) -> ctypes.Array[ctypes.c_char_p]:
    return (ctypes.c_char_p * len(items))(*(s.encode() for s in items))


def _arch_option(arch: str) -> str:
    if not re.fullmatch(r"(sm|compute)_\d+a?", arch):
        raise ValueError(f"bad CUDA architecture {arch!r}: expected e.g. 'sm_90' or 'compute_90'")
    return f"--gpu-architecture={arch}"


def _program_log(lib: ctypes.CDLL, prog: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    _check(lib, lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
    buf = ctypes.create_string_buffer(size.value)
    _check(lib, lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return buf.value.decode(errors="replace").strip()


def _program_output(lib: ctypes.CDLL, prog: ctypes.c_void_p, kind: str) -> bytes:
    size = ctypes.c_size_t()
    _check(lib, getattr(lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)), kind)
    buf = ctypes.create_string_buffer(size.value)
    _check(lib, getattr(lib, f"nvrtcGet{kind}")(prog, buf), kind)
    return buf.raw


def compile_cuda(
    source: str,
    arch: str = "sm_90",
    name: str = "coco.cu",
    include_dirs: Iterable[str | os.PathLike[str]] = (),
    options: Iterable[str] = (),
    *,
    headers: Mapping[str, str] | None = None,
    warnings_as_errors: bool = True,
) -> CompiledCuda:
    """Compile one CUDA C translation unit for one architecture.

    `headers` (include name -> text) are added to the device layer headers, which are always
    available in memory as `#include "coco_device.h"`. Raises NvrtcError with NVRTC's full log
    when compilation fails or, with `warnings_as_errors`, when the log contains a warning.
    """
    lib = _load_library()
    all_headers = {**device_headers(), **(headers or {})}
    names = list(all_headers)
    opts = [
        _arch_option(arch),
        "-std=c++17",
        *_EXACT_MATH_OPTIONS,
        *(f"-I{os.fspath(d)}" for d in include_dirs),
        *options,
    ]
    prog = ctypes.c_void_p()
    _check(
        lib,
        lib.nvrtcCreateProgram(
            ctypes.byref(prog),
            source.encode(),
            name.encode(),
            len(names),
            _string_array([all_headers[n] for n in names]),
            _string_array(names),
        ),
        "nvrtcCreateProgram",
    )
    try:
        result = lib.nvrtcCompileProgram(prog, len(opts), _string_array(opts))
        log = _program_log(lib, prog)
        _check(lib, result, f"NVRTC compilation of {name} for {arch}", log)
        if warnings_as_errors and _WARNING_RE.search(log):
            raise NvrtcError(f"NVRTC warned while compiling {name} for {arch}", log)
        if arch.startswith("sm_"):
            return CompiledCuda(arch, _program_output(lib, prog, "CUBIN"), None, log)
        return CompiledCuda(arch, None, _program_output(lib, prog, "PTX"), log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_all_archs(
    source: str, archs: Sequence[str] = DEFAULT_ARCHS, **kwargs: object
) -> dict[str, CompiledCuda]:
    """Compile `source` for every architecture CI checks (sm_80 and sm_90 by default)."""
    return {arch: compile_cuda(source, arch, **kwargs) for arch in archs}  # type: ignore[arg-type]
