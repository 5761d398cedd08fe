"""Comparing a backend's per-rank outputs with the sim oracle (`coco-run --check`).

Integers and booleans compare exactly. Floats compare within the tolerance of the ops on each
output's path (core/path_tolerances.py: exact where only reductions with a stated
accumulation feed it), else within the per-dtype tolerances of
coconet.core.tolerances.TOLERANCES (library reductions in f32/f16 and in another order than the
oracle's f64 rank-order accumulation, libm vs NumPy transcendentals): |x - ref| <= atol +
rtol (|ref| + max |ref|), NaN matching NaN. Each comparison also says whether it was
bit-exact.

The `max |ref|` term (over the piece's finite values) is the norm-wise part of the bound, as
in BLAS testing: an element that a long reduction cancels to near zero carries the rounding
error of its large terms, not one relative to itself. A GEMM computed in row chunks (the
overlap schedules) lets cuBLAS pick another kernel and summation order per chunk; seen on an
H200, an f16 output of 0.004 moved by 0.0156 (one ulp of the f16 hidden activation flipped,
times the next GEMM's weights), in a tensor whose largest value is 64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from coconet.core.tolerances import TOLERANCES, Tolerance

_ELT_OF_DTYPE = {
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "float8_e4m3fn": "f8E4M3FN",
    "float8_e5m2": "f8E5M2",
}


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) for a dtype; (0, 0) for integers and booleans."""
    elt = _ELT_OF_DTYPE.get(np.dtype(dtype).name)
    if elt is None:
        return 0.0, 0.0
    tol = TOLERANCES[elt]
    return float(tol.rtol), float(tol.atol)


@dataclass
class Difference:
    output: str
    rank: int
    max_abs_error: float
    num_different: int
    num_elements: int
    detail: str = ""

    def __str__(self) -> str:
        if self.detail:
            return f"output '{self.output}' on rank {self.rank}: {self.detail}"
        return (
            f"output '{self.output}' on rank {self.rank} differs from the sim oracle: "
            f"{self.num_different} of {self.num_elements} element(s) out of tolerance, "
            f"max abs error {self.max_abs_error:.6g}"
        )


@dataclass
class CheckResult:
    differences: list[Difference]
    bit_exact: bool
    max_abs_error: float

    @property
    def ok(self) -> bool:
        return not self.differences


def _as_f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if a.dtype.kind != "b" else a.astype(np.int64).astype(np.float64)


def compare_piece(
    name: str, rank: int, got: np.ndarray, want: np.ndarray, tol: Tolerance | None = None
) -> tuple[Difference | None, bool, float]:
    """(difference or None, bit-exact?, max abs error) of one rank's piece of one output,
    within `tol` (default: its dtype's)."""
    if got.shape != want.shape:
        return (
            Difference(
                name,
                rank,
                float("inf"),
                got.size,
                want.size,
                f"shape {list(got.shape)}, the oracle's {list(want.shape)}",
            ),
            False,
            float("inf"),
        )
    if got.dtype != want.dtype:
        return (
            Difference(
                name,
                rank,
                float("inf"),
                got.size,
                want.size,
                f"dtype {got.dtype.name}, the oracle's {want.dtype.name}",
            ),
            False,
            float("inf"),
        )
    if got.size == 0:
        return None, True, 0.0
    x, y = _as_f64(got), _as_f64(want)
    with np.errstate(all="ignore"):
        both_nan = np.isnan(x) & np.isnan(y)
        equal = (x == y) | both_nan
        bits = bool(
            np.array_equal(
                np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8)
            )
        ) or bool(equal.all() and got.dtype.kind in "biu")
        err = np.where(equal, 0.0, np.abs(x - y))
        err = np.where(np.isnan(err), np.inf, err)
        rtol, atol = tolerance(got.dtype) if tol is None else (tol.rtol, tol.atol)
        finite = np.abs(y[np.isfinite(y)])
        scale = float(finite.max()) if finite.size else 0.0
        ok = equal | (err <= atol + rtol * (np.abs(y) + scale))
    max_err = float(err.max())
    if ok.all():
        return None, bits or bool(equal.all()), max_err
    return Difference(name, rank, max_err, int((~ok).sum()), int(ok.size)), False, max_err


def compare_outputs(
    got: Sequence[Mapping[str, np.ndarray]],
    want: Sequence[Mapping[str, np.ndarray]],
    tolerances: Mapping[str, Tolerance] | None = None,
) -> CheckResult:
    """Compare every rank's pieces (`got[rank][name]`) with the oracle's, each output within
    its tolerance in `tolerances` (core/path_tolerances.py: from the ops on its path) or, for
    an output it lacks, its dtype's."""
    tolerances = tolerances or {}
    diffs: list[Difference] = []
    exact, worst = True, 0.0
    for rank, (g, w) in enumerate(zip(got, want, strict=True)):
        for name, ref in w.items():
            if name not in g:
                diffs.append(
                    Difference(
                        name, rank, float("inf"), 0, ref.size, "missing from the backend's outputs"
                    )
                )
                exact = False
                continue
            d, bits, err = compare_piece(
                name, rank, np.asarray(g[name]), np.asarray(ref), tolerances.get(name)
            )
            exact &= bits
            worst = max(worst, err)
            if d is not None:
                diffs.append(d)
    return CheckResult(diffs, exact and not diffs, worst)
