"""How far a result may move when a schedule reassociates a reduction: per element type,
`|after - before| <= atol + rtol * |before|`. Used by translation validation
(coconet/equivalence.py) and by `coco-run --check` (runtime/check.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """`|after - before| <= atol + rtol * |before|`, elementwise; NaN matches NaN, an infinity
    only the same infinity."""

    rtol: float
    atol: float

    @property
    def exact(self) -> bool:
        return self.rtol == 0.0 and self.atol == 0.0


EXACT = Tolerance(rtol=0.0, atol=0.0)

# Test inputs are O(1) (core/values.py draws floats in [0.1, 1)), so `atol` is set near one
# ulp at magnitude 1: it only matters for results that cancel to about zero.
TOLERANCES: dict[str, Tolerance] = {
    # 10 mantissa bits, ulp(1) = 9.8e-4. Kernels accumulate in f32 and round once to f16, so a
    # reordered reduction moves the f16 result by at most an ulp or so: allow 2 ulps.
    "f16": Tolerance(rtol=2e-3, atol=1e-3),
    # 7 mantissa bits, ulp(1) = 7.8e-3; same argument as f16: 2 ulps.
    "bf16": Tolerance(rtol=1.6e-2, atol=1e-2),
    # ulp(1) = 1.2e-7. A ring all-reduce on p ranks sums in f32 with up to p - 1 roundings in a
    # rank-dependent order, and downstream rsqrt/div/pow amplify relative error a few times:
    # ~80 ulps covers p <= 16 with that amplification; atol ~ 10 ulps at 1 for cancellations.
    "f32": Tolerance(rtol=1e-5, atol=1e-6),
    # ulp(1) = 2.2e-16; the f32 argument scaled, with a wide margin (4500 ulps) since f64
    # programs are short and the margin costs no real bug detection at these magnitudes.
    "f64": Tolerance(rtol=1e-12, atol=1e-12),
    # fp8 (3 and 2 mantissa bits, ulp(1) = 0.125 and 0.25): kernels compute in f32 and round
    # once, so the f16 argument holds: 2 ulps.
    "f8E4M3FN": Tolerance(rtol=0.25, atol=0.125),
    "f8E5M2": Tolerance(rtol=0.5, atol=0.25),
    # Integer +, *, max, min wrap and are associative and commutative, and i1 sums/products are
    # or/and: no reduction order can change an integer result, so integers compare exactly.
    "i32": EXACT,
    "i64": EXACT,
    "i1": EXACT,
}
