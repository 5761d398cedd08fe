"""The exact combination of gathered pieces (collectives.combine) as compiled host code.

Where MPI cannot reduce a collective (bf16, f16, fp8; max/min of floats; a stated
accumulation; `exact_collectives`), the cpu backend gathers every member's piece and combines
them in rank order in f64, rounding once -- the sim's arithmetic. In NumPy that is a dozen
passes over memory with temporaries (widen, add, round to odd in f32, round to bf16): an
all_reduce of 4M bf16 values took ~170 ms of combining where MPI moves the bytes in ~3 ms.
Here the same arithmetic is one C++ pass (toolchain/coco_combine.h), compiled by the host
compiler once per combination of types, operator and accumulation and cached like the plan's
kernels; the bits are NumPy's (test_host_combine.py checks them on every type and kind).

Integers and i1, and pieces of a type the unit does not know, stay with NumPy (`combine`
answers None).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from coconet.dialects.reduction import Reduction
from coconet.toolchain.host_compiler import HostKernel, compile_host

# The C type of each element type the unit combines, by NumPy dtype name (bf16 and fp8 also
# travel as their bit patterns: the same bytes).
_C_TYPES = {
    "float64": "double",
    "float32": "float",
    "float16": "coco_f16",
    "bfloat16": "coco_bf16",
    "float8_e4m3fn": "coco_f8e4m3",
    "float8_e5m2": "coco_f8e5m2",
}
_OPS = {Reduction.SUM: "Sum", Reduction.PROD: "Prod", Reduction.MAX: "Max", Reduction.MIN: "Min"}
# a stated accumulation (comm.accumulation), None: none stated (f64 throughout)
_ACC_TYPES = {
    None: "double",
    "f64": "double",
    "f32": "float",
    "f16": "coco_f16",
    "bf16": "coco_bf16",
}
_ENTRY = "coco_combine_pieces"

# Elements a block combines at least: below it, fewer blocks (each block is an OpenMP
# iteration; a rank runs one thread, runtime/cpu.py).
_BLOCK_ELEMENTS = 1 << 16


def _source(src: str, dst: str, op: str, acc: str) -> str:
    """One unit per combination (~0.4 s at -O3; the sixteen of a type pair in one unit took
    6 s): a program combines few."""
    return f'#include "coco_combine.h"\nCOCO_COMBINE({_ENTRY}, {src}, {dst}, {op}, {acc})\n'


class HostCombine:
    """`combine(kind, pieces, src, dst, storage, acc)` as collectives.combine takes it, on
    host arrays, through a compiled kernel per combination (built on first use)."""

    def __init__(self) -> None:
        self.kernels: dict[tuple[str, str, str, str], HostKernel] = {}

    def kernel(self, src: str, dst: str, op: str, acc: str) -> HostKernel:
        key = (src, dst, op, acc)
        k = self.kernels.get(key)
        if k is None:
            library = compile_host(_source(src, dst, op, acc))
            argtypes = (ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_longlong)
            k = self.kernels[key] = library.kernel(_ENTRY, *argtypes, ctypes.c_void_p)
        return k

    def __call__(
        self,
        kind: Reduction,
        pieces: Any,
        src: np.dtype,
        dst: np.dtype,
        storage: np.dtype,
        acc_elt: str | None = None,
    ) -> np.ndarray | None:
        """The combination of `pieces` (an array, one member's piece per leading index), or
        None where this unit does not cover the types (the caller combines in NumPy)."""
        c_src = _C_TYPES.get(np.dtype(src).name)
        c_dst = _C_TYPES.get(np.dtype(dst).name)
        if (
            not isinstance(pieces, np.ndarray)
            or pieces.ndim < 2
            or c_src is None
            or c_dst is None
            or kind not in _OPS
            or acc_elt not in _ACC_TYPES
            or pieces.dtype.itemsize != np.dtype(src).itemsize
            or np.dtype(storage).itemsize != np.dtype(dst).itemsize
        ):
            return None
        members = pieces.shape[0]
        if members < 1:
            return None
        rows = pieces.reshape(members, -1) if pieces.flags.c_contiguous else None
        if rows is None:
            # a view of the first elements of each row (an uneven reduce_scatter's block)
            rows = pieces if pieces.ndim == 2 and pieces.strides[1] == pieces.itemsize else None
        if rows is None:
            return None
        n = rows.shape[1]
        out = np.empty(pieces.shape[1:], dtype=storage)
        if n:
            stride = rows.strides[0] // rows.itemsize if members > 1 else n
            k = self.kernel(c_src, c_dst, _OPS[kind], _ACC_TYPES[acc_elt])
            grid = max(1, min(n // _BLOCK_ELEMENTS, os.cpu_count() or 1))
            k(grid, 1, rows.ctypes.data, stride, members, n, out.ctypes.data)
        return out


__all__ = ["HostCombine"]
