// RUN: COCO_ROUNDTRIP
// RUN: COCO_GENERIC_ROUNDTRIP
// RUN: coco-opt %s --split-input-file | filecheck %s

// A dim several grid axes cut is cut in mixed radix, outermost cut first: in grid order
// unless the layouts state levels (`sliced<DIM, level L>`, 0 outermost). Megatron's flat
// buffer, sliced on tp (axis 1) and reduce-scattered over dp (axis 0), nests dp's cut inside
// each tp piece; the reduce_scatter infers that nesting, the slice states it, an
// elementwise op meets a value cut by the outer axis alone, and the all_gather undoes it.

// CHECK-LABEL: func.func @megatron_flat
// CHECK:         %r = comm.reduce_scatter sum %g over [0] : !coco.tensor<12xf32, [local, sliced<0>]> -> !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>
// CHECK-NEXT:    %ws = coco.slice %w : !coco.tensor<12xf32, [replicated, sliced<0>]> -> !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>
// CHECK-NEXT:    %u = coco.sub %ws, %r : !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>
// CHECK-NEXT:    %b = coco.add %u, %w : !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>, !coco.tensor<12xf32, [replicated, sliced<0>]> -> !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>
// CHECK-NEXT:    %a = comm.all_gather %b over [0] : !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]> -> !coco.tensor<12xf32, [replicated, sliced<0>]>
func.func @megatron_flat(%g: !coco.tensor<12xf32, [local, sliced<0>]>, %w: !coco.tensor<12xf32, [replicated, sliced<0>]>) -> !coco.tensor<12xf32, [replicated, sliced<0>]> attributes {coco.grid = #coco.grid<[2, 2]>} {
  %r = comm.reduce_scatter sum %g over [0] : !coco.tensor<12xf32, [local, sliced<0>]> -> !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>
  %ws = coco.slice %w : !coco.tensor<12xf32, [replicated, sliced<0>]> -> !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>
  %u = coco.sub %ws, %r : !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>
  %b = coco.add %u, %w : !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>, !coco.tensor<12xf32, [replicated, sliced<0>]> -> !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]>
  %a = comm.all_gather %b over [0] : !coco.tensor<12xf32, [sliced<0, level 1>, sliced<0, level 0>]> -> !coco.tensor<12xf32, [replicated, sliced<0>]>
  func.return %a : !coco.tensor<12xf32, [replicated, sliced<0>]>
}

// -----

// Three axes cut dim 1 in the order 2, 0, 1; a reduction over dim 0 keeps the nesting of
// dim 1 (now dim 0), and a cut that is grid order again (axis 2 gathered away: 0 then 1) is
// written without levels.
// CHECK-LABEL: func.func @three_axes
// CHECK:         %s = coco.reduce_dims sum %x dims [0] : !coco.tensor<4x24xf32, [sliced<1, level 1>, sliced<1, level 2>, sliced<1, level 0>]> -> !coco.tensor<24xf32, [sliced<0, level 1>, sliced<0, level 2>, sliced<0, level 0>]>
// CHECK-NEXT:    %t = comm.all_gather %x over [1]
// CHECK-SAME:      -> !coco.tensor<4x24xf32, [sliced<1, level 1>, replicated, sliced<1, level 0>]>
// CHECK-NEXT:    %y = comm.all_gather %t over [0] : !coco.tensor<4x24xf32, [sliced<1, level 1>, replicated, sliced<1, level 0>]> -> !coco.tensor<4x24xf32, [replicated, replicated, sliced<1>]>
func.func @three_axes(%x: !coco.tensor<4x24xf32, [sliced<1, level 1>, sliced<1, level 2>, sliced<1, level 0>]>) -> (!coco.tensor<24xf32, [sliced<0, level 1>, sliced<0, level 2>, sliced<0, level 0>]>, !coco.tensor<4x24xf32, [replicated, replicated, sliced<1>]>) attributes {coco.grid = #coco.grid<[2, 2, 2]>} {
  %s = coco.reduce_dims sum %x dims [0] : !coco.tensor<4x24xf32, [sliced<1, level 1>, sliced<1, level 2>, sliced<1, level 0>]> -> !coco.tensor<24xf32, [sliced<0, level 1>, sliced<0, level 2>, sliced<0, level 0>]>
  %t = comm.all_gather %x over [1] : !coco.tensor<4x24xf32, [sliced<1, level 1>, sliced<1, level 2>, sliced<1, level 0>]> -> !coco.tensor<4x24xf32, [sliced<1, level 1>, replicated, sliced<1, level 0>]>
  %y = comm.all_gather %t over [0] : !coco.tensor<4x24xf32, [sliced<1, level 1>, replicated, sliced<1, level 0>]> -> !coco.tensor<4x24xf32, [replicated, replicated, sliced<1>]>
  func.return %s, %y : !coco.tensor<24xf32, [sliced<0, level 1>, sliced<0, level 2>, sliced<0, level 0>]>, !coco.tensor<4x24xf32, [replicated, replicated, sliced<1>]>
}
