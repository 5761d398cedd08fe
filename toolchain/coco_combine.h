// Exact rank-order combination of gathered pieces on the host: what the library collectives
// (runtime/collectives.py `combine`) compute where MPI cannot reduce -- bf16, f16 and fp8 have
// no MPI type, max/min must propagate NaN, and a stated accumulation rounds every step.
//
// Each element: the members' values widened exactly to double, combined in member order
// (rounded to the stated accumulation after each step), rounded ONCE to the result type --
// the sim's all_reduce. Doubles round to bf16, f16 and fp8 through round-to-odd in f32 (f32
// has more than twice their bits), which makes the second rounding the single rounding of
// the double; the same operations as coconet.core.values.odd_f32_bits, so the same bits.
//
// A unit instantiates COCO_COMBINE(name, Src, Dst, Op, Acc) for one combination
// (runtime/host_combine.py). Loops run over tiles of a block's elements, member by member, so
// each loop is a plain vectorizable pass (the NumPy form made ~12 passes over memory).
#pragma once
#include "coco_device.h"

namespace coco_combine {

// Every element type widens exactly through the device layer's coco_to_f32.
template <typename T>
COCO_HD double widen(T x) {
  return (double)coco_to_f32(x);
}
COCO_HD double widen(double x) { return x; }

// x rounded to odd in f32: truncated toward zero, the last bit set where inexact (NaN too,
// as coconet.core.values.odd_f32_bits does it; the kernels' coco_f64_to_f32_odd keeps NaN).
COCO_HD float odd_f32(double x) {
  const float f = (float)x;
  const double back = (double)f;
  coco_u32 bits = coco_float_as_u32(f);
  const bool inexact = back != x;
  bits = (inexact && fabs(back) > fabs(x)) ? bits - 1u : bits;
  return coco_u32_as_float(inexact ? (bits | 1u) : bits);
}

// A double rounded once to T: through odd in f32, then the device layer's coco_from_f32<T>
// (f16, bf16, fp8); f32 and f64 directly.
template <typename T>
struct narrow {
  static COCO_HD T cvt(double x) { return coco_from_f32<T>(odd_f32(x)); }
};
template <>
struct narrow<double> {
  static COCO_HD double cvt(double x) { return x; }
};
template <>
struct narrow<float> {
  static COCO_HD float cvt(double x) { return (float)x; }
};

// A partial rounded to the stated accumulation type A (double: none stated).
template <typename A>
COCO_HD double round_acc(double x) {
  return widen(narrow<A>::cvt(x));
}
template <>
COCO_HD double round_acc<double>(double x) {
  return x;
}

// The combining operators, as NumPy's vector loops apply them on x86: of two NaNs the first
// propagates (addpd's rule, which the compiler may not keep: it may commute a + b), max/min
// propagate a NaN and give the second operand on ties (-0 vs +0: maxpd/minpd).
struct Sum {
  static COCO_HD double apply(double a, double b) { return a != a ? a : a + b; }
};
struct Prod {
  static COCO_HD double apply(double a, double b) { return a != a ? a : a * b; }
};
struct Max {
  static COCO_HD double apply(double a, double b) { return (a != a || a > b) ? a : b; }
};
struct Min {
  static COCO_HD double apply(double a, double b) { return (a != a || a < b) ? a : b; }
};

constexpr coco_i64 kTile = 1024;

// Block b of the grid combines elements [b*n/grid, (b+1)*n/grid) of every member's piece
// (member m's piece starts `stride` elements after member m-1's).
template <typename Src, typename Dst, typename Op, typename Acc>
COCO_HD void combine_range(const Src* pieces, coco_i64 stride, coco_i32 members, coco_i64 begin,
                           coco_i64 end, Dst* out) {
  double acc[kTile];
  for (coco_i64 t = begin; t < end; t += kTile) {
    const coco_i64 len = end - t < kTile ? end - t : kTile;
    const Src* first = pieces + t;
    for (coco_i64 k = 0; k < len; ++k) acc[k] = round_acc<Acc>(widen(first[k]));
    for (coco_i32 m = 1; m < members; ++m) {
      const Src* piece = pieces + (coco_i64)m * stride + t;
      for (coco_i64 k = 0; k < len; ++k)
        acc[k] = round_acc<Acc>(Op::apply(acc[k], widen(piece[k])));
    }
    for (coco_i64 k = 0; k < len; ++k) out[t + k] = narrow<Dst>::cvt(acc[k]);
  }
}

}  // namespace coco_combine

#define COCO_COMBINE(name, Src, Dst, Op, Acc)                                               \
  COCO_KERNEL(name, const void* pieces, coco_i64 stride, coco_i32 members, coco_i64 n,      \
              void* out) {                                                                  \
    COCO_KERNEL_BODY_BEGIN                                                                  \
    const coco_i64 b = coco_block_idx(), grid = coco_grid_dim();                           \
    coco_combine::combine_range<Src, Dst, coco_combine::Op, Acc>(                           \
        static_cast<const Src*>(pieces), stride, members, n * b / grid, n * (b + 1) / grid, \
        static_cast<Dst*>(out));                                                            \
    COCO_KERNEL_BODY_END                                                                    \
  }
